// The kernels of the fused softmax + cross-entropy on CUDA (cross_entropy.cu launches them; Note [Fused
// cross-entropy] in kernels/stubs.h), in a header so that a host compiler can build them too:
// tests/kernels/test_cross_entropy_emulated.cpp runs them on the CPU under tests/harness/simt_emulator.h.
// Invariant: one block per row; f16/bf16 logits are read as they are and computed in float; a NaN or +inf logit, or a
// row of only -inf, makes its row's loss NaN, as on the CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ember/base/host_device.h"
#include "ember/core/half.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda {

constexpr int kMaxThreads = 256;

// Accumulation type of a logits element type: double for f64, float otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// e^x in A. f32 takes it as 2^(x log2 e) by exp2f, one MUFU.EX2 on the device where expf adds a range reduction of
// several instructions (as Note [Flash exponentials] in attention_flash_kernels.cuh); the rounding of x log2 e adds
// |x| 2^-24 ln 2 relative error, which for the x <= 0 of these kernels matters only where e^x is far below the terms
// it is summed with.
template <class A>
__device__ __forceinline__ A exp_acc(A x) {
  if constexpr (std::is_same_v<A, double>)
    return exp(x);
  else
    return exp2f(x * 1.4426950408889634f);
}

// A running log-sum-exp: m the largest value seen, s = sum of e^(x - m); nan set once a NaN or a +inf was seen.
// Note [Non-finite rows]: the CPU kernel subtracts the row max before exponentiating, so a +inf logit (inf - inf)
// and a row of nothing but -inf (-inf - -inf) give it a NaN lse, hence a NaN loss and gradient; `nan` and the
// m == -inf test in cross_entropy_kernel reproduce that (the running form alone would give lse +inf / -inf).
template <class A>
struct RowAcc {
  A m, s, sum_x;
  bool nan;
};

template <class A>
__device__ __forceinline__ void acc_add(RowAcc<A>& a, A x) {
  a.sum_x += x;
  if (x != x || x == A(INFINITY)) {  // Note [Non-finite rows]: m stays below +inf here (acc_add_pack's may not)
    a.nan = true;
  } else if (x > a.m) {
    a.s = a.s * exp_acc(a.m - x) + A(1);  // m = -inf at first: e^-inf = 0
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += exp_acc(x - a.m);
  }
}

// Note [Cross-entropy packs]
// A 16-byte pack's elements are added at once: the pack's max first, then one rescale of the running sum to the new
// max, then an exponential per element with no compare or branch, where acc_add's per-element form compares, branches
// (lanes diverge while the max is still rising) and may rescale at every element. An element costs about 7
// instructions (max, difference, multiply, EX2, two adds, the non-finite test) against about 25, which is what keeps a
// bf16 row (8 elements per 16 bytes) from being bound by instruction issue rather than memory. A NaN or +inf sets
// `nan` (fmax skips a NaN; a +inf max only makes s NaN, which `nan` overrides anyway); a pack of only -inf elements
// adds nothing, and while m is still -inf the exponentials are taken against 0 so that -inf - -inf never appears.
template <class A, int V>
__device__ __forceinline__ void acc_add_pack(RowAcc<A>& a, const A (&x)[V]) {
  A mx = a.m, sum_x = A(0);
  bool bad = false;
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) {
    mx = x[e] > mx ? x[e] : mx;
    sum_x += x[e];
    bad = bad || !(x[e] < A(INFINITY));  // NaN or +inf
  }
  const A ref = mx == A(-INFINITY) ? A(0) : mx;
  A sum = a.s * exp_acc(a.m - ref);
  EMBER_UNROLL
  for (int e = 0; e < V; ++e) sum += exp_acc(x[e] - ref);
  a.m = mx;
  a.s = sum;
  a.sum_x += sum_x;
  a.nan = a.nan || bad;
}

template <class A>
__device__ __forceinline__ void acc_merge(RowAcc<A>& a, A m, A s, A sum_x, bool nan) {
  a.sum_x += sum_x;
  a.nan = a.nan || nan;
  if (m > a.m) {
    a.s = s + a.s * exp_acc(a.m - m);
    a.m = m;
  } else if (m != -INFINITY) {
    a.s += s * exp_acc(m - a.m);
  }
}

// Combines every thread's accumulator of the block; the result is valid in thread 0. blockDim.x is a multiple of 32.
template <class A>
__device__ RowAcc<A> block_combine(RowAcc<A> a) {
  __shared__ A sh_m[kMaxThreads / 32], sh_s[kMaxThreads / 32], sh_x[kMaxThreads / 32];
  __shared__ bool sh_nan[kMaxThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    const A m = __shfl_down_sync(0xffffffffu, a.m, offset);
    const A s = __shfl_down_sync(0xffffffffu, a.s, offset);
    const A x = __shfl_down_sync(0xffffffffu, a.sum_x, offset);
    const bool nan = __shfl_down_sync(0xffffffffu, static_cast<int>(a.nan), offset) != 0;
    acc_merge(a, m, s, x, nan);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    sh_m[warp] = a.m;
    sh_s[warp] = a.s;
    sh_x[warp] = a.sum_x;
    sh_nan[warp] = a.nan;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w) acc_merge(a, sh_m[w], sh_s[w], sh_x[w], sh_nan[w]);
  }
  return a;
}

