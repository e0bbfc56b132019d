// The trainer program: command-line parsing and the sequence config -> data -> Trainer.
#include "trainer/cli.h"

#include <mpi.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "comm/mpi_check.h"
#include "nn/console.h"
#include "trainer/config.h"
#include "trainer/predict.h"
#include "trainer/stop_signal.h"
#include "trainer/trainer.h"

extern char** environ;

namespace rt::trainer {
namespace {

// What --eval and --predict take from a checkpoint before the job is built: the configuration
// it keeps and its class names (none in older files and PyTorch imports).
struct SavedRun {
  bool read = false;
  std::string config_yaml;
  std::vector<std::string> classes;
};

// Rank 0 reads the checkpoint (once: the caller keeps it) and every rank receives it. Collective.
SavedRun read_saved_run(const std::string& path, int rank) {
  SavedRun s;
  std::string names;
  if (rank == 0) {
    Checkpoint ck = checkpoint_read(path, CheckpointParts::none());
    s.config_yaml = std::move(ck.config_yaml);
    for (const std::string& c : ck.classes) names += c + '\0';
  }
  s.config_yaml = comm::broadcast_string(std::move(s.config_yaml), 0, MPI_COMM_WORLD);
  names = comm::broadcast_string(std::move(names), 0, MPI_COMM_WORLD);
  for (size_t at = 0; at < names.size();) {
    const size_t end = names.find('\0', at);
    s.classes.push_back(names.substr(at, end - at));
    at = end + 1;
  }
  s.read = true;
  return s;
}

// The dataset tool built beside this program (build/bin/make_imagenet_like).
std::string generator_path() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (ec ? std::filesystem::path(".") : self.parent_path()).string() + "/make_imagenet_like";
}

// Makes the folder dataset of data.generate at data.root when the root does not exist yet: rank 0
// runs make_imagenet_like (which writes to a temporary folder and renames it, so an interrupted
// run never leaves a root that looks complete); the other ranks wait without spinning. Called on
// every rank (collective): rank 0's data.generate decides, as data.generate.* may differ per rank.
// A stop signal meanwhile (stop_signal.h) ends the generator early: returns that signal on every
// rank then, else 0.
int generate_dataset_if_missing(const Config& cfg, int rank, bool wanted) {
  int missing = rank == 0 && wanted && cfg.generate.classes > 0 && !std::filesystem::exists(cfg.data.root);
  MPI_CHECK(MPI_Bcast(&missing, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (!missing) return 0;
  int stopped = 0;
  if (rank == 0) {
    const auto& g = cfg.generate;
    const std::string tool = generator_path();
    if (!std::filesystem::exists(tool))
      throw ConfigError(str_cat(cfg.data.root, ": data.root does not exist and data.generate needs ", tool,
                                ", which is missing (build it: cmake --build build --target make_imagenet_like)"));
    std::vector<std::string> args = {tool,
                                     "--out", cfg.data.root,
                                     "--classes", std::to_string(g.classes),
                                     "--train-per-class", std::to_string(g.train_per_class),
                                     "--val-per-class", std::to_string(g.val_per_class),
                                     "--width", std::to_string(g.size),
                                     "--height", std::to_string(g.size),
                                     "--seed", std::to_string(g.seed)};
    std::printf("generating %s: %d classes x (%d train + %d val) images of %dx%d\n", cfg.data.root.c_str(),
                g.classes, g.train_per_class, g.val_per_class, g.size, g.size);
    std::fflush(stdout);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    // posix_spawn (vfork-like) rather than fork: safe in a process that holds MPI state.
    if (int rc = posix_spawn(&pid, tool.c_str(), nullptr, nullptr, argv.data(), environ); rc != 0)
      throw ConfigError(str_cat(tool, ": cannot start the dataset generator (", std::strerror(rc), ")"));
    // Polled, so that a stop signal (which reaches the ranks, not the generator) ends it too: a
    // large dataset takes minutes, and the generator removes its half-made folder when asked.
    int status = 0;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid || (w < 0 && errno != EINTR)) break;
      if (!stopped && stop_handlers_installed() && (stopped = stop_signal()) != 0) ::kill(pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!stopped && (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !std::filesystem::exists(cfg.data.root)))
      throw ConfigError(str_cat(cfg.data.root, ": generating the dataset with ", tool, " failed (status ",
                                WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")"));
  }
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(&stopped, 1, MPI_INT, 0, MPI_COMM_WORLD, &req));
  for (int done = 0; !done;) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return stopped;
}

// --topk's value: a whole number of classes, 1 or more.
int parse_top_k(const std::string& v) {
  size_t used = 0;
  long k = 0;
  try {
    k = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || k < 1 || k > 1000000)
    throw ConfigError(str_cat("command line: --topk takes a whole number of classes, 1 or more, not '", v, "'"));
  return int(k);
}

}  // namespace

