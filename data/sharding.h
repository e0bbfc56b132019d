// Which samples a rank sees: the epoch's order (one permutation seeded by (seed, epoch), shared by
// all ranks; identity for evaluation), each rank's disjoint share of it, and the batches of that
// share. Pure integer math, testable with (rank, world) as plain numbers and no files.
//
// Training: rank r's share is positions r, r + N, r + 2N, ... of the permutation, floor(n / N) of
// them (the same on every rank); it yields floor(share / batch) full batches and the rest of the
// share (the ragged tail, at most N * batch - 1 samples in all) is not used that epoch — a
// different tail every epoch, since the permutation changes.
// Evaluation: the same interleaving over 0..n-1 in order, but every position is used: the shares
// cover each sample exactly once, the last batch of a rank may be short and step counts may
// differ by one between ranks.
// Repeated augmentation (training, repeats = m > 1; Hoffer et al. 2020, as DeiT's and torchvision's
// RASampler): position p of the epoch holds permutation entry p / m, so each of the first n / m
// samples fills m consecutive positions — on m different ranks when m <= N — and is augmented
// differently in each (its copy number p % m keys the augmentation). Shares, steps and batches
// are as without it: an epoch takes as many steps, drawing n / m distinct samples.
#pragma once

#include <cstdint>
#include <vector>

namespace rt::data {

struct ShardSpec {
  int64_t n = 0;      // samples in the split (all ranks)
  int world = 1;      // ranks
  int batch = 1;      // samples per batch per rank
  bool train = true;  // shuffled, tail dropped evenly; false: in order, exactly once
  uint64_t seed = 0;
  int repeats = 1;    // training: each drawn sample used this many times an epoch (see above)
};

// Throws rt::Error when training has n < world (some rank would get nothing; evaluation gives
// ranks past the last sample an empty share), or batch/world/rank are invalid.
void shard_check(const ShardSpec& spec, int rank);

// The permutation of epoch e (Fisher–Yates driven by (seed, e)), or 0..n-1 when !shuffle.
std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch, int64_t n, bool shuffle);

// Samples in rank's share of the epoch order (train: floor(n / world) for every rank).
int64_t share_size(const ShardSpec& spec, int rank);
// Share positions this rank turns into batches (train: steps * batch; eval: the whole share).
int64_t share_used(const ShardSpec& spec, int rank);
// Position in the epoch order of the rank's k-th share sample.
inline int64_t share_position(int64_t k, int world, int rank) { return k * world + rank; }
// Batches the rank yields per epoch.
int64_t steps_per_epoch(const ShardSpec& spec, int rank);
// Share positions [first, last) of batch `step`.
void batch_range(const ShardSpec& spec, int rank, int64_t step, int64_t* first, int64_t* last);

// Global sample indices of batch `step` of epoch `epoch` on `rank` (computes the whole epoch
// order: for tests and tools; the loader keeps an EpochShare instead). copies (optional): each
// one's copy number (0 without repeated augmentation).
std::vector<int64_t> batch_indices(const ShardSpec& spec, int rank, int64_t epoch, int64_t step,
                                   std::vector<int>* copies = nullptr);

// One rank's view of one epoch, with the order computed once.
class EpochShare {
 public:
  EpochShare() = default;
  EpochShare(const ShardSpec& spec, int rank, int64_t epoch);
  int64_t steps() const { return steps_; }
  int64_t size() const { return size_; }  // share size (substitutes are drawn from all of it)
  // Global sample index of the k-th share sample (0 <= k < size()), and which of its copies this
  // is (0 <= copy < spec.repeats).
  int64_t sample(int64_t k) const { return order_[share_position(k, spec_.world, rank_) / spec_.repeats]; }
  int copy(int64_t k) const { return int(share_position(k, spec_.world, rank_) % spec_.repeats); }
  void batch_range(int64_t step, int64_t* first, int64_t* last) const {
    data::batch_range(spec_, rank_, step, first, last);
  }

 private:
  ShardSpec spec_;
  int rank_ = 0;
  int64_t steps_ = 0, size_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace rt::data
