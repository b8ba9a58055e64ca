// What the DataLoader loads from: an Example (one sample's tensors), the random-access Dataset, the streaming
// IterableDataset read in shards, and TransformDataset (a dataset with per-sample transforms applied).
// Invariant: Dataset::get and IterableDataset::open are const and safe to call from several threads at once; one
// ExampleStream is used by one thread at a time; every example of an IterableDataset lies in exactly one shard.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "ember/core/generator.h"
#include "ember/core/tensor.h"

namespace ember::data {

// One sample. Both tensors are on the CPU; the DataLoader stacks them along a new first dimension.
struct Example {
  Tensor data;    // the input, e.g. u8 [1, 28, 28] (an image, channels first) or i64 [T] (token ids)
  Tensor target;  // the label or target, e.g. i64 0-d (a class) or i64 [T] (the next tokens)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Sample `index` (IndexError outside [0, size())). `rng` belongs to this sample alone: the DataLoader seeds it
  // from (loader seed, epoch, index) (random.h sample_seed), so random transforms give the same sample whatever
  // worker loads it and however many workers there are. Datasets without randomness ignore it.
  virtual Example get(int64_t index, Generator& rng) const = 0;
  // get() with the generator of sample_seed(0, 0, index).
  Example get(int64_t index) const;
};

// The examples of one shard of a streaming dataset, in order; next() returns nullopt once the shard is exhausted.
class ExampleStream {
 public:
  virtual ~ExampleStream() = default;
  virtual std::optional<Example> next() = 0;
};

class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  // A stream over shard `shard` of `num_shards` (DataLoader worker w of N reads shard w; without workers, shard 0 of
  // 1). The shards partition the dataset. `seed` and `epoch` key any shuffling the dataset does. ValueError for a
  // shard outside [0, num_shards).
  virtual std::unique_ptr<ExampleStream> open(int64_t shard, int64_t num_shards, uint64_t seed,
                                              int64_t epoch) const = 0;
};

// A per-sample transform: takes a CPU tensor and the sample's generator, returns the transformed tensor
// (transforms.h has ToTensor, Normalize, the random crops and flips, and Compose).
using Transform = std::function<Tensor(const Tensor&, Generator&)>;

// `base` with `data_transform` applied to each sample's data and `target_transform` to its target (either may be
// empty: identity). The transforms draw from the sample's generator, data first.
class TransformDataset final : public Dataset {
 public:
  TransformDataset(std::shared_ptr<const Dataset> base, Transform data_transform, Transform target_transform = {});
  int64_t size() const override { return base_->size(); }
  Example get(int64_t index, Generator& rng) const override;
  using Dataset::get;

 private:
  std::shared_ptr<const Dataset> base_;
  Transform data_transform_, target_transform_;
};

}  // namespace ember::data
