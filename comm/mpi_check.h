// MPI error checking: MPI_CHECK throws rt::CommError naming file:line, the call and MPI's message.
#pragma once
#include <mpi.h>

#include <string>

#include "nn/error.h"

namespace rt {

// A communication failure or a disagreement between ranks (sizes, model layout, settings).
class CommError : public Error {
 public:
  using Error::Error;
};

// MPI's own text for an error code, e.g. "MPI_ERR_TRUNCATE: message truncated".
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace rt

// Checks an MPI return code. Our communicators use MPI_ERRORS_RETURN so that failures reach this
// macro (and then main's abort path) with a location instead of MPI's bare default abort.
#define MPI_CHECK(call)                                                                  \
  do {                                                                                   \
    int rt_mpi_rc_ = (call);                                                             \
    if (rt_mpi_rc_ != MPI_SUCCESS)                                                       \
      throw ::rt::CommError(::rt::str_cat(__FILE__, ":", __LINE__, ": ", #call, ": ",    \
                                          ::rt::mpi_error_string(rt_mpi_rc_)));          \
  } while (0)