const char* cli_usage() {
  return "usage: trainer --config FILE [--set key=value ...] [--resume PATH|auto] [--weights PATH]\n"
         "       trainer --eval --checkpoint PATH|--weights PATH [--config FILE] [--set key=value ...]\n"
         "       trainer --predict --checkpoint PATH|--weights PATH [--ema] [--topk N] [--output FILE]\n"
         "               [--config FILE] [--set ...] IMAGE|FOLDER...\n"
         "Run under MPI for several ranks: mpirun -np N trainer --config FILE ...\n"
         "\n"
         "  --config FILE        YAML configuration (see configs/*.yaml and docs/trainer.md)\n"
         "  --set key=value      override one key, e.g. --set train.batch=64 --set optimizer.lr=0.2;\n"
         "                       the value is YAML (numbers, true/false, [30, 60], text)\n"
         "  --resume PATH|auto   continue a run from a checkpoint; auto = the newest valid one in\n"
         "                       the run's checkpoint folder (none: start fresh)\n"
         "  --weights PATH       start from a checkpoint's weights (fine-tuning, a new schedule):\n"
         "                       parameters and BN statistics of the same name and shape, the rest\n"
         "                       (e.g. another model.classes' fc) as initialised; with --resume auto,\n"
         "                       only while the run has no checkpoint of its own; a PyTorch state\n"
         "                       dict converted by tools/torch_weights.py import serves too\n"
         "  --eval               evaluate only: top-1/top-5 of --checkpoint (or of --weights, which\n"
         "                       must hold every tensor) over the validation split (without --config,\n"
         "                       the configuration saved in the file)\n"
         "  --predict IMAGE...   the 5 best classes of each image file by --checkpoint's model (or\n"
         "                       --weights', which must hold every tensor), the image prepared as the\n"
         "                       validation split's; class names as the checkpoint's training data\n"
         "                       named them; a folder: its .jpg/.jpeg/.png files, recursively; one\n"
         "                       process classifies them all\n"
         "  --topk N             --predict's classes per image (default 5)\n"
         "  --output FILE        --predict's answers also as FILE.csv or FILE.jsonl\n"
         "  --ema                --predict with the checkpoint's moving average of the weights\n"
         "                       (a run with train.ema)\n"
         "  --checkpoint PATH    the checkpoint --eval evaluates or --predict classifies with\n"
         "  --help, -h           this text\n"
         "\n"
         "Rank 0 prints the resolved configuration, progress, epoch summaries; metrics go to\n"
         "<run_dir>/metrics.jsonl (log.jsonl), checkpoints to <run_dir>/checkpoints.\n"
         "SIGUSR1 or SIGUSR2 to mpirun (or SIGTERM, SIGINT to the ranks) stops training after the\n"
         "current step or evaluation with a checkpoint; --resume auto continues from it.\n";
}

