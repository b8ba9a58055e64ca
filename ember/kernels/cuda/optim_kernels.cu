// CUDA kernels of the fused optimizer updates (sgd_step, adam_step, adam_step_multi), registered for their stubs: one
// grid-stride pass over the contiguous parameter(s), gradient(s) and state, each element updated with the math of
// kernels/optim_math.h that the CPU kernel runs, so both devices take the same steps (up to FMA contraction).
// Invariant: every element is read once and written once; the coefficients are computed on the host, once per call.
#include <algorithm>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/optim_math.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;

// State element type for a parameter of type T: double for f64, else float (as the CPU kernel).
template <class T>
using state_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ---- kernels ----------------------------------------------------------------------------------------------------

// buf is null when momentum is off (sgd_update reads it only when c.use_momentum).
template <class T>
__global__ void sgd_kernel(T* __restrict__ p, const T* __restrict__ g, state_t<T>* __restrict__ buf, int64_t n,
                           SgdCoeffs<op_math_t<T>> c) {
  using M = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    M b = buf != nullptr ? static_cast<M>(buf[i]) : M(0);
    p[i] = T(sgd_update<M>(static_cast<M>(p[i]), static_cast<M>(g[i]), b, c));
    if (buf != nullptr) buf[i] = static_cast<state_t<T>>(b);
  }
}

template <class T>
__global__ void adam_kernel(T* __restrict__ p, const T* __restrict__ g, state_t<T>* __restrict__ m,
                            state_t<T>* __restrict__ v, int64_t n, AdamCoeffs<op_math_t<T>> c) {
  using M = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    M mi = static_cast<M>(m[i]), vi = static_cast<M>(v[i]);
    p[i] = T(adam_update<M>(static_cast<M>(p[i]), static_cast<M>(g[i]), mi, vi, c));
    m[i] = static_cast<state_t<T>>(mi);
    v[i] = static_cast<state_t<T>>(vi);
  }
}

// Multi-tensor Adam (Note [Multi-tensor Adam] in ops_optim.cpp): blockIdx.y picks the table entry, blocks along x
// stride over its elements. Entries of one launch share T; each carries its own coefficients.
constexpr int kMultiEntries = 24;  // per launch: the table (~2 KiB) stays well inside the 4 KiB kernel-parameter space
constexpr int kMultiMaxBlocksPerEntry = 64;
// An entry with more elements than an entry's blocks cover at 16 elements per thread runs alone, on the
// single-tensor kernel's full grid: in a table its 64 blocks would leave most of the GPU idle while they finish
// (GPT-2's 38.6M-element token embedding: 16K threads, ~2.4K elements each, the tail of its launch).
constexpr int64_t kMultiMaxEntryNumel = int64_t{kMultiMaxBlocksPerEntry} * kElementwiseThreads * 16;

template <class T>
struct AdamTable {
  T* p[kMultiEntries];
  const T* g[kMultiEntries];
  state_t<T>* m[kMultiEntries];
  state_t<T>* v[kMultiEntries];
  int64_t n[kMultiEntries];
  AdamCoeffs<op_math_t<T>> c[kMultiEntries];
};

template <class T>
__global__ void adam_multi_kernel(const __grid_constant__ AdamTable<T> t) {
  using M = op_math_t<T>;
  const int e = static_cast<int>(blockIdx.y);
  T* __restrict__ p = t.p[e];
  const T* __restrict__ g = t.g[e];
  state_t<T>* __restrict__ m = t.m[e];
  state_t<T>* __restrict__ v = t.v[e];
  const AdamCoeffs<M> c = t.c[e];
  for (int64_t i = grid_stride_begin(); i < t.n[e]; i += grid_stride_step()) {
    M mi = static_cast<M>(m[i]), vi = static_cast<M>(v[i]);
    p[i] = T(adam_update<M>(static_cast<M>(p[i]), static_cast<M>(g[i]), mi, vi, c));
    m[i] = static_cast<state_t<T>>(mi);
    v[i] = static_cast<state_t<T>>(vi);
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& params,
                cudaStream_t stream) {
  using M = op_math_t<T>;
  const int64_t n = param.numel();
  const SgdCoeffs<M> c = sgd_coeffs<M>(params);
  auto* buf = c.use_momentum ? static_cast<state_t<T>*>(momentum_buf.raw_data()) : nullptr;
  sgd_kernel<T><<<grid_for(n, param.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()), buf, n, c);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_adam(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& params, cudaStream_t stream) {
  using M = op_math_t<T>;
  const int64_t n = param.numel();
  adam_kernel<T><<<grid_for(n, param.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()),
      static_cast<state_t<T>*>(exp_avg.raw_data()), static_cast<state_t<T>*>(exp_avg_sq.raw_data()), n,
      adam_coeffs<M>(params));
  EMBER_CUDA_LAUNCH_CHECK();
}