// ---- kernels ----------------------------------------------------------------------------------------------------

// `packed` (uniform over the launch; cross_entropy_packed): every row is whole 16-byte packs, read one pack per access.
template <class T>
__global__ void cross_entropy_kernel(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t cols,
                                     int64_t ignore_index, double smoothing, acc_t<T>* __restrict__ loss,
                                     acc_t<T>* __restrict__ lse, bool packed) {
  using A = acc_t<T>;
  using P = ::ember::cuda::Pack<T>;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  // The target and its logit, read by the thread that finishes the row before the row pass, so their two dependent
  // loads overlap it instead of following the block's combine (targets are checked on the host: ignore_index or a
  // class, so row[t] is inside the row).
  int64_t t = 0;
  A x_t = A(0);
  if (threadIdx.x == 0) {
    t = target[r];
    if (t != ignore_index) x_t = static_cast<A>(row[t]);
  }
  RowAcc<A> a{-INFINITY, A(0), A(0), false};
  if (packed) {
    const P* prow = reinterpret_cast<const P*>(row);
    for (int64_t pc = threadIdx.x; pc < cols / P::kSize; pc += blockDim.x) {
      const P p = prow[pc];
      A x[P::kSize];
      EMBER_UNROLL
      for (int e = 0; e < P::kSize; ++e) x[e] = static_cast<A>(p.v[e]);
      acc_add_pack(a, x);  // Note [Cross-entropy packs]
    }
  } else {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc_add(a, static_cast<A>(row[j]));
  }
  a = block_combine(a);
  if (threadIdx.x != 0) return;
  // Note [Non-finite rows]: cols >= 1 here, so m == -inf means every logit of the row is -inf.
  const A l = (a.nan || a.m == A(-INFINITY)) ? A(NAN) : a.m + log(a.s);
  lse[r] = l;
  if (t == ignore_index) {
    loss[r] = A(0);
    return;
  }
  const A nll = l - x_t;
  if (smoothing > 0.0) {
    const A c = static_cast<A>(cols);
    loss[r] = static_cast<A>(1.0 - smoothing) * nll + static_cast<A>(smoothing) / c * (c * l - a.sum_x);
  } else {
    loss[r] = nll;
  }
}

// `packed`: as the forward's, for the logits and grad_logits rows.
template <class T>
__global__ void cross_entropy_backward_kernel(const acc_t<T>* __restrict__ grad_loss, const T* __restrict__ logits,
                                              const int64_t* __restrict__ target, const acc_t<T>* __restrict__ lse,
                                              int64_t cols, int64_t ignore_index, acc_t<T> uniform, acc_t<T> hit,
                                              T* __restrict__ grad_logits, bool packed) {
  using A = acc_t<T>;
  using P = ::ember::cuda::Pack<T>;
  constexpr int V = P::kSize;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  T* out = grad_logits + r * cols;
  const int64_t t = target[r];
  const A g = grad_loss[r], l = lse[r];  // read with the target, not after it (every row has both)
  if (t == ignore_index) {  // the gradient of an ignored row is 0; its logits are not read
    if (packed) {
      P zero;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) zero.v[e] = T(A(0));
      for (int64_t pc = threadIdx.x; pc < cols / V; pc += blockDim.x) reinterpret_cast<P*>(out)[pc] = zero;
    } else {
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = T(A(0));
    }
    return;
  }
  const A g_uniform = g * uniform, g_hit = g * hit;
  // g (p - uniform) = g p - g uniform for every element; the target's also subtracts g hit, once per row.
  auto grad_of = [&](A x) { return g * exp_acc(x - l) - g_uniform; };
  if (packed) {
    const P* prow = reinterpret_cast<const P*>(row);
    P* pout = reinterpret_cast<P*>(out);
    for (int64_t pc = threadIdx.x; pc < cols / V; pc += blockDim.x) {
      const P p = prow[pc];
      A d[V];
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) d[e] = grad_of(static_cast<A>(p.v[e]));
      const int64_t te = t - pc * V;  // the target's place in this pack, if it is in it
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) d[e] -= te == e ? g_hit : A(0);
      P o;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) o.v[e] = T(d[e]);
      pout[pc] = o;
    }
  } else {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const A d = grad_of(static_cast<A>(row[j]));
      out[j] = T(j == t ? d - g_hit : d);
    }
  }
}

// Whether rows of `cols` elements of T from `logits` (and `grad_logits`, when given) are whole aligned 16-byte packs.
template <class T>
bool cross_entropy_packed(const void* logits, const void* grad_logits, int64_t cols) {
  auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return cols % ::ember::cuda::Pack<T>::kSize == 0 && aligned(logits) && aligned(grad_logits);
}

// Threads per row: the columns rounded up to a warp, at most kMaxThreads.
inline unsigned int threads_for(int64_t cols) {
  const int64_t warps = (cols + 31) / 32;
  return static_cast<unsigned int>(32 * (warps < kMaxThreads / 32 ? warps : kMaxThreads / 32));
}

}  // namespace ember::kernels::cuda
