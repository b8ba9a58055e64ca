// DataLoader: every sample exactly once per epoch (shuffled or not, 0-3 workers, drop_last), the same order whatever
// the worker count, per-sample transform seeds, streaming datasets sharded across workers, the prefetch bound, clean
// shutdown mid-epoch, the batches held ahead on the delivery device's allocator, worker exceptions reaching the caller, pinned batches, samplers (hand-computed distributed
// splits), collation errors, bad options; on a GPU, batches delivered to the device equal the host batches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ember/data/collate.h"
#include "ember/data/dataloader.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/data/random.h"
#include "ember/data/sampler.h"
#include "ember/data/text_stream.h"
#include "ember/data/transforms.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using data::Batch;
using data::DataLoader;
using data::DataLoaderOptions;
using data::Example;

// Sample i: data f32 [2] = {i, 10 i}, target i64 0-d = i. Optionally throws at one index, returns data of shape [1]
// at another, sleeps, counts calls.
class IndexDataset final : public data::Dataset {
 public:
  explicit IndexDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index, Generator&) const override {
    EMBER_CHECK(index >= 0 && index < n_, IndexError, "IndexDataset: index ", index);
    calls.fetch_add(1);
    if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    if (index == throw_at) {
      if (throw_std) throw std::runtime_error("plain failure at " + std::to_string(index));
      EMBER_THROW(FormatError, "sample ", index, " is corrupt");
    }
    Example ex;
    ex.data = index == short_at ? from_vector<float>({1.0f}, {1})
                                : from_vector<float>({static_cast<float>(index), 10.0f * static_cast<float>(index)}, {2});
    ex.target = scalar_tensor(index, DType::i64);
    return ex;
  }
  int64_t n_;
  int64_t throw_at = -1;
  int64_t short_at = -1;
  bool throw_std = false;
  int sleep_us = 0;
  mutable std::atomic<int64_t> calls{0};
};

std::vector<int64_t> targets_of(const Batch& b) { return b.target.to_vector<int64_t>(); }

std::vector<int64_t> epoch_targets(DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> out;
  int64_t expected_index = 0;
  for (Batch& b : loader) {
    EXPECT_EQ(b.index, expected_index++);
    const std::vector<int64_t> t = targets_of(b);
    EXPECT_EQ(t, b.indices);
    const std::vector<float> d = b.data.to_vector<float>();
    for (size_t i = 0; i < t.size(); ++i) {  // rows carry their own sample's data
      EXPECT_EQ(d[2 * i], static_cast<float>(t[i]));
      EXPECT_EQ(d[2 * i + 1], 10.0f * static_cast<float>(t[i]));
    }
    if (batch_sizes) batch_sizes->push_back(b.size());
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST(DataLoader, EverySampleExactlyOnce) {
  const int64_t n = 23;
  auto ds = std::make_shared<IndexDataset>(n);
  for (bool shuffle : {false, true})
    for (int64_t workers : {0, 1, 2, 3})
      for (int64_t batch : {1, 4, 7})
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "shuffle " << shuffle << " workers " << workers << " batch " << batch
                                            << " drop_last " << drop_last);
          DataLoaderOptions o;
          o.batch_size = batch;
          o.shuffle = shuffle;
          o.drop_last = drop_last;
          o.num_workers = workers;
          o.seed = 7;
          DataLoader loader(ds, o);
          std::vector<int64_t> sizes;
          std::vector<int64_t> seen = epoch_targets(loader, &sizes);
          const int64_t expected_batches = drop_last ? n / batch : (n + batch - 1) / batch;
          EXPECT_EQ(loader.num_batches(), expected_batches);
          ASSERT_EQ(static_cast<int64_t>(sizes.size()), expected_batches);
          for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], batch);
          std::set<int64_t> distinct(seen.begin(), seen.end());
          EXPECT_EQ(distinct.size(), seen.size());  // nothing twice
          if (drop_last) {
            EXPECT_EQ(static_cast<int64_t>(seen.size()), (n / batch) * batch);
          } else {
            EXPECT_EQ(static_cast<int64_t>(seen.size()), n);  // everything once
          }
          if (!shuffle) EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
        }
}

