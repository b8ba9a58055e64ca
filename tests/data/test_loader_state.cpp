// DataLoader::state / load_state (Note [Loader position]): a loader interrupted at several positions — inside an
// epoch, at its end, across epochs — and continued by a fresh loader from its state delivers exactly the batches an
// uninterrupted loader delivers (indices and bit-identical randomly transformed data), with 0 and 2 workers on either
// side; skipped batches are not loaded; streaming loaders replay; bad positions are refused.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "ember/data/dataloader.h"
#include "ember/data/random.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using data::DataLoader;
using data::DataLoaderOptions;
using data::Example;
using data::LoaderState;

// Sample i: data f32 [2] = {i, i + u} with u drawn from the sample's generator (a random transform), target i.
class NoisyDataset final : public data::Dataset {
 public:
  explicit NoisyDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index, Generator& rng) const override {
    calls.fetch_add(1);
    const float u = static_cast<float>(data::uniform(rng));
    Example ex;
    ex.data = from_vector<float>({static_cast<float>(index), static_cast<float>(index) + u}, {2});
    ex.target = scalar_tensor(index, DType::i64);
    return ex;
  }
  int64_t n_;
  mutable std::atomic<int64_t> calls{0};
};

// Shard s of k holds s, s + k, ... < n, each with a draw from Generator(seed + epoch) after skipping index counters.
class NoisyStream final : public data::IterableDataset {
 public:
  explicit NoisyStream(int64_t n) : n_(n) {}
  std::unique_ptr<data::ExampleStream> open(int64_t shard, int64_t num_shards, uint64_t seed,
                                            int64_t epoch) const override {
    struct S final : data::ExampleStream {
      int64_t next_index, step, n;
      uint64_t seed;
      std::optional<Example> next() override {
        if (next_index >= n) return std::nullopt;
        const int64_t i = next_index;
        next_index += step;
        Generator g(data::sample_seed(seed, 0, i));
        Example ex;
        ex.data = from_vector<float>({static_cast<float>(i), static_cast<float>(data::uniform(g))}, {2});
        ex.target = scalar_tensor(i, DType::i64);
        return ex;
      }
    };
    auto s = std::make_unique<S>();
    s->next_index = shard;
    s->step = num_shards;
    s->n = n_;
    s->seed = seed + static_cast<uint64_t>(epoch) * 1000;
    return s;
  }
  int64_t n_;
};

// One delivered batch, as raw bytes (bitwise comparison) and its position.
struct Seen {
  int64_t epoch, index;
  std::vector<int64_t> indices;
  std::vector<float> data;
  std::vector<int64_t> target;
  bool operator==(const Seen& o) const {
    return epoch == o.epoch && index == o.index && indices == o.indices && target == o.target &&
           data.size() == o.data.size() &&
           std::memcmp(data.data(), o.data.data(), data.size() * sizeof(float)) == 0;
  }
};

// The loader's next batch, starting the next epoch when one ends (a training loop's usual pattern).
Seen take(DataLoader& loader) {
  std::optional<data::Batch> b = loader.next();
  if (!b) {
    loader.start_epoch();
    b = loader.next();
  }
  EXPECT_TRUE(b.has_value());
  return {loader.epoch(), b->index, b->indices, b->data.to_vector<float>(), b->target.to_vector<int64_t>()};
}

DataLoaderOptions options(int64_t workers, uint64_t seed = 5) {
  DataLoaderOptions o;
  o.batch_size = 3;
  o.shuffle = true;
  o.seed = seed;
  o.num_workers = workers;
  return o;
}

TEST(LoaderState, ContinuingFromAStateEqualsTheUninterruptedSequence) {
  auto ds = std::make_shared<NoisyDataset>(20);  // 7 batches per epoch, the last of 2
  constexpr int64_t kTotal = 24;                 // into the fourth epoch
  std::vector<Seen> reference;
  {
    DataLoader loader(ds, options(0));
    for (int64_t i = 0; i < kTotal; ++i) reference.push_back(take(loader));
  }
  ASSERT_EQ(reference[7].epoch, 1);
  ASSERT_EQ(reference[7].index, 0);
  for (int64_t before : {0, 2}) {
    for (int64_t after : {0, 2}) {
      for (int64_t at : {0, 1, 3, 6, 7, 8, 13, 14, 20}) {
        SCOPED_TRACE("workers " + std::to_string(before) + " -> " + std::to_string(after) + ", interrupted after " +
                     std::to_string(at) + " batches");
        LoaderState s;
        {
          DataLoader first(ds, options(before));
          for (int64_t i = 0; i < at; ++i) ASSERT_EQ(take(first), reference[static_cast<size_t>(i)]);
          s = first.state();
        }
        DataLoader second(ds, options(after, /*seed=*/99));  // the state carries the seed
        second.load_state(s);
        EXPECT_EQ(second.state().epoch, s.epoch);
        EXPECT_EQ(second.state().batches_consumed, s.batches_consumed);
        for (int64_t i = at; i < kTotal; ++i) ASSERT_EQ(take(second), reference[static_cast<size_t>(i)]) << i;
      }
    }
  }
}

