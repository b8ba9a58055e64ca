// CUDA backing of the caching allocator (cuda instance, GPU only): segments, out-of-memory as nullptr, pooled events
// against a stream held busy by a host function, expandable segments mapped page by page and written with
// cudaMemset, and a CachingAllocator running over it. Without a GPU only the factory's refusal is tested.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "ember/memory/cuda_backing.h"
#include "ember/memory/cuda_device.h"
#include "tests/harness/op_harness.h"

#if defined(EMBER_WITH_CUDA)
#include <cuda_runtime.h>

#include "tests/memory/cuda_stream_gate.h"

#include "ember/memory/caching_allocator.h"
#endif

using namespace ember;

class CudaBackingTest : public ember::testing::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    if (!device().is_cuda()) GTEST_SKIP() << "the CUDA backing is tested on the cuda instance";
  }
};

#if defined(EMBER_WITH_CUDA)

namespace {

constexpr int64_t MiB = 1024 * 1024;
constexpr int64_t GiB = 1024 * MiB;

using cuda_test::StreamGate;
using cuda_test::wait_for_flag;

// Reads `n` bytes of device memory at `p` back to the host.
std::vector<unsigned char> read_back(const void* p, int64_t n) {
  std::vector<unsigned char> host(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(host.data(), p, static_cast<size_t>(n), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// Index of the first byte of [begin, end) that is not `value`, or -1.
int64_t first_mismatch(const std::vector<unsigned char>& v, int64_t begin, int64_t end, unsigned char value) {
  for (int64_t i = begin; i < end; ++i)
    if (v[static_cast<size_t>(i)] != value) return i;
  return -1;
}

char* at(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

}  // namespace

TEST(CudaBacking, FactoryRejectsMissingDevice) {
  EXPECT_THROW(memory::make_cuda_backing(memory::cuda::device_count()), DeviceError);
  EXPECT_THROW(memory::make_cuda_backing(-1), DeviceError);
}

TEST_P(CudaBackingTest, MallocWriteReadFree) {
  auto backing = memory::make_cuda_backing(0);
  EXPECT_EQ(backing->name(), "cuda:0");
  EXPECT_TRUE(backing->materialized());
  const int64_t capacity = backing->capacity();
  const int64_t before = backing->available();
  EXPECT_GT(capacity, 0);
  EXPECT_GT(before, 0);
  EXPECT_LE(before, capacity);

  const int64_t n = 256 * MiB;
  void* p = backing->malloc(n);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  EXPECT_LE(backing->available(), before - n + 16 * MiB);  // the device really gave the bytes
  ASSERT_EQ(cudaMemset(p, 0x5a, static_cast<size_t>(n)), cudaSuccess);
  const auto host = read_back(p, n);
  EXPECT_EQ(first_mismatch(host, 0, n, 0x5a), -1);
  backing->free(p, n);
  EXPECT_GE(backing->available(), before - 16 * MiB);
  EXPECT_THROW(backing->malloc(0), ValueError);
}

TEST_P(CudaBackingTest, TooLargeReturnsNullptrAndClearsTheError) {
  auto backing = memory::make_cuda_backing(0);
  EXPECT_EQ(backing->malloc(backing->capacity() + GiB), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = backing->malloc(MiB);  // the device is still usable
  ASSERT_NE(p, nullptr);
  backing->free(p, MiB);
}

TEST_P(CudaBackingTest, EventsCompleteAfterSynchronizeAndArePooled) {
  memory::CudaBacking backing(0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> go{false};
  ASSERT_EQ(cudaLaunchHostFunc(stream, wait_for_flag, &go), cudaSuccess);  // busy until go
  const StreamGate gate{go, stream};  // opens the stream even if the test bails out early

  const memory::EventId busy = backing.record_event(reinterpret_cast<memory::StreamId>(stream));
  const memory::EventId idle = backing.record_event(0);  // legacy default stream: nothing queued
  EXPECT_NE(busy, idle);
  EXPECT_FALSE(backing.event_completed(busy));
  go.store(true);
  backing.synchronize();
  EXPECT_TRUE(backing.event_completed(busy));
  EXPECT_TRUE(backing.event_completed(idle));
  EXPECT_EQ(backing.pooled_events(), 2);

  // Released events are reused, not recreated.
  backing.release_event(busy);
  const memory::EventId again = backing.record_event(reinterpret_cast<memory::StreamId>(stream));
  EXPECT_EQ(again, busy);
  EXPECT_EQ(backing.pooled_events(), 2);
  backing.synchronize();
  EXPECT_TRUE(backing.event_completed(again));
  backing.release_event(again);
  backing.release_event(idle);
  EXPECT_THROW(backing.release_event(idle), ValueError);    // released twice
  EXPECT_THROW(backing.event_completed(999), ValueError);  // never handed out
}

TEST_P(CudaBackingTest, ExpandableMapWriteUnmap) {
  memory::CudaBacking backing(0);
  if (!backing.supports_expandable()) GTEST_SKIP() << "no virtual-memory support on this device/driver";
  const int64_t page = backing.page_size();
  EXPECT_GE(page, 2 * MiB);

  void* base = backing.reserve_range(8 * page);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % static_cast<uintptr_t>(page), 0u);
  const int64_t free_before = backing.available();

  ASSERT_TRUE(backing.map(base, 3 * page));
  EXPECT_EQ(backing.mapped_pages(), 3);
  ASSERT_EQ(cudaMemset(base, 0x11, static_cast<size_t>(3 * page)), cudaSuccess);
  ASSERT_TRUE(backing.map(at(base, 3 * page), 2 * page));  // grows the range contiguously
  EXPECT_EQ(backing.mapped_pages(), 5);
  EXPECT_LE(backing.available(), free_before - 4 * page);
  ASSERT_EQ(cudaMemset(at(base, 2 * page), 0x22, static_cast<size_t>(3 * page)), cudaSuccess);  // across the seam
  auto host = read_back(base, 5 * page);
  EXPECT_EQ(first_mismatch(host, 0, 2 * page, 0x11), -1);
  EXPECT_EQ(first_mismatch(host, 2 * page, 5 * page, 0x22), -1);

  EXPECT_THROW(backing.map(at(base, 4 * page), page), ValueError);      // already mapped
  EXPECT_THROW(backing.map(at(base, 512), page), ValueError);           // not page aligned
  EXPECT_THROW(backing.map(at(base, 7 * page), 2 * page), ValueError);  // past the range

  backing.unmap(at(base, 3 * page), 2 * page);
  EXPECT_EQ(backing.mapped_pages(), 3);
  host = read_back(base, 3 * page);  // the pages still mapped keep their contents
  EXPECT_EQ(first_mismatch(host, 0, 2 * page, 0x11), -1);
  EXPECT_EQ(first_mismatch(host, 2 * page, 3 * page, 0x22), -1);
  ASSERT_TRUE(backing.map(at(base, 3 * page), page));  // remap after unmap
  ASSERT_EQ(cudaMemset(at(base, 3 * page), 0x33, static_cast<size_t>(page)), cudaSuccess);
  host = read_back(at(base, 3 * page), page);
  EXPECT_EQ(first_mismatch(host, 0, page, 0x33), -1);

  backing.release_range(base, 8 * page);  // unmaps what is left
  EXPECT_EQ(backing.mapped_pages(), 0);
  EXPECT_GE(backing.available(), free_before - page);
}

TEST_P(CudaBackingTest, ExpandableMapOutOfMemoryLeavesNothingMapped) {
  memory::CudaBacking backing(0);
  if (!backing.supports_expandable()) GTEST_SKIP() << "no virtual-memory support on this device/driver";
  const int64_t page = backing.page_size();
  // Take all but about 1 GiB with an ordinary segment, so the mapping below runs out quickly.
  void* hog = nullptr;
  int64_t hog_size = backing.available() - GiB;
  while (hog_size > 0 && (hog = backing.malloc(hog_size)) == nullptr) hog_size -= GiB;
  const int64_t free_left = backing.available();
  const int64_t pages = free_left / page + 64;
  void* base = backing.reserve_range(pages * page);
  ASSERT_NE(base, nullptr);
  EXPECT_FALSE(backing.map(base, pages * page));
  EXPECT_EQ(backing.mapped_pages(), 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_GE(backing.available(), free_left - page);  // the pages created before the failure were released
  ASSERT_TRUE(backing.map(base, 2 * page));           // and mapping works again
  ASSERT_EQ(cudaMemset(base, 0x44, static_cast<size_t>(2 * page)), cudaSuccess);
  const auto host = read_back(base, 2 * page);
  EXPECT_EQ(first_mismatch(host, 0, 2 * page, 0x44), -1);
  backing.release_range(base, pages * page);
  if (hog != nullptr) backing.free(hog, hog_size);
}

TEST_P(CudaBackingTest, CachingAllocatorOverCuda) {
  memory::CachingAllocator alloc(memory::make_cuda_backing(0), memory::AllocatorConfig{}, "cuda:0");
  void* p = alloc.allocate(1000);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(cudaMemset(p, 0x6b, 1000), cudaSuccess);
  const auto host = read_back(p, 1000);
  EXPECT_EQ(first_mismatch(host, 0, 1000, 0x6b), -1);
  const memory::DeviceStats s = alloc.device_stats();
  EXPECT_EQ(s.allocated_bytes[memory::kAggregatePool].current, 1024);  // 512-byte rounding
  EXPECT_EQ(s.requested_bytes[memory::kAggregatePool].current, 1000);
  EXPECT_EQ(s.reserved_bytes[memory::kAggregatePool].current, 2 * MiB);  // one small-pool segment
  alloc.deallocate(p);
  void* q = alloc.allocate(1000);  // served from the cache
  EXPECT_EQ(q, p);
  void* big = alloc.allocate(30 * MiB);
  ASSERT_NE(big, nullptr);
  ASSERT_EQ(cudaMemset(big, 0, 30 * MiB), cudaSuccess);
  alloc.check_invariants();
  alloc.deallocate(q);
  alloc.deallocate(big);
  EXPECT_THROW(alloc.allocate(alloc.backing().capacity() + GiB), OutOfMemoryError);
  alloc.check_invariants();
  alloc.empty_cache();
  EXPECT_EQ(alloc.device_stats().reserved_bytes[memory::kAggregatePool].current, 0);
  void* again = alloc.allocate(5 * MiB);  // usable after the OOM
  ASSERT_NE(again, nullptr);
  alloc.deallocate(again);
}

TEST_P(CudaBackingTest, CachingAllocatorWithExpandableSegments) {
  auto backing = memory::make_cuda_backing(0);
  if (!backing->supports_expandable()) GTEST_SKIP() << "no virtual-memory support on this device/driver";
  memory::AllocatorConfig config;
  config.expandable_segments = true;
  memory::CachingAllocator alloc(std::move(backing), config, "cuda:0 expandable");
  std::vector<void*> live;
  for (int64_t n : {3 * MiB, 30 * MiB, 7 * MiB, 64 * MiB}) {
    void* p = alloc.allocate(n);
    ASSERT_NE(p, nullptr) << n;
    ASSERT_EQ(cudaMemset(p, 0x19, static_cast<size_t>(n)), cudaSuccess) << n;
    const auto host = read_back(p, n);
    EXPECT_EQ(first_mismatch(host, 0, n, 0x19), -1) << n;
    live.push_back(p);
  }
  alloc.check_invariants();
  for (void* p : live) alloc.deallocate(p);
  alloc.empty_cache();
  alloc.check_invariants();
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
}

#else

TEST_P(CudaBackingTest, BuiltWithoutCuda) { GTEST_SKIP() << "ember was built without CUDA"; }

#endif

EMBER_INSTANTIATE_DEVICE_TESTS(CudaBackingTest);
