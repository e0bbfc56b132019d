// Epoch order, per-rank shares and batch ranges (see sharding.h for the rules).
#include "data/sharding.h"

#include <algorithm>
#include <numeric>

#include "data/rng.h"
#include "nn/error.h"

namespace rt::data {

void shard_check(const ShardSpec& spec, int rank) {
  if (spec.world < 1 || rank < 0 || rank >= spec.world)
    throw Error(str_cat("data: rank ", rank, " outside world of ", spec.world));
  if (spec.batch < 1) throw Error(str_cat("data: batch size must be >= 1, got ", spec.batch));
  if (spec.repeats < 1 || (!spec.train && spec.repeats != 1))
    throw Error(str_cat("data: repeated_augment must be >= 1 (1: off) and 1 for evaluation, got ", spec.repeats));
  // Evaluation visits each sample once wherever it is: ranks past the last get none and add
  // nothing to the sums. Training needs a share on every rank.
  if (spec.train ? spec.n < spec.world : spec.n < 1)
    throw Error(spec.train ? str_cat("data: ", spec.n, " samples are fewer than the ", spec.world,
                                     " ranks: some rank would get no data")
                           : std::string("data: no samples to evaluate"));
  // Each epoch draws n / repeats images: fewer than a global batch would train on the same few.
  if (spec.train && spec.repeats > 1 && spec.n / spec.repeats < int64_t{spec.world} * spec.batch)
    throw Error(str_cat("data: repeated_augment ", spec.repeats, " draws ", spec.n / spec.repeats, " of the ", spec.n,
                        " training samples an epoch, fewer than one global batch (", spec.world, " ranks x ",
                        spec.batch, "): lower it"));
}

std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch, int64_t n, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  Rng rng(seed, epoch, 0, Stream::permutation);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

int64_t share_size(const ShardSpec& spec, int rank) {
  if (spec.train) return spec.n / spec.world;
  // Positions rank, rank + world, ... below n.
  return spec.n > rank ? (spec.n - rank + spec.world - 1) / spec.world : 0;
}

int64_t steps_per_epoch(const ShardSpec& spec, int rank) {
  const int64_t share = share_size(spec, rank);
  return spec.train ? share / spec.batch : (share + spec.batch - 1) / spec.batch;
}

int64_t share_used(const ShardSpec& spec, int rank) {
  return spec.train ? steps_per_epoch(spec, rank) * spec.batch : share_size(spec, rank);
}

void batch_range(const ShardSpec& spec, int rank, int64_t step, int64_t* first, int64_t* last) {
  const int64_t used = share_used(spec, rank);
  *first = std::min(step * spec.batch, used);
  *last = std::min(*first + spec.batch, used);
}

std::vector<int64_t> batch_indices(const ShardSpec& spec, int rank, int64_t epoch, int64_t step,
                                   std::vector<int>* copies) {
  const std::vector<int64_t> order = epoch_order(spec.seed, epoch, spec.n, spec.train);
  int64_t first = 0, last = 0;
  batch_range(spec, rank, step, &first, &last);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(last - first));
  if (copies) copies->clear();
  for (int64_t k = first; k < last; ++k) {
    const int64_t p = share_position(k, spec.world, rank);
    out.push_back(order[p / spec.repeats]);
    if (copies) copies->push_back(int(p % spec.repeats));
  }
  return out;
}

EpochShare::EpochShare(const ShardSpec& spec, int rank, int64_t epoch)
    : spec_(spec), rank_(rank), steps_(steps_per_epoch(spec, rank)),
      size_(share_size(spec, rank)), order_(epoch_order(spec.seed, epoch, spec.n, spec.train)) {}

}  // namespace rt::data
