// The hand-written tensor-core GEMM's kernel (tc_gemm.cu launches it; Note [Tensor-core GEMM]), in a header so that a
// host compiler can build it too: tests/kernels/test_tc_gemm_emulated.cpp runs it on the CPU under
// tests/harness/simt_emulator.h, which checks the emulator's model of mma.sync, ldmatrix and cp.async against this
// kernel, verified on an H100.
// Invariant: every global access is bounds-checked (zero-filled loads, guarded stores), so any M, N, K >= 1 is exact
// up to f32 accumulation and one rounding per output element.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/cuda/mma.cuh"

namespace ember::cuda::tc {

// Note [Tensor-core GEMM]
// Tiling. One block of 256 threads (8 warps) computes a 128 x 128 tile of out[b] = a[b] @ bm[b], walking K in
// steps of 32. The warps form a 2 x 4 grid; warp w owns rows 64 * (w / 4) .. +64 and columns 32 * (w % 4) .. +32 of
// the block tile, i.e. 4 x 4 mma tiles of 16 x 8, held as 4 x 4 x 4 f32 accumulators per thread. Each 32-wide K
// step is two k16 mma steps. The grid is (N tiles, M tiles, batch); y and z are capped at 65535 by the launcher,
// which loops over chunks of M tiles and of batches.
//
// Shared memory holds kStages stages; stage s has the A tile [128][32] and the B tile [32][128], both row-major and
// padded by 8 elements per row (A rows 40 elements = 80 B, B rows 136 elements = 272 B). An ldmatrix phase reads 8
// rows of 16 B each; with these strides the 8 row addresses are 16 B apart modulo 128 B (80 r and 272 r mod 128 are
// eight distinct multiples of 16 for r = 0..7), so the 8 reads hit disjoint banks. Every row start and every 8-element
// column offset is 16 B aligned, as cp.async.cg (16 B) and ldmatrix require. 4 stages x 18944 B = 74 KiB of dynamic
// shared memory: above the 48 KiB default, so the launcher raises cudaFuncAttributeMaxDynamicSharedMemorySize (sm_80
// and later allow 99 KiB or more per block; H100/H200 227 KiB, room for two blocks per SM).
//
// Pipeline (the usual multistage loop). The prologue issues tiles 0..S-2, one commit group each. Iteration kt waits
// until at most S-2 groups are pending (so tile kt has landed for this thread), then __syncthreads (so it has landed
// for every thread, and every warp has finished reading stage (kt-1) % S), then issues tile kt+S-1 into that stage,
// commits (an empty group past the last tile keeps the counting uniform) and computes on stage kt % S.
//
// Global loads. Fast path, per operand: when the row length (K for A, N for B) is a multiple of 8 and the base pointer
// is 16 B aligned, every 8-element chunk is either wholly inside the matrix or wholly outside it and is 16 B aligned;
// cp.async with src-size 0 zero-fills the chunks outside. Otherwise (general path) each thread copies single
// elements with bounds checks through registers into the stage with ordinary shared stores (two in flight: a deeper
// unroll makes the kernel spill at the 128-register cap of two blocks per SM); the same barriers order them, so both
// paths share the pipeline (the general path simply does not overlap its loads with the math).
// Out-of-range elements are +0 (bit pattern 0 in f16 and bf16), so partial tiles add nothing to the sums.
//
// Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), with g = lane >> 2 (groupID) and t = lane & 3 (threadID_in_group); a
// 32-bit register holds two 16-bit elements, the lower-indexed one in the low half:
//   A (16 x 16, row): a0,a1: (g, 2t..2t+1)   a2,a3: (g+8, 2t..2t+1)   a4,a5: (g, 2t+8..)   a6,a7: (g+8, 2t+8..)
//                     i.e. registers A0 = (g, 2t), A1 = (g+8, 2t), A2 = (g, 2t+8), A3 = (g+8, 2t+8)   [row, k]
//   B (16 x 8, col):  b0,b1: (k = 2t..2t+1, n = g)   b2,b3: (k = 2t+8..2t+9, n = g)
//                     i.e. registers B0 = (k 2t, n g), B1 = (k 2t+8, n g)
//   C/D (16 x 8 f32): c0,c1: (g, 2t..2t+1)   c2,c3: (g+8, 2t..2t+1)
// ldmatrix.sync.aligned.m8n8.x4.b16: lanes 8j..8j+7 give the row addresses of 8 x 8 matrix j, and register j of lane
// l receives matrix j's elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1); with .trans it receives (2(l%4), l/4) and
// (2(l%4)+1, l/4). Hence:
//   A: lane l points at row (l % 16), column 8 (l / 16) of a 16 x 16 A block: matrix 0 = rows 0-7 / k 0-7, 1 = rows
//      8-15 / k 0-7, 2 = rows 0-7 / k 8-15, 3 = rows 8-15 / k 8-15, so registers 0..3 are exactly A0..A3.
//   B: B is stored [k][n] (row-major K x N), and the mma wants it "col" (k fastest per thread), so .trans: lane l
//      points at k row (l % 16), column 8 (l / 16) of a 16 x 16 B block: matrix 0 = k 0-7 / n 0-7, 1 = k 8-15 /
//      n 0-7, 2 = k 0-7 / n 8-15, 3 = k 8-15 / n 8-15; transposed, register 0 of lane l holds (k 2t..2t+1, n g) = B0
//      of the n-tile 0-7, register 1 = B1 of it, registers 2 and 3 = B0 and B1 of the n-tile 8-15.
// Epilogue: c0,c1 (and c2,c3) are two adjacent columns of one row; they are rounded once to f16/bf16 (the rounding
// the CPU uses, core/half.h) and stored as one 32-bit word when N is even and out is 4 B aligned, else element-wise;
// every store is guarded by row < M and column < N.
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 32;
constexpr int kStages = 4;
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarpsN = 4;
constexpr int kWarpM = 64, kWarpN = 32;     // warp tile
constexpr int kMmaM = kWarpM / 16;          // 4 mma tiles along M per warp
constexpr int kMmaN = kWarpN / 8;           // 4 mma tiles along N per warp
constexpr int kPad = 8;                     // elements of padding per shared-memory row
constexpr int kStrideA = kBlockK + kPad;    // 40 elements (80 B)
constexpr int kStrideB = kBlockN + kPad;    // 136 elements (272 B)
constexpr int kTileA = kBlockM * kStrideA;  // elements of one A stage
constexpr int kTileB = kBlockK * kStrideB;  // elements of one B stage
constexpr int kStageElems = kTileA + kTileB;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageElems * sizeof(uint16_t);
constexpr int kMaxGridYZ = 65535;

static_assert(kThreads == 32 * (kBlockM / kWarpM) * (kBlockN / kWarpN), "one warp per warp tile");
static_assert(kWarpsN == kBlockN / kWarpN, "warp grid");
static_assert(kBlockK % 16 == 0 && kMmaN % 2 == 0, "k16 steps; B fragments come in n16 pairs");
static_assert((kStrideA * 2) % 16 == 0 && (kStrideB * 2) % 16 == 0, "16 B aligned shared rows");
static_assert((kTileA * 2) % 16 == 0 && (kStageElems * 2) % 16 == 0, "16 B aligned stages");
static_assert((kBlockM * kBlockK / 8) % kThreads == 0 && (kBlockK * kBlockN / 8) % kThreads == 0, "whole chunks");
static_assert((kBlockM * kBlockK) % kThreads == 0 && (kBlockK * kBlockN) % kThreads == 0, "whole elements");

struct TcGemmParams {
  const uint16_t* a;  // [batch, M, K] bit patterns of f16/bf16
  const uint16_t* b;  // [batch, K, N]
  uint16_t* out;      // [batch, M, N]
  int64_t M, N, K;
  int64_t batch_begin;   // batch index of blockIdx.z == 0
  int64_t m_tile_begin;  // M tile of blockIdx.y == 0
  bool a_vec, b_vec;     // 16 B cp.async loads allowed for A / B (Note [Tensor-core GEMM], global loads)
  bool out_vec2;         // 32-bit paired stores allowed (N even, out 4 B aligned)
};

// ---- tile loads -------------------------------------------------------------------------------------------------

// A tile rows m0.., columns k0.. of the matrix `a` (M x K, row-major) into the stage `sa` ([128][kStrideA]).
__device__ __forceinline__ void load_tile_a(uint16_t* sa, const uint16_t* a, int64_t M, int64_t K, int64_t m0,
                                            int64_t k0, bool vec, int tid) {
  if (vec) {
    constexpr int kChunksPerRow = kBlockK / 8;  // 4
    EMBER_UNROLL
    for (int i = 0; i < kBlockM * kChunksPerRow / kThreads; ++i) {
      const int chunk = tid + i * kThreads;
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
      const int64_t gm = m0 + row, gk = k0 + col;
      const bool inside = gm < M && gk < K;  // K % 8 == 0: gk < K implies gk + 8 <= K
      const uint16_t* src = inside ? a + gm * K + gk : a;
      cp_async_16(sa + row * kStrideA + col, src, inside ? 16 : 0);
    }
  } else {
    EMBER_UNROLL_N(2)
    for (int e = tid; e < kBlockM * kBlockK; e += kThreads) {
      const int64_t gm = m0 + e / kBlockK, gk = k0 + e % kBlockK;
      sa[(e / kBlockK) * kStrideA + e % kBlockK] = (gm < M && gk < K) ? a[gm * K + gk] : uint16_t{0};
    }
  }
}

// B tile rows k0.., columns n0.. of the matrix `b` (K x N, row-major) into the stage `sb` ([32][kStrideB]).
__device__ __forceinline__ void load_tile_b(uint16_t* sb, const uint16_t* b, int64_t K, int64_t N, int64_t k0,
                                            int64_t n0, bool vec, int tid) {
  if (vec) {
    constexpr int kChunksPerRow = kBlockN / 8;  // 16
    EMBER_UNROLL
    for (int i = 0; i < kBlockK * kChunksPerRow / kThreads; ++i) {
      const int chunk = tid + i * kThreads;
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
      const int64_t gk = k0 + row, gn = n0 + col;
      const bool inside = gk < K && gn < N;  // N % 8 == 0: gn < N implies gn + 8 <= N
      const uint16_t* src = inside ? b + gk * N + gn : b;
      cp_async_16(sb + row * kStrideB + col, src, inside ? 16 : 0);
    }
  } else {
    EMBER_UNROLL_N(2)
    for (int e = tid; e < kBlockK * kBlockN; e += kThreads) {
      const int64_t gk = k0 + e / kBlockN, gn = n0 + e % kBlockN;
      sb[(e / kBlockN) * kStrideB + e % kBlockN] = (gk < K && gn < N) ? b[gk * N + gn] : uint16_t{0};
    }
  }
}

// ---- kernel -----------------------------------------------------------------------------------------------------

// One 128 x 128 output tile per block (Note [Tensor-core GEMM]). T (Half or BFloat16) picks the mma type and the
// output rounding; the data travel as raw 16-bit patterns.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) tc_gemm_kernel(TcGemmParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  EMBER_DYNAMIC_SHARED(uint16_t, smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

