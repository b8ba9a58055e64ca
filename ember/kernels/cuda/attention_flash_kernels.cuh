// The flash attention kernels of attention_flash.cu (Note [Flash attention]) and their launch geometry, in a header
// so that a host compiler can build them too: tests/kernels/test_attention_flash_emulated.cpp runs them on the CPU
// under tests/harness/simt_emulator.h, which defines the CUDA keywords and the warp primitives used here
// (__syncthreads, __shfl_xor_sync, mma_16816) before including this file.
// Invariant: every element of out, lse and grad_qkv (and of the backward's delta scratch) is written exactly once, by
// the block that owns its row; reads past T are zero-filled and masked, so any T >= 1 is exact up to the roundings of
// Note [Flash attention].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/mma.cuh"
#include "ember/kernels/elementwise_math.h"

namespace ember::cuda::flash {

using ::ember::kernels::ember_log;

// Note [Flash attention]
// The algorithm of FlashAttention-2 (Dao, 2023) over the packed qkv [B, T, 3 C] of a GPT block, head size HD (32 or
// 64), scale 1 / sqrt(HD). A tile is 64 rows; a block has 4 warps, warp w owning rows 16 w .. 16 w + 15 of its tile,
// so each warp's products are m16n8k16 mma.sync tiles (fragments as in Note [Tensor-core GEMM] in tc_gemm_kernel.cuh)
// with its 16 rows as the A operand, held in registers for the whole block.
//
// Forward (grid: B H query tiles, the most loaded causal tiles first). The warp keeps its q rows as A fragments, and
// per row a running max m, a running sum l (the thread's share; the quad's four shares are added at the end) and the
// output accumulator o [16, HD] in f32. Per key tile of 64 (staged in shared memory, k and v, rows past T zero):
// s = q k^T in f32, scaled, masked (keys >= T, and keys after the row when causal) to -inf; m' = max(m, max_j s);
// o and l are multiplied by e^(m - m'); p = e^(s - m'); l += sum p; o += p v, with p rounded to 16 bits as the A
// operand (its C-fragment layout is the A layout of the next product, two n-tiles per k step). At the end
// out = o / l (rounded once) and lse = m + log l. A row whose max is still -inf (no key yet) uses 0 in place of m',
// so its p and e^(m - m') are 0 and not NaN; a NaN or +inf score makes the row's l, and so out and lse, NaN, as the
// CPU kernel gives. Unlike the CPU kernel, which visits only a row's unmasked keys, the tile products also multiply
// the masked keys of the diagonal tile (by p = 0): a NaN or inf in such a key's k or v (or, backward, in a masked
// query's q or grad_out) makes the rows of that tile NaN here and not on the CPU. Finite inputs give the same sums.
//
// Exponentials are taken in base 2 (Note [Flash exponentials]), and a tile pair without masked elements skips the
// per-element mask test (tile_has_masked).
//
// Backward, two launches; p is recomputed as e^(s - lse) from the saved lse, and
//   ds_ij = p_ij (dp_ij - delta_i) scale,  dp = grad_out v^T,  delta_i = sum_j p_ij dp_ij = grad_out_i . o_i.
// 1. Query tiles (grid as the forward): delta_i = grad_out_i . o_i, stored in an f32 scratch [B, H, T], from the
//    forward's output when the caller passes it (FlashParams::o; autograd does), else from o_i = sum_j p_ij v_j
//    recomputed in f32 by a first pass over the key tiles; then a pass forms ds per key tile and accumulates
//    dq = ds k, written once to the q columns of grad_qkv. No atomics: the sum over keys stays in the block.
// 2. Key tiles (the first key tiles, which the most causal query tiles reach, first): the warp keeps its 16 key rows
//    of k and v as A fragments and walks the query tiles that see them (from its own tile on when causal), with q,
//    grad_out, lse and delta staged in shared memory; it forms s^T = k q^T, p^T, dp^T = v grad_out^T and ds^T in
//    f32 and accumulates dv = p^T grad_out and dk = ds^T q, written once to the k and v columns.
// Together the backward runs 7 tile products per (query tile, key tile) pair with the forward's output (9 without)
// against FlashAttention-2's 5, which adds dq with atomics: this one is deterministic.
//
// Precision: the products accumulate in f32 from 16-bit operands; the scores are never rounded (the tiled path rounds
// them to 16 bits, Note [Attention precision] in attention.cu); p and ds are rounded to 16 bits as A operands, as
// in FlashAttention; out, dq, dk and dv are rounded once when stored.
//
// Shared memory: two tiles [64][HD + 8] of 16-bit elements (the 8 pad elements put the 32-bit fragment reads of a
// warp on distinct banks), plus 64 lse and 64 delta floats in the key-tile kernel, each twice (Note [Flash tile
// pipeline]): at most 37 KiB, static.
constexpr int kTile = 64;
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;
constexpr int kNt = kTile / 8;   // n-tiles of 8 across a tile (scores)
constexpr int kKt = kTile / 16;  // k steps of 16 across a tile (p @ v and the like)
static_assert(kThreads >= kTile, "a thread per row of a tile carries its lse and delta");

struct FlashParams {
  const uint16_t* qkv;       // [B, T, 3 C]
  const uint16_t* grad_out;  // [B, T, C] (backward)
  const uint16_t* o;         // [B, T, C]: the forward's output (backward; nullptr: recomputed)
  uint16_t* out;             // forward: out [B, T, C]; backward: grad_qkv [B, T, 3 C]
  float* lse;                // [B, H, T] (written by the forward, read by the backward)
  float* delta;              // [B, H, T] (backward scratch)
  int64_t B, T, C, H;
  int64_t tiles;     // ceil(T / kTile)
  float scale;       // 1 / sqrt(HD)
  float scale_log2;  // scale log2(e): scores in base-2 units (Note [Flash exponentials])
  bool causal;
};

// Note [Flash exponentials]
// Every e^x of the kernels is computed as 2^(x log2 e) with exp2f, whose device form is one MUFU.EX2 (plus a scaling
// for results below 2^-126), where expf adds a range reduction of several instructions: with the scale folded in,
// a score's exponential costs one FMUL or FFMA and one EX2. The forward keeps the running max in base-2 units (s
// scale log2 e) and stores lse = m ln 2 + log l in natural units; the backward takes lse log2 e per row. The
// exponentials differ from expf's by at most a few ulps of f32, well below the 16-bit rounding of p.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Loads and stores of a whole word (4 or 16 bytes) at an address aligned to its size. Host compilations (the
// emulated test of tests/harness/simt_emulator.h) copy bytes, as strict aliasing requires, and stop on a misaligned
// address, which the hardware would fault on.
template <class W>
__device__ __forceinline__ W load_word(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const W*>(p);
#else
  if (reinterpret_cast<uintptr_t>(p) % sizeof(W) != 0) std::abort();
  W w;
  std::memcpy(&w, p, sizeof(W));
  return w;
#endif
}
template <class W>
__device__ __forceinline__ void store_word(void* p, const W& w) {
#if defined(__CUDA_ARCH__)
  *static_cast<W*>(p) = w;
#else
  if (reinterpret_cast<uintptr_t>(p) % sizeof(W) != 0) std::abort();
  std::memcpy(p, &w, sizeof(W));
#endif
}

// ---- fragments --------------------------------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ float low_half(uint32_t w) {
  return static_cast<float>(T::from_bits(static_cast<uint16_t>(w & 0xffffu)));
}
template <class T>
__device__ __forceinline__ float high_half(uint32_t w) {
  return static_cast<float>(T::from_bits(static_cast<uint16_t>(w >> 16)));
}