CliOptions cli_parse(int argc, const char* const* argv) {
  CliOptions o;
  std::set<std::string> given;  // the options given once
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // --option=value, as GNU tools take it, for every option with a value.
    std::optional<std::string> inline_value;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = a.substr(eq + 1);
      a.resize(eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw ConfigError(str_cat("command line: ", a, " needs a value (see --help)"));
      // Its value forgotten, an option would take the next option for it.
      if (std::string(argv[i + 1]).rfind("--", 0) == 0)
        throw ConfigError(str_cat("command line: ", a, " needs a value, not the option '", argv[i + 1],
                                  "' (see --help)"));
      return argv[++i];
    };
    // A second value would silently replace the first; an empty one (--resume=$CKPT with CKPT
    // unset) would mean "none": a fresh run, the last one's checkpoints set aside.
    auto once = [&](std::string& field) {
      std::string v = value();
      if (v.empty())
        throw ConfigError(str_cat("command line: ", a, " has an empty value (an unset variable?); see --help"));
      if (!given.insert(a).second)
        throw ConfigError(str_cat("command line: ", a, " given twice ('", field, "' and '", v, "')",
                                  a == "--config" ? ": files do not merge (--set adds keys)" : ""));
      field = std::move(v);
    };
    const bool flag = a == "--eval" || a == "--predict" || a == "--ema" || a == "--help" || a == "-h";
    if (flag && inline_value) throw ConfigError(str_cat("command line: ", a, " takes no value (see --help)"));
    if (a == "--config") once(o.config);
    else if (a == "--set") o.sets.push_back(value());
    else if (a == "--resume") once(o.resume);
    else if (a == "--weights") once(o.weights);
    else if (a == "--checkpoint") once(o.checkpoint);
    else if (a == "--eval") o.eval = true;
    else if (a == "--predict") o.predict = true;
    else if (a == "--ema") o.ema = true;
    else if (a == "--topk") {
      std::string top;
      once(top);
      o.top_k = parse_top_k(top);
    }
    else if (a == "--output") once(o.output);
    else if (a == "--help" || a == "-h") o.help = true;
    else if (a.rfind("-", 0) != 0) o.files.push_back(a);
    else throw ConfigError(str_cat("command line: unknown argument '", argv[i], "' (see --help)"));
  }
  if (o.help) return o;
  if (o.eval && o.predict) throw ConfigError("command line: --eval and --predict exclude each other");
  if (!o.predict && !o.files.empty())
    throw ConfigError(str_cat("command line: unknown argument '", o.files.front(),
                              "' (image files go with --predict; see --help)"));
  if (o.predict && o.files.empty()) throw ConfigError("command line: --predict needs image files to classify");
  if ((given.count("--topk") || given.count("--output")) && !o.predict)
    throw ConfigError(str_cat("command line: ", given.count("--topk") ? "--topk" : "--output", " goes with --predict"));
  if (!o.output.empty()) predict_output_check(o.output);
  if (o.ema && !o.predict)
    throw ConfigError("command line: --ema goes with --predict (--eval reports the moving average by itself)");
  const char* mode = o.eval ? "--eval" : "--predict";
  if (o.uses_model_file() && o.checkpoint.empty() == o.weights.empty())
    throw ConfigError(str_cat("command line: ", mode, " needs --checkpoint PATH or --weights PATH (one of them)"));
  if (!o.uses_model_file() && !o.checkpoint.empty())
    throw ConfigError(
        "command line: --checkpoint goes with --eval or --predict (to continue training use --resume PATH)");
  if (o.uses_model_file() && !o.resume.empty())
    throw ConfigError(str_cat("command line: ", mode, " and --resume exclude each other"));
  if (!o.weights.empty() && !o.resume.empty() && o.resume != "auto")
    throw ConfigError("command line: --weights goes with --resume auto only (which continues the run if it has "
                      "checkpoints), not with --resume PATH");
  if (!o.uses_model_file() && o.config.empty())
    throw ConfigError("command line: --config FILE is required (see --help)");
  return o;
}

