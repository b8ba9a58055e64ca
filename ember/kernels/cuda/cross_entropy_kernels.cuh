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

template <class A>
__device__ __forceinline__ A exp_acc(A x) {
  if constexpr (std::is_same_v<A, double>)
    return exp(x);
  else
    return expf(x);
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
  if (x != x || x == A(INFINITY)) {  // Note [Non-finite rows]: m never becomes +inf
    a.nan = true;
  } else if (x > a.m) {
    a.s = a.s * exp_acc(a.m - x) + A(1);  // m = -inf at first: e^-inf = 0
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += exp_acc(x - a.m);
  }
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
      EMBER_UNROLL
      for (int e = 0; e < P::kSize; ++e) acc_add(a, static_cast<A>(p.v[e]));
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
  const bool ignored = t == ignore_index;
  const A g = ignored ? A(0) : grad_loss[r], l = ignored ? A(0) : lse[r];
  // The gradient of element j from its logit x (0 for an ignored row).
  auto grad_of = [&](int64_t j, A x) {
    if (ignored) return T(A(0));
    const A p = exp_acc(x - l);
    return T(j == t ? g * ((p - uniform) - hit) : g * (p - uniform));
  };
  if (packed) {
    const P* prow = reinterpret_cast<const P*>(row);
    P* pout = reinterpret_cast<P*>(out);
    for (int64_t pc = threadIdx.x; pc < cols / V; pc += blockDim.x) {
      P p;
      if (!ignored) p = prow[pc];  // an ignored row's logits are not read
      P o;
      EMBER_UNROLL
      for (int e = 0; e < V; ++e) o.v[e] = grad_of(pc * V + e, ignored ? A(0) : static_cast<A>(p.v[e]));
      pout[pc] = o;
    }
  } else {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      out[j] = grad_of(j, ignored ? A(0) : static_cast<A>(row[j]));
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
