// The DataLoader's epoch: worker threads with bounded per-worker queues, in-order delivery, exception forwarding,
// clean shutdown, and the device stage that queues host-to-device copies ahead of the consumer.
// Invariant: worker w produces, in increasing order, exactly the batches the consumer will take from its queue
// (map-style: k = w, w + N, ...; streams: the batches of shard w), so delivery order never depends on timing.
#include "ember/data/dataloader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "ember/autograd/anomaly.h"
#include "ember/autograd/checkpoint.h"
#include "ember/base/error.h"
#include "ember/data/collate.h"
#include "ember/data/device_copy.h"
#include "ember/data/random.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/tags.h"

namespace ember::data {

namespace {

// Rethrows `error` as the same ember error type with `context` in front of its message. Another std::exception (a
// user's std::runtime_error, std::out_of_range, ...) cannot be rebuilt with a new message, so it becomes an ember
// Error (a std::runtime_error) carrying the context and the original message, as PyTorch re-raises a worker's error
// it cannot rebuild as RuntimeError; anything that is not a std::exception is rethrown unchanged.
template <class E, class... Rest>
[[noreturn]] void rethrow_as(const std::exception_ptr& error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(context + e.what(), e.requested(), e.capacity(), e.allocated(), e.reserved());
  } catch (const E& e) {
    throw E(context + e.what());
  } catch (...) {
    if constexpr (sizeof...(Rest) > 0) {
      rethrow_as<Rest...>(error, context);
    } else {
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        throw Error(context + e.what());
      } catch (const std::exception& e) {
        throw Error(context + e.what());
      }
    }
  }
}

[[noreturn]] void rethrow_with_context(const std::exception_ptr& error, const std::string& context) {
  rethrow_as<ShapeError, DTypeError, DeviceError, FormatError, ConfigError, IndexError, ValueError, BackendError,
             CheckpointError, autograd::AnomalyError>(error, context);
}

// Batches in an epoch of n samples (no overflow for any batch size).
int64_t batch_count(int64_t n, int64_t batch_size, bool drop_last) {
  return n / batch_size + (!drop_last && n % batch_size != 0 ? 1 : 0);
}

struct Slot {
  Batch batch;                // host batch (collated, pinned when the loader pins)
  std::exception_ptr error;   // set instead of the batch when producing it failed
  std::string context;        // "DataLoader worker w, batch k: "
};

struct WorkerQueue {
  std::deque<Slot> ready;
  bool done = false;  // the worker produced everything it will produce
};

struct InFlight {
  Batch batch;
  std::shared_ptr<DeviceCopier::Ticket> ticket;
};

}  // namespace

struct DataLoader::Epoch {
  // Fixed for the epoch.
  const Dataset* dataset = nullptr;
  const IterableDataset* stream = nullptr;
  DataLoaderOptions options;
  int64_t epoch = 0;
  bool pinned = false;
  std::vector<std::vector<int64_t>> plan;  // map-style: the indices of each batch

  // Shared with the workers (guarded by mutex).
  std::mutex mutex;
  std::condition_variable ready_cv;  // a slot was pushed or a worker finished
  std::condition_variable space_cv;  // a slot was taken, or stop
  bool stop = false;
  std::atomic<bool> stopping{false};  // `stop`, readable without the lock between samples
  std::vector<WorkerQueue> queues;
  std::vector<std::thread> threads;

  // The consumer's side.
  int64_t next_batch = 0;                      // map-style: the next batch index to deliver
  int64_t delivered = 0;                       // host batches produced so far (the next Batch::index)
  int64_t handed_out = 0;                      // batches next() returned (behind `delivered` on CUDA)
  int64_t turn = 0;                            // streams with workers: the worker to take from next
  std::vector<bool> exhausted;                 // streams with workers: finished and drained
  std::unique_ptr<ExampleStream> inline_stream;  // streams without workers
  bool host_done = false;                      // no more host batches
  std::exception_ptr pending_error;            // a worker's error, raised once the batches before it are delivered
  std::string pending_context;
  DeviceCopier* copier = nullptr;              // CUDA delivery (the loader's, outlives the epoch)
  std::deque<InFlight> in_flight;