  const int64_t batch = p.batch_begin + blockIdx.z;
  const int64_t m0 = (p.m_tile_begin + blockIdx.y) * kBlockM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const uint16_t* a = p.a + batch * p.M * p.K;
  const uint16_t* b = p.b + batch * p.K * p.N;
  uint16_t* out = p.out + batch * p.M * p.N;
  const int64_t k_tiles = (p.K + kBlockK - 1) / kBlockK;

  float acc[kMmaM][kMmaN][4];
  EMBER_UNROLL
  for (int i = 0; i < kMmaM; ++i) EMBER_UNROLL
  for (int j = 0; j < kMmaN; ++j) EMBER_UNROLL
  for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  auto load_stage = [&](int64_t kt, int stage) {
    uint16_t* sa = smem + stage * kStageElems;
    load_tile_a(sa, a, p.M, p.K, m0, kt * kBlockK, p.a_vec, tid);
    load_tile_b(sa + kTileA, b, p.K, p.N, kt * kBlockK, n0, p.b_vec, tid);
  };

  // Prologue: tiles 0 .. kStages-2, one commit group each (empty past the last tile).
  EMBER_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  // Per-lane ldmatrix offsets within a warp's 16 x 16 blocks (Note [Tensor-core GEMM], ldmatrix).
  const int ld_row = lane & 15, ld_col = (lane >> 4) * 8;

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile kt are done
    __syncthreads();               // everyone's are; stage (kt - 1) % kStages is free again
    {
      const int64_t next = kt + kStages - 1;
      if (next < k_tiles) load_stage(next, static_cast<int>(next % kStages));
      cp_async_commit();
    }

