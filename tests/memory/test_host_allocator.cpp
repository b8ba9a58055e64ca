// Host allocator: 64-byte alignment, zero-size requests, exact statistics across tensor lifetimes (measured as deltas,
// since other tests in the process may hold memory), invalid frees, thread safety, format_bytes, and the CUDA
// device query on a machine that may have no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "ember/core/storage.h"
#include "ember/core/tensor.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/host_allocator.h"
#include "tests/harness/op_harness.h"

using namespace ember;
using memory::AllocatorStats;

namespace {

memory::Allocator& host() { return memory::host_allocator(); }

int64_t round64(int64_t n) { return (n + 63) / 64 * 64; }

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

}  // namespace

TEST(HostAllocator, Identity) {
  EXPECT_EQ(&memory::host_allocator(), &memory::host_allocator());
  EXPECT_EQ(&allocator_for(Device::cpu()), static_cast<memory::Allocator*>(&memory::cpu_allocator()));
  EXPECT_EQ(host().name(), "host");
  EXPECT_EQ(memory::kAlignment, 64);
}

TEST(HostAllocator, AlignmentOf64) {
  std::vector<void*> ptrs;
  for (int64_t n : {1, 3, 8, 63, 64, 65, 100, 1000, 4097, 1 << 20}) {
    void* p = host().allocate(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_TRUE(aligned64(p)) << n << " bytes at " << p;
    std::memset(p, 0xab, static_cast<size_t>(n));  // the whole request is writable
    ptrs.push_back(p);
  }
  for (void* p : ptrs) host().deallocate(p);
  // Tensor data comes from the same allocator.
  for (int64_t n : {1, 7, 33}) EXPECT_TRUE(aligned64(empty({n}, DType::u8).raw_data())) << n;
}

TEST(HostAllocator, ZeroSizeReturnsNullptr) {
  const AllocatorStats before = host().stats();
  EXPECT_EQ(host().allocate(0), nullptr);
  host().deallocate(nullptr);  // a no-op
  const AllocatorStats after = host().stats();
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  EXPECT_EQ(after.num_frees, before.num_frees);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  // An empty tensor holds no bytes.
  Tensor e = zeros({0, 5});
  EXPECT_EQ(e.storage()->data(), nullptr);
  EXPECT_EQ(host().stats().num_allocs, before.num_allocs);
  EXPECT_THROW(host().allocate(-1), ValueError);
}

TEST(HostAllocator, RawStatisticsExact) {
  const AllocatorStats s0 = host().stats();
  void* a = host().allocate(100);
  AllocatorStats s = host().stats();
  EXPECT_EQ(s.allocated_bytes - s0.allocated_bytes, 100);
  EXPECT_EQ(s.reserved_bytes - s0.reserved_bytes, 128);  // rounded up to 64
  EXPECT_EQ(s.num_allocs - s0.num_allocs, 1);
  void* b = host().allocate(64);
  s = host().stats();
  EXPECT_EQ(s.allocated_bytes - s0.allocated_bytes, 164);
  EXPECT_EQ(s.reserved_bytes - s0.reserved_bytes, 192);
  EXPECT_GE(s.peak_allocated_bytes, s.allocated_bytes);
  EXPECT_GE(s.reserved_bytes, s.allocated_bytes);
  host().deallocate(a);
  s = host().stats();
  EXPECT_EQ(s.allocated_bytes - s0.allocated_bytes, 64);
  EXPECT_EQ(s.reserved_bytes - s0.reserved_bytes, 64);
  EXPECT_EQ(s.num_frees - s0.num_frees, 1);
  host().deallocate(b);
  s = host().stats();
  EXPECT_EQ(s.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(s.num_allocs - s0.num_allocs, 2);
  EXPECT_EQ(s.num_frees - s0.num_frees, 2);
  EXPECT_EQ(s.num_ooms, s0.num_ooms);
}

TEST(HostAllocator, PeakAndReset) {
  host().reset_peak_stats();
  const AllocatorStats s0 = host().stats();
  EXPECT_EQ(s0.peak_allocated_bytes, s0.allocated_bytes);
  void* big = host().allocate(1000);
  host().deallocate(big);
  void* small = host().allocate(10);
  AllocatorStats s = host().stats();
  EXPECT_EQ(s.peak_allocated_bytes - s0.allocated_bytes, 1000);
  EXPECT_EQ(s.allocated_bytes - s0.allocated_bytes, 10);
  host().reset_peak_stats();
  EXPECT_EQ(host().stats().peak_allocated_bytes - s0.allocated_bytes, 10);
  host().deallocate(small);
  EXPECT_EQ(host().stats().peak_allocated_bytes - s0.allocated_bytes, 10);  // the peak stays until the next reset
  host().reset_peak_stats();
  EXPECT_EQ(host().stats().peak_allocated_bytes, s0.allocated_bytes);
}

// CPU tensors come from the CPU caching allocator, which rounds every request up to a multiple of 512 bytes.
TEST(CpuTensors, LifetimesStatisticsExact) {
  memory::Allocator& cpu = memory::cpu_allocator();
  cpu.reset_peak_stats();
  const AllocatorStats s0 = cpu.stats();
  auto allocated = [&] { return cpu.stats().allocated_bytes - s0.allocated_bytes; };
  auto allocs = [&] { return cpu.stats().num_allocs - s0.num_allocs; };
  auto frees = [&] { return cpu.stats().num_frees - s0.num_frees; };
  {
    Tensor a = empty({1000}, DType::f32);  // 4000 B -> 4096
    Tensor b = zeros({3, 5}, DType::f64);  // 120 B -> 512
    EXPECT_EQ(allocated(), 4608);
    EXPECT_EQ(allocs(), 2);
    // Views allocate nothing.
    Tensor v = a.view({10, 100}).t().slice(0, 0, 50, 2);
    Tensor w = b.expand({4, 3, 5}).select(0, 1);
    Tensor r = a.reshape({20, 50});
    EXPECT_EQ(allocs(), 2);
    EXPECT_EQ(allocated(), 4608);
    {
      Tensor c = b.t().contiguous();  // a copy: another 512
      Tensor d = b.to(DType::f16);    // 30 B -> 512
      EXPECT_EQ(allocated(), 5632);
      EXPECT_EQ(allocs(), 4);
      EXPECT_EQ(frees(), 0);
      EXPECT_EQ(cpu.stats().peak_allocated_bytes - s0.allocated_bytes, 5632);
    }
    EXPECT_EQ(allocated(), 4608);
    EXPECT_EQ(frees(), 2);
    // Storage outlives the tensor object that made it while a view holds it.
    a = Tensor();
    EXPECT_EQ(allocated(), 4608);
    v = Tensor();
    EXPECT_EQ(allocated(), 4608);
    r = Tensor();
    EXPECT_EQ(allocated(), 512);
    EXPECT_EQ(frees(), 3);
  }
  EXPECT_EQ(allocated(), 0);
}

TEST(HostAllocator, InvalidFreesThrow) {
  const AllocatorStats s0 = host().stats();
  int local = 0;
  EXPECT_THROW(host().deallocate(&local), ValueError);
  void* p = host().allocate(16);
  EXPECT_THROW(host().deallocate(static_cast<char*>(p) + 1), ValueError);  // interior pointer
  host().deallocate(p);
  EXPECT_THROW(host().deallocate(p), ValueError);  // double free
  const AllocatorStats s = host().stats();
  EXPECT_EQ(s.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s.num_frees - s0.num_frees, 1);  // failed frees are not counted
  try {
    host().deallocate(&local);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("deallocate"), std::string::npos) << e.what();
  }
}

// Under AddressSanitizer this needs allocator_may_return_null=1 (set by the debug-asan test preset).
TEST(HostAllocator, HugeRequestIsOutOfMemoryError) {
  const AllocatorStats s0 = host().stats();
  const int64_t huge = int64_t{1} << 62;
  try {
    (void)host().allocate(huge);
    FAIL() << "allocating 4 EiB succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), huge);
    EXPECT_EQ(e.allocated(), s0.allocated_bytes);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  const AllocatorStats s = host().stats();
  EXPECT_EQ(s.num_ooms - s0.num_ooms, 1);
  EXPECT_EQ(s.num_allocs, s0.num_allocs);
  EXPECT_EQ(s.allocated_bytes, s0.allocated_bytes);
}

TEST(HostAllocator, ThreadSafetySmoke) {
  const AllocatorStats s0 = host().stats();
  constexpr int kThreads = 4, kIters = 10000, kLive = 8;
  std::vector<int> corrupt(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &corrupt] {
      // Each thread keeps up to kLive blocks alive, stamps them with its id and checks the stamp on free:
      // overlapping live blocks handed to two threads would show up as a wrong stamp.
      void* live[kLive] = {};
      int64_t sizes[kLive] = {};
      uint32_t rng = 12345u + static_cast<uint32_t>(t);
      for (int i = 0; i < kIters; ++i) {
        const int slot = i % kLive;
        if (live[slot] != nullptr) {
          const unsigned char* p = static_cast<const unsigned char*>(live[slot]);
          if (p[0] != t || p[sizes[slot] - 1] != t) ++corrupt[t];
          memory::host_allocator().deallocate(live[slot]);
        }
        rng = rng * 1664525u + 1013904223u;
        sizes[slot] = 1 + static_cast<int64_t>((rng >> 8) % 4096);
        live[slot] = memory::host_allocator().allocate(sizes[slot]);
        std::memset(live[slot], t, static_cast<size_t>(sizes[slot]));
      }
      for (int slot = 0; slot < kLive; ++slot) memory::host_allocator().deallocate(live[slot]);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(corrupt[t], 0) << "thread " << t;
  const AllocatorStats s = host().stats();
  EXPECT_EQ(s.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(s.num_allocs - s0.num_allocs, kThreads * kIters);
  EXPECT_EQ(s.num_frees - s0.num_frees, kThreads * kIters);
  EXPECT_GE(s.peak_allocated_bytes, s.allocated_bytes);
}

TEST(CpuTensors, StorageReleasesOnDestruction) {
  memory::Allocator& cpu = memory::cpu_allocator();
  const AllocatorStats s0 = cpu.stats();
  {
    StorageImpl st(256, Device::cpu());
    EXPECT_NE(st.data(), nullptr);
    EXPECT_EQ(st.nbytes(), 256);
    EXPECT_EQ(cpu.stats().allocated_bytes - s0.allocated_bytes, 512);  // rounded to the 512 B minimum block
  }
  EXPECT_EQ(cpu.stats().allocated_bytes, s0.allocated_bytes);
  EXPECT_THROW(StorageImpl(-1, Device::cpu()), ValueError);
  StorageImpl meta(1 << 30, Device::meta());
  EXPECT_EQ(meta.data(), nullptr);
  EXPECT_EQ(meta.nbytes(), 1 << 30);
  EXPECT_EQ(cpu.stats().num_allocs - s0.num_allocs, 1);
}

TEST(FormatBytes, Values) {
  EXPECT_EQ(memory::format_bytes(0), "0 B");
  EXPECT_EQ(memory::format_bytes(1), "1 B");
  EXPECT_EQ(memory::format_bytes(1023), "1023 B");
  EXPECT_EQ(memory::format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(memory::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(memory::format_bytes(1048575), "1024.00 KiB");  // 1023.999 KiB printed with 2 decimals
  EXPECT_EQ(memory::format_bytes(int64_t{1} << 20), "1.00 MiB");
  EXPECT_EQ(memory::format_bytes(int64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(memory::format_bytes(int64_t{6} << 30), "6.00 GiB");
  EXPECT_EQ(memory::format_bytes(int64_t{5} << 40), "5.00 TiB");
  EXPECT_EQ(memory::format_bytes(int64_t{1} << 50), "1024.00 TiB");  // TiB is the largest unit
  EXPECT_EQ(memory::format_bytes(-2048), "-2.00 KiB");
  EXPECT_EQ(memory::format_bytes(-5), "-5 B");
}

TEST(CudaDevice, CountWithoutGpu) {
  int n = -1;
  EXPECT_NO_THROW(n = memory::cuda::device_count());
  EXPECT_GE(n, 0);
  EXPECT_EQ(memory::cuda::is_available(), n > 0);
  if (n == 0) {
    EXPECT_THROW(allocator_for(Device::cuda(0)), DeviceError);
    EXPECT_THROW(memory::cuda::allocator(0), DeviceError);
    EXPECT_THROW(memory::cuda::synchronize(0), DeviceError);
    char buf[4] = {};
    EXPECT_THROW(memory::cuda::copy_bytes(buf, buf, 4, memory::cuda::CopyKind::HostToDevice, 0), DeviceError);
    EXPECT_THROW(empty({2}, Device::cuda(0)), DeviceError);
  } else {
    EXPECT_THROW(allocator_for(Device::cuda(n)), DeviceError);  // one past the last device
  }
}