// The 32-bit word of elements (row, col), (row, col + 1) of a row-major matrix with leading dimension ld; 0 for rows
// at or past `rows`. col is even and ld even, so the word is 4-byte aligned.
__device__ __forceinline__ uint32_t load_pair(const uint16_t* m, int64_t ld, int64_t row, int64_t rows, int64_t col) {
  return row < rows ? load_word<uint32_t>(m + row * ld + col) : 0u;
}

// A fragments of rows r0 .. r0 + 15 (all HD columns) of a row-major matrix in global memory.
template <int HD>
__device__ __forceinline__ void load_a(uint32_t (&a)[HD / 16][4], const uint16_t* m, int64_t ld, int64_t r0,
                                       int64_t rows, int lane) {
  const int g = lane >> 2, t = lane & 3;
  EMBER_UNROLL
  for (int ks = 0; ks < HD / 16; ++ks) {
    const int c = ks * 16 + 2 * t;
    a[ks][0] = load_pair(m, ld, r0 + g, rows, c);
    a[ks][1] = load_pair(m, ld, r0 + g + 8, rows, c);
    a[ks][2] = load_pair(m, ld, r0 + g, rows, c + 8);
    a[ks][3] = load_pair(m, ld, r0 + g + 8, rows, c + 8);
  }
}

