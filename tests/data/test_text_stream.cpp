// Token windows: TextWindowDataset checked against hand-written windows, and TextFileStream over generated files:
// every window of the file exactly once across 1, 2 and 3 shards (with and without shuffle, each window compared
// with the file's bytes), the unshuffled order worked out by hand, shuffles reproducible per (seed, epoch) and
// different across epochs, memory bounded by the chunk buffer (measured with a peak window on the CPU allocator),
// and a file truncated after construction reported as FormatError.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ember/data/text_stream.h"
#include "ember/memory/allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using data::TextFileStream;
using data::TextWindowDataset;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ember_text_stream_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

// n random bytes (std::mt19937_64, independent of ember's RNG) written to `p`; returns them.
std::string write_random_file(const fs::path& p, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string bytes(static_cast<size_t>(n), '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

// --- TextWindowDataset ------------------------------------------------------------------------------------------

TEST(TextWindowDataset, WindowsByHand) {
  // ids 100..110 (L = 11), T = 4: (11 - 1) / 4 = 2 windows; ids 108..110 only ever appear as targets or not at all.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 11; ++i) ids.push_back(100 + i);
  const TextWindowDataset ds(from_vector<int64_t>(ids, {11}), 4);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.block_size(), 4);
  const data::Example w0 = ds.get(0), w1 = ds.get(1);
  EXPECT_EQ(w0.data.dtype(), DType::i64);
  EXPECT_EQ(w0.data.sizes(), (Shape{4}));
  EXPECT_EQ(w0.data.to_vector<int64_t>(), (std::vector<int64_t>{100, 101, 102, 103}));
  EXPECT_EQ(w0.target.to_vector<int64_t>(), (std::vector<int64_t>{101, 102, 103, 104}));
  EXPECT_EQ(w1.data.to_vector<int64_t>(), (std::vector<int64_t>{104, 105, 106, 107}));
  EXPECT_EQ(w1.target.to_vector<int64_t>(), (std::vector<int64_t>{105, 106, 107, 108}));
  EXPECT_THROW((void)ds.get(2), IndexError);
  EXPECT_THROW((void)ds.get(-1), IndexError);
  // L = 9, T = 4: the last window's target ends on the last id.
  const TextWindowDataset exact(from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {9}), 4);
  EXPECT_EQ(exact.size(), 2);
  EXPECT_EQ(exact.get(1).target.to_vector<int64_t>(), (std::vector<int64_t>{6, 7, 8, 9}));
}

TEST(TextWindowDataset, BadArgumentsAreRejected) {
  const Tensor ids = arange(int64_t{10});
  ASSERT_EQ(ids.dtype(), DType::i64);
  EXPECT_THROW(TextWindowDataset(ids, 0), ValueError);
  EXPECT_THROW(TextWindowDataset(ids, -3), ValueError);
  EXPECT_THROW(TextWindowDataset(ids, 10), ValueError);  // L <= T: no window
  EXPECT_EQ(TextWindowDataset(ids, 9).size(), 1);
  EXPECT_THROW(TextWindowDataset(ids.to(DType::i32), 2), DTypeError);
  EXPECT_THROW(TextWindowDataset(ids.view({2, 5}), 2), ShapeError);
}

// --- TextFileStream ---------------------------------------------------------------------------------------------

