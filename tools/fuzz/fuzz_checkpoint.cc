// libFuzzer program for the checkpoint reader (entry logic in targets.cc; run through tools/fuzz.sh).
#include "tools/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rt::fuzz::fuzz_checkpoint(data, size);
  return 0;
}