// Note [Flash tile pipeline]
// The tiles a block streams (k and v in the forward and dq kernels; q, grad_out, lse and delta in the dkdv kernel)
// are double-buffered: while the warps compute on buffer i % 2, cp.async fills buffer (i + 1) % 2 with tile i + 1, so
// a tile's loads overlap the previous tile's products instead of standing between two barriers. One barrier a tile
// does both jobs: it follows this thread's cp_async_wait<0> (tile i has landed for the copies it issued) and so makes
// tile i visible to the block, and it follows every warp's reads of tile i - 1, so the copies of tile i + 1 issued
// right after it may overwrite that buffer. The dkdv kernel's per-row floats (lse log2 e, which needs a multiply on the
// way, and delta) are loaded into registers at the issue by threads 0 .. kTile - 1 and stored to their buffer at the
// next tile's start (`land`), before its barrier: their latency hides behind a tile's products too. (The two carried
// registers push that kernel at head size 64 to 48 bytes of spills, all outside its tile loop.) A walk starts with a barrier, so it may follow another walk over
// the same buffers (the dq kernel's two passes), and ends with no copy in flight (its last group is empty).
// Shared memory doubles: at head size 64 the forward holds 36 KiB, three blocks a SM 108 KiB (sm_80 and sm_90 have
// 164 and 228 KiB a SM; sm_86 and sm_89, 100 KiB, fit two).

// Rows r0 .. r0 + kTile - 1 of a row-major [rows, ld] matrix's HD columns at m into s by cp.async, 16 bytes a copy;
// rows at or past `rows` are zero-filled and not read. m and ld keep every row's columns 16-byte aligned
// (flash_attention_applies). The bytes land at the issuing thread's cp_async_wait (Note [Flash tile pipeline]).
template <int HD>
__device__ __forceinline__ void copy_tile_async(uint16_t (*s)[HD + kPad], const uint16_t* m, int64_t ld, int64_t r0,
                                                int64_t rows, int tid) {
  constexpr int kChunks = HD / 8;
  static_assert(kTile * kChunks % kThreads == 0, "every thread copies the same number of chunks");
  EMBER_UNROLL
  for (int j = 0; j < kTile * kChunks / kThreads; ++j) {
    const int i = tid + j * kThreads, r = i / kChunks, c = (i % kChunks) * 8;
    const bool inside = r0 + r < rows;
    cp_async_16(&s[r][c], inside ? m + (r0 + r) * ld + c : m, inside ? 16 : 0);
  }
}

// Walks the tiles x0 = first, first + kTile, .. < end (Note [Flash tile pipeline]): issue(x0, buf) starts the copies
// of tile x0 into buffer buf, land(buf) runs at the start of the tile's turn, before the barrier, and body(x0, buf)
// computes on the landed tile.
template <class Issue, class Land, class Body>
__device__ __forceinline__ void stream_tiles(int64_t first, int64_t end, Issue issue, Land land, Body body) {
  __syncthreads();  // an earlier walk's reads of the buffers are done
  if (first < end) issue(first, 0);
  cp_async_commit();
  int buf = 0;
  for (int64_t x0 = first; x0 < end; x0 += kTile, buf ^= 1) {
    land(buf);
    cp_async_wait<0>();
    __syncthreads();
    if (x0 + kTile < end) issue(x0 + kTile, buf ^ 1);
    cp_async_commit();
    body(x0, buf);
  }
}

// The key tiles [0, k_end) of k and v (q points at the head's q columns of row 0; k and v are C and 2 C further)
// through ks and vs, two buffers each: body(k0, ks[buf], vs[buf]).
template <int HD, class Body>
__device__ __forceinline__ void stream_kv(uint16_t (*ks)[kTile][HD + kPad], uint16_t (*vs)[kTile][HD + kPad],
                                          const uint16_t* q, const FlashParams& p, int64_t k_end, int tid, Body body) {
  stream_tiles(
      0, k_end,
      [&](int64_t k0, int buf) {
        copy_tile_async<HD>(ks[buf], q + p.C, 3 * p.C, k0, p.T, tid);
        copy_tile_async<HD>(vs[buf], q + 2 * p.C, 3 * p.C, k0, p.T, tid);
      },
      [](int) {}, [&](int64_t k0, int buf) { body(k0, ks[buf], vs[buf]); });
}

