// Pinned host pool: power-of-two block sizes, LIFO reuse after free, exact statistics against hand-computed numbers,
// empty_cache, error paths, poisoning, out-of-memory, a multi-threaded smoke test, and (cuda instance, GPU only)
// record_stream holding a block back until the stream's work has finished and cudaHostRegister'd blocks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "ember/memory/cuda_device.h"
#include "ember/memory/pinned_pool.h"
#include "tests/harness/op_harness.h"

#if defined(EMBER_WITH_CUDA)
#include <cuda_runtime.h>

#include "tests/memory/cuda_stream_gate.h"
#endif

using namespace ember;
using memory::PinnedPool;
using memory::PinnedSource;

namespace {

constexpr int64_t KiB = 1024;
constexpr int64_t MiB = 1024 * 1024;

bool aligned_to(const void* p, int64_t a) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(a) == 0; }

}  // namespace

TEST(PinnedPool, SourceIsDecidedByTheMachine) {
  PinnedPool pool;
  if (memory::cuda::device_count() > 0) {
    EXPECT_EQ(pool.source(), PinnedSource::CudaHostAlloc);
    EXPECT_TRUE(pool.page_locked());
  } else {  // CPU-only build, or a CUDA build on a machine without a GPU: plain host memory, no failure
    EXPECT_EQ(pool.source(), PinnedSource::PlainHost);
    EXPECT_FALSE(pool.page_locked());
    EXPECT_NE(pool.name().find("not page-locked"), std::string::npos) << pool.name();
  }
  void* p = pool.allocate(100);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x3c, 100);
  pool.deallocate(p);

  memory::AllocatorConfig reg;
  reg.pinned_use_host_register = true;
  reg.pinned_num_register_threads = 4;
  PinnedPool registered(reg);
  EXPECT_EQ(registered.source(),
            memory::cuda::device_count() > 0 ? PinnedSource::CudaHostRegister : PinnedSource::PlainHost);
  for (int64_t n : {int64_t{100}, 5 * KiB, 1 * MiB + 3}) {  // one page, several pages, chunks for 4 threads
    auto* q = static_cast<unsigned char*>(registered.allocate(n));
    ASSERT_NE(q, nullptr);
    std::memset(q, 0x7e, static_cast<size_t>(n));
    EXPECT_EQ(q[n - 1], 0x7e);
    registered.deallocate(q);
  }
  registered.empty_cache();
  EXPECT_EQ(registered.stats().reserved_bytes, 0);
}

TEST(PinnedPool, BlocksArePowersOfTwo) {
  PinnedPool pool;
  // (request, block) pairs computed by hand: the smallest power of two >= max(request, 512).
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {1, 512},          {511, 512},         {512, 512},           {513, 1024},          {1000, 1024},
      {1024, 1024},      {1025, 2048},       {3000, 4096},         {4097, 8192},         {100000, 131072},
      {1 * MiB, 1 * MiB}, {1 * MiB + 1, 2 * MiB}, {5 * MiB, 8 * MiB}};
  std::vector<void*> live;
  int64_t reserved = 0;
  for (auto [request, block] : cases) {
    void* p = pool.allocate(request);
    ASSERT_NE(p, nullptr) << request;
    live.push_back(p);
    reserved += block;
    EXPECT_EQ(pool.block_size(p), block) << request;
    EXPECT_EQ(pool.stats().reserved_bytes, reserved) << request;
    EXPECT_TRUE(aligned_to(p, std::min<int64_t>(block, 4096))) << request << " at " << p;
    std::memset(p, 0xa5, static_cast<size_t>(block));  // the whole block is usable
  }
  for (void* p : live) pool.deallocate(p);
}