  ~Epoch() { shut_down(); }

  void shut_down() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
      stopping.store(true, std::memory_order_relaxed);
    }
    space_cv.notify_all();
    ready_cv.notify_all();
    for (std::thread& t : threads)
      if (t.joinable()) t.join();
    threads.clear();
  }

  int64_t num_workers() const { return options.num_workers; }

  // --- producing ------------------------------------------------------------------------------------------------

  // Batch k of the plan; nullopt when the epoch is stopping (checked before each sample, so shutdown waits for
  // at most the sample being loaded).
  std::optional<Batch> load_batch(int64_t k) const {
    std::vector<Example> examples;
    examples.reserve(plan[static_cast<size_t>(k)].size());
    for (int64_t index : plan[static_cast<size_t>(k)]) {
      if (stopping.load(std::memory_order_relaxed)) return std::nullopt;
      Generator rng(sample_seed(options.seed, epoch, index));
      try {
        examples.push_back(dataset->get(index, rng));
      } catch (...) {
        rethrow_with_context(std::current_exception(), "dataset index " + std::to_string(index) + ": ");
      }
    }
    Example stacked = collate(examples, pinned, plan[static_cast<size_t>(k)]);
    Batch batch;
    batch.data = std::move(stacked.data);
    batch.target = std::move(stacked.target);
    batch.indices = plan[static_cast<size_t>(k)];
    return batch;
  }

  // The next batch of a stream (nullopt when it has no more, or only a partial batch under drop_last).
  std::optional<Batch> read_batch(ExampleStream& s) const {
    std::vector<Example> examples;
    examples.reserve(static_cast<size_t>(std::min<int64_t>(options.batch_size, 4096)));
    while (static_cast<int64_t>(examples.size()) < options.batch_size) {
      if (stopping.load(std::memory_order_relaxed)) return std::nullopt;
      std::optional<Example> ex = s.next();
      if (!ex) break;
      examples.push_back(std::move(*ex));
    }
    if (examples.empty()) return std::nullopt;
    if (options.drop_last && static_cast<int64_t>(examples.size()) < options.batch_size) return std::nullopt;
    Example stacked = collate(examples, pinned);
    Batch batch;
    batch.data = std::move(stacked.data);
    batch.target = std::move(stacked.target);
    return batch;
  }

  // Waits for room in worker w's queue; false when the epoch is stopping.
  bool wait_for_space(int64_t w) {
    std::unique_lock<std::mutex> lock(mutex);
    space_cv.wait(lock, [&] {
      return stop || static_cast<int64_t>(queues[static_cast<size_t>(w)].ready.size()) < options.prefetch_factor;
    });
    return !stop;
  }

  // Pushes a slot; false when the worker should stop (epoch stopping, or the slot carries an error).
  bool push(int64_t w, Slot slot) {
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stop) return false;
      queues[static_cast<size_t>(w)].ready.push_back(std::move(slot));
    }
    ready_cv.notify_all();
    return !failed;
  }

  void finish_worker(int64_t w) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      queues[static_cast<size_t>(w)].done = true;
    }
    ready_cv.notify_all();
  }

  void map_worker(int64_t w) {
    memory::PhaseScope data_phase(memory::Phase::Data);  // batches are owned by "/data"
    const int64_t n = static_cast<int64_t>(plan.size());
    for (int64_t k = w; k < n; k += num_workers()) {
      if (!wait_for_space(w)) break;
      Slot slot;
      try {
        std::optional<Batch> b = load_batch(k);
        if (!b) break;  // stopping
        slot.batch = std::move(*b);
      } catch (...) {
        slot.error = std::current_exception();
        slot.context = "DataLoader worker " + std::to_string(w) + ", batch " + std::to_string(k) + ": ";
      }
      if (!push(w, std::move(slot))) break;
    }
    finish_worker(w);
  }

  void stream_worker(int64_t w) {
    memory::PhaseScope data_phase(memory::Phase::Data);
    try {
      std::unique_ptr<ExampleStream> s = stream->open(w, num_workers(), options.seed, epoch);
      for (int64_t j = 0;; ++j) {
        if (!wait_for_space(w)) break;
        Slot slot;
        try {
          std::optional<Batch> b = read_batch(*s);
          if (!b) break;
          slot.batch = std::move(*b);
        } catch (...) {
          slot.error = std::current_exception();
          slot.context = "DataLoader worker " + std::to_string(w) + ", its batch " + std::to_string(j) + ": ";
        }
        if (!push(w, std::move(slot))) break;
      }
    } catch (...) {  // open() failed
      Slot slot;
      slot.error = std::current_exception();
      slot.context = "DataLoader worker " + std::to_string(w) + ", opening its shard: ";
      push(w, std::move(slot));
    }
    finish_worker(w);
  }

  void start_workers() {
    queues.resize(static_cast<size_t>(num_workers()));
    exhausted.assign(static_cast<size_t>(num_workers()), false);
    threads.reserve(static_cast<size_t>(num_workers()));
    for (int64_t w = 0; w < num_workers(); ++w) {
      if (dataset != nullptr)
        threads.emplace_back([this, w] { map_worker(w); });
      else
        threads.emplace_back([this, w] { stream_worker(w); });
    }
  }

  // --- consuming ------------------------------------------------------------------------------------------------

  // Takes the front slot of worker w's queue (the caller holds the lock and saw it non-empty).
  Slot take(std::unique_lock<std::mutex>& lock, int64_t w) {
    Slot slot = std::move(queues[static_cast<size_t>(w)].ready.front());
    queues[static_cast<size_t>(w)].ready.pop_front();
    lock.unlock();
    space_cv.notify_all();
    return slot;
  }

  // The next host batch, or nullopt at the end; a worker's error is thrown (with its context) instead.
  std::optional<Batch> next_host() {
    if (host_done) return std::nullopt;
    std::optional<Batch> out;
    if (num_workers() == 0) {
      if (dataset != nullptr) {
        if (next_batch < static_cast<int64_t>(plan.size())) {
          const int64_t k = next_batch++;
          try {
            out = load_batch(k);  // never stopping here: only the consumer's thread stops an inline epoch
          } catch (...) {
            host_done = true;
            rethrow_with_context(std::current_exception(), "DataLoader batch " + std::to_string(k) + ": ");
          }
        }
      } else {
        try {
          if (!inline_stream) inline_stream = stream->open(0, 1, options.seed, epoch);
          out = read_batch(*inline_stream);
        } catch (...) {
          host_done = true;
          rethrow_with_context(std::current_exception(),
                               "DataLoader batch " + std::to_string(delivered) + " of the stream: ");
        }
      }
    } else if (dataset != nullptr) {
      if (next_batch < static_cast<int64_t>(plan.size())) {
        const int64_t w = next_batch % num_workers();
        std::unique_lock<std::mutex> lock(mutex);
        ready_cv.wait(lock, [&] {
          const WorkerQueue& q = queues[static_cast<size_t>(w)];
          return !q.ready.empty() || q.done;
        });
        EMBER_CHECK(!queues[static_cast<size_t>(w)].ready.empty(), Error, "DataLoader: worker ", w,
                    " finished before producing batch ", next_batch);
        Slot slot = take(lock, w);
        ++next_batch;
        if (slot.error) {
          host_done = true;
          rethrow_with_context(slot.error, slot.context);
        }
        out = std::move(slot.batch);
      }
    } else {
      std::unique_lock<std::mutex> lock(mutex);
      for (int64_t tried = 0; tried < num_workers(); ++tried) {
        const int64_t w = turn % num_workers();
        if (!exhausted[static_cast<size_t>(w)]) {
          ready_cv.wait(lock, [&] {
            const WorkerQueue& q = queues[static_cast<size_t>(w)];
            return !q.ready.empty() || q.done;
          });
          if (!queues[static_cast<size_t>(w)].ready.empty()) {
            Slot slot = take(lock, w);
            turn = w + 1;
            if (slot.error) {
              host_done = true;
              rethrow_with_context(slot.error, slot.context);
            }
            out = std::move(slot.batch);
            break;
          }
          exhausted[static_cast<size_t>(w)] = true;
        }
        turn = w + 1;
      }
    }
    if (!out) {
      host_done = true;
      return std::nullopt;
    }
    out->index = delivered++;
    return out;
  }

  std::optional<Batch> next() {
    memory::PhaseScope data_phase(memory::Phase::Data);  // inline loading and the device copies
    if (!copier) return next_host();
    // CUDA: keep device_prefetch batches queued behind the one handed out (Note [Copy stream] in device_copy.h).
    while (!pending_error && static_cast<int64_t>(in_flight.size()) < options.device_prefetch + 1) {
      std::optional<Batch> host;
      try {
        host = next_host();
      } catch (...) {
        pending_error = std::current_exception();  // delivered after the batches already in flight
        break;
      }
      if (!host) break;
      InFlight f;
      f.batch = std::move(*host);
      try {
        f.ticket = copier->start({&f.batch.data, &f.batch.target});
      } catch (...) {  // e.g. the device is out of memory: the epoch ends after the batches already in flight
        host_done = true;
        pending_error = std::current_exception();
        break;
      }
      in_flight.push_back(std::move(f));
    }
    if (in_flight.empty()) {
      if (pending_error) std::rethrow_exception(std::exchange(pending_error, nullptr));
      return std::nullopt;
    }
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    copier->hand_over(f.ticket);
    return std::move(f.batch);
  }

  // Note [Loader position]: a stream's first `n` batches, read and dropped (they carry no device copies yet).
  void discard_stream_batches(int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (!next_host()) break;
  }
};

