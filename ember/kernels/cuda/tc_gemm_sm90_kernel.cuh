// The Hopper GEMM's kernel (tc_gemm_sm90.cu launches it; Note [Hopper GEMM]): TMA tile loads, warpgroup MMA and a
// warp-specialised pipeline for f16/bf16 batched row-major products with f32 accumulation, in a header so that a host
// compiler can build it too: tests/kernels/test_tc_gemm_sm90_emulated.cpp runs it on the CPU under
// tests/harness/simt_emulator.h, which models mbarriers, TMA boxes with the 128-byte swizzle and wgmma descriptors.
// Invariant: out-of-range elements of A and B arrive as zeros (TMA) and every store is guarded by row < M and
// column < N, so any M, N >= 1 and K >= 1 with K and N multiples of 8 (the launcher's conditions) are exact up to f32
// accumulation and one rounding per output element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/cuda/kernel_macros.h"
#include "ember/kernels/cuda/mma.cuh"
#include "ember/kernels/cuda/wgmma.cuh"

namespace ember::cuda::sm90 {

// Note [Hopper GEMM]
// Work split. One block of 384 threads (three warpgroups) computes 128 x BN tiles of out[b] = a[b] @ bm[b]:
// warpgroup 0 is the producer (one thread issues every TMA load; setmaxnreg gives the group's registers away),
// warpgroups 1 and 2 are consumers, each owning 64 rows of the tile and all BN columns as BN / 2 f32 accumulators per
// thread (one wgmma m64nBNk16 per 16 of K). The kernel is persistent: the grid is min(tiles, SMs) blocks (one fits
// an SM), and block b takes tiles b, b + gridDim.x, ... of the batch-major order in which each batch's tiles go in
// groups of kGroupM M tiles, column by column (a wave of blocks then shares a few A row-blocks and B column-blocks in
// L2). The pipeline's stage counters run on across a block's tiles, so the producer loads the next tile's first
// stages while the consumers write the previous one out.
//
// Tile width. BN = 256 loads (128 + 256) / 256 = 1.5 bytes of operands per output column and k against 3 at BN = 64
// (A is shared by more columns), but a small product then has fewer tiles than the GPU has SMs. The launcher
// (wgmma_config_for) minimises waves x bytes a block loads per k step, over the widths and cluster sizes, the
// time of a wave if loads bound it: on an H100 (132 SMs, ~66 clusters of 2) 1024^3 takes BN = 64 alone (128 tiles,
// one wave, where BN = 256 would leave 100 SMs idle) and 2048^3 and larger take BN = 256 in clusters of 2.
//
// Clusters. With kCluster = 2 two blocks along M (rank r takes rows 128 r .. of the cluster's 256-row tile) share
// B: each loads its A box and half of B's boxes (j = r, r + 2, ...) with TMA multicast into the same stage of both
// blocks, so B's bytes cross from L2 once per pair (a third fewer bytes per FLOP at BN = 256). Each block's full[s]
// still expects the whole stage (its A, its B boxes, the other's B boxes); empty[s] counts the 4 consumers of the
// cluster (remote arrivals by mapa + mbarrier.arrive.shared::cluster), since either producer writes both blocks'
// stage s. A cluster_sync after the barriers' initialisation and another before exit keep every remote arrival and
// multicast inside both blocks' lifetimes; the producer's idle threads therefore stay to the end. The launcher runs as
// many clusters as fit at once (cudaOccupancyMaxActiveClusters), persistent like single blocks.
//
// Shared memory: kStages stages (4 x 48 KiB at BN = 256, 6 x 32 KiB at 128, 8 x 24 KiB at 64), each the A box (128
// rows x 64 K, 16 KiB) and BN / 64 B boxes (64 K rows x 64 N columns, 8 KiB each), then 2 * kStages mbarriers. The base
// is rounded up to 1024 bytes. Every box is loaded by TMA with CU_TENSOR_MAP_SWIZZLE_128B: row r of a box (128 bytes)
// lands at r * 128 with its 16-byte chunk j at chunk j ^ (r % 8) — the same address-based pattern (bits 4-6 ^= bits
// 7-9) that wgmma's 128-byte swizzle mode reads, which is why every atom of 8 rows must start 1024-byte aligned. The
// pattern spreads the 8 rows of a core matrix over all banks.
//
// Descriptors (PTX ISA, "Shared Memory Matrix Layout", canonical layouts in units of elements, T = 8 for 16 bits):
//   A, K-major, 128B swizzle: ((8, m), (T, 2k)) : ((8T, SBO), (1, T)). Rows are 128 bytes apart, 8-row groups SBO =
//     1024 bytes apart; LBO is unused (1). Consumer c's 64 rows start at c * 8 KiB; k16 step kk adds 32 bytes to the
//     start address (the swizzle applies to the final address, so offsets inside a 128-byte row are allowed).
//   B, N-major (imm-trans-b = 1), 128B swizzle: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)). 64 contiguous N
//     elements per 128-byte row, K rows 128 bytes apart, 8-row groups SBO = 1024 bytes apart, and the next 64 columns
//     (the next TMA box) LBO = 8 KiB away; k16 step kk adds 16 rows = 2 KiB to the start address.
//
// Layouts. a may also be stored [K, M] (M-major: the transposed operand of a weight gradient, x^T @ g) and b [N, K]
// (K-major: a linear layer's weight, x @ W^T); wgmma reads either from shared memory (imm-trans-a / imm-trans-b). An
// M-major A stage is two boxes of 64 M columns x 64 K rows (consumer c's 64 rows are box c; k16 steps 16 rows =
// 2 KiB, as B's N-major); a K-major B stage is BN / 64 boxes of 64 K columns x 64 N rows, which stack into BN rows of
// 128 bytes read like A's K-major rows (SBO 1024, k16 steps 32 bytes). The layout with both operands transposed goes
// to cuBLASLt. An optional bias (N elements of T) is added to the f32 sums before the one rounding.
//
// Pipeline. full[s] (count 1) completes when the producer has armed it with the stage's byte count
// (arrive.expect_tx) and the TMA copies have delivered those bytes; empty[s] (count 2, 4 in a cluster) completes when
// the consumers have finished reading the stage. With it counting the block's k tiles over all its tiles, stage it %
// kStages in round r = it / kStages waits full parity r & 1 and, for r > 0, empty parity (r - 1) & 1. A consumer issues
// the 4 wgmma of k tile it, commits them as one group, waits until at most one group is pending (so k tile it - 1's
// products are done) and releases that stage: the tensor cores always have the next group queued. After a tile's last k
// tile it waits for every group, releases the last stage, and only then runs the epilogue.
//
// Accumulator fragment of wgmma m64nNk16 (PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk16"): thread t of
// the warpgroup (warp w = t / 32, lane l) holds, for each 8-column block j, d[4j + 0..1] at row 16w + l / 4 and
// columns 8j + 2 (l % 4) + 0..1, and d[4j + 2..3] at row 16w + l / 4 + 8, same columns — mma.sync's C layout per
// warp, repeated over N.
//
// Registers: __launch_bounds__(384, 1) caps ptxas at 168 per thread; setmaxnreg moves the producer to 56 and the
// consumers to 224 (56 * 128 + 224 * 256 = 64512 = 168 * 384; the consumers need at most 157, and at 40 the
// producer of the widest M-major kernel spilled). setmaxnreg.inc waits until the block's pool has the
// registers, so a kernel compiled to fewer than 168 would hang its consumers: the launcher reads the kernels' register
// counts and keeps the kernel off (wgmma_gemm_supported false) unless every one is 168.
constexpr int kBlockM = 128, kBlockK = 64, kGroupM = 8;
constexpr int kThreads = 384;
constexpr int kBoxN = 64;                             // N columns per B box (128 bytes)
constexpr uint32_t kABytes = kBlockM * kBlockK * 2;   // 16 KiB
constexpr uint32_t kBBoxBytes = kBlockK * kBoxN * 2;  // 8 KiB

// The tile widths the launcher chooses from (Note [Hopper GEMM], "Tile width"): N columns per block = the wgmma's n.
template <int BN>
struct Tile {
  static_assert(BN == 64 || BN == 128 || BN == 256, "BN is 64, 128 or 256");
  static constexpr int kBlockN = BN;
  static constexpr uint32_t kStageBytes = kABytes + kBBoxBytes * (BN / kBoxN);  // 48, 32 or 24 KiB
  static constexpr int kStages = BN == 256 ? 4 : BN == 128 ? 6 : 8;             // 192 KiB of stages at most
  static constexpr size_t kSmemBytes = size_t{kStages} * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;
};

struct WgmmaGemmParams {
  uint16_t* out;         // [batch, M, N] row-major, 16-bit elements
  const uint16_t* bias;  // N elements added to every row before the rounding, or null
  int64_t M, N, K;
  int64_t m_tiles, n_tiles;  // m_tiles counts tiles of 128 * cluster rows (one per cluster)
  int64_t tiles;             // batch * m_tiles * n_tiles
  bool out_vec2;             // 32-bit paired stores allowed (N even, out 4 B aligned)
};

// Where tile `tile` (0 .. p.tiles - 1) of rows_per_tile x BN lies: batch-major, then groups of kGroupM M tiles walked
// column by column.
struct TileCoord {
  int64_t batch, m0, n0;
};
template <int BN>
EMBER_HD_INLINE TileCoord tile_coord(const WgmmaGemmParams& p, int64_t tile, int64_t rows_per_tile) {
  const int64_t per_batch = p.m_tiles * p.n_tiles;
  const int64_t batch = tile / per_batch, in_batch = tile % per_batch;
  const int64_t per_group = int64_t{kGroupM} * p.n_tiles;
  const int64_t first_m = in_batch / per_group * kGroupM;
  const int64_t group_m = p.m_tiles - first_m < kGroupM ? p.m_tiles - first_m : kGroupM;
  return {batch, (first_m + in_batch % per_group % group_m) * rows_per_tile, in_batch % per_group / group_m * BN};
}

// kAMajorM: a is stored [batch, K, M] (M-major) instead of [batch, M, K]; kBMajorK: b is stored [batch, N, K]
// (K-major) instead of [batch, K, N] (Note [Hopper GEMM], "Layouts").
template <class T, int BN, int kCluster, bool kAMajorM, bool kBMajorK>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_gemm_kernel(const __grid_constant__ TmaDescriptor map_a, const __grid_constant__ TmaDescriptor map_b,
                      const WgmmaGemmParams p) {
  static_assert(kCluster == 1 || (kCluster == 2 && BN / kBoxN % 2 == 0), "a cluster of 2 splits the B boxes");
  constexpr int kStages = Tile<BN>::kStages;
  constexpr uint32_t kStageBytes = Tile<BN>::kStageBytes;
  EMBER_DYNAMIC_SHARED(unsigned char, smem_raw);
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(kStages) * kStageBytes);
  uint64_t* empty = full + kStages;
  // Stage s: the A box, then the B boxes.
  auto stage_a = [&](int s) { return smem + static_cast<size_t>(s) * kStageBytes; };
  auto stage_b = [&](int s) { return smem + static_cast<size_t>(s) * kStageBytes + kABytes; };