TEST(PinnedPool, ReuseAfterFreeReturnsTheSameBlock) {
  PinnedPool pool;
  void* p = pool.allocate(1000);
  pool.deallocate(p);
  void* q = pool.allocate(600);  // same 1024-byte bin
  EXPECT_EQ(q, p);
  EXPECT_EQ(pool.detailed_stats().num_cache_hits, 1);
  EXPECT_EQ(pool.detailed_stats().num_host_allocs, 1);
  void* r = pool.allocate(1025);  // the 2048-byte bin is empty: a new block
  EXPECT_NE(r, p);
  EXPECT_EQ(pool.detailed_stats().num_host_allocs, 2);

  // LIFO within a bin: the most recently freed block comes back first.
  void* a = pool.allocate(700);
  pool.deallocate(q);
  pool.deallocate(a);
  EXPECT_EQ(pool.allocate(1024), a);
  EXPECT_EQ(pool.allocate(513), q);
  EXPECT_EQ(pool.detailed_stats().num_host_allocs, 3);
  pool.deallocate(a);
  pool.deallocate(q);
  pool.deallocate(r);
}

// allocated_bytes counts block sizes (after rounding), requested_bytes what the callers asked for.
TEST(PinnedPool, StatisticsAreExact) {
  PinnedPool pool;
  void* a = pool.allocate(100);   // block 512
  void* b = pool.allocate(3000);  // block 4096
  void* c = pool.allocate(5000);  // block 8192
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 12800);
  EXPECT_EQ(s.totals.peak_allocated_bytes, 12800);
  EXPECT_EQ(s.totals.requested_bytes, 8100);
  EXPECT_EQ(s.totals.peak_requested_bytes, 8100);
  EXPECT_EQ(s.totals.reserved_bytes, 12800);
  EXPECT_EQ(s.totals.peak_reserved_bytes, 12800);
  EXPECT_EQ(s.totals.num_allocs, 3);
  EXPECT_EQ(s.totals.num_frees, 0);
  EXPECT_EQ(s.live_blocks, 3);
  EXPECT_EQ(s.live_block_bytes, 12800);
  EXPECT_EQ(s.cached_blocks, 0);

  pool.deallocate(b);
  s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 8704);
  EXPECT_EQ(s.totals.peak_allocated_bytes, 12800);
  EXPECT_EQ(s.totals.requested_bytes, 5100);
  EXPECT_EQ(s.totals.peak_requested_bytes, 8100);
  EXPECT_EQ(s.totals.reserved_bytes, 12800);  // cached, still held
  EXPECT_EQ(s.totals.num_frees, 1);
  EXPECT_EQ(s.live_blocks, 2);
  EXPECT_EQ(s.live_block_bytes, 8704);
  EXPECT_EQ(s.cached_blocks, 1);
  EXPECT_EQ(s.cached_bytes, 4096);
  EXPECT_EQ(s.pending_blocks, 0);

  pool.reset_peak_stats();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 8704);
  EXPECT_EQ(pool.stats().peak_requested_bytes, 5100);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 12800);

  void* d = pool.allocate(2049);  // reuses b's 4096 block
  EXPECT_EQ(d, b);
  s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 12800);
  EXPECT_EQ(s.totals.peak_allocated_bytes, 12800);
  EXPECT_EQ(s.totals.requested_bytes, 7149);
  EXPECT_EQ(s.totals.peak_requested_bytes, 7149);
  EXPECT_EQ(s.totals.reserved_bytes, 12800);
  EXPECT_EQ(s.totals.num_allocs, 4);
  EXPECT_EQ(s.num_host_allocs, 3);
  EXPECT_EQ(s.num_cache_hits, 1);

  pool.deallocate(a);  // 512 block, 100 requested
  s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 12288);
  EXPECT_EQ(s.totals.requested_bytes, 7049);

  for (void* p : {c, d}) pool.deallocate(p);
  s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 0);
  EXPECT_EQ(s.totals.requested_bytes, 0);
  EXPECT_EQ(s.totals.peak_allocated_bytes, 12800);
  EXPECT_EQ(s.totals.peak_requested_bytes, 7149);
  EXPECT_EQ(s.totals.num_frees, 4);
  EXPECT_EQ(s.live_blocks, 0);
  EXPECT_EQ(s.cached_blocks, 3);
  EXPECT_EQ(s.cached_bytes, 12800);
  EXPECT_EQ(pool.stats().num_ooms, 0);
}

