// A CPU emulator of the CUDA execution model, enough to run ember's warp-synchronous kernels on a machine without a
// GPU: every thread of a block is a fiber (ucontext) on the calling thread, scheduled round-robin with the warps of a
// block skewed (some run in every round, others in every second to fourth, and one late warp only when the others
// all wait, so they drift apart between barriers as on a GPU and an unordered shared-memory access tends to read the
// wrong bytes); __syncthreads,
// the warp shuffles (xor, down), ldmatrix and mma.sync m16n8k16 are rendezvous points where a fiber yields until its
// block (or warp) has arrived. Blocks of a launch run one after the other (a cluster's blocks together), so
// `__shared__` variables (defined here as function-local statics) belong to the running block. Include this header,
// then the kernel header (it defines the CUDA keywords the kernels use), and launch with simt::launch. Invariant: 1-D
// blocks of whole warps; a barrier that not every live thread of the block (or warp) reaches is reported as a deadlock
// (SimtError), never hangs. cp.async copies land at their wait (simt::cp_async). What it does not model: memory
// ordering between threads beyond the barriers and waits, bank conflicts, timing, and any instruction not defined
// here.
#pragma once

// Device code guarded for nvcc (block_reduce.cuh) also compiles for the emulator.
#define EMBER_SIMT_EMULATION 1

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <type_traits>

#include "ember/core/half.h"

namespace ember::testing::simt {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

// A kernel that broke the execution model (barrier divergence, a block size that is not whole warps).
struct SimtError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Index and size of the emulated thread running now.
struct ThreadIndex {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
  int lane = 0;
};
const ThreadIndex& current();

// Runs kernel() as grid.x * grid.y * grid.z blocks of `block` threads (a multiple of 32, at most 1024), with
// `dynamic_shared` bytes of dynamic shared memory (EMBER_DYNAMIC_SHARED; 4096-byte aligned, zeroed before the first
// block). Throws SimtError on deadlock.
// With cluster > 1, grid.x is cut into clusters of `cluster` consecutive blocks that run together (their fibers
// interleave), each with its own dynamic shared memory, so they can meet at cluster_sync and reach each other's shared
// memory (map_shared). Function-static `__shared__` variables would be shared by a cluster's blocks: kernels launched
// in clusters keep their shared state in dynamic shared memory.
void launch(Dim3 grid, unsigned block, const std::function<void()>& kernel, size_t dynamic_shared = 0,
            unsigned cluster = 1);
inline void launch(unsigned grid, unsigned block, const std::function<void()>& kernel) {
  launch(Dim3{grid, 1, 1}, block, kernel);
}
// The running launch's dynamic shared memory.
void* dynamic_shared();

// Block-wide barrier of the running thread's block.
void syncthreads();
// Rank of the running thread's block in its cluster (%cluster_ctarank).
unsigned cluster_ctarank();
// barrier.cluster.arrive + wait: every thread of every block of the cluster.
void cluster_sync();
// mapa: the address in block `rank`'s dynamic shared memory at p's offset in the running block's.
void* map_shared(const void* p, unsigned rank);
// Every lane of the running thread's warp contributes `bytes` from `in`; once all 32 have, each receives the 32
// contributions, lane order, in `all` (32 * bytes).
void warp_exchange(const void* in, size_t bytes, void* all);
// Every lane contributes `in_bytes` from `in`; once all 32 have, combine(all_in, all_out) runs once for the warp (32
// contributions in, 32 results of `out_bytes` out, lane order) and each lane receives its result in `out`.
void warp_collective(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                     const std::function<void(const char* all_in, char* all_out)>& combine);

// __shfl_xor_sync over a full warp.
template <class T>
T shfl_xor(T v, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<T>);
  T all[32];
  warp_exchange(&v, sizeof(T), all);
  return all[current().lane ^ lane_mask];
}