// B fragments from shared memory by ldmatrix.x4 (Note [Tensor-core GEMM] in tc_gemm_kernel.cuh): lane l gives the
// address of row l % 8 of 8 x 8 matrix j = l / 8, and register j of every lane receives its elements of matrix j.
// - Tile stored [n][k] (the product's k runs along the tile's rows): B0 of n-tile n wants (k 2t..2t+1, n g), which is
//   row g, elements 2t..2t+1 of the 8 x 8 block (rows n.., columns k..): plain ldmatrix. Matrices (n0, k0),
//   (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8) give B0, B1 of n-tile n0 and B0, B1 of n-tile n0 + 8.
// - Tile stored [k][n]: the same elements are a column pair of the block (rows k.., columns n..): ldmatrix.trans,
//   which gives lane l the elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4). Matrices (k0, n0), (k0 + 8, n0),
//   (k0, n0 + 8), (k0 + 8, n0 + 8) give B0, B1 of n-tile n0 and B0, B1 of n-tile n0 + 8.
// Every row address is 16-byte aligned (rows of (HD + kPad) * 2 bytes, column offsets multiples of 8 elements); with
// rows 80 or 144 bytes apart, the 8 rows of a matrix fall on distinct 16-byte bank groups.

// x[kNt][4] (a warp's 16 x kTile f32 product, C layout) = a (16 x HD, A fragments) @ s^T (s stored [kTile][HD]).
template <class T, int HD>
__device__ __forceinline__ void product_rows(float (&x)[kNt][4], const uint32_t (&a)[HD / 16][4],
                                             const uint16_t (*s)[HD + kPad], int lane) {
  EMBER_UNROLL
  for (int nt = 0; nt < kNt; ++nt) {
    EMBER_UNROLL
    for (int e = 0; e < 4; ++e) x[nt][e] = 0.0f;
  }
  const int j = lane >> 3, row = ((j >> 1) << 3) + (lane & 7), col = (j & 1) << 3;
  EMBER_UNROLL
  for (int ks = 0; ks < HD / 16; ++ks) {
    EMBER_UNROLL
    for (int nt = 0; nt < kNt; nt += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, &s[nt * 8 + row][ks * 16 + col]);
      mma_16816<T>(x[nt], a[ks], b[0], b[1]);
      mma_16816<T>(x[nt + 1], a[ks], b[2], b[3]);
    }
  }
}

// acc[HD / 8][4] (16 x HD, C layout) += x (16 x kTile, C layout, rounded to T as the A operand) @ s (s stored
// [kTile][HD]). The C fragments of n-tiles 2 kk and 2 kk + 1 are the A fragment of k step kk.
template <class T, int HD>
__device__ __forceinline__ void accumulate_columns(float (&acc)[HD / 8][4], const float (&x)[kNt][4],
                                                   const uint16_t (*s)[HD + kPad], int lane) {
  const int j = lane >> 3, row = ((j & 1) << 3) + (lane & 7), col = (j >> 1) << 3;
  EMBER_UNROLL
  for (int kk = 0; kk < kKt; ++kk) {
    const uint32_t a[4] = {pack2<T>(x[2 * kk][0], x[2 * kk][1]), pack2<T>(x[2 * kk][2], x[2 * kk][3]),
                           pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
    EMBER_UNROLL
    for (int dt = 0; dt < HD / 8; dt += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, &s[kk * 16 + row][dt * 8 + col]);
      mma_16816<T>(acc[dt], a, b[0], b[1]);
      mma_16816<T>(acc[dt + 1], a, b[2], b[3]);
    }
  }
}

// Sum over the quad (the 4 threads sharing a row of a C fragment).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Stores rows r0 + g and r0 + g + 8 (those < rows) of a 16 x HD C-layout accumulator times factor[row half], rounded
// to T, into the row-major matrix m (leading dimension ld) as 32-bit words.
template <class T, int HD>
__device__ __forceinline__ void store_rows(uint16_t* m, int64_t ld, int64_t r0, int64_t rows,
                                           const float (&acc)[HD / 8][4], const float (&factor)[2], int lane) {
  const int g = lane >> 2, t = lane & 3;
  EMBER_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int64_t row = r0 + g + 8 * half;
    if (row >= rows) continue;
    EMBER_UNROLL
    for (int dt = 0; dt < HD / 8; ++dt)
      store_word(m + row * ld + dt * 8 + 2 * t,
                 pack2<T>(acc[dt][2 * half] * factor[half], acc[dt][2 * half + 1] * factor[half]));
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
  EMBER_UNROLL
  for (int i = 0; i < N; ++i) {
    EMBER_UNROLL
    for (int e = 0; e < 4; ++e) x[i][e] = 0.0f;
  }
}