TEST(PinnedPool, EmptyCacheFreesOnlyUnusedBlocks) {
  PinnedPool pool;
  void* keep = pool.allocate(10 * KiB);  // block 16384
  void* x = pool.allocate(600);          // 1024
  void* y = pool.allocate(70 * KiB);     // 131072
  pool.deallocate(x);
  pool.deallocate(y);
  pool.empty_cache();
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.totals.reserved_bytes, 16384);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.num_host_frees, 2);
  EXPECT_EQ(s.live_blocks, 1);
  std::memset(keep, 1, 10 * KiB);  // the live block survived
  // The cache is empty, so the next request goes to the system.
  void* z = pool.allocate(600);
  EXPECT_EQ(pool.detailed_stats().num_host_allocs, 4);
  EXPECT_EQ(pool.detailed_stats().num_cache_hits, 0);
  pool.deallocate(z);
  pool.deallocate(keep);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  EXPECT_EQ(pool.detailed_stats().num_host_frees, 4);
}

TEST(PinnedPool, ZeroSizeAndErrors) {
  PinnedPool pool;
  EXPECT_EQ(pool.allocate(0), nullptr);
  pool.deallocate(nullptr);
  EXPECT_EQ(pool.stats().num_allocs, 0);
  EXPECT_EQ(pool.stats().num_frees, 0);
  EXPECT_THROW(pool.allocate(-1), ValueError);

  void* p = pool.allocate(64);
  int local = 0;
  EXPECT_THROW(pool.deallocate(&local), ValueError);       // not ours
  EXPECT_THROW(pool.record_stream(&local, 0), ValueError);  // not ours
  EXPECT_THROW(pool.block_size(&local), ValueError);
  pool.deallocate(p);
  EXPECT_THROW(pool.deallocate(p), ValueError);  // double free
  EXPECT_THROW(pool.record_stream(p, 0), ValueError);  // freed
  EXPECT_EQ(pool.stats().num_frees, 1);
}

TEST(PinnedPool, RecordStreamWithoutGpuReusesImmediately) {
  PinnedPool pool;
  if (pool.page_locked()) GTEST_SKIP() << "with a GPU, reuse waits on a real stream (see the cuda instance)";
  void* p = pool.allocate(4096);
  pool.record_stream(p, 0);
  pool.record_stream(p, 12345);  // any stream id: nothing runs on devices here
  pool.deallocate(p);
  EXPECT_EQ(pool.detailed_stats().pending_blocks, 0);
  EXPECT_EQ(pool.allocate(4096), p);
  pool.deallocate(p);
}

TEST(PinnedPool, PoisonsNewAllocations) {
  const bool before = memory::poison_allocations();
  memory::set_poison_allocations(true);
  PinnedPool pool;
  auto* p = static_cast<unsigned char*>(pool.allocate(300));
  for (int i = 0; i < 300; ++i) ASSERT_EQ(p[i], memory::kPoisonByte) << i;
  std::memset(p, 0, 300);
  pool.deallocate(p);
  auto* q = static_cast<unsigned char*>(pool.allocate(300));  // reused block is poisoned again
  EXPECT_EQ(q, p);
  for (int i = 0; i < 300; ++i) ASSERT_EQ(q[i], memory::kPoisonByte) << i;
  pool.deallocate(q);
  memory::set_poison_allocations(before);
}

TEST(PinnedPool, OutOfMemoryThrowsAndThePoolStaysUsable) {
  PinnedPool pool;
  void* p = pool.allocate(1000);
  pool.deallocate(p);  // a cached block the failed request frees before giving up
  EXPECT_THROW(pool.allocate(int64_t{1} << 60), OutOfMemoryError);
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.totals.num_ooms, 1);
  EXPECT_EQ(s.cached_blocks, 0);
  EXPECT_EQ(s.num_host_frees, 1);
  EXPECT_EQ(s.totals.reserved_bytes, 0);
  EXPECT_EQ(s.totals.allocated_bytes, 0);
  EXPECT_EQ(s.totals.requested_bytes, 0);
  void* q = pool.allocate(1000);
  ASSERT_NE(q, nullptr);
  pool.deallocate(q);
  EXPECT_THROW(pool.allocate((int64_t{1} << 62) + 1), ValueError);
}