// __shfl_down_sync over a full warp: lane l gets lane l + delta's value, or its own past lane 31.
template <class T>
T shfl_down(T v, unsigned delta) {
  static_assert(std::is_trivially_copyable_v<T>);
  T all[32];
  warp_exchange(&v, sizeof(T), all);
  const unsigned from = static_cast<unsigned>(current().lane) + delta;
  return from < 32 ? all[from] : v;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += A (16 x 16) B (16 x 8) over the warp's fragments, with the
// layouts of Note [Tensor-core GEMM] in ember/kernels/cuda/tc_gemm_kernel.cuh (g = lane / 4, t = lane % 4; a 32-bit
// register holds the lower-indexed element in its low half): A0 = (g, 2t), A1 = (g + 8, 2t), A2 = (g, 2t + 8), A3 = (g
// + 8, 2t + 8) [row, k]; B0 = (k 2t, n g), B1 = (k 2t + 8, n g); C: d0, d1 = (g, 2t..2t+1), d2, d3 = (g + 8, 2t..2t+1).
// Sums in f32 in k order.
template <class T>
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Frag {
    uint32_t a[4], b[2];
    float c[4];
  };
  const Frag mine{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  warp_collective(&mine, sizeof(Frag), d, sizeof(d), [](const char* in, char* out) {
    Frag all[32];
    std::memcpy(all, in, sizeof(all));
    auto lo = [](uint32_t w) { return static_cast<float>(T::from_bits(static_cast<uint16_t>(w & 0xffffu))); };
    auto hi = [](uint32_t w) { return static_cast<float>(T::from_bits(static_cast<uint16_t>(w >> 16))); };
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      for (int j = 0; j < 4; ++j) {
        const int row = g + 8 * (j & 1), k = 2 * t + 8 * (j >> 1);
        A[row][k] = lo(all[l].a[j]);
        A[row][k + 1] = hi(all[l].a[j]);
      }
      for (int j = 0; j < 2; ++j) {
        const int k = 2 * t + 8 * j;
        B[k][g] = lo(all[l].b[j]);
        B[k + 1][g] = hi(all[l].b[j]);
      }
    }
    float result[32][4];
    for (int l = 0; l < 32; ++l) {
      const int g = l >> 2, t = l & 3;
      for (int j = 0; j < 4; ++j) {
        const int row = g + 8 * (j >> 1), col = 2 * t + (j & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
        result[l][j] = all[l].c[j] + sum;
      }
    }
    std::memcpy(out, result, sizeof(result));
  });
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of 8 x 8 matrix l / 8
// (16-byte aligned: SimtError otherwise); register j of lane l receives elements (l / 4, 2 (l % 4)) and
// (l / 4, 2 (l % 4) + 1) of matrix j, or with trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4), the first in the
// low half.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  warp_collective(&row, sizeof(row), r, sizeof(r), [trans](const char* in, char* out) {
    const void* rows[32];
    std::memcpy(rows, in, sizeof(rows));
    uint16_t m[4][8][8];
    for (int l = 0; l < 32; ++l) {
      if (reinterpret_cast<uintptr_t>(rows[l]) % 16 != 0)
        throw SimtError("ldmatrix: a row address is not 16-byte aligned");
      std::memcpy(m[l / 8][l % 8], rows[l], 16);
    }
    uint32_t result[32][4];
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < 4; ++j) {
        const int g = l / 4, t = l % 4;
        const uint16_t lo = trans ? m[j][2 * t][g] : m[j][g][2 * t];
        const uint16_t hi = trans ? m[j][2 * t + 1][g] : m[j][g][2 * t + 1];
        result[l][j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
    std::memcpy(out, result, sizeof(result));
  });
}

// Every thread of the running thread's warpgroup (128 consecutive threads; the block must be whole warpgroups)
// contributes `in_bytes`; once all 128 have, combine runs once for the group (128 contributions in, 128 results of
// `out_bytes` out, thread order) and each thread receives its result in `out`.
void warpgroup_collective(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                          const std::function<void(const char* all_in, char* all_out)>& combine);