// The block's (batch, head) and tile: the tile order is reversed for the query-tile kernels (late causal tiles
// carry the most keys) and kept for the key-tile kernel.
struct BlockWork {
  int64_t b, h, bh, tile;
};
__device__ __forceinline__ BlockWork block_work(const FlashParams& p, bool reversed) {
  const int64_t bh_count = p.B * p.H, bi = blockIdx.x;
  const int64_t bh = bi % bh_count, order = bi / bh_count;
  return {bh / p.H, bh % p.H, bh, reversed ? p.tiles - 1 - order : order};
}

// Keys visible to query rows [q0, q0 + kTile): up to the tile's last row when causal.
__device__ __forceinline__ int64_t key_end(const FlashParams& p, int64_t q0) {
  return p.causal ? (q0 + kTile < p.T ? q0 + kTile : p.T) : p.T;
}

// Whether query qi does not see key kj: either is past T, or kj comes after qi in a causal call.
__device__ __forceinline__ bool masked(const FlashParams& p, int64_t qi, int64_t kj) {
  return qi >= p.T || kj >= p.T || (p.causal && kj > qi);
}

// Whether the pair (query tile q0, key tile k0) has a masked element at all: a query or key past T, or, causal, a
// key after one of the tile's queries (the diagonal tile: tiles are aligned). Uniform over the block; the other pairs
// (all but one or two per row of tiles at GPT-2's T) skip the per-element test, which is about a third of the
// instructions of a tile's score math.
__device__ __forceinline__ bool tile_has_masked(const FlashParams& p, int64_t q0, int64_t k0) {
  return q0 + kTile > p.T || k0 + kTile > p.T || (p.causal && k0 + kTile - 1 > q0);
}

// p = e^(s scale - lse) = 2^(s scale log2 e - lse log2 e) in place of a warp's 16 x kTile scores s (C layout), 0
// where masked (tested only when kEdge: tile_has_masked): query_of(nt, e) and key_of(nt, e) give the query and key of
// element (nt, e), lse2_of(nt, e) its query's lse log2 e (Note [Flash exponentials]).
template <bool kEdge, class QueryFn, class KeyFn, class LseFn>
__device__ __forceinline__ void probabilities(float (&s)[kNt][4], const FlashParams& p, QueryFn query_of, KeyFn key_of,
                                              LseFn lse2_of) {
  EMBER_UNROLL
  for (int nt = 0; nt < kNt; ++nt) {
    EMBER_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float v = exp2f(s[nt][e] * p.scale_log2 - lse2_of(nt, e));
      s[nt][e] = kEdge && masked(p, query_of(nt, e), key_of(nt, e)) ? 0.0f : v;
    }
  }
}

// ds = p (dp - delta) scale in place of dp (0 where masked, tested only when kEdge), with p from `probabilities` and
// delta_of(nt, e) the query's delta.
template <bool kEdge, class QueryFn, class KeyFn, class DeltaFn>
__device__ __forceinline__ void score_grads(float (&dp)[kNt][4], const float (&pr)[kNt][4], const FlashParams& p,
                                            QueryFn query_of, KeyFn key_of, DeltaFn delta_of) {
  EMBER_UNROLL
  for (int nt = 0; nt < kNt; ++nt) {
    EMBER_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float v = pr[nt][e] * (dp[nt][e] - delta_of(nt, e)) * p.scale;
      dp[nt][e] = kEdge && masked(p, query_of(nt, e), key_of(nt, e)) ? 0.0f : v;
    }
  }
}

