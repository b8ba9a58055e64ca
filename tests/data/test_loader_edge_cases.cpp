// DataLoader edge cases the guide promises (docs/data.md): shutdown stops a worker after the sample it is loading,
// a stream's error ends the epoch and names the loader with or without workers, and RandomResizedCrop's fallback
// window rounds as torchvision's Python round() does (half to even), checked against values worked out by hand.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ember/data/dataloader.h"
#include "ember/data/transforms.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using data::DataLoader;
using data::DataLoaderOptions;
using data::Example;

Example example_of(int64_t i) {
  Example ex;
  ex.data = from_vector<float>({static_cast<float>(i)}, {1});
  ex.target = scalar_tensor(i, DType::i64);
  return ex;
}

// Sample 1 signals that it was entered and then takes 200 ms; every get() is counted.
class SlowSampleDataset final : public data::Dataset {
 public:
  int64_t size() const override { return 64; }
  Example get(int64_t index, Generator&) const override {
    calls.fetch_add(1);
    if (index == 1) {
      entered.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return example_of(index);
  }
  mutable std::atomic<int64_t> calls{0};
  mutable std::atomic<bool> entered{false};
};

// docs/data.md: "Destroying a loader ... mid-epoch wakes the workers and joins them; a worker inside Dataset::get
// finishes that sample first." The worker is inside get(1), the second sample of batch 0 (batch_size 8), when the
// loader is destroyed: it loads no further sample.
TEST(DataLoaderShutdown, StopsAfterTheSampleInProgress) {
  auto ds = std::make_shared<SlowSampleDataset>();
  {
    DataLoaderOptions o;
    o.batch_size = 8;
    o.num_workers = 1;
    o.prefetch_factor = 1;
    DataLoader loader(ds, o);
    loader.start_epoch();
    while (!ds->entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }  // destroyed while the worker sleeps in get(1)
  EXPECT_EQ(ds->calls.load(), 2) << "samples loaded after the loader was destroyed mid-sample";
}

// A stream of examples 0..9 that raises FormatError when it reaches example 3 (and goes on after it if asked).
class FlakyStream final : public data::IterableDataset {
 public:
  std::unique_ptr<data::ExampleStream> open(int64_t shard, int64_t, uint64_t, int64_t) const override {
    struct S final : data::ExampleStream {
      int64_t next_i = 0;
      bool active = true;
      std::optional<Example> next() override {
        if (!active) return std::nullopt;
        const int64_t i = next_i++;
        if (i >= 10) return std::nullopt;
        if (i == 3) EMBER_THROW(FormatError, "example 3 is corrupt");
        return example_of(i);
      }
    };
    auto s = std::make_unique<S>();
    s->active = shard == 0;  // with several shards only the first one holds the examples
    return s;
  }
};

// docs/data.md "Errors": the exception reaches the caller "with its type kept and its message prefixed by the worker
// and batch ... the epoch ends there" — with workers, and without them (the stream read in the calling thread).
TEST(DataLoaderStreamErrors, EndTheEpochWithContextWithAndWithoutWorkers) {
  auto ds = std::make_shared<FlakyStream>();
  for (int64_t workers : {1, 0}) {
    SCOPED_TRACE(::testing::Message() << "workers " << workers);
    DataLoaderOptions o;
    o.batch_size = 2;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    ASSERT_TRUE(loader.next().has_value());  // examples 0 and 1
    const std::string msg = error_message<FormatError>([&] { (void)loader.next(); });
    EXPECT_NE(msg.find("example 3 is corrupt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("DataLoader"), std::string::npos) << msg;
    EXPECT_FALSE(loader.next().has_value()) << "the epoch should have ended with the error";
  }
}

// torchvision's fallback: in_ratio = 100 / 3 > max ratio 1.5, so h = 3 and w = int(round(3 * 1.5)) = round(4.5) = 4
// (Python rounds half to even), left = (100 - 4) // 2 = 48. Scale (1, 1) needs an area of 300 px, which no window of
// height <= 3 and ratio <= 1.5 has, so all ten attempts fail.
TEST(RandomResizedCropTorchvision, FallbackRoundsHalfToEven) {
  const data::RandomResizedCrop rrc(4, 4, {1.0, 1.0}, {0.5, 1.5});
  Generator g(0);
  const data::RandomResizedCrop::Window win = rrc.get_params(3, 100, g);
  EXPECT_EQ(win.h, 3);
  EXPECT_EQ(win.w, 4);
  EXPECT_EQ(win.top, 0);
  EXPECT_EQ(win.left, 48);
}

}  // namespace
}  // namespace ember::testing