TEST(PinnedPool, ConcurrentAllocateAndFree) {
  PinnedPool pool;
  constexpr int kThreads = 8;
  constexpr int kIters = 3000;
  const uint64_t seed = ember::testing::test_seed();
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      std::uniform_int_distribution<int64_t> size(1, 20000);
      std::vector<std::pair<unsigned char*, int64_t>> held;
      const auto mark = static_cast<unsigned char>(t + 1);
      for (int i = 0; i < kIters; ++i) {
        if (held.size() < 8 && (held.empty() || rng() % 2 == 0)) {
          const int64_t n = size(rng);
          auto* p = static_cast<unsigned char*>(pool.allocate(n));
          std::memset(p, mark, static_cast<size_t>(n));
          held.emplace_back(p, n);
        } else {
          const size_t k = rng() % held.size();
          auto [p, n] = held[k];
          // Another thread writing into this block would show up here.
          if (p[0] != mark || p[n / 2] != mark || p[n - 1] != mark) corrupted.fetch_add(1);
          pool.deallocate(p);
          held[k] = held.back();
          held.pop_back();
        }
      }
      for (auto [p, n] : held) pool.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0) << "seed " << seed;
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.totals.allocated_bytes, 0);
  EXPECT_EQ(s.totals.requested_bytes, 0);
  EXPECT_EQ(s.totals.num_allocs, s.totals.num_frees);
  EXPECT_EQ(s.live_blocks, 0);
  EXPECT_EQ(s.cached_bytes, s.totals.reserved_bytes);
  EXPECT_EQ(s.num_cache_hits + s.num_host_allocs, s.totals.num_allocs);
  EXPECT_LE(s.totals.peak_requested_bytes, s.totals.peak_allocated_bytes);
  EXPECT_LE(s.totals.peak_allocated_bytes, s.totals.peak_reserved_bytes);
  EXPECT_GT(s.totals.peak_requested_bytes, 0);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
}

TEST(PinnedPool, ProcessWidePool) {
  PinnedPool& pool = memory::pinned_pool();
  EXPECT_EQ(&pool, &memory::pinned_pool());
  void* p = pool.allocate(123);
  EXPECT_EQ(pool.block_size(p), 512);
  pool.deallocate(p);
}

// GPU: a block recorded on a stream is not reused until the stream's work has finished.
class PinnedPoolDeviceTest : public ember::testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    if (!device().is_cuda()) GTEST_SKIP() << "stream-ordered reuse is tested on the cuda instance";
  }
};

#if defined(EMBER_WITH_CUDA)

namespace {
using cuda_test::StreamGate;
using cuda_test::wait_for_flag;
}  // namespace

TEST_P(PinnedPoolDeviceTest, RecordStreamDefersReuse) {
  PinnedPool pool;
  ASSERT_EQ(pool.source(), PinnedSource::CudaHostAlloc);
  // Both blocks come from the system before the stream is held busy, so nothing below calls cudaHostAlloc (which
  // may synchronise) while the host function blocks.
  void* p = pool.allocate(64 * KiB);
  void* spare = pool.allocate(64 * KiB);
  pool.deallocate(spare);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> go{false};
  ASSERT_EQ(cudaLaunchHostFunc(stream, wait_for_flag, &go), cudaSuccess);  // the stream is busy until go
  const StreamGate gate{go, stream};  // opens the stream even if the test bails out early

  pool.record_stream(p, reinterpret_cast<memory::StreamId>(stream));
  pool.deallocate(p);
  EXPECT_EQ(pool.detailed_stats().pending_blocks, 1);
  void* q = pool.allocate(64 * KiB);  // p is still in use by the stream: the spare block comes back
  EXPECT_EQ(q, spare);
  EXPECT_EQ(pool.detailed_stats().pending_blocks, 1);

  go.store(true);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  void* r = pool.allocate(64 * KiB);  // the event has completed: p comes back
  EXPECT_EQ(r, p);
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.pending_blocks, 0);
  EXPECT_EQ(s.live_blocks, 2);
  EXPECT_EQ(s.num_host_allocs, 2);

  // A pinned block is a valid source for an async copy to the device.
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64 * KiB), cudaSuccess);
  std::memset(r, 0x42, 64 * KiB);
  ASSERT_EQ(cudaMemcpyAsync(dev, r, 64 * KiB, cudaMemcpyHostToDevice, stream), cudaSuccess);
  std::vector<unsigned char> back(64 * KiB, 0);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dev, 64 * KiB, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(back.front(), 0x42);
  EXPECT_EQ(back.back(), 0x42);
  ASSERT_EQ(cudaFree(dev), cudaSuccess);

  pool.deallocate(q);
  pool.deallocate(r);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
}

