// The trainer program's command line, and everything it does once MPI is up.
#pragma once
#include <string>
#include <vector>

namespace rt::trainer {

struct CliOptions {
  std::string config;              // --config FILE
  std::vector<std::string> sets;   // --set key=value, in order
  bool eval = false;               // --eval: evaluate --checkpoint only
  bool predict = false;            // --predict FILE...: classify image files with --checkpoint
  std::vector<std::string> files;  // --predict's images
  bool ema = false;                // --ema: --predict with the checkpoint's moving average
  std::string checkpoint;          // --checkpoint PATH (with --eval or --predict)
  std::string resume;              // --resume PATH|auto
  std::string weights;             // --weights PATH: start from a checkpoint's weights
  bool help = false;               // --help / -h
  // The file --eval evaluates or --predict classifies with (and, without --config, takes the
  // configuration of).
  const std::string& eval_file() const { return weights.empty() ? checkpoint : weights; }
  bool uses_model_file() const { return eval || predict; }
};

// Throws ConfigError naming the bad argument (unknown option, missing value, --eval without
// --checkpoint, ...).
CliOptions cli_parse(int argc, const char* const* argv);
const char* cli_usage();

// Runs the program after MPI_Init_thread: loads and prints the configuration, generates the
// quickstart dataset if asked, then trains (optionally resuming) or evaluates. Returns the exit
// status; throws on any error (main aborts every rank with the message).
int cli_main(int argc, const char* const* argv);

}  // namespace rt::trainer