CliShape cli_shape(const CliOptions& o) {
  CliShape s;
  s.mode = o.help ? 3 : o.predict ? 2 : o.eval ? 1 : 0;
  s.config = !o.config.empty();
  s.resume = o.resume.empty() ? 0 : o.resume == "auto" ? 1 : 2;
  s.weights = !o.weights.empty();
  s.checkpoint = !o.checkpoint.empty();
  s.ema = o.ema;
  return s;
}

std::string cli_disagreement(const std::vector<CliShape>& all) {
  static const char* const modes[] = {"training", "--eval", "--predict", "--help"};
  static const char* const resumes[] = {"no --resume", "--resume auto", "--resume FILE"};
  const auto given = [](const char* option, int32_t v) { return str_cat(v ? "" : "no ", option); };
  for (size_t r = 1; r < all.size(); ++r) {
    const CliShape &a = all[r], &z = all[0];
    std::string mine, root;
    if (a.mode != z.mode) mine = modes[a.mode & 3], root = modes[z.mode & 3];
    else if (a.config != z.config) mine = given("--config", a.config), root = given("--config", z.config);
    else if (a.resume != z.resume) mine = resumes[a.resume % 3], root = resumes[z.resume % 3];
    else if (a.weights != z.weights) mine = given("--weights", a.weights), root = given("--weights", z.weights);
    else if (a.checkpoint != z.checkpoint)
      mine = given("--checkpoint", a.checkpoint), root = given("--checkpoint", z.checkpoint);
    else if (a.ema != z.ema) mine = given("--ema", a.ema), root = given("--ema", z.ema);
    else continue;
    return str_cat("command line: rank ", r, " has ", mine, ", rank 0 ", root,
                   " (every rank must be given the same mode, --config, --resume, --weights, --checkpoint and "
                   "--ema; --set may differ where config keys may)");
  }
  return "";
}