// pinned_use_cuda_host_register: the pages are touched by several threads but the block is registered as one range,
// so an async copy may cross any page of it and only the block's start unregisters it.
TEST_P(PinnedPoolDeviceTest, HostRegisterPinsTheWholeBlockOnce) {
  memory::AllocatorConfig reg;
  reg.pinned_use_host_register = true;
  reg.pinned_num_register_threads = 4;
  PinnedPool pool(reg);
  ASSERT_EQ(pool.source(), PinnedSource::CudaHostRegister);
  auto* p = static_cast<unsigned char*>(pool.allocate(1 * MiB));  // 4 threads: 256 KiB of pages each
  ASSERT_NE(p, nullptr);
  for (int64_t off : {int64_t{0}, 256 * KiB - 1, 256 * KiB, 700 * KiB, 1 * MiB - 1}) {
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, p + off), cudaSuccess) << off;
    EXPECT_EQ(attr.type, cudaMemoryTypeHost) << off;  // page-locked (registered), not pageable
  }
  // A second-quarter address is inside the registration, not the start of one of its own.
  EXPECT_NE(cudaHostUnregister(p + 256 * KiB), cudaSuccess);
  (void)cudaGetLastError();

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 8 * KiB), cudaSuccess);
  unsigned char* across = p + 256 * KiB - 4 * KiB;  // 8 KiB straddling the first quarter boundary
  for (int i = 0; i < 8 * KiB; ++i) across[i] = static_cast<unsigned char>(i * 7 + 1);
  std::vector<unsigned char> back(8 * KiB, 0);
  ASSERT_EQ(cudaMemcpyAsync(dev, across, 8 * KiB, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dev, 8 * KiB, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < 8 * KiB; ++i) ASSERT_EQ(back[i], static_cast<unsigned char>(i * 7 + 1)) << i;
  ASSERT_EQ(cudaFree(dev), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);

  pool.deallocate(p);
  EXPECT_NO_THROW(pool.empty_cache());  // one cudaHostUnregister on the block's start
  EXPECT_EQ(pool.stats().reserved_bytes, 0);
  EXPECT_EQ(pool.detailed_stats().num_host_frees, 1);
}

// Stream 0 is the legacy default stream of the device current at record_stream: the event goes there.
TEST_P(PinnedPoolDeviceTest, RecordOnTheDefaultStream) {
  PinnedPool pool;
  ASSERT_EQ(pool.source(), PinnedSource::CudaHostAlloc);
  void* p = pool.allocate(4 * KiB);
  pool.record_stream(p, 0);
  pool.record_stream(p, 0);  // recorded once
  pool.deallocate(p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pool.allocate(4 * KiB), p);  // the event has completed
  memory::PinnedPoolStats s = pool.detailed_stats();
  EXPECT_EQ(s.pending_blocks, 0);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.totals.allocated_bytes, 4 * KiB);
  pool.deallocate(p);
}

#else

TEST_P(PinnedPoolDeviceTest, RecordStreamDefersReuse) { GTEST_SKIP() << "built without CUDA"; }
TEST_P(PinnedPoolDeviceTest, HostRegisterPinsTheWholeBlockOnce) { GTEST_SKIP() << "built without CUDA"; }
TEST_P(PinnedPoolDeviceTest, RecordOnTheDefaultStream) { GTEST_SKIP() << "built without CUDA"; }

#endif

EMBER_INSTANTIATE_DEVICE_TESTS(PinnedPoolDeviceTest);
