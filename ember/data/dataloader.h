// DataLoader: batches from a Dataset (through a sampler) or an IterableDataset, loaded by worker threads into a
// bounded prefetch queue, collated into (pinned) host memory and, for a CUDA device, copied ahead on a stream of
// its own. Invariant: delivery order never depends on timing — map-style batches come in the sampler's order
// whatever the number of workers; streams give worker 0's first batch, worker 1's first, ... (an order that depends
// on the worker count, since the shards do); each sample's random transforms depend only on (seed, epoch, index);
// and at most num_workers * prefetch_factor batches wait in host memory.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "ember/core/device.h"
#include "ember/core/tensor.h"
#include "ember/data/dataset.h"
#include "ember/data/sampler.h"

namespace ember::data {

class DeviceCopier;

struct Batch {
  Tensor data;                   // [B, *data shape] on the loader's device
  Tensor target;                 // [B, *target shape] (0-d targets give [B])
  int64_t index = 0;             // position of the batch in its epoch
  std::vector<int64_t> indices;  // the dataset indices of its samples (map-style datasets; empty for streams)
  int64_t size() const { return data.defined() ? data.size(0) : 0; }
};

// Where a loader stands (DataLoader::state): the epoch the next batch comes from, how many batches of it were already
// delivered, and the seed that keys the shuffle and the per-sample transforms. Together with the dataset and the
// options this determines every batch still to come (Note [Loader position]).
struct LoaderState {
  int64_t epoch = 0;
  int64_t batches_consumed = 0;
  uint64_t seed = 0;
  // Streaming datasets only: the shard count (max(1, num_workers)) that produced the order — a stream's batches depend
  // on it, so a state is refused by a loader with another one. 0: map-style (its order does not depend on workers).
  int64_t stream_shards = 0;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;      // a RandomSampler(seed) instead of the SequentialSampler (map-style; not with sampler)
  bool drop_last = false;    // drop an epoch's last, incomplete batch
  uint64_t seed = 0;         // keys the shuffle, the per-sample transform generators and streaming datasets
  std::shared_ptr<const Sampler> sampler;  // the index order (e.g. DistributedSampler); map-style only
  int64_t num_workers = 0;   // loader threads; 0 loads in the calling thread, on demand
  int64_t prefetch_factor = 2;  // batches each worker may hold ready ahead of the consumer (>= 1)
  bool pin_memory = false;   // collate into pinned host memory (always, when `device` is CUDA)
  Device device = Device::cpu();  // where batches are delivered
  // CUDA: batches whose host-to-device copies are queued ahead of the one returned (0: copy on demand; the
  // consumer's next kernels then wait for the whole copy). Ignored on the CPU.
  int64_t device_prefetch = 1;
};

class DataLoader {
 public:
  // ValueError for a null dataset, batch_size < 1, num_workers < 0, prefetch_factor < 1, device_prefetch < 0, both
  // shuffle and a sampler, or a sampler/shuffle with a streaming dataset; DeviceError for an unavailable device.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  DataLoader(std::shared_ptr<const IterableDataset> dataset, DataLoaderOptions options);
  // Stops the epoch in progress: wakes and joins the workers (a worker inside Dataset::get finishes that sample and
  // loads no other).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const DataLoaderOptions& options() const { return options_; }
  // Batches per epoch (map-style); -1 for a streaming dataset, whose length is known only by reading it.
  int64_t num_batches() const;
  // Samples per epoch (map-style; -1 for streams).
  int64_t num_samples() const;
  // Note [Batches held ahead]
  // While the consumer works on one batch, a loader holds others on the memory of its delivery device: a CUDA loader
  // the device_prefetch batches copied ahead (its host batches live in pinned memory, not on the device); a CPU loader
  // with workers, per worker, up to prefetch_factor collated batches waiting in its queue plus the one it is loading
  // (its samples, then their collated copy) — the samples only, when batches collate into pinned memory; a CPU loader
  // without workers loads inline, between the consumer's steps, and holds none. held_ahead() counts that memory in
  // batches' worth, so a batch-size search can hold as much beside its trial steps (train::TrainRunner does). For the
  // batch being loaded it is an estimate: the samples are separate allocations, each rounded up to 512 bytes, so they
  // can take more than their collated copy (an MNIST sample: 3.5 + 0.5 KiB, against 3.07 KiB of a collated row).
  static int64_t held_ahead(const DataLoaderOptions& options);

  // The epoch the next start_epoch() runs (epochs count up from 0 by themselves; set_epoch overrides, as
  // DistributedSampler.set_epoch does in PyTorch, and cancels a position load_state left pending).
  void set_epoch(int64_t epoch) {
    next_epoch_ = epoch;
    skip_ = 0;
  }
  int64_t epoch() const { return current_epoch_; }

  // Note [Loader position]
  // A map-style epoch's batches are fixed by (sampler, dataset size, epoch) and each sample's transforms by
  // (seed, epoch, index), so (epoch, batches consumed, seed) pins down every batch still to come, whatever the worker
  // count and however far the workers had prefetched. state() is that position: during an epoch, its number and the
  // batches next() has returned from it (an epoch that ran out reports all of them); between epochs, the epoch the
  // next start_epoch() runs and 0. load_state() ends the epoch in progress, adopts the seed (the shuffle's too, unless
  // the options gave a sampler, which keys its own order) and makes the next start_epoch() — or next(), which starts
  // one — resume there: map-style loaders drop the consumed batches from the epoch's plan without loading a sample;
  // streaming loaders have no random access, so they read the consumed batches again and discard them (the same
  // batches, since a stream's order depends only on (seed, epoch, worker count)). ValueError for a negative epoch or
  // count, or more consumed batches than a map-style epoch has.
  LoaderState state() const;
  void load_state(const LoaderState& state);

  // Starts an epoch (ending one in progress) and its workers.
  void start_epoch();
  // The epoch's next batch; nullopt when it is over (then call start_epoch() again). Starts an epoch if none runs.
  // A worker's exception is rethrown here, with its type and message prefixed by the worker and batch, and ends
  // the epoch.
  std::optional<Batch> next();

  // Range-for over one epoch: `for (Batch& b : loader)` calls start_epoch() at begin().
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    Iterator() = default;
    explicit Iterator(DataLoader* loader);
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return at_end() == other.at_end(); }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    bool at_end() const { return !current_.has_value(); }
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  Iterator begin();
  Iterator end() { return Iterator(); }

  struct Epoch;  // the state of one running epoch (dataloader.cpp)

 private:
  void validate();
  void stop_epoch();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const IterableDataset> stream_;
  DataLoaderOptions options_;
  std::shared_ptr<const Sampler> sampler_;
  std::unique_ptr<DeviceCopier> copier_;  // CUDA: one copy stream for the loader's life (before epoch_: outlives it)
  int64_t next_epoch_ = 0;
  int64_t current_epoch_ = -1;
  int64_t skip_ = 0;  // batches the next start_epoch() skips (load_state)
  std::unique_ptr<Epoch> epoch_;
};

}  // namespace ember::data