// --- DataLoader ---------------------------------------------------------------------------------------------------

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  EMBER_CHECK(dataset_ != nullptr, ValueError, "DataLoader: the dataset is null");
  validate();
  EMBER_CHECK(!(options_.shuffle && options_.sampler), ValueError,
              "DataLoader: shuffle and sampler are mutually exclusive (a sampler decides the order)");
  sampler_ = options_.sampler;
  if (!sampler_) {
    if (options_.shuffle)
      sampler_ = std::make_shared<RandomSampler>(options_.seed);
    else
      sampler_ = std::make_shared<SequentialSampler>();
  }
}

DataLoader::DataLoader(std::shared_ptr<const IterableDataset> dataset, DataLoaderOptions options)
    : stream_(std::move(dataset)), options_(std::move(options)) {
  EMBER_CHECK(stream_ != nullptr, ValueError, "DataLoader: the dataset is null");
  validate();
  EMBER_CHECK(!options_.shuffle && !options_.sampler, ValueError,
              "DataLoader: a streaming dataset takes no sampler and no shuffle flag (it orders its own examples)");
}

DataLoader::~DataLoader() { stop_epoch(); }

void DataLoader::validate() {
  const DataLoaderOptions& o = options_;
  EMBER_CHECK(o.batch_size >= 1, ValueError, "DataLoader: batch_size must be >= 1, got ", o.batch_size);
  EMBER_CHECK(o.num_workers >= 0, ValueError, "DataLoader: num_workers must be >= 0, got ", o.num_workers);
  EMBER_CHECK(o.prefetch_factor >= 1, ValueError, "DataLoader: prefetch_factor must be >= 1, got ",
              o.prefetch_factor);
  EMBER_CHECK(o.device_prefetch >= 0, ValueError, "DataLoader: device_prefetch must be >= 0, got ",
              o.device_prefetch);
  EMBER_CHECK(o.device.is_cpu() || o.device.is_cuda(), DeviceError, "DataLoader: cannot deliver batches to ",
              o.device.str());
  if (o.device.is_cuda()) {
    const int n = memory::cuda::device_count();
    EMBER_CHECK(o.device.index >= 0 && o.device.index < n, DeviceError, "DataLoader: ", o.device.str(),
                " is not available (", n, " CUDA device(s) visible)");
  }
}

