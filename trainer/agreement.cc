// The trainer's agreement between ranks: the stall check of its own collectives, and at start-up,
// beyond the model and comm settings that the
// reducer's check compares (comm/agreement.h): the same configuration and the same data. Ranks
// launched with different settings (an --set on one of them, a config file that differs between
// nodes) or different copies of the dataset would otherwise run different numbers of steps per
// epoch, evaluations or checkpoints and end up waiting in different collectives, or train on
// overlapping shares without a word.
#include <algorithm>
#include <array>

#include "comm/agreement.h"
#include "comm/mpi_check.h"
#include "comm/stall.h"
#include "data/dataset.h"
#include "trainer/trainer.h"

namespace rt::trainer {
namespace {

// The lowest rank for which `differs` holds anywhere, and how many ranks it holds for; -1 if none.
std::pair<int, int> first_differing(bool differs, int world, MPI_Comm comm) {
  std::vector<int> all(size_t(world), 0);
  const int mine = differs;
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm));
  int first = -1, count = 0;
  for (int r = 0; r < world; ++r)
    if (all[size_t(r)]) {
      if (first < 0) first = r;
      ++count;
    }
  return {first, count};
}

}  // namespace

Trainer::CtlWatch Trainer::watch_ctl(const comm::StallLabel& what) {
  if (!ctl_stall_) return CtlWatch{nullptr};
  ctl_stall_->arrive(++ctl_calls_, what);
  ctl_stall_->begin_blocking();  // for the MPI collectives; the ring's waits poll it themselves
  return CtlWatch{ctl_stall_.get()};
}

Trainer::CtlWatch::~CtlWatch() {
  if (!w) return;
  w->end_blocking();
  w->leave();
}

void Trainer::check_config_agreement() {
  if (world_ == 1) return;
  const MPI_Comm comm = ctl_comm_->mpi();
  const std::string first = comm::broadcast_string(config_yaml_, 0, comm);
  const std::string diff =
      rank_ == 0 ? "" : config_changes(first, cfg_, [](const std::string& k) { return !config_key_per_rank(k); },
                                       "on rank 0", str_cat("on rank ", rank_));
  const auto [bad, count] = first_differing(!diff.empty(), world_, comm);
  if (bad < 0) return;
  throw ConfigError(str_cat("ranks disagree at start-up (", world_, " ranks): rank ", bad,
                            "'s configuration differs from rank 0's: ", comm::broadcast_string(diff, bad, comm),
                            count > 1 ? str_cat(" (and ", count - 1, " more rank(s) differ)") : "",
                            "; every rank must run the same configuration (the same file and --set options)"));
}

void Trainer::check_data_agreement() {
  if (world_ == 1) return;
  const MPI_Comm comm = ctl_comm_->mpi();
  // What the ranks saw: training samples and classes, validation samples (-1: not opened), and
  // the classes' names (hashed: folders of another dataset with as many images).
  // (An evaluation opens no training data: the validation data's classes then.)
  const data::Loader& classes = train_loader_ ? *train_loader_ : *val_loader_;
  comm::Fnv names;
  for (const std::string& c : classes.class_names()) names.add_str(c);
  // And the labels in sample order: each rank's list built apart (by `find`, say) may hold the
  // same files in another order, where sample i is another image on each rank.
  std::array<int64_t, 6> mine = {train_loader_ ? int64_t(train_loader_->size()) : -1, int64_t(classes.num_classes()),
                                 val_loader_ ? int64_t(val_loader_->size()) : -1, int64_t(names.value()),
                                 train_loader_ ? int64_t(train_loader_->order_hash()) : 0,
                                 val_loader_ ? int64_t(val_loader_->order_hash()) : 0};
  std::array<int64_t, 6> first = mine;
  MPI_CHECK(MPI_Bcast(first.data(), 6, MPI_INT64_T, 0, comm));
  const auto [bad, count] = first_differing(mine != first, world_, comm);
  if (bad < 0) return;
  const auto describe = [&](const std::array<int64_t, 6>& d) {
    const std::vector<std::string>& c = classes.class_names();
    const std::string names = c.empty() ? "" : str_cat(c.front(), c.size() > 1 ? str_cat(" … ", c.back()) : "", "; ");
    if (d[0] < 0)
      return str_cat(d[2], " validation samples of ", d[1], " classes (", names,
                     data::split_source(cfg_.data, data::Split::val), ")");
    return str_cat(d[0], " training samples of ", d[1], " classes (", names,
                   data::split_source(cfg_.data, data::Split::train), ")",
                   d[2] >= 0 ? str_cat(", ", d[2], " validation samples (",
                                       data::split_source(cfg_.data, data::Split::val), ")")
                             : std::string());
  };
  const std::string theirs = comm::broadcast_string(describe(mine), bad, comm);
  // Counts and names the same, labels not: said apart, as the two descriptions would read alike.
  std::array<int64_t, 3> why = {std::equal(mine.begin(), mine.begin() + 4, first.begin()), mine[4] != first[4],
                                mine[5] != first[5]};
  MPI_CHECK(MPI_Bcast(why.data(), 3, MPI_INT64_T, bad, comm));
  const std::string order =
      why[0] ? str_cat(", with other labels or file names in sample order in its ",
                       why[1] ? (why[2] ? "training and validation" : "training") : "validation",
                       " data (another copy, or the same files listed in another order)")
             : "";
  throw ConfigError(str_cat("ranks disagree at start-up (", world_, " ranks): rank ", bad, " sees ", theirs, order,
                            ", rank 0 ", comm::broadcast_string(describe(first), 0, comm),
                            count > 1 ? str_cat(" (and ", count - 1, " more rank(s) differ)") : "",
                            "; every rank must read the same dataset"));
}

}  // namespace rt::trainer
