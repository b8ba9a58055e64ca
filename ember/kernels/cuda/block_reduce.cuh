// Warp- and block-wide all-reductions of the CUDA row kernels (softmax, layer norm, attention): every participating
// thread gets the result. Invariant: callers have whole warps active (blockDim.x a multiple of 32, at most 1024) and
// call a block reduction from every thread of the block, so the full-mask shuffles and the barriers are never
// divergent.
#pragma once

#include <limits>

#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

#if defined(__CUDACC__) || defined(EMBER_SIMT_EMULATION)  // the CPU emulator of tests/harness/simt_emulator.h
// max that propagates NaN from either side (a plain `a > b ? a : b` drops a NaN b), as the CPU's has_nan flag does.
template <class A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return (a != a || a > b) ? a : b;
}

struct SumOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return nan_max(a, b);
  }
};

// Every lane of a fully active warp gets op over the 32 lanes' values.
template <class A, class Op>
__device__ __forceinline__ A warp_all_reduce(A v, Op op) {
  EMBER_UNROLL
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Every thread of the block gets op over all threads' values. `slots` is __shared__ [32]. The leading barrier keeps a
// call's writes from racing with the previous call's reads of the slots.
template <class A, class Op>
__device__ __forceinline__ A block_all_reduce(A v, Op op, A identity, A* slots) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_all_reduce(v, op);
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = lane < warps ? slots[lane] : identity;
  return warp_all_reduce(v, op);
}
#endif

}  // namespace ember::cuda