int64_t DataLoader::held_ahead(const DataLoaderOptions& o) {  // Note [Batches held ahead]
  if (o.device.is_cuda()) return o.device_prefetch;
  if (o.num_workers == 0) return 0;
  return o.num_workers * (o.pin_memory ? 1 : o.prefetch_factor + 1);
}

int64_t DataLoader::num_samples() const {
  if (!dataset_) return -1;
  return static_cast<int64_t>(sampler_->indices(dataset_->size(), 0).size());
}

int64_t DataLoader::num_batches() const {
  const int64_t n = num_samples();
  if (n < 0) return -1;
  return batch_count(n, options_.batch_size, options_.drop_last);
}

void DataLoader::stop_epoch() { epoch_.reset(); }

void DataLoader::start_epoch() {
  stop_epoch();
  auto e = std::make_unique<Epoch>();
  e->dataset = dataset_.get();
  e->stream = stream_.get();
  e->options = options_;
  e->epoch = next_epoch_;
  e->pinned = options_.pin_memory || options_.device.is_cuda();
  const int64_t skip = std::exchange(skip_, 0);
  if (dataset_) {
    const std::vector<int64_t> order = sampler_->indices(dataset_->size(), e->epoch);
    const int64_t n = static_cast<int64_t>(order.size()), b = options_.batch_size;
    const int64_t batches = batch_count(n, b, options_.drop_last);
    // Note [Loader position]: the consumed batches leave the plan, so no worker loads their samples.
    const int64_t first = std::min(skip, batches);
    for (int64_t k = first; k < batches; ++k) {
      const int64_t lo = k * b, hi = std::min(n, lo + b);
      e->plan.emplace_back(order.begin() + lo, order.begin() + hi);
    }
    e->delivered = e->handed_out = first;
  }
  if (options_.device.is_cuda()) {
    if (!copier_) copier_ = std::make_unique<DeviceCopier>(options_.device);  // one copy stream per loader
    e->copier = copier_.get();
  }
  current_epoch_ = next_epoch_;
  next_epoch_ = current_epoch_ + 1;
  e->start_workers();
  if (stream_ && skip > 0) {
    e->discard_stream_batches(skip);
    e->handed_out = e->delivered;
  }
  epoch_ = std::move(e);
}