// Every example of the stream, as the index of the window it equals in `file` (checked byte by byte: data is
// file[i*T, i*T+T), target file[i*T+1, i*T+T+1)). `index_of` maps a window's T+1 bytes to its index.
std::vector<int64_t> drain(data::ExampleStream& stream, const std::string& file, int64_t t,
                           const std::map<std::string, int64_t>& index_of) {
  std::vector<int64_t> seen;
  while (std::optional<data::Example> ex = stream.next()) {
    EXPECT_EQ(ex->data.dtype(), DType::i64);
    EXPECT_EQ(ex->data.sizes(), (Shape{t}));
    EXPECT_EQ(ex->target.sizes(), (Shape{t}));
    const std::vector<int64_t> d = ex->data.to_vector<int64_t>(), y = ex->target.to_vector<int64_t>();
    std::string key;
    for (int64_t v : d) key += static_cast<char>(v);
    key += static_cast<char>(y.back());
    const auto it = index_of.find(key);
    if (it == index_of.end()) {
      ADD_FAILURE() << "an example matches no window of the file";
      continue;
    }
    const int64_t i = it->second;
    for (int64_t k = 0; k < t; ++k) {
      EXPECT_EQ(d[k], static_cast<uint8_t>(file[i * t + k])) << "window " << i << " data " << k;
      EXPECT_EQ(y[k], static_cast<uint8_t>(file[i * t + k + 1])) << "window " << i << " target " << k;
    }
    seen.push_back(i);
  }
  return seen;
}

std::map<std::string, int64_t> window_index(const std::string& file, int64_t t) {
  std::map<std::string, int64_t> m;
  const int64_t w = (static_cast<int64_t>(file.size()) - 1) / t;
  for (int64_t i = 0; i < w; ++i) m.emplace(file.substr(i * t, t + 1), i);
  EXPECT_EQ(static_cast<int64_t>(m.size()), w) << "the generated file has repeated windows; pick another seed";
  return m;
}

TEST(TextFileStream, AccessorsAndBadArguments) {
  TempDir dir;
  const fs::path p = dir.path / "text.bin";
  write_random_file(p, 5001, 1);
  const TextFileStream s(p.string(), 16, 7);
  EXPECT_EQ(s.file_bytes(), 5001);
  EXPECT_EQ(s.num_windows(), 312);  // (5001 - 1) / 16
  EXPECT_EQ(s.num_chunks(), 45);    // ceil(312 / 7)
  EXPECT_EQ(s.chunk_bytes(), 7 * 16 + 1);
  EXPECT_THROW(TextFileStream(p.string(), 0, 7), ValueError);
  EXPECT_THROW(TextFileStream(p.string(), 16, 0), ValueError);
  EXPECT_THROW(TextFileStream(p.string(), 5001, 1), ValueError);  // no window fits
  EXPECT_EQ(TextFileStream(p.string(), 5000, 1).num_windows(), 1);
  EXPECT_THROW(TextFileStream((dir.path / "absent").string(), 16, 7), ValueError);
  EXPECT_THROW(TextFileStream(dir.path.string(), 16, 7), ValueError);  // a directory
  EXPECT_THROW((void)s.open(-1, 2, 0, 0), ValueError);
  EXPECT_THROW((void)s.open(2, 2, 0, 0), ValueError);
  EXPECT_THROW((void)s.open(0, 0, 0, 0), ValueError);
}

TEST(TextFileStream, UnshuffledOrderIsTheShardsChunksInTurn) {
  TempDir dir;
  const fs::path p = dir.path / "text.bin";
  const std::string file = write_random_file(p, 5001, 2);
  const TextFileStream s(p.string(), 16, 7);
  const auto index_of = window_index(file, 16);
  // By hand: 3 shards; shard 1 reads chunks 1, 4, 7, ..., 43, i.e. windows 7..13, 28..34, ...; chunk 44 (windows
  // 308..311, the short last one) belongs to shard 2.
  for (int64_t shard = 0; shard < 3; ++shard) {
    std::vector<int64_t> expected;
    for (int64_t c = shard; c < 45; c += 3)
      for (int64_t w = c * 7; w < std::min<int64_t>(c * 7 + 7, 312); ++w) expected.push_back(w);
    auto stream = s.open(shard, 3, 0, 0);
    EXPECT_EQ(drain(*stream, file, 16, index_of), expected) << "shard " << shard;
    EXPECT_FALSE(stream->next().has_value());  // stays exhausted
  }
}