TEST(LoaderState, PositionsReadBackAsTheEpochAndTheBatchesTakenFromIt) {
  auto ds = std::make_shared<NoisyDataset>(20);
  DataLoader loader(ds, options(2));
  LoaderState s = loader.state();
  EXPECT_EQ(s.epoch, 0);
  EXPECT_EQ(s.batches_consumed, 0);
  EXPECT_EQ(s.seed, 5u);
  for (int i = 0; i < 4; ++i) take(loader);
  s = loader.state();
  EXPECT_EQ(s.epoch, 0);
  EXPECT_EQ(s.batches_consumed, 4);
  for (int i = 0; i < 3; ++i) take(loader);
  s = loader.state();
  EXPECT_EQ(s.epoch, 0) << "an epoch that ran out reports all of its batches";
  EXPECT_EQ(s.batches_consumed, 7);
  EXPECT_FALSE(loader.next().has_value());
  loader.start_epoch();
  s = loader.state();
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.batches_consumed, 0);
}

TEST(LoaderState, SkippedBatchesAreNotLoaded) {
  auto ds = std::make_shared<NoisyDataset>(20);
  DataLoader loader(ds, options(0));
  loader.load_state({1, 5, 5});
  ASSERT_EQ(ds->calls.load(), 0);
  const Seen b = take(loader);
  EXPECT_EQ(b.epoch, 1);
  EXPECT_EQ(b.index, 5);
  EXPECT_EQ(ds->calls.load(), 3) << "only the delivered batch's samples were loaded";
  EXPECT_EQ(take(loader).indices.size(), 2u) << "then the epoch's last, partial batch";
  EXPECT_FALSE(loader.next().has_value());
}

TEST(LoaderState, StreamingLoadersReplayToTheirPosition) {
  auto ds = std::make_shared<NoisyStream>(17);  // 6 batches of 3 per epoch (the last of 2, or per-shard partials)
  for (int64_t workers : {0, 2}) {
    DataLoaderOptions o;
    o.batch_size = 3;
    o.seed = 3;
    o.num_workers = workers;
    std::vector<Seen> reference;
    {
      DataLoader loader(ds, o);
      for (int i = 0; i < 15; ++i) reference.push_back(take(loader));
    }
    for (int64_t at : {0, 2, 5, 7, 11}) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", interrupted after " + std::to_string(at));
      LoaderState s;
      {
        DataLoader first(ds, o);
        for (int64_t i = 0; i < at; ++i) ASSERT_EQ(take(first), reference[static_cast<size_t>(i)]);
        s = first.state();
      }
      DataLoader second(ds, o);
      second.load_state(s);
      for (int64_t i = at; i < 15; ++i) ASSERT_EQ(take(second), reference[static_cast<size_t>(i)]) << i;
    }
  }
}

TEST(LoaderState, AStreamPositionIsRefusedByALoaderWithAnotherShardCount) {
  // A stream's order depends on how many shards (workers) read it: a position taken with 2 workers means nothing to
  // a loader with 3 (or none), so it is refused and the loader keeps its own position.
  auto ds = std::make_shared<NoisyStream>(17);
  DataLoaderOptions o;
  o.batch_size = 3;
  o.num_workers = 2;
  DataLoader first(ds, o);
  take(first);
  const LoaderState s = first.state();
  EXPECT_EQ(s.stream_shards, 2);
  for (int64_t workers : {0, 3}) {
    o.num_workers = workers;
    DataLoader other(ds, o);
    EXPECT_THROW(other.load_state(s), ValueError) << workers;
    EXPECT_EQ(other.state().batches_consumed, 0);
  }
  o.num_workers = 2;
  DataLoader same(ds, o);
  EXPECT_NO_THROW(same.load_state(s));
  EXPECT_EQ(DataLoader(std::make_shared<NoisyDataset>(20), options(2)).state().stream_shards, 0) << "map-style";
}

TEST(LoaderState, BadPositionsAreRefused) {
  auto ds = std::make_shared<NoisyDataset>(20);
  DataLoader loader(ds, options(0));
  take(loader);
  EXPECT_THROW(loader.load_state({-1, 0, 5}), ValueError);
  EXPECT_THROW(loader.load_state({0, -1, 5}), ValueError);
  EXPECT_THROW(loader.load_state({0, 8, 5}), ValueError) << "an epoch has 7 batches";
  EXPECT_EQ(loader.state().batches_consumed, 1) << "a refused position changes nothing";
  loader.load_state({2, 7, 5});  // the end of epoch 2: the next batch is epoch 3's first
  EXPECT_FALSE(loader.next().has_value());
  loader.start_epoch();
  EXPECT_EQ(loader.epoch(), 3);
}

}  // namespace
}  // namespace ember::testing
