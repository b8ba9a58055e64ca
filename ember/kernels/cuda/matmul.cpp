// The CUDA kernels of the `bmm` and `linear_bias` stubs, through gemm() (blas.h). bmm: out[b] = a[b] @ bm[b] (+= when
// accumulating: beta 1) for a [B, M, K], bm [B, K, N] with any strides (batch stride 0 where a side broadcasts) into
// the contiguous out [B, M, N].
// Invariant: the operands reach gemm() as the views they are; gemm() decides per operand whether cuBLASLt reads it
// in place or from a packed copy (Note [GEMM through cuBLASLt] in blas.cu), and K == 0 yields zeros.
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::MatrixRef;

void check_on_device(const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, "bmm: the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void bmm_cuda(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, "bmm: the CUDA kernel got ", out.description());
  check_on_device(a, device);
  check_on_device(b, device);
  // The CPU kernel takes the floating dtypes (EMBER_DISPATCH_FLOAT), one for all three tensors.
  const DType dt = out.dtype();
  EMBER_CHECK(is_floating(dt), DTypeError,
              "bmm: expects a floating dtype, got ", out.description());
  EMBER_CHECK(a.dtype() == dt && b.dtype() == dt, DTypeError, "bmm: operands ", a.description(), " and ",
              b.description(), " must have the output's dtype (", out.description(), ")");
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3, ShapeError, "bmm: expects [B, M, K] x [B, K, N] -> ",
              "[B, M, N], got ", a.description(), ", ", b.description(), " and ", out.description());
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  EMBER_CHECK(b.size(0) == B && b.size(1) == K && out.size(0) == B && out.size(1) == M && out.size(2) == N, ShapeError,
              "bmm: shapes ", shape_str(a.sizes()), " x ", shape_str(b.sizes()), " -> ", shape_str(out.sizes()),
              " do not match [B, M, K] x [B, K, N] -> [B, M, N]");
  EMBER_CHECK(out.is_contiguous(), ValueError, "bmm: the output ", out.description(), " must be contiguous");
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // An empty operand (K == 0) may have no storage (null data); gemm() reads neither operand then.
  const MatrixRef ra{a.raw_data(), a.stride(0), a.stride(1), a.stride(2)};
  const MatrixRef rb{b.raw_data(), b.stride(0), b.stride(1), b.stride(2)};
  ::ember::cuda::gemm(dt, B, M, N, K, ra, rb, out.raw_data(), M * N, N, /*alpha=*/1.0, /*beta=*/accumulate ? 1.0 : 0.0,
                      device.index, stream);
}

// The CUDA kernel of the `linear_bias` stub: out [rows, out] = x [rows, in] @ weight^T + bias, the bias added in
// cuBLASLt's epilogue (Note [Bias epilogue] in blas.cu); x and weight are read as the views they are.
void linear_bias_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, "linear: the CUDA kernel got ", out.description());
  check_on_device(x, device);
  check_on_device(weight, device);
  check_on_device(bias, device);
  const DType dt = out.dtype();
  EMBER_CHECK(is_floating(dt), DTypeError,
              "linear: expects a floating dtype, got ", out.description());
  EMBER_CHECK(x.dtype() == dt && weight.dtype() == dt && bias.dtype() == dt, DTypeError, "linear: ", x.description(),
              ", ", weight.description(), " and ", bias.description(), " must have the output's dtype (",
              out.description(), ")");
  EMBER_CHECK(x.dim() == 2 && weight.dim() == 2 && bias.dim() == 1 && out.dim() == 2, ShapeError,
              "linear: expects x [rows, in], weight [out, in], bias [out] -> [rows, out], got ", x.description(), ", ",
              weight.description(), ", ", bias.description(), " and ", out.description());
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  EMBER_CHECK(weight.size(1) == K && bias.size(0) == N && out.size(0) == M && out.size(1) == N, ShapeError,
              "linear: shapes x ", shape_str(x.sizes()), ", weight ", shape_str(weight.sizes()), ", bias ",
              shape_str(bias.sizes()), " -> ", shape_str(out.sizes()), " do not match");
  EMBER_CHECK(out.is_contiguous() && bias.is_contiguous(), ValueError, "linear: the output ", out.description(),
              " and the bias ", bias.description(), " must be contiguous");
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // weight^T [in, out]: element (k, n) is weight (n, k).
  const MatrixRef rx{x.raw_data(), 0, x.stride(0), x.stride(1)};
  const MatrixRef rw{weight.raw_data(), 0, weight.stride(1), weight.stride(0)};
  ::ember::cuda::gemm(dt, 1, M, N, K, rx, rw, out.raw_data(), M * N, N, /*alpha=*/1.0, /*beta=*/0.0, device.index,
                      stream, bias.raw_data());
}

}  // namespace

EMBER_REGISTER_KERNEL(bmm, DeviceType::CUDA, bmm_cuda);
EMBER_REGISTER_KERNEL(linear_bias, DeviceType::CUDA, linear_bias_cuda);

}  // namespace ember::kernels::cuda