TEST(TextFileStream, EveryWindowExactlyOnceAcrossShards) {
  TempDir dir;
  // Two lengths: one leaving trailing bytes no window uses, one where the last target ends on the last byte.
  for (int64_t length : {int64_t{5001}, int64_t{16 * 300 + 1}}) {
    const fs::path p = dir.path / ("text_" + std::to_string(length) + ".bin");
    const uint64_t seed = 3 + static_cast<uint64_t>(length);
    const std::string file = write_random_file(p, length, seed);
    const auto index_of = window_index(file, 16);
    for (bool shuffle : {false, true}) {
      const TextFileStream s(p.string(), 16, 7, shuffle);
      for (int64_t shards : {1, 2, 3}) {
        std::vector<int> count(static_cast<size_t>(s.num_windows()), 0);
        for (int64_t shard = 0; shard < shards; ++shard) {
          auto stream = s.open(shard, shards, /*seed=*/42, /*epoch=*/1);
          for (int64_t i : drain(*stream, file, 16, index_of)) ++count[static_cast<size_t>(i)];
        }
        for (int64_t i = 0; i < s.num_windows(); ++i)
          ASSERT_EQ(count[static_cast<size_t>(i)], 1) << "window " << i << ", " << shards << " shards, shuffle "
                                                      << shuffle << ", length " << length << ", file seed " << seed;
      }
    }
  }
}