TEST(DataLoader, OrderDependsOnSeedAndEpochNotOnWorkers) {
  auto ds = std::make_shared<IndexDataset>(40);
  auto order = [&](int64_t workers, uint64_t seed, int64_t epoch) {
    DataLoaderOptions o;
    o.batch_size = 6;
    o.shuffle = true;
    o.seed = seed;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    loader.set_epoch(epoch);
    return epoch_targets(loader);
  };
  const std::vector<int64_t> reference = order(0, 3, 0);
  EXPECT_EQ(order(1, 3, 0), reference);
  EXPECT_EQ(order(3, 3, 0), reference);
  EXPECT_NE(order(0, 4, 0), reference);
  EXPECT_NE(order(2, 3, 1), reference);
  EXPECT_EQ(order(2, 3, 1), order(0, 3, 1));

  DataLoaderOptions o;
  o.batch_size = 6;
  o.shuffle = true;
  o.seed = 3;
  DataLoader loader(ds, o);  // epochs count up by themselves
  EXPECT_EQ(epoch_targets(loader), reference);
  EXPECT_EQ(loader.epoch(), 0);
  EXPECT_EQ(epoch_targets(loader), order(0, 3, 1));
  EXPECT_EQ(loader.epoch(), 1);
}

TEST(DataLoader, TransformsDrawFromPerSampleGenerators) {
  auto base = std::make_shared<IndexDataset>(30);
  // Adds a uniform draw of the sample's generator: the expected value is computed from sample_seed directly.
  data::Transform noise = [](const Tensor& x, Generator& rng) {
    std::vector<float> v = x.to_vector<float>();
    for (float& f : v) f += static_cast<float>(data::uniform(rng));
    return from_vector<float>(v, x.sizes());
  };
  auto ds = std::make_shared<data::TransformDataset>(base, noise);
  for (int64_t workers : {0, 2, 3}) {
    DataLoaderOptions o;
    o.batch_size = 4;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    loader.set_epoch(5);
    for (Batch& b : loader) {
      const std::vector<float> d = b.data.to_vector<float>();
      for (size_t i = 0; i < b.indices.size(); ++i) {
        const int64_t idx = b.indices[i];
        Generator rng(data::sample_seed(11, 5, idx));
        const float u0 = static_cast<float>(data::uniform(rng)), u1 = static_cast<float>(data::uniform(rng));
        EXPECT_EQ(d[2 * i], static_cast<float>(idx) + u0) << "workers " << workers << " sample " << idx;
        EXPECT_EQ(d[2 * i + 1], 10.0f * static_cast<float>(idx) + u1);
      }
    }
  }
}

// A stream of 0..n-1 split by residue: shard s of k yields s, s + k, s + 2k, ...
class ResidueStream final : public data::IterableDataset {
 public:
  explicit ResidueStream(int64_t n) : n_(n) {}
  std::unique_ptr<data::ExampleStream> open(int64_t shard, int64_t shards, uint64_t, int64_t) const override {
    EMBER_CHECK(shard >= 0 && shard < shards, ValueError, "ResidueStream: bad shard");
    struct S final : data::ExampleStream {
      int64_t next_i, step, n;
      std::optional<Example> next() override {
        if (next_i >= n) return std::nullopt;
        Example ex;
        ex.data = from_vector<float>({static_cast<float>(next_i), 10.0f * static_cast<float>(next_i)}, {2});
        ex.target = scalar_tensor(next_i, DType::i64);
        next_i += step;
        return ex;
      }
    };
    auto s = std::make_unique<S>();
    s->next_i = shard;
    s->step = shards;
    s->n = n_;
    return s;
  }
  int64_t n_;
};

TEST(DataLoader, StreamingDatasetShardsAcrossWorkers) {
  auto ds = std::make_shared<ResidueStream>(29);
  for (int64_t workers : {0, 1, 2, 3}) {
    DataLoaderOptions o;
    o.batch_size = 4;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    EXPECT_EQ(loader.num_batches(), -1);
    std::vector<int64_t> seen;
    std::vector<int64_t> first_of_batch;
    for (Batch& b : loader) {
      EXPECT_TRUE(b.indices.empty());
      const std::vector<int64_t> t = targets_of(b);
      first_of_batch.push_back(t.front());
      seen.insert(seen.end(), t.begin(), t.end());
    }
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(29);
    for (int64_t i = 0; i < 29; ++i) all[static_cast<size_t>(i)] = i;
    EXPECT_EQ(sorted, all) << "workers " << workers;
    // Round robin over the workers' shards: batch j comes from shard j mod workers while every shard has batches.
    const int64_t k = std::max<int64_t>(workers, 1);
    for (int64_t j = 0; j < k && j < static_cast<int64_t>(first_of_batch.size()); ++j)
      EXPECT_EQ(first_of_batch[static_cast<size_t>(j)], j);
  }
  DataLoaderOptions bad;
  bad.shuffle = true;
  EXPECT_THROW(DataLoader(ds, bad), ValueError);
}

