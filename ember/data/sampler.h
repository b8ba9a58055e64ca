// Samplers: the order in which a DataLoader visits a Dataset's indices in one epoch — in order, a seeded shuffle, or
// one replica's share for data-parallel training (PyTorch's DistributedSampler). Invariant: indices() depends only
// on (sampler settings, dataset size, epoch), so every rank and every run sees the same order for a seed.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices of one epoch of a dataset of `size` samples (each in [0, size)).
  virtual std::vector<int64_t> indices(int64_t size, int64_t epoch) const = 0;
};

// 0, 1, ..., size - 1.
class SequentialSampler final : public Sampler {
 public:
  std::vector<int64_t> indices(int64_t size, int64_t epoch) const override;
};

// A permutation of 0..size-1 drawn from Generator(sample_seed(seed, epoch, -1)): reproducible for a seed, different
// in each epoch.
class RandomSampler final : public Sampler {
 public:
  explicit RandomSampler(uint64_t seed = 0) : seed_(seed) {}
  std::vector<int64_t> indices(int64_t size, int64_t epoch) const override;

 private:
  uint64_t seed_;
};

// Replica `rank` of `num_replicas` (PyTorch's DistributedSampler): the epoch's order (a RandomSampler permutation when
// shuffle, else 0..size-1) is padded by repeating its head up to a multiple of num_replicas (or, with drop_last,
// cut down to one), and the replica takes every num_replicas-th index starting at `rank`. All replicas get the same
// count, together they cover every sample (padding repeats a few), and they agree on the order when they share
// seed and epoch. ValueError for num_replicas < 1 or rank outside [0, num_replicas).
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(int64_t num_replicas, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices(int64_t size, int64_t epoch) const override;
  // Samples per replica for a dataset of `size`.
  int64_t num_samples(int64_t size) const;

 private:
  int64_t num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
};

}  // namespace ember::data