TEST(TextFileStream, MoreShardsThanChunksGivesEmptyStreams) {
  TempDir dir;
  const fs::path p = dir.path / "small.bin";
  const std::string file = write_random_file(p, 65, 5);
  const TextFileStream s(p.string(), 8, 4, true);  // 8 windows, 2 chunks
  ASSERT_EQ(s.num_chunks(), 2);
  const auto index_of = window_index(file, 8);
  std::vector<int64_t> all;
  for (int64_t shard = 0; shard < 5; ++shard) {
    auto stream = s.open(shard, 5, 9, 0);
    const std::vector<int64_t> got = drain(*stream, file, 8, index_of);
    if (shard >= 2) EXPECT_TRUE(got.empty()) << "shard " << shard;
    all.insert(all.end(), got.begin(), got.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(TextFileStream, ShuffleIsReproducibleAndChangesWithEpochAndSeed) {
  TempDir dir;
  const fs::path p = dir.path / "text.bin";
  const std::string file = write_random_file(p, 5001, 6);
  const auto index_of = window_index(file, 16);
  const TextFileStream s(p.string(), 16, 7, /*shuffle=*/true);
  auto order = [&](int64_t shard, uint64_t seed, int64_t epoch) {
    auto stream = s.open(shard, 2, seed, epoch);
    return drain(*stream, file, 16, index_of);
  };
  const std::vector<int64_t> a = order(0, 42, 0);
  EXPECT_EQ(order(0, 42, 0), a);          // same (seed, epoch, shard): same order
  EXPECT_NE(order(0, 42, 1), a);          // another epoch
  EXPECT_NE(order(0, 43, 0), a);          // another seed
  EXPECT_EQ(order(1, 42, 3), order(1, 42, 3));
  EXPECT_NE(order(1, 42, 3), order(1, 42, 4));
  // It is a shuffle: the same windows as the unshuffled shard, in another order, and windows move inside chunks too.
  const TextFileStream plain(p.string(), 16, 7);
  auto plain_stream = plain.open(0, 2, 42, 0);
  const std::vector<int64_t> sorted_order = drain(*plain_stream, file, 16, index_of);
  EXPECT_NE(a, sorted_order);
  std::vector<int64_t> sorted_a = a;
  std::sort(sorted_a.begin(), sorted_a.end());
  EXPECT_EQ(sorted_a, sorted_order);
  // Consecutive groups of 7 (full chunks) each hold one chunk's windows, not in ascending order everywhere.
  bool moved_inside = false;
  for (size_t g = 0; g + 7 <= a.size(); g += 7) {
    std::vector<int64_t> group(a.begin() + static_cast<long>(g), a.begin() + static_cast<long>(g + 7));
    if (!std::is_sorted(group.begin(), group.end())) moved_inside = true;
    std::sort(group.begin(), group.end());
    if (group.back() - group.front() == 6) continue;  // one full chunk
    // A group may straddle the short last chunk (4 windows, in shard 0 since chunk 44 is even); then stop checking.
    break;
  }
  EXPECT_TRUE(moved_inside);
}

TEST(TextFileStream, MemoryIsBoundedByTheChunkBuffer) {
  TempDir dir;
  const fs::path p = dir.path / "big.bin";
  constexpr int64_t kFileBytes = (3 << 20) / 2 + 123;  // 1.5 MiB and change
  const std::string file = write_random_file(p, kFileBytes, 7);
  // T = 64, K = 256: a 16 KiB (+1 byte) buffer for a 1.5 MiB file.
  for (bool shuffle : {false, true}) {
    const TextFileStream s(p.string(), 64, 256, shuffle);
    ASSERT_EQ(s.chunk_bytes(), 256 * 64 + 1);
    memory::CachingAllocator& alloc = memory::cpu_allocator();
    const int64_t before = alloc.stats().allocated_bytes;
    int64_t peak = 0, windows = 0;
    uint64_t sum = 0, expected_sum = 0;
    {
      memory::PeakWindow window(alloc);
      auto stream = s.open(0, 1, 11, 0);
      while (std::optional<data::Example> ex = stream->next()) {
        const int64_t* d = ex->data.data<int64_t>();
        const int64_t* y = ex->target.data<int64_t>();
        for (int64_t k = 0; k < 64; ++k) sum += static_cast<uint64_t>(d[k]) * 3 + static_cast<uint64_t>(y[k]);
        ++windows;
      }
      peak = window.peak() - before;
    }
    for (int64_t i = 0; i < s.num_windows() * 64; ++i)
      expected_sum += static_cast<uint64_t>(static_cast<uint8_t>(file[static_cast<size_t>(i)])) * 3 +
                      static_cast<uint8_t>(file[static_cast<size_t>(i) + 1]);
    EXPECT_EQ(windows, s.num_windows());
    EXPECT_EQ(sum, expected_sum);  // every byte of every window was streamed
    std::printf("TextFileStream (shuffle %d): %lld-byte file, %lld-byte chunk buffer, peak %lld bytes allocated\n",
                shuffle ? 1 : 0, static_cast<long long>(kFileBytes), static_cast<long long>(s.chunk_bytes()),
                static_cast<long long>(peak));
    EXPECT_GE(peak, s.chunk_bytes()) << "the chunk buffer should come from the CPU allocator";
    EXPECT_LT(peak, 4 * s.chunk_bytes() + 4096);
    EXPECT_LT(peak * 32, kFileBytes);
  }
}

TEST(TextFileStream, TruncationAfterConstructionIsAFormatError) {
  TempDir dir;
  const fs::path p = dir.path / "text.bin";
  write_random_file(p, 5001, 8);
  const TextFileStream s(p.string(), 16, 7);
  // Truncated before the stream starts: the last chunk (bytes 4928..4992, read by shard 0 of 1 at the end) is short.
  fs::resize_file(p, 4950);
  {
    auto stream = s.open(0, 1, 0, 0);
    int64_t emitted = 0;
    const std::string msg = error_message<FormatError>([&] {
      while (stream->next()) ++emitted;
    });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_EQ(emitted, 44 * 7);  // the 44 complete chunks before it
  }
  // Truncated while a stream is part-way through.
  write_random_file(p, 5001, 8);
  auto stream = s.open(0, 1, 0, 0);
  ASSERT_TRUE(stream->next().has_value());
  fs::resize_file(p, 100);
  const std::string msg = error_message<FormatError>([&] {
    while (stream->next()) {
    }
  });
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
}

}  // namespace
}  // namespace ember::testing