TEST(DataLoader, PrefetchIsBoundedAndShutdownJoinsWorkers) {
  auto ds = std::make_shared<IndexDataset>(400);
  ds->sleep_us = 200;
  DataLoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 2;
  o.prefetch_factor = 3;
  {
    DataLoader loader(ds, o);
    ASSERT_TRUE(loader.next().has_value());
    // With one batch taken, each worker fills its queue with prefetch_factor batches and then waits: exactly
    // (1 + num_workers * prefetch_factor) batches are loaded — no fewer (the workers do prefetch), no more (bounded).
    const int64_t expected = (1 + o.num_workers * o.prefetch_factor) * o.batch_size;
    for (int i = 0; i < 5000 && ds->calls.load() < expected; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // room to overshoot, were the bound broken
    std::printf("samples loaded after one batch: %lld (expected %lld)\n", static_cast<long long>(ds->calls.load()),
                static_cast<long long>(expected));
    EXPECT_EQ(ds->calls.load(), expected);
  }  // destroyed mid-epoch: the workers are joined here
  const int64_t after = ds->calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ds->calls.load(), after);  // nothing runs any more
  EXPECT_EQ(ds.use_count(), 1);
}

TEST(DataLoader, WorkerExceptionReachesTheCaller) {
  for (int64_t workers : {0, 1, 3}) {
    auto ds = std::make_shared<IndexDataset>(20);
    ds->throw_at = 13;
    DataLoaderOptions o;
    o.batch_size = 3;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    int64_t delivered = 0;
    try {
      while (loader.next()) ++delivered;
      ADD_FAILURE() << "no exception";
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("batch 4: dataset index 13: sample 13 is corrupt"), std::string::npos) << what;
      if (workers > 0) EXPECT_NE(what.find("worker " + std::to_string(4 % workers)), std::string::npos) << what;
    }
    EXPECT_EQ(delivered, 4);        // batches 0..3 came first
    EXPECT_FALSE(loader.next());    // the epoch ended with the error
    loader.start_epoch();           // a new epoch runs into it again
    EXPECT_TRUE(loader.next().has_value());
  }
  auto ds = std::make_shared<IndexDataset>(8);
  ds->throw_at = 2;
  ds->throw_std = true;
  DataLoaderOptions o;
  o.num_workers = 2;
  DataLoader loader(ds, o);
  EXPECT_NO_THROW(loader.next());
  EXPECT_NO_THROW(loader.next());
  try {  // a plain std::runtime_error: an ember Error (a std::runtime_error) with the context
    loader.next();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("DataLoader worker 0, batch 2: dataset index 2: plain failure at 2"), std::string::npos)
        << what;
  }
  // A sample of another shape: the collation error names the batch, the example's position in it and its dataset
  // index (shuffled, so the two differ).
  for (int64_t workers : {0, 2}) {
    auto shapes = std::make_shared<IndexDataset>(12);
    shapes->short_at = 7;
    DataLoaderOptions so;
    so.batch_size = 4;
    so.shuffle = true;
    so.seed = 3;
    so.num_workers = workers;
    DataLoader shuffled(shapes, so);
    try {
      while (shuffled.next()) {
      }
      ADD_FAILURE() << "no exception";
    } catch (const ShapeError& e) {
      const std::string what = e.what();
      // Index 7 is either the odd example or (when it comes first in its batch) the example the others differ from.
      EXPECT_NE(what.find("(dataset index 7)'s"), std::string::npos) << what;
      EXPECT_NE(what.find("DataLoader"), std::string::npos) << what;
    }
  }
}

