// Sequential, random and distributed samplers. Invariant: the distributed sampler's replicas partition the padded
// (or trimmed) epoch order, so their union is the dataset and they never disagree on the order.
#include "ember/data/sampler.h"

#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/data/random.h"

namespace ember::data {

namespace {
void check_size(int64_t size, const char* who) {
  EMBER_CHECK(size >= 0, ValueError, who, ": negative dataset size ", size);
}
}  // namespace

std::vector<int64_t> SequentialSampler::indices(int64_t size, int64_t) const {
  check_size(size, "SequentialSampler");
  std::vector<int64_t> out(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

std::vector<int64_t> RandomSampler::indices(int64_t size, int64_t epoch) const {
  check_size(size, "RandomSampler");
  Generator gen(sample_seed(seed_, epoch, -1));
  return permutation(size, gen);
}

DistributedSampler::DistributedSampler(int64_t num_replicas, int64_t rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  EMBER_CHECK(num_replicas >= 1, ValueError, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  EMBER_CHECK(rank >= 0 && rank < num_replicas, ValueError, "DistributedSampler: rank ", rank, " outside [0, ",
              num_replicas, ")");
}

int64_t DistributedSampler::num_samples(int64_t size) const {
  check_size(size, "DistributedSampler");
  if (drop_last_) return size / num_replicas_;
  return (size + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t size, int64_t epoch) const {
  std::vector<int64_t> order = shuffle_ ? RandomSampler(seed_).indices(size, epoch) : SequentialSampler().indices(size, 0);
  const int64_t per_replica = num_samples(size);
  const int64_t total = per_replica * num_replicas_;
  if (total > size && size > 0) {  // pad by repeating the head of the order (as often as needed)
    const size_t head = order.size();
    for (int64_t i = size; i < total; ++i) order.push_back(order[static_cast<size_t>(i - size) % head]);
  }
  order.resize(static_cast<size_t>(total));  // drop_last trims the tail
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_replica));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ember::data
