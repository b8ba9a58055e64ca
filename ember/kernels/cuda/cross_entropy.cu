// CUDA kernels of the fused softmax + cross-entropy (Note [Fused cross-entropy] in kernels/stubs.h), registered for
// the `cross_entropy` and `cross_entropy_backward` stubs: one block per row; the forward reads the row once, keeping
// a running (max, sum of e^(x - max), sum of x) per thread that the block combines; the backward recomputes each
// probability from the logit and the row's lse. Invariant: f16/bf16 logits are read as they are and computed in
// float; a NaN or +inf logit, or a row of only -inf, makes its row's loss NaN, as on the CPU.
#include <cmath>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;

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

template <class T>
__global__ void cross_entropy_kernel(const T* __restrict__ logits, const int64_t* __restrict__ target, int64_t cols,
                                     int64_t ignore_index, double smoothing, acc_t<T>* __restrict__ loss,
                                     acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  RowAcc<A> a{-INFINITY, A(0), A(0), false};
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc_add(a, static_cast<A>(row[j]));
  a = block_combine(a);
  if (threadIdx.x != 0) return;
  // Note [Non-finite rows]: cols >= 1 here, so m == -inf means every logit of the row is -inf.
  const A l = (a.nan || a.m == A(-INFINITY)) ? A(NAN) : a.m + log(a.s);
  lse[r] = l;
  const int64_t t = target[r];
  if (t == ignore_index) {
    loss[r] = A(0);
    return;
  }
  const A nll = l - static_cast<A>(row[t]);
  if (smoothing > 0.0) {
    const A c = static_cast<A>(cols);
    loss[r] = static_cast<A>(1.0 - smoothing) * nll + static_cast<A>(smoothing) / c * (c * l - a.sum_x);
  } else {
    loss[r] = nll;
  }
}

template <class T>
__global__ void cross_entropy_backward_kernel(const acc_t<T>* __restrict__ grad_loss, const T* __restrict__ logits,
                                              const int64_t* __restrict__ target, const acc_t<T>* __restrict__ lse,
                                              int64_t cols, int64_t ignore_index, acc_t<T> uniform, acc_t<T> hit,
                                              T* __restrict__ grad_logits) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  T* out = grad_logits + r * cols;
  const int64_t t = target[r];
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = T(A(0));
    return;
  }
  const A g = grad_loss[r], l = lse[r];
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const A p = exp_acc(static_cast<A>(row[j]) - l);
    out[j] = T(j == t ? g * ((p - uniform) - hit) : g * (p - uniform));
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

// Threads per row: the columns rounded up to a warp, at most kMaxThreads.
unsigned int threads_for(int64_t cols) {
  const int64_t warps = (cols + 31) / 32;
  return static_cast<unsigned int>(32 * (warps < kMaxThreads / 32 ? warps : kMaxThreads / 32));
}

template <class T>
void launch_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                    const Tensor& loss, const Tensor& lse, cudaStream_t stream) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  cross_entropy_kernel<T><<<static_cast<unsigned int>(rows), threads_for(cols), 0, stream>>>(
      static_cast<const T*>(logits.raw_data()), static_cast<const int64_t*>(target.raw_data()), cols, ignore_index,
      smoothing, static_cast<acc_t<T>*>(loss.raw_data()), static_cast<acc_t<T>*>(lse.raw_data()));
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                     int64_t ignore_index, double smoothing, const Tensor& grad_logits, cudaStream_t stream) {
  using A = acc_t<T>;
  const int64_t rows = logits.size(0), cols = logits.size(1);
  cross_entropy_backward_kernel<T><<<static_cast<unsigned int>(rows), threads_for(cols), 0, stream>>>(
      static_cast<const A*>(grad_loss.raw_data()), static_cast<const T*>(logits.raw_data()),
      static_cast<const int64_t*>(target.raw_data()), static_cast<const A*>(lse.raw_data()), cols, ignore_index,
      static_cast<A>(smoothing / static_cast<double>(cols)), static_cast<A>(1.0 - smoothing),
      static_cast<T*>(grad_logits.raw_data()));
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry points -----------------------------------------------------------------------------------------------

// The layout ops_loss.cpp guarantees, re-checked because the kernels index flat rows: everything on one CUDA device,
// logits [M, C] contiguous, the [M] tensors contiguous, the row count within the grid's x limit.
void check_rows(const char* op, const Tensor& logits, std::initializer_list<const Tensor*> per_row) {
  const Device device = logits.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", logits.description());
  EMBER_CHECK(logits.dim() == 2 && logits.is_contiguous(), ShapeError, op, ": logits ", logits.description(),
              " must be a contiguous [M, C]");
  EMBER_CHECK(logits.size(0) <= 0x7fffffff, ShapeError, op, ": ", logits.size(0), " rows exceed the grid limit");
  for (const Tensor* t : per_row) {
    EMBER_CHECK(t->device() == device, DeviceError, op, ": ", t->description(), " is not on ", device.str());
    EMBER_CHECK(t->is_contiguous() && t->numel() == logits.size(0), ShapeError, op, ": ", t->description(),
                " must be a contiguous tensor of ", logits.size(0), " rows");
  }
}

void cross_entropy_cuda(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                        const Tensor& loss, const Tensor& lse) {
  check_rows("cross_entropy_rows", logits, {&target, &loss, &lse});
  if (logits.numel() == 0) return;
  DeviceGuard guard(logits.device().index);
  const cudaStream_t stream = ::ember::cuda::current_stream(logits.device().index).get();
  EMBER_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rows",
                       [&] { launch_forward<scalar_t>(logits, target, ignore_index, smoothing, loss, lse, stream); });
}

void cross_entropy_backward_cuda(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                 int64_t ignore_index, double smoothing, const Tensor& grad_logits) {
  check_rows("cross_entropy_rows_backward", logits, {&grad_loss, &target, &lse});
  EMBER_CHECK(grad_logits.sizes() == logits.sizes() && grad_logits.is_contiguous(), ShapeError,
              "cross_entropy_rows_backward: grad_logits ", grad_logits.description(), " does not match the logits");
  if (logits.numel() == 0) return;
  DeviceGuard guard(logits.device().index);
  const cudaStream_t stream = ::ember::cuda::current_stream(logits.device().index).get();
  EMBER_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rows_backward", [&] {
    launch_backward<scalar_t>(grad_loss, logits, target, lse, ignore_index, smoothing, grad_logits, stream);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(cross_entropy, DeviceType::CUDA, cross_entropy_cuda);
EMBER_REGISTER_KERNEL(cross_entropy_backward, DeviceType::CUDA, cross_entropy_backward_cuda);

}  // namespace ember::kernels::cuda