// Note [Batches held ahead]: with one batch taken and the workers' queues full, a CPU loader holds exactly
// num_workers * prefetch_factor collated batches on the CPU allocator (within held_ahead's bound, which adds the batch
// each worker may be loading); pinned batches wait outside it; a loader without workers holds none.
TEST(DataLoader, HeldAheadBoundsTheBatchesWaitingOnTheDeliveryDevice) {
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const int64_t batch_bytes = 512 + 512;  // data f32 [64, 2] and target i64 [64]: one 512 B block each
  for (const bool pinned : {false, true}) {
    auto ds = std::make_shared<IndexDataset>(4000);
    DataLoaderOptions o;
    o.batch_size = 64;
    o.num_workers = 2;
    o.prefetch_factor = 3;
    o.pin_memory = pinned;
    EXPECT_EQ(DataLoader::held_ahead(o), pinned ? 2 : 8);
    const int64_t before = alloc.stats().allocated_bytes;
    DataLoader loader(ds, o);
    const std::optional<Batch> taken = loader.next();
    ASSERT_TRUE(taken.has_value());
    const int64_t loaded = (1 + o.num_workers * o.prefetch_factor) * o.batch_size;
    for (int i = 0; i < 5000 && ds->calls.load() < loaded; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t waiting = pinned ? 0 : o.num_workers * o.prefetch_factor * batch_bytes;
    const int64_t consumer = pinned ? 0 : batch_bytes;
    for (int i = 0; i < 2000 && alloc.stats().allocated_bytes - before != consumer + waiting; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the last samples' collation and push
    EXPECT_EQ(alloc.stats().allocated_bytes - before, consumer + waiting) << "pinned " << pinned;
    EXPECT_LE(waiting, DataLoader::held_ahead(o) * batch_bytes);
  }
  DataLoaderOptions inline_loading;
  EXPECT_EQ(DataLoader::held_ahead(inline_loading), 0);
  DataLoaderOptions cuda;
  cuda.device = Device::cuda(0);
  cuda.num_workers = 4;
  cuda.device_prefetch = 2;
  EXPECT_EQ(DataLoader::held_ahead(cuda), 2);  // the host batches are in pinned memory
}

TEST(DataLoader, PinnedBatches) {
  Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_FALSE(t.is_pinned());
  Tensor p = t.transpose(0, 1).pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(p.pin_memory().is_same(p));
  EXPECT_TRUE(empty_pinned({3}, DType::i64).is_pinned());

  auto ds = std::make_shared<IndexDataset>(10);
  DataLoaderOptions o;
  o.batch_size = 4;
  o.pin_memory = true;
  o.num_workers = 1;
  DataLoader loader(ds, o);
  for (Batch& b : loader) {
    EXPECT_TRUE(b.data.is_pinned());
    EXPECT_TRUE(b.target.is_pinned());
  }
}

TEST(DataLoader, Samplers) {
  // DistributedSampler, hand-computed: 10 samples over 3 replicas pad to 12 (0..9, 0, 1) or trim to 9.
  const std::vector<std::vector<int64_t>> padded = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
  const std::vector<std::vector<int64_t>> trimmed = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(data::DistributedSampler(3, r, false).indices(10, 0), padded[static_cast<size_t>(r)]);
    EXPECT_EQ(data::DistributedSampler(3, r, false, 0, true).indices(10, 0), trimmed[static_cast<size_t>(r)]);
  }
  // Shuffled: the replicas partition one permutation (no padding for 12 over 4), agree per epoch, change across.
  std::vector<int64_t> all;
  for (int64_t r = 0; r < 4; ++r) {
    const std::vector<int64_t> mine = data::DistributedSampler(4, r, true, 9).indices(12, 2);
    EXPECT_EQ(mine.size(), 3u);
    EXPECT_EQ(mine, data::DistributedSampler(4, r, true, 9).indices(12, 2));
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::vector<int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  const std::vector<int64_t> perm = data::RandomSampler(9).indices(12, 2);  // the shared epoch order
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 3; ++j)
      EXPECT_EQ(all[static_cast<size_t>(3 * r + j)], perm[static_cast<size_t>(r + 4 * j)]);
  EXPECT_NE(data::DistributedSampler(4, 0, true, 9).indices(12, 2),
            data::DistributedSampler(4, 0, true, 9).indices(12, 3));
  EXPECT_THROW(data::DistributedSampler(0, 0), ValueError);
  EXPECT_THROW(data::DistributedSampler(2, 2), ValueError);

  // A loader with a distributed sampler delivers only its replica's samples.
  auto ds = std::make_shared<IndexDataset>(10);
  DataLoaderOptions o;
  o.batch_size = 3;
  o.sampler = std::make_shared<data::DistributedSampler>(3, 1, false);
  o.num_workers = 2;
  DataLoader loader(ds, o);
  EXPECT_EQ(loader.num_samples(), 4);
  std::vector<int64_t> seen;
  for (Batch& b : loader) {
    const std::vector<int64_t> t = targets_of(b);
    seen.insert(seen.end(), t.begin(), t.end());
  }
  EXPECT_EQ(seen, padded[1]);

  // RandomSampler: a permutation, the same for a seed and epoch.
  const std::vector<int64_t> p = data::RandomSampler(5).indices(50, 0);
  std::set<int64_t> distinct(p.begin(), p.end());
  EXPECT_EQ(distinct.size(), 50u);
  EXPECT_EQ(*distinct.rbegin(), 49);
  EXPECT_EQ(p, data::RandomSampler(5).indices(50, 0));
  EXPECT_NE(p, data::RandomSampler(5).indices(50, 1));
}

TEST(DataLoader, CollateRefusesMismatchedExamples) {
  Example a{from_vector<float>({1, 2}, {2}), scalar_tensor(0, DType::i64)};
  Example b{from_vector<float>({1, 2, 3}, {3}), scalar_tensor(1, DType::i64)};
  Example c{from_vector<double>({1, 2}, {2}), scalar_tensor(1, DType::i64)};
  EXPECT_THROW(data::collate({a, b}), ShapeError);
  EXPECT_THROW(data::collate({a, c}), DTypeError);
  EXPECT_THROW(data::collate({}), ValueError);
  Example strided{from_vector<float>({1, 2, 3, 4}, {2, 2}).transpose(0, 1), scalar_tensor(5, DType::i64)};
  Example dense{from_vector<float>({5, 6, 7, 8}, {2, 2}), scalar_tensor(6, DType::i64)};
  Example batch = data::collate({strided, dense});
  EXPECT_EQ(batch.data.sizes(), (Shape{2, 2, 2}));
  EXPECT_EQ(batch.data.to_vector<float>(), (std::vector<float>{1, 3, 2, 4, 5, 6, 7, 8}));
  EXPECT_EQ(batch.target.to_vector<int64_t>(), (std::vector<int64_t>{5, 6}));
}

TEST(DataLoader, BadOptions) {
  auto ds = std::make_shared<IndexDataset>(4);
  auto with = [&](auto edit) {
    DataLoaderOptions o;
    edit(o);
    return DataLoader(ds, o);
  };
  EXPECT_THROW(with([](DataLoaderOptions& o) { o.batch_size = 0; }), ValueError);
  EXPECT_THROW(with([](DataLoaderOptions& o) { o.num_workers = -1; }), ValueError);
  EXPECT_THROW(with([](DataLoaderOptions& o) { o.prefetch_factor = 0; }), ValueError);
  EXPECT_THROW(with([](DataLoaderOptions& o) { o.device_prefetch = -1; }), ValueError);
  EXPECT_THROW(with([](DataLoaderOptions& o) { o.device = Device::meta(); }), DeviceError);
  EXPECT_THROW(with([](DataLoaderOptions& o) {
                 o.shuffle = true;
                 o.sampler = std::make_shared<data::SequentialSampler>();
               }),
               ValueError);
  // Batch counts never overflow, whatever the batch size.
  EXPECT_EQ(with([](DataLoaderOptions& o) { o.batch_size = INT64_MAX; }).num_batches(), 1);
  if (!memory::cuda::is_available()) {
    EXPECT_THROW(with([](DataLoaderOptions& o) { o.device = Device::cuda(0); }), DeviceError);
  }
  EXPECT_THROW(DataLoader(std::shared_ptr<const data::Dataset>(), {}), ValueError);
}

// The guide's example (docs/data.md): MNIST-like images through crop + ToTensor + Normalize, two workers.
TEST(DataLoader, ImagePipelineAsInTheGuide) {
  const data::MnistData raw = data::synthetic_mnist(100, 3);
  auto images = std::make_shared<data::ImageDataset>(data::ImageDataset::from(raw));
  auto train_set = std::make_shared<data::TransformDataset>(
      images, data::Compose({data::RandomCrop(28, 28, /*padding=*/2), data::ToTensor(),
                             data::Normalize({data::kMnistMean}, {data::kMnistStd})}));
  DataLoader loader(train_set, {.batch_size = 16, .shuffle = true, .seed = 1, .num_workers = 2});
  EXPECT_EQ(loader.num_batches(), 7);
  const std::vector<int64_t> labels = raw.labels.to_vector<int64_t>();
  int64_t seen = 0;
  for (Batch& b : loader) {
    EXPECT_EQ(b.data.dtype(), DType::f32);
    EXPECT_EQ(b.data.sizes(), (Shape{b.size(), 1, 28, 28}));
    const std::vector<int64_t> t = targets_of(b);
    for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i], labels[static_cast<size_t>(b.indices[i])]);
    // Normalised pixels lie in [(0 - mean) / std, (1 - mean) / std].
    for (float v : b.data.to_vector<float>()) {
      EXPECT_GE(v, (0.0 - data::kMnistMean) / data::kMnistStd - 1e-5);
      EXPECT_LE(v, (1.0 - data::kMnistMean) / data::kMnistStd + 1e-5);
    }
    seen += b.size();
  }
  EXPECT_EQ(seen, 100);
}