// The forward's scores of one key tile in base-2 units (s scale log2 e; -inf where masked, tested only when kEdge)
// and the row maxima of the thread's elements into mx.
template <bool kEdge>
__device__ __forceinline__ void base2_scores(float (&s)[kNt][4], float (&mx)[2], const FlashParams& p,
                                             const int64_t (&rows)[2], int64_t k0, int t) {
  EMBER_UNROLL
  for (int nt = 0; nt < kNt; ++nt) {
    EMBER_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float v = s[nt][e] * p.scale_log2;
      s[nt][e] = kEdge && masked(p, rows[e >> 1], k0 + nt * 8 + 2 * t + (e & 1)) ? -INFINITY : v;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    }
  }
}

// ---- kernels ----------------------------------------------------------------------------------------------------

template <class T, int HD>
__global__ void __launch_bounds__(kThreads, HD == 32 ? 4 : 3) flash_forward_kernel(FlashParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  __shared__ __align__(16) uint16_t ks[2][kTile][HD + kPad];
  __shared__ __align__(16) uint16_t vs[2][kTile][HD + kPad];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const BlockWork w = block_work(p, /*reversed=*/true);
  const int64_t R = 3 * p.C;
  const uint16_t* q = p.qkv + w.b * p.T * R + w.h * HD;
  const int64_t q0 = w.tile * kTile, r0 = q0 + 16 * warp;
  const int64_t rows[2] = {r0 + g, r0 + g + 8};
  const float inf = INFINITY;

  uint32_t qa[HD / 16][4];
  load_a<HD>(qa, q, R, r0, p.T, lane);
  float o[HD / 8][4];
  zero(o);
  float m[2] = {-inf, -inf}, l[2] = {0.0f, 0.0f};
  stream_kv<HD>(ks, vs, q, p, key_end(p, q0), tid, [&](int64_t k0, const uint16_t(*kt)[HD + kPad],
                                                        const uint16_t(*vt)[HD + kPad]) {
    float s[kNt][4];
    product_rows<T, HD>(s, qa, kt, lane);
    float mx[2] = {-inf, -inf};
    if (tile_has_masked(p, q0, k0))
      base2_scores<true>(s, mx, p, rows, k0, t);
    else
      base2_scores<false>(s, mx, p, rows, k0, t);
    float ref[2];  // base 2 (Note [Flash exponentials]), as m
    EMBER_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      ref[r] = m_new == -inf ? 0.0f : m_new;
      const float alpha = exp2f(m[r] - ref[r]);
      m[r] = m_new;
      l[r] *= alpha;
      EMBER_UNROLL
      for (int dt = 0; dt < HD / 8; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }
    EMBER_UNROLL
    for (int nt = 0; nt < kNt; ++nt) {
      EMBER_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - ref[e >> 1]);
        l[e >> 1] += s[nt][e];
      }
    }
    accumulate_columns<T, HD>(o, s, vt, lane);
  });
  float inv[2];
  EMBER_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = 1.0f / l[r];
    if (t == 0 && rows[r] < p.T) p.lse[w.bh * p.T + rows[r]] = m[r] * kLn2 + ember_log(l[r]);
  }
  store_rows<T, HD>(p.out + w.b * p.T * p.C + w.h * HD, p.C, r0, p.T, o, inv, lane);
#else
  __trap();  // flash_attention_applies refuses devices below sm_80
#endif
}

