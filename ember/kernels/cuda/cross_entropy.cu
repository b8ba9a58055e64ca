// CUDA kernels of the fused softmax + cross-entropy (Note [Fused cross-entropy] in kernels/stubs.h), registered for
// the `cross_entropy` and `cross_entropy_backward` stubs: one block per row; the forward reads the row once, keeping
// a running (max, sum of e^(x - max), sum of x) per thread that the block combines; the backward recomputes each
// probability from the logit and the row's lse. Invariant: f16/bf16 logits are read as they are and computed in
// float; a NaN or +inf logit, or a row of only -inf, makes its row's loss NaN, as on the CPU.
#include <cmath>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/cross_entropy_kernels.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;

// ---- launchers --------------------------------------------------------------------------------------------------

template <class T>
void launch_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                    const Tensor& loss, const Tensor& lse, cudaStream_t stream) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  cross_entropy_kernel<T><<<static_cast<unsigned int>(rows), threads_for(cols), 0, stream>>>(
      static_cast<const T*>(logits.raw_data()), static_cast<const int64_t*>(target.raw_data()), cols, ignore_index,
      smoothing, static_cast<acc_t<T>*>(loss.raw_data()), static_cast<acc_t<T>*>(lse.raw_data()),
      cross_entropy_packed<T>(logits.raw_data(), nullptr, cols));
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
      static_cast<T*>(grad_logits.raw_data()),
      cross_entropy_packed<T>(logits.raw_data(), grad_logits.raw_data(), cols));
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