// A file streamed by TextFileStream through the loader: every window exactly once whatever the worker count.
TEST(DataLoader, StreamsAFileThroughWorkers) {
  std::string path = (std::filesystem::temp_directory_path() / "ember_loader_stream_XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::string bytes(4001, '\0');
  std::mt19937 gen(5);  // random bytes: every 8-byte window is distinct (checked below), so content names it
  for (char& c : bytes) c = static_cast<char>(gen() & 0xff);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const int64_t T = 8, windows = (4001 - 1) / T;
  std::set<std::string> distinct;
  for (int64_t w = 0; w < windows; ++w) distinct.insert(bytes.substr(static_cast<size_t>(w * T), T + 1));
  ASSERT_EQ(static_cast<int64_t>(distinct.size()), windows);
  auto stream = std::make_shared<data::TextFileStream>(path, T, /*chunk_windows=*/16, /*shuffle=*/true);
  for (int64_t workers : {0, 1, 3}) {
    DataLoader loader(stream, {.batch_size = 5, .seed = 2, .num_workers = workers});
    std::vector<int64_t> starts;  // recovered window offsets
    for (Batch& b : loader) {
      const std::vector<int64_t> d = b.data.to_vector<int64_t>(), y = b.target.to_vector<int64_t>();
      for (int64_t r = 0; r < b.size(); ++r) {
        // Find the window by content: windows start at multiples of T; check data and target against the file.
        int64_t found = -1;
        for (int64_t w = 0; w < windows && found < 0; ++w) {
          bool match = true;
          for (int64_t j = 0; j < T && match; ++j)
            match = d[static_cast<size_t>(r * T + j)] == static_cast<uint8_t>(bytes[static_cast<size_t>(w * T + j)]) &&
                    y[static_cast<size_t>(r * T + j)] == static_cast<uint8_t>(bytes[static_cast<size_t>(w * T + j + 1)]);
          if (match) found = w;
        }
        EXPECT_GE(found, 0);
        starts.push_back(found);
      }
    }
    std::sort(starts.begin(), starts.end());
    ASSERT_EQ(static_cast<int64_t>(starts.size()), windows) << "workers " << workers;
    for (int64_t w = 0; w < windows; ++w) EXPECT_EQ(starts[static_cast<size_t>(w)], w);
  }
  std::filesystem::remove(path);
}

// On a GPU: batches arrive on the device with the host batches' values, with and without copies queued ahead.
class DataLoaderDevice : public DeviceTest {};

TEST_P(DataLoaderDevice, DeliversBatchesToTheDevice) {
  if (device().is_cuda()) EMBER_SKIP_WITHOUT_CUDA();
  auto ds = std::make_shared<IndexDataset>(37);
  for (int64_t ahead : {0, 1, 3}) {
    DataLoaderOptions o;
    o.batch_size = 5;
    o.shuffle = true;
    o.num_workers = 2;
    o.device = device();
    o.device_prefetch = ahead;
    DataLoader loader(ds, o);
    std::vector<int64_t> seen;
    for (Batch& b : loader) {
      EXPECT_EQ(b.data.device(), device());
      EXPECT_EQ(b.target.device(), device());
      const std::vector<int64_t> t = b.target.cpu().to_vector<int64_t>();
      EXPECT_EQ(t, b.indices);
      const std::vector<float> d = b.data.cpu().to_vector<float>();
      for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(d[2 * i + 1], 10.0f * static_cast<float>(t[i]));
      seen.insert(seen.end(), t.begin(), t.end());
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), 37u);
    for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  }
}
EMBER_INSTANTIATE_DEVICE_TESTS(DataLoaderDevice);

}  // namespace
}  // namespace ember::testing