    const uint16_t* sa = smem + static_cast<int>(kt % kStages) * kStageElems;
    const uint16_t* sb = sa + kTileA;
    EMBER_UNROLL
    for (int ks = 0; ks < kBlockK / 16; ++ks) {
      uint32_t af[kMmaM][4];
      uint32_t bf[kMmaN][2];
      EMBER_UNROLL
      for (int i = 0; i < kMmaM; ++i) {
        const int row = warp_m * kWarpM + i * 16 + ld_row;
        ldmatrix_x4(af[i], sa + row * kStrideA + ks * 16 + ld_col);
      }
      EMBER_UNROLL
      for (int jj = 0; jj < kMmaN / 2; ++jj) {
        const int col = warp_n * kWarpN + jj * 16 + ld_col;
        uint32_t r[4];
        ldmatrix_x4_trans(r, sb + (ks * 16 + ld_row) * kStrideB + col);
        bf[2 * jj][0] = r[0];
        bf[2 * jj][1] = r[1];
        bf[2 * jj + 1][0] = r[2];
        bf[2 * jj + 1][1] = r[3];
      }
      EMBER_UNROLL
      for (int i = 0; i < kMmaM; ++i) EMBER_UNROLL
      for (int j = 0; j < kMmaN; ++j) mma_16816<T>(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; nothing is in flight when the block exits

  // Epilogue: registers -> global, rounded once, guarded by row < M and column < N.
  const int g = lane >> 2, t = lane & 3;
  EMBER_UNROLL
  for (int i = 0; i < kMmaM; ++i) {
    EMBER_UNROLL
    for (int j = 0; j < kMmaN; ++j) {
      const int64_t col = n0 + warp_n * kWarpN + j * 8 + 2 * t;
      if (col >= p.N) continue;
      EMBER_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + warp_m * kWarpM + i * 16 + g + 8 * h;
        if (row >= p.M) continue;
        const uint16_t lo = T(acc[i][j][2 * h]).bits;
        uint16_t* dst = out + row * p.N + col;
        if (col + 1 < p.N) {
          const uint16_t hi = T(acc[i][j][2 * h + 1]).bits;
          if (p.out_vec2) {
            *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
          } else {
            dst[0] = lo;
            dst[1] = hi;
          }
        } else {
          dst[0] = lo;
        }
      }
    }
  }
#else
  __trap();  // the launcher refuses devices below sm_80
#endif
}

}  // namespace ember::cuda::tc