// Query tiles of the backward: delta, then dq (Note [Flash attention], backward 1).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_backward_dq_kernel(FlashParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  __shared__ __align__(16) uint16_t ks[2][kTile][HD + kPad];
  __shared__ __align__(16) uint16_t vs[2][kTile][HD + kPad];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const BlockWork w = block_work(p, /*reversed=*/true);
  const int64_t R = 3 * p.C;
  const uint16_t* q = p.qkv + w.b * p.T * R + w.h * HD;
  const uint16_t* go = p.grad_out + w.b * p.T * p.C + w.h * HD;
  const int64_t q0 = w.tile * kTile, r0 = q0 + 16 * warp;
  const int64_t rows[2] = {r0 + g, r0 + g + 8};
  float lse2[2];  // lse log2 e (Note [Flash exponentials])
  EMBER_UNROLL
  for (int r = 0; r < 2; ++r) lse2[r] = rows[r] < p.T ? p.lse[w.bh * p.T + rows[r]] * kLog2e : 0.0f;

  uint32_t qa[HD / 16][4], da[HD / 16][4];
  load_a<HD>(qa, q, R, r0, p.T, lane);
  load_a<HD>(da, go, p.C, r0, p.T, lane);
  auto query_of = [&](int, int e) { return rows[e >> 1]; };
  auto lse2_of = [&](int, int e) { return lse2[e >> 1]; };
  const int64_t k_end = key_end(p, q0);

  // delta_i = grad_out_i . o_i, with o from the forward or from a first pass: o = sum_j p_ij v_j (C layout).
  // da[ks][j] holds (row g + 8 (j & 1), columns 16 ks + 8 (j >> 1) + 2t, +1): in C layout o[2 ks + (j >> 1)], elements
  // 2 (j & 1) and 2 (j & 1) + 1; the A fragments of o (oa) hold the same positions as da.
  float part[2] = {0.0f, 0.0f};
  if (p.o != nullptr) {
    uint32_t oa[HD / 16][4];
    load_a<HD>(oa, p.o + w.b * p.T * p.C + w.h * HD, p.C, r0, p.T, lane);
    EMBER_UNROLL
    for (int ks_ = 0; ks_ < HD / 16; ++ks_) {
      EMBER_UNROLL
      for (int j = 0; j < 4; ++j)
        part[j & 1] +=
            low_half<T>(da[ks_][j]) * low_half<T>(oa[ks_][j]) + high_half<T>(da[ks_][j]) * high_half<T>(oa[ks_][j]);
    }
  } else {
    float o[HD / 8][4];
    zero(o);
    stream_kv<HD>(ks, vs, q, p, k_end, tid, [&](int64_t k0, const uint16_t(*kt)[HD + kPad],
                                                const uint16_t(*vt)[HD + kPad]) {
      float s[kNt][4];
      product_rows<T, HD>(s, qa, kt, lane);
      auto key_of = [&](int nt, int e) { return k0 + nt * 8 + 2 * t + (e & 1); };
      if (tile_has_masked(p, q0, k0))
        probabilities<true>(s, p, query_of, key_of, lse2_of);
      else
        probabilities<false>(s, p, query_of, key_of, lse2_of);
      accumulate_columns<T, HD>(o, s, vt, lane);
    });
    EMBER_UNROLL
    for (int ks_ = 0; ks_ < HD / 16; ++ks_) {
      EMBER_UNROLL
      for (int j = 0; j < 4; ++j) {
        const float* c = o[2 * ks_ + (j >> 1)] + 2 * (j & 1);
        part[j & 1] += low_half<T>(da[ks_][j]) * c[0] + high_half<T>(da[ks_][j]) * c[1];
      }
    }
  }
  float delta[2];
  EMBER_UNROLL
  for (int r = 0; r < 2; ++r) {
    delta[r] = quad_sum(part[r]);
    if (t == 0 && rows[r] < p.T) p.delta[w.bh * p.T + rows[r]] = delta[r];
  }

  // Pass 2: ds = p (dp - delta) scale per key tile, dq += ds k.
  float dq[HD / 8][4];
  zero(dq);
  stream_kv<HD>(ks, vs, q, p, k_end, tid, [&](int64_t k0, const uint16_t(*kt)[HD + kPad],
                                              const uint16_t(*vt)[HD + kPad]) {
    float s[kNt][4], dp[kNt][4];
    product_rows<T, HD>(s, qa, kt, lane);
    auto key_of = [&](int nt, int e) { return k0 + nt * 8 + 2 * t + (e & 1); };
    auto delta_of = [&](int, int e) { return delta[e >> 1]; };
    product_rows<T, HD>(dp, da, vt, lane);
    if (tile_has_masked(p, q0, k0)) {
      probabilities<true>(s, p, query_of, key_of, lse2_of);
      score_grads<true>(dp, s, p, query_of, key_of, delta_of);
    } else {
      probabilities<false>(s, p, query_of, key_of, lse2_of);
      score_grads<false>(dp, s, p, query_of, key_of, delta_of);
    }
    accumulate_columns<T, HD>(dq, dp, kt, lane);
  });
  const float one[2] = {1.0f, 1.0f};
  store_rows<T, HD>(p.out + w.b * p.T * R + w.h * HD, R, r0, p.T, dq, one, lane);
#else
  __trap();
#endif
}