std::optional<Batch> DataLoader::next() {
  if (!epoch_) start_epoch();
  std::optional<Batch> b = epoch_->next();
  if (b) ++epoch_->handed_out;
  return b;
}

LoaderState DataLoader::state() const {
  const int64_t shards = dataset_ ? 0 : std::max<int64_t>(1, options_.num_workers);
  if (epoch_) return {current_epoch_, epoch_->handed_out, options_.seed, shards};
  return {next_epoch_, skip_, options_.seed, shards};
}

void DataLoader::load_state(const LoaderState& s) {
  EMBER_CHECK(s.epoch >= 0 && s.batches_consumed >= 0, ValueError, "DataLoader::load_state: epoch ", s.epoch,
              " and batches consumed ", s.batches_consumed, " must be >= 0");
  if (dataset_) {
    // The epoch's batch count under the state's seed (a sampler's count does not depend on its seed or epoch).
    const int64_t batches = num_batches();
    EMBER_CHECK(s.batches_consumed <= batches, ValueError, "DataLoader::load_state: ", s.batches_consumed,
                " batches consumed, but an epoch of this loader has ", batches,
                " (another dataset size, batch size or drop_last?)");
  } else {
    const int64_t shards = std::max<int64_t>(1, options_.num_workers);
    EMBER_CHECK(s.stream_shards == 0 || s.stream_shards == shards, ValueError, "DataLoader::load_state: the position "
                "was taken with the stream in ", s.stream_shards, " shard(s) (num_workers), this loader reads it in ",
                shards, ": the batches would differ");
  }
  stop_epoch();
  options_.seed = s.seed;
  if (dataset_ && options_.shuffle && !options_.sampler) sampler_ = std::make_shared<RandomSampler>(s.seed);
  next_epoch_ = s.epoch;
  skip_ = s.batches_consumed;
}

DataLoader::Iterator::Iterator(DataLoader* loader) : loader_(loader) { current_ = loader_->next(); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  current_ = loader_->next();
  return *this;
}

DataLoader::Iterator DataLoader::begin() {
  start_epoch();
  return Iterator(this);
}

}  // namespace ember::data