namespace {
// The job itself, once the configuration is known: evaluation of a checkpoint, or training.
int run_job(const Config& cfg, const CliOptions& o, int rank) {
  if (o.predict) {
    if (rank != 0) return 0;  // one process classifies them all
    std::vector<std::string> saved;
    const std::vector<Prediction> ps = predict_files(cfg, o.eval_file(), predict_inputs(o.files), o.top_k, o.ema, &saved);
    const std::vector<std::string> names = predict_class_names(cfg, saved, o.eval_file());
    size_t failed = 0;
    for (const Prediction& p : ps) {
      std::printf("%s\n", prediction_line(p, names).c_str());
      failed += !p.error.empty();
    }
    std::fflush(stdout);
    if (!o.output.empty()) write_predictions(o.output, ps, names, int(std::min<int64_t>(o.top_k, cfg.model.classes)));
    if (failed) std::fprintf(stderr, "ringtrain: --predict: %zu of %zu files not classified\n", failed, ps.size());
    return failed ? 1 : 0;
  }
  // The new run's --resume auto would take up the source run's checkpoints as its own.
  if (!o.weights.empty() && !o.eval) {
    std::error_code ec;
    const auto here = std::filesystem::weakly_canonical(config_checkpoint_dir(cfg), ec);
    if (!ec && std::filesystem::weakly_canonical(o.weights, ec).parent_path() == here && !ec)
      throw ConfigError(str_cat("--weights ", o.weights, " lies in this run's own checkpoint folder (", here.string(),
                                "): give the new run another run_dir (--set run_dir=...)"));
  }
  Trainer t(cfg, MPI_COMM_WORLD, {}, o.eval ? Trainer::Use::evaluate : Trainer::Use::train);
  if (o.eval) {
    const std::string& path = o.eval_file();
    if (o.weights.empty()) t.load_checkpoint(path, /*for_training=*/false);
    else t.load_weights(path, /*for_eval=*/true);
    EvalResult r = t.evaluate();
    std::string figures =
        str_cat("eval ", path, ": top1 ", fixed(r.top1_pct(), 2), "% top5 ", fixed(r.top5_pct(), 2),
                "% loss ", fixed(r.loss, 4), " over ", r.samples, " images", skipped_note(r), " (",
                fixed(r.seconds, 1), " s)");
    JsonLine line("eval");
    line.add("checkpoint", path)
        .add("step", t.step())
        .add("val_loss", r.loss)
        .add("val_top1", r.top1_pct())
        .add("val_top5", r.top5_pct())
        .add("val_samples", r.samples)
        .add("val_skipped", r.skipped)
        .add("val_s", r.seconds);
    if (t.has_ema()) {  // the checkpoint keeps a moving average of the weights (train.ema): it too
      const EvalResult e = t.evaluate_ema();
      line.add("ema_val_loss", e.loss).add("ema_val_top1", e.top1_pct()).add("ema_val_top5", e.top5_pct());
      figures += str_cat("; its moving average of the weights: top1 ", fixed(e.top1_pct(), 2), "% top5 ",
                         fixed(e.top5_pct(), 2), "% loss ", fixed(e.loss, 4));
    }
    t.report(line, figures);
    // The figures are what --eval is for: printed even where log.progress is off.
    if (rank == 0 && !cfg.log.progress) std::printf("%s\n", figures.c_str());
    return 0;
  }
  // --weights starts a run; once it has checkpoints, --resume auto continues it instead.
  const std::string resumed = o.resume.empty() ? "" : t.resume(o.resume);
  if (!o.weights.empty() && resumed.empty()) t.load_weights(o.weights);
  t.train();
  // Stopped early: not a success, as for a process the signal would have ended.
  return t.stopped_by() ? 128 + t.stopped_by() : 0;
}
}  // namespace