// Key tiles of the backward: dk and dv (Note [Flash attention], backward 2).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_backward_dkdv_kernel(FlashParams p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  __shared__ __align__(16) uint16_t qs[2][kTile][HD + kPad];
  __shared__ __align__(16) uint16_t gs[2][kTile][HD + kPad];
  __shared__ float lse_s[2][kTile], delta_s[2][kTile];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const BlockWork w = block_work(p, /*reversed=*/false);
  const int64_t R = 3 * p.C;
  const uint16_t* q = p.qkv + w.b * p.T * R + w.h * HD;
  const uint16_t* go = p.grad_out + w.b * p.T * p.C + w.h * HD;
  const int64_t k0 = w.tile * kTile, r0 = k0 + 16 * warp;
  const int64_t keys[2] = {r0 + g, r0 + g + 8};

  uint32_t ka[HD / 16][4], va[HD / 16][4];
  load_a<HD>(ka, q + p.C, R, r0, p.T, lane);
  load_a<HD>(va, q + 2 * p.C, R, r0, p.T, lane);
  float dk[HD / 8][4], dv[HD / 8][4];
  zero(dk);
  zero(dv);
  auto key_of = [&](int, int e) { return keys[e >> 1]; };
  // Query tiles before k0 see none of these keys when causal (tiles are aligned: q0 + kTile <= k0). Thread i < kTile
  // carries row i's lse log2 e and delta from its issue to the next tile's start in registers (Note [Flash tile
  // pipeline]).
  float lse2_next = 0.0f, delta_next = 0.0f;
  auto issue = [&](int64_t q0, int buf) {
    copy_tile_async<HD>(qs[buf], q, R, q0, p.T, tid);
    copy_tile_async<HD>(gs[buf], go, p.C, q0, p.T, tid);
    if (tid < kTile) {
      const bool inside = q0 + tid < p.T;
      lse2_next = inside ? p.lse[w.bh * p.T + q0 + tid] * kLog2e : 0.0f;  // Note [Flash exponentials]
      delta_next = inside ? p.delta[w.bh * p.T + q0 + tid] : 0.0f;
    }
  };
  auto land = [&](int buf) {
    if (tid < kTile) {
      lse_s[buf][tid] = lse2_next;
      delta_s[buf][tid] = delta_next;
    }
  };
  stream_tiles(p.causal ? k0 : 0, p.T, issue, land, [&](int64_t q0, int buf) {
    auto query_of = [&](int nt, int e) { return q0 + nt * 8 + 2 * t + (e & 1); };
    float s[kNt][4], dp[kNt][4];
    auto lse2_of = [&](int nt, int e) { return lse_s[buf][nt * 8 + 2 * t + (e & 1)]; };
    auto delta_of = [&](int nt, int e) { return delta_s[buf][nt * 8 + 2 * t + (e & 1)]; };
    const bool edge = tile_has_masked(p, q0, k0);
    product_rows<T, HD>(s, ka, qs[buf], lane);  // s^T = k q^T
    if (edge)
      probabilities<true>(s, p, query_of, key_of, lse2_of);
    else
      probabilities<false>(s, p, query_of, key_of, lse2_of);
    accumulate_columns<T, HD>(dv, s, gs[buf], lane);  // dv += p^T grad_out
    product_rows<T, HD>(dp, va, gs[buf], lane);       // dp^T = v grad_out^T
    if (edge)
      score_grads<true>(dp, s, p, query_of, key_of, delta_of);
    else
      score_grads<false>(dp, s, p, query_of, key_of, delta_of);
    accumulate_columns<T, HD>(dk, dp, qs[buf], lane);  // dk += ds^T q
  });
  const float one[2] = {1.0f, 1.0f};
  uint16_t* grad = p.out + w.b * p.T * R + w.h * HD;
  store_rows<T, HD>(grad + p.C, R, r0, p.T, dk, one, lane);
  store_rows<T, HD>(grad + 2 * p.C, R, r0, p.T, dv, one, lane);
#else
  __trap();
#endif
}

// ---- geometry (host) ---------------------------------------------------------------------------------------------

inline FlashParams make_params(const FlashShape& s, bool causal) {
  FlashParams p{};
  p.B = s.B;
  p.T = s.T;
  p.C = s.C;
  p.H = s.H;
  p.tiles = (s.T + kTile - 1) / kTile;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.C / s.H)));
  p.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(s.C / s.H)));
  p.causal = causal;
  return p;
}

// Blocks of each launch (1-D grid, kThreads threads each): one per (batch, head, tile).
inline int64_t flash_blocks(const FlashParams& p) { return p.tiles * p.B * p.H; }

}  // namespace ember::cuda::flash
