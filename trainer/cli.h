// The trainer program's command line, and everything it does once MPI is up.
#pragma once
#include <cstdint>
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
  int top_k = 5;                   // --topk N: --predict's classes per image
  std::string output;              // --output FILE.csv|.jsonl: --predict's answers for programs
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

// What every rank's command line must agree on, as the collectives that follow depend on it: the
// mode, where the configuration comes from, --resume (none, auto, a file), --weights or
// --checkpoint, --ema. (Paths may differ between nodes: rank 0 reads the files; the
// configurations' keys are compared later, config_agreement.)
struct CliShape {
  int32_t mode = 0;        // 0 train, 1 --eval, 2 --predict, 3 --help
  int32_t config = 0;      // --config given
  int32_t resume = 0;      // 0 none, 1 auto, 2 a file
  int32_t weights = 0;     // --weights given
  int32_t checkpoint = 0;  // --checkpoint given
  int32_t ema = 0;
};
CliShape cli_shape(const CliOptions& o);
// "" when every rank's shape is rank 0's; else one line naming the first rank that differs, and
// how, e.g. "command line: rank 1 has --resume auto, rank 0 none (...)".
std::string cli_disagreement(const std::vector<CliShape>& all);
const char* cli_usage();

// Runs the program after MPI_Init_thread: loads and prints the configuration, generates the
// quickstart dataset if asked, then trains (optionally resuming) or evaluates. Returns the exit
// status; throws on any error (main aborts every rank with the message).
int cli_main(int argc, const char* const* argv);

}  // namespace rt::trainer