int cli_main(int argc, const char* const* argv) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const CliOptions o = cli_parse(argc, argv);
  // Before anything collective, or any file moved: ranks launched with other options (an MPMD
  // line, a wrapper script per node) would wait in different collectives until the stall
  // check, or for ever.
  std::vector<CliShape> shapes(static_cast<size_t>(world));
  const CliShape mine = cli_shape(o);
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, shapes.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD));
  if (const std::string why = cli_disagreement(shapes); !why.empty()) throw ConfigError(why);
  if (o.help) {
    if (rank == 0) std::fputs(cli_usage(), stdout);
    return 0;
  }
  SavedRun saved;  // read where the job needs it, at most once
  const auto saved_run = [&]() -> const SavedRun& {
    if (!saved.read) saved = read_saved_run(o.eval_file(), rank);
    return saved;
  };
  Config cfg = o.config.empty() && o.uses_model_file()
                   ? config_parse(saved_run().config_yaml, o.eval_file() + " (saved configuration)", o.sets)
                   : config_load(o.config, o.sets);
  if (config_data_sources(cfg.data) == 0) {
    // A weights file imported from PyTorch names no dataset. --predict needs none (the images are
    // on its command line); --eval does, and the fix is the user's to give.
    if (o.predict) cfg.data.synthetic = true;
    else if (o.eval)
      throw ConfigError(str_cat(cfg.source, ": names no dataset to evaluate on: give --config FILE or --set "
                                "data.root=PATH"));
  }
  // Evaluation and prediction exchange no gradients: the saved run's algorithm, node size,
  // compression and BN groups were set for its rank count and backend (a node size or group that
  // need not divide this job's ranks, nccl on a GPU), none of which changes a figure here.
  if (o.uses_model_file()) {
    const comm::CommConfig defaults;
    cfg.comm.algorithm = defaults.algorithm;
    cfg.comm.ranks_per_node = defaults.ranks_per_node;
    cfg.comm.compression = defaults.compression;
    cfg.model.bn_group = 1;
    // A GPU run's file in the CPU program: the way out is one --set away.
    if (cfg.backend.rfind("cuda", 0) == 0 && !backend_registered(cfg.backend) &&
        config_origin(cfg, "backend").find("(saved configuration)") != std::string::npos)
      throw ConfigError(str_cat(config_origin(cfg, "backend"), ": backend ", cfg.backend,
                                ", the training run's, is not in this program: --set backend=onednn evaluates the "
                                "checkpoint on the CPU (or run build/bin/trainer_cuda on a GPU)"));
    // The training machine's algorithm cache is that machine's path: used only where given here.
    if (config_origin(cfg, "cuda.algo_cache").find("(saved configuration)") != std::string::npos)
      cfg.cuda.algo_cache.clear();
    // A fault drill's run is evaluated, not drilled again (its stall would hang --eval).
    if (config_origin(cfg, "debug.fault").find("(saved configuration)") != std::string::npos) cfg.debug = {};
  }
  config_validate(cfg);
  // An evaluation on a validation folder alone: the model's own class list labels it. Each rank
  // looks at its own file system (data.root may differ between nodes); rank 0 reads the list
  // where any rank needs it.
  if (o.eval) {
    int need = !cfg.data.root.empty() && std::filesystem::is_directory(cfg.data.root) &&
               !std::filesystem::exists(std::filesystem::path(cfg.data.root) / "train");
    int any = need;
    MPI_CHECK(MPI_Allreduce(&need, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any) {  // collective: rank 0 reads where any rank needs it
      const SavedRun& s = saved_run();
      if (need) cfg.data.known_classes = s.classes;
    }
  }
  cfg.run_dir = config_run_dir(cfg);  // printed resolved, as the checkpoints will hold it
  if (rank == 0 && cfg.log.print_config && !o.predict) {  // --predict prints its answers alone
    std::printf("# ringtrain: resolved configuration (%d rank(s))\n%s", world, config_to_yaml(cfg).c_str());
    std::fflush(stdout);
  }
  // From here on a training job stops cleanly on a stop signal (stop_signal.h): a batch system may
  // send one during a long set-up (a dataset generated, a checkpoint loaded).
  if (!o.uses_model_file()) install_stop_handlers(rank == 0);
  if (const int stop = generate_dataset_if_missing(cfg, rank, !o.predict)) {
    if (rank == 0)
      stderr_line(str_cat("ringtrain: stopped by ", stop_signal_name(stop), " while generating ", cfg.data.root,
                          ": nothing trained",
                          std::filesystem::exists(cfg.data.root) ? " (the dataset was finished first)"
                                                                 : "; the next run generates the dataset anew"));
    return 128 + stop;
  }

  // Memory is what a job most often runs out of: say which key to lower.
  auto hint = [&](const char* what) {
    const int64_t side = data::eval_image_size(cfg.data);
    const std::string sides = side == cfg.data.image_size
                                  ? str_cat(cfg.data.image_size, " px")
                                  : str_cat(cfg.data.image_size, " px (evaluation: ", side, " px)");
    return OutOfMemory(str_cat(what, "; ", cfg.model.name, " (model.width ", cfg.model.width, ") with train.batch ",
                               cfg.train.batch, " per rank (", config_origin(cfg, "train.batch"),
                               "; also the evaluation batch) at ", sides, " on backend ", cfg.backend,
                               " does not fit in memory: lower ",
                               cfg.train.batch > 1 ? "train.batch (train.accumulate keeps the global batch)"
                                                   : "data.image_size, data.eval_image_size or model.width"));
  };
  try {
    return run_job(cfg, o, rank);
  } catch (const OutOfMemory& e) {
    throw hint(e.what());
  } catch (const std::bad_alloc&) {
    throw hint("host memory exhausted (std::bad_alloc)");
  }
}

}  // namespace rt::trainer