// Launches the entries above kMultiMaxEntryNumel one by one (launch_adam), the rest in tables of kMultiEntries, each
// entry's blocks sized by its numel. Either way each element gets the same update.
template <class T>
void launch_adam_multi(const std::vector<AdamStepEntry>& all, cudaStream_t stream) {
  using M = op_math_t<T>;
  std::vector<const AdamStepEntry*> entries;
  entries.reserve(all.size());
  for (const AdamStepEntry& e : all) {
    if (e.param.numel() > kMultiMaxEntryNumel)
      launch_adam<T>(e.param, e.grad, e.exp_avg, e.exp_avg_sq, e.p, stream);
    else
      entries.push_back(&e);
  }
  for (size_t first = 0; first < entries.size(); first += kMultiEntries) {
    const size_t count = std::min<size_t>(kMultiEntries, entries.size() - first);
    AdamTable<T> t{};
    int64_t most = 0;
    for (size_t k = 0; k < count; ++k) {
      const AdamStepEntry& e = *entries[first + k];
      t.p[k] = static_cast<T*>(e.param.raw_data());
      t.g[k] = static_cast<const T*>(e.grad.raw_data());
      t.m[k] = static_cast<state_t<T>*>(e.exp_avg.raw_data());
      t.v[k] = static_cast<state_t<T>*>(e.exp_avg_sq.raw_data());
      t.n[k] = e.param.numel();
      t.c[k] = adam_coeffs<M>(e.p);
      most = std::max(most, t.n[k]);
    }
    const int64_t blocks = std::min<int64_t>(kMultiMaxBlocksPerEntry, (most + kElementwiseThreads - 1) /
                                                                         kElementwiseThreads);
    const dim3 grid(static_cast<unsigned int>(std::max<int64_t>(blocks, 1)), static_cast<unsigned int>(count));
    adam_multi_kernel<T><<<grid, kElementwiseThreads, 0, stream>>>(t);
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

// ---- entry points -----------------------------------------------------------------------------------------------

// The layout the front end (ops_optim.cpp) guarantees, re-checked here because the kernel indexes flat arrays:
// every tensor on param's CUDA device, contiguous, with param's numel; grad of param's dtype; state f32 (f64 for f64).
void check_operands(const char* op, const Tensor& param, const Tensor& grad,
                    std::initializer_list<const Tensor*> state) {
  const Device device = param.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", param.description());
  const DType state_dtype = param.dtype() == DType::f64 ? DType::f64 : DType::f32;
  EMBER_CHECK(grad.dtype() == param.dtype(), DTypeError, op, ": grad ", grad.description(), " and param ",
              param.description(), " differ in dtype");
  auto check_layout = [&](const Tensor& t) {
    EMBER_CHECK(t.device() == device, DeviceError, op, ": ", t.description(), " is not on ", device.str());
    EMBER_CHECK(t.is_contiguous() && t.numel() == param.numel(), ShapeError, op, ": ", t.description(),
                " is not a contiguous tensor of param's ", param.numel(), " elements");
  };
  check_layout(param);
  check_layout(grad);
  for (const Tensor* s : state) {
    check_layout(*s);
    EMBER_CHECK(s->dtype() == state_dtype, DTypeError, op, ": optimizer state ", s->description(), " should be ",
                dtype_name(state_dtype));
  }
}

void sgd_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p) {
  if (p.momentum != 0.0)
    check_operands("sgd_step_", param, grad, {&momentum_buf});
  else
    check_operands("sgd_step_", param, grad, {});
  if (param.numel() == 0) return;
  DeviceGuard guard(param.device().index);
  const cudaStream_t stream = ::ember::cuda::current_stream(param.device().index).get();
  EMBER_DISPATCH_FLOAT(param.dtype(), "sgd_step_", [&] { launch_sgd<scalar_t>(param, grad, momentum_buf, p, stream); });
}

void adam_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const AdamParams& p) {
  check_operands("adam_step_", param, grad, {&exp_avg, &exp_avg_sq});
  if (param.numel() == 0) return;
  DeviceGuard guard(param.device().index);
  const cudaStream_t stream = ::ember::cuda::current_stream(param.device().index).get();
  EMBER_DISPATCH_FLOAT(param.dtype(), "adam_step_",
                       [&] { launch_adam<scalar_t>(param, grad, exp_avg, exp_avg_sq, p, stream); });
}

void adam_step_multi_cuda(const std::vector<AdamStepEntry>& entries) {
  if (entries.empty()) return;
  const Device device = entries.front().param.device();
  const DType dtype = entries.front().param.dtype();
  for (const AdamStepEntry& e : entries) {
    check_operands("adam_step_multi_", e.param, e.grad, {&e.exp_avg, &e.exp_avg_sq});
    EMBER_CHECK(e.param.device() == device && e.param.dtype() == dtype, DTypeError, "adam_step_multi_: entries ",
                entries.front().param.description(), " and ", e.param.description(), " differ in device or dtype");
  }
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(dtype, "adam_step_multi_", [&] { launch_adam_multi<scalar_t>(entries, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(sgd_step, DeviceType::CUDA, sgd_step_cuda);
EMBER_REGISTER_KERNEL(adam_step, DeviceType::CUDA, adam_step_cuda);
EMBER_REGISTER_KERNEL(adam_step_multi, DeviceType::CUDA, adam_step_multi_cuda);

}  // namespace ember::kernels::cuda