  const int k_tiles = static_cast<int>((p.K + kBlockK - 1) / kBlockK);
  const int wg = static_cast<int>(threadIdx.x) / 128, t = static_cast<int>(threadIdx.x) % 128;
  const int rank = kCluster > 1 ? static_cast<int>(cluster_ctarank()) : 0;  // which 128 rows of the cluster's tile
  const int64_t first_tile = blockIdx.x / kCluster, tile_step = gridDim.x / kCluster;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * kCluster);  // both consumers of every block of the cluster
    }
    fence_mbarrier_init();
  }
  if constexpr (kCluster > 1) {
    cluster_sync();  // every block's barriers exist before any block multicasts into it or arrives on them
  } else {
    __syncthreads();
  }

  if (wg == 0) {  // producer
    setmaxnreg_dec<56>();
    if (t == 0) {
      int64_t it = 0;  // k tiles loaded so far, over every tile of this block
      for (int64_t tile = first_tile; tile < p.tiles; tile += tile_step) {
        const TileCoord at = tile_coord<BN>(p, tile, int64_t{kBlockM} * kCluster);
        const int m0 = static_cast<int>(at.m0) + rank * kBlockM, n0 = static_cast<int>(at.n0);
        const int batch = static_cast<int>(at.batch);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = static_cast<int>(it % kStages);
          if (it >= kStages) {
            mbar_wait(&empty[s], static_cast<unsigned>(it / kStages - 1) & 1u);
          }
          mbar_arrive_expect_tx(&full[s], kStageBytes);
          if constexpr (kAMajorM) {  // two boxes of 64 M columns x 64 K rows
            tma_load_3d(stage_a(s), &map_a, m0, kt * kBlockK, batch, &full[s]);
            tma_load_3d(stage_a(s) + kBBoxBytes, &map_a, m0 + 64, kt * kBlockK, batch, &full[s]);
          } else {  // one box of 64 K columns x 128 M rows
            tma_load_3d(stage_a(s), &map_a, kt * kBlockK, m0, batch, &full[s]);
          }
          // B: every box, or in a cluster this block's share of them, multicast to every block of the cluster. A box
          // is 64 N columns x 64 K rows, or K-major 64 K columns x 64 N rows.
          for (int j = rank; j < BN / kBoxN; j += kCluster) {
            const int c0 = kBMajorK ? kt * kBlockK : n0 + j * kBoxN, c1 = kBMajorK ? n0 + j * kBoxN : kt * kBlockK;
            if constexpr (kCluster == 1) {
              tma_load_3d(stage_b(s) + j * kBBoxBytes, &map_b, c0, c1, batch, &full[s]);
            } else {
              tma_load_3d_multicast(stage_b(s) + j * kBBoxBytes, &map_b, c0, c1, batch, &full[s],
                                    static_cast<uint16_t>((1u << kCluster) - 1u));
            }
          }
        }
      }
    }
  } else {  // consumers
    setmaxnreg_inc<224>();
    const int c = wg - 1;
    const int warp = t / 32, lane = t % 32;
    // Stage s is read: one arrival on its empty barrier in every block of the cluster (their producers write it).
    auto release = [&](int s) {
      if constexpr (kCluster == 1) {
        mbar_arrive(&empty[s]);
      } else {
        for (int r = 0; r < kCluster; ++r) mbar_arrive_cluster(&empty[s], static_cast<unsigned>(r));
      }
    };
    int64_t it = 0;  // k tiles consumed so far, over every tile of this block
    for (int64_t tile = first_tile; tile < p.tiles; tile += tile_step) {
      const TileCoord at = tile_coord<BN>(p, tile, int64_t{kBlockM} * kCluster);
      float d[BN / 2];
      EMBER_UNROLL
      for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
      wgmma_fence_operand(d);
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = static_cast<int>(it % kStages);
        mbar_wait(&full[s], static_cast<unsigned>(it / kStages) & 1u);
        const unsigned char* a = stage_a(s) + c * (64 * 128);
        const unsigned char* b = stage_b(s);
        wgmma_fence();
        EMBER_UNROLL
        for (int kk = 0; kk < kBlockK / 16; ++kk)
          // A: K-major, k16 step 32 bytes along the rows; M-major, 16 K rows of 128 bytes (the 64 rows are one box).
          // B: N-major, 16 K rows of 128 bytes, the next 64 columns a box (8 KiB) away; K-major, 32 bytes along rows.
          wgmma_m64nk16<T, BN, kAMajorM, !kBMajorK>(
              d, kAMajorM ? SmemOperand{a + kk * 2048, kBBoxBytes, 1024} : SmemOperand{a + kk * 32, 16, 1024},
              kBMajorK ? SmemOperand{b + kk * 32, 16, 1024} : SmemOperand{b + kk * 2048, kBBoxBytes, 1024}, 1);
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0 && t == 0) release(static_cast<int>((it - 1) % kStages));
      }
      wgmma_wait<0>();
      wgmma_fence_operand(d);  // the epilogue's reads stay after the wait
      // The tile's last stage is free: the producer fills the next tile's stages while this epilogue runs.
      if (t == 0) release(static_cast<int>((it - 1) % kStages));

      // Epilogue: registers -> global, rounded once, guarded by row < M and column < N; the bias pair of a column
      // block is read once for the thread's two rows.
      uint16_t* out = p.out + at.batch * p.M * p.N;
      const int64_t row0 = at.m0 + rank * kBlockM + 64 * c + 16 * warp + lane / 4;
      EMBER_UNROLL
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t col = at.n0 + 8 * j + 2 * (lane % 4);
        if (col >= p.N) continue;
        float bias_lo = 0.0f, bias_hi = 0.0f;
        if (p.bias != nullptr) {  // col + 1 < N: N is a multiple of 8
          bias_lo = static_cast<float>(T::from_bits(p.bias[col]));
          bias_hi = static_cast<float>(T::from_bits(p.bias[col + 1]));
        }
        EMBER_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0 + 8 * h;
          if (row >= p.M) continue;
          uint16_t* dst = out + row * p.N + col;
          float lo = d[4 * j + 2 * h], hi = d[4 * j + 2 * h + 1];
          if (p.bias != nullptr) {
            lo += bias_lo;
            hi += bias_hi;
          }
          const uint32_t pair = pack2<T>(lo, hi);
          if (p.out_vec2) {
            *reinterpret_cast<uint32_t*>(dst) = pair;
          } else {
            dst[0] = static_cast<uint16_t>(pair & 0xffffu);
            if (col + 1 < p.N) dst[1] = static_cast<uint16_t>(pair >> 16);
          }
        }
      }
    }
  }
  // No block of a cluster exits while another may still arrive on its barriers or write into its stages.
  if constexpr (kCluster > 1) cluster_sync();
}

}  // namespace ember::cuda::sm90