// Lets the other threads of the block run (a spin-wait's body).
void yield_now();

// ---- cp.async (sm_80) ----
// A copy of 16 bytes to shared memory (those past src_bytes zero; both addresses 16-byte aligned), modelled as late
// as the hardware may complete it: the issue fills dst with poison (every bit set: NaN in f32, f16 and bf16), and the
// bytes land only when the issuing thread's cp_async_wait_group covers the copy's group. A read before that wait, or
// by another thread before a barrier that follows it, sees the poison; so does a reader of the old contents that an
// issue overwrote without a barrier in between. A store to the destination or the source before the wait, and a
// thread that exits with copies in flight, throw SimtError.
void cp_async(void* dst, const void* src, int src_bytes);
// cp.async.commit_group: the thread's copies issued since the last commit form a group (possibly empty).
void cp_async_commit_group();
// cp.async.wait_group: the thread's committed groups but the newest `pending` have landed on return.
void cp_async_wait_group(int pending);

// ---- mbarriers and TMA (sm_90) ----
// An mbarrier lives at a shared-memory address (its 8 bytes are not used); its state is kept per block. A phase
// completes when `count` arrivals and every expected transaction byte have come; completions count as progress.
void mbarrier_init(void* bar, unsigned count);
// One arrival; with expect_tx_bytes > 0 it also expects that many transaction bytes (arrive.expect_tx).
void mbarrier_arrive(void* bar, unsigned expect_tx_bytes);
// Transaction bytes delivered (what a TMA copy does on completion).
void mbarrier_complete_tx(void* bar, unsigned bytes);
// mbarrier.try_wait.parity: true once the phase of this parity has completed (the current phase's parity differs).
bool mbarrier_test_parity(void* bar, unsigned parity);

// What a CUtensorMap describes, for the emulated TMA: a tensor of up to 3 dims (dims[0] innermost, contiguous), byte
// strides of dims 1 and 2, a box, and the 128-byte swizzle (then box[0] * elem_bytes must be 128).
struct TensorMap {
  const void* base = nullptr;
  uint64_t dims[3] = {1, 1, 1};
  uint64_t strides[3] = {0, 0, 0};  // bytes; strides[0] unused (elem_bytes)
  uint32_t box[3] = {1, 1, 1};
  uint32_t elem_bytes = 2;
  bool swizzle_128b = false;
};

// The 128-byte swizzle of shared-memory addresses (CU_TENSOR_MAP_SWIZZLE_128B, wgmma's mode 1): the 16-byte chunk
// index (address bits 4-6) is XORed with the 128-byte row index within a 1024-byte block (bits 7-9).
inline uintptr_t swizzle_128b(uintptr_t address) { return address ^ (((address >> 7) & 7u) << 4); }

// cp.async.bulk.tensor tile load, synchronous: box at coordinates c (c[0] innermost) into dst (128-byte aligned,
// row-major box, swizzled if the map says so; elements outside the tensor are zeros), then completes the box's bytes
// on bar.
void tma_load(void* dst, const TensorMap& map, const int (&c)[3], void* bar);
// The same box into every block of the cluster whose bit is set in cta_mask, at dst's and bar's offsets there.
void tma_load_multicast(void* dst, const TensorMap& map, const int (&c)[3], void* bar, uint16_t cta_mask);

}  // namespace ember::testing::simt

// ---- the CUDA names the kernels use ---------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define threadIdx (::ember::testing::simt::current().thread_idx)
#define blockIdx (::ember::testing::simt::current().block_idx)
#define blockDim (::ember::testing::simt::current().block_dim)
#define gridDim (::ember::testing::simt::current().grid_dim)

inline void __syncthreads() { ::ember::testing::simt::syncthreads(); }

#define EMBER_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::ember::testing::simt::dynamic_shared())

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  if (mask != 0xffffffffu) throw ::ember::testing::simt::SimtError("__shfl_xor_sync: only full-warp masks");
  return ::ember::testing::simt::shfl_xor(v, lane_mask);
}

template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
  if (mask != 0xffffffffu) throw ::ember::testing::simt::SimtError("__shfl_down_sync: only full-warp masks");
  return ::ember::testing::simt::shfl_down(v, delta);
}

#define __restrict__ __restrict

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace ember::cuda {
using ::ember::testing::simt::mma_16816;
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ::ember::testing::simt::ldmatrix_x4(r, smem, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  ::ember::testing::simt::ldmatrix_x4(r, smem, true);
}
// cp.async with its commit/wait protocol (simt::cp_async: a missing wait or barrier reads poison).
inline void cp_async_16(void* dst, const void* src, int src_bytes) {
  ::ember::testing::simt::cp_async(dst, src, src_bytes);
}
inline void cp_async_commit() { ::ember::testing::simt::cp_async_commit_group(); }
template <int N>
void cp_async_wait() {
  ::ember::testing::simt::cp_async_wait_group(N);
}
}  // namespace ember::cuda

// ---- the Hopper GEMM's primitives (ember/kernels/cuda/wgmma.cuh) ----
namespace ember::cuda {
using TmaDescriptor = ::ember::testing::simt::TensorMap;

inline void mbar_init(uint64_t* bar, unsigned count) { ::ember::testing::simt::mbarrier_init(bar, count); }
inline void fence_mbarrier_init() {}
inline void mbar_arrive(uint64_t* bar) { ::ember::testing::simt::mbarrier_arrive(bar, 0); }
inline void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  ::ember::testing::simt::mbarrier_arrive(bar, bytes);
}
inline bool mbar_try_wait(uint64_t* bar, unsigned parity) {
  if (::ember::testing::simt::mbarrier_test_parity(bar, parity)) return true;
  ::ember::testing::simt::yield_now();
  return false;
}
// The emulator reports a wait that no phase ends as a deadlock (the device form traps after kMbarHangNs).
inline void mbar_wait(uint64_t* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
inline void tma_load_3d(void* dst, const TmaDescriptor* map, int c0, int c1, int c2, uint64_t* bar) {
  const int c[3] = {c0, c1, c2};
  ::ember::testing::simt::tma_load(dst, *map, c, bar);
}
inline void tma_load_3d_multicast(void* dst, const TmaDescriptor* map, int c0, int c1, int c2, uint64_t* bar,
                                  uint16_t cta_mask) {
  const int c[3] = {c0, c1, c2};
  ::ember::testing::simt::tma_load_multicast(dst, *map, c, bar, cta_mask);
}
inline unsigned cluster_ctarank() { return ::ember::testing::simt::cluster_ctarank(); }
inline void cluster_sync() { ::ember::testing::simt::cluster_sync(); }
// mbarrier.arrive on the barrier at bar's offset in block `rank` of the cluster (mapa + shared::cluster arrive).
inline void mbar_arrive_cluster(uint64_t* bar, unsigned rank) {
  ::ember::testing::simt::mbarrier_arrive(::ember::testing::simt::map_shared(bar, rank), 0);
}
template <int kRegs>
void setmaxnreg_dec() {}
template <int kRegs>
void setmaxnreg_inc() {}
// wgmma runs synchronously at issue: fence, commit and wait have nothing left to order (a read of the accumulators
// before the wait goes unnoticed, as a missing cp.async wait does).
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
void wgmma_wait() {}
template <int R>
void wgmma_fence_operand(float (&)[R]) {}

// wgmma.mma_async.m64nNk16.f32 (N = 64, 128, 256), both operands in the 128-byte swizzle mode (PTX ISA canonical
// layouts, Note [Hopper GEMM]); for an operand X with start address s, LBO and SBO, element (r, k) of its r index
// (m of A, n of B) and k index is read at swizzle_128b(address) with address
//   K-major (A without kTransA, B with kTransB false):  s + (r / 8) * SBO + (r % 8) * 128 + 2 k
//   MN-major (A with kTransA, B with kTransB true):     s + (r / 64) * LBO + (k / 8) * SBO + (k % 8) * 128 + 2 (r % 64)
// Every thread must pass the same operands (SimtError otherwise); sums in f32 in k order; the accumulator layout is
// Note [Hopper GEMM]'s.
template <class T, int N, bool kTransA = false, bool kTransB = true, class Operand>
void wgmma_m64nk16(float (&d)[N / 2], const Operand& a, const Operand& b, int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "N is 64, 128 or 256");
  namespace simt = ::ember::testing::simt;
  constexpr int R = N / 2;  // accumulators per thread
  struct In {
    float d[R];
    const void* a;
    const void* b;
    uint32_t a_lbo, a_sbo, b_lbo, b_sbo;
    int scale_d;
  };
  const In mine = [&] {
    In v{};
    std::memcpy(v.d, d, sizeof(v.d));
    v.a = a.start;
    v.b = b.start;
    v.a_lbo = a.lbo;
    v.a_sbo = a.sbo;
    v.b_lbo = b.lbo;
    v.b_sbo = b.sbo;
    v.scale_d = scale_d;
    return v;
  }();
  simt::warpgroup_collective(&mine, sizeof(In), d, sizeof(d), [](const char* in, char* out) {
    const In* all = reinterpret_cast<const In*>(in);
    for (int t = 1; t < 128; ++t)
      if (all[t].a != all[0].a || all[t].b != all[0].b || all[t].a_lbo != all[0].a_lbo ||
          all[t].a_sbo != all[0].a_sbo || all[t].b_lbo != all[0].b_lbo || all[t].b_sbo != all[0].b_sbo ||
          all[t].scale_d != all[0].scale_d)
        throw simt::SimtError("wgmma: the threads of a warpgroup pass different operands");
    const In& op = all[0];
    if (reinterpret_cast<uintptr_t>(op.a) % 16 != 0 || reinterpret_cast<uintptr_t>(op.b) % 16 != 0)
      throw simt::SimtError("wgmma: an operand's start address is not 16-byte aligned");
    auto load = [](uintptr_t address) {
      uint16_t bits;
      std::memcpy(&bits, reinterpret_cast<const void*>(simt::swizzle_128b(address)), 2);
      return static_cast<float>(T::from_bits(bits));
    };
    float A[64][16], B[16][N];
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(op.a), b0 = reinterpret_cast<uintptr_t>(op.b);
    auto k_major = [](uintptr_t start, uint32_t sbo, int r, int k) {
      return start + (r / 8) * sbo + (r % 8) * 128 + 2 * k;
    };
    auto mn_major = [](uintptr_t start, uint32_t lbo, uint32_t sbo, int r, int k) {
      return start + (r / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (r % 64);
    };
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k)
        A[m][k] = load(kTransA ? mn_major(a0, op.a_lbo, op.a_sbo, m, k) : k_major(a0, op.a_sbo, m, k));
    for (int k = 0; k < 16; ++k)
      for (int n = 0; n < N; ++n)
        B[k][n] = load(kTransB ? mn_major(b0, op.b_lbo, op.b_sbo, n, k) : k_major(b0, op.b_sbo, n, k));
    float* result = reinterpret_cast<float*>(out);
    for (int t = 0; t < 128; ++t) {
      const int w = t / 32, l = t % 32;
      for (int i = 0; i < R; ++i) {
        const int j = i / 4, r = i % 4;
        const int row = 16 * w + l / 4 + 8 * (r / 2), col = 8 * j + 2 * (l % 4) + (r % 2);
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
        result[t * R + i] = (op.scale_d != 0 ? all[t].d[i] : 0.0f) + sum;
      }
    }
  });
}
}  // namespace ember::cuda
