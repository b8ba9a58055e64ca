// The CUDA entry points of the conv2d and conv2d_backward stubs, and the path settings of conv.h. Each entry point
// checks devices, dtypes and shapes, makes the device current and routes to cuDNN or im2col (conv_impl.h).
// Invariant: a convolution cuDNN declines runs on the im2col path, so every checked call writes its outputs.
#include "ember/kernels/cuda/conv.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/conv_impl.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/stubs.h"

namespace ember::cuda {

namespace {

constexpr int kUnset = -1;
std::atomic<int> g_strategy{kUnset};
std::atomic<int64_t> g_chunk_bytes{int64_t{64} << 20};

ConvStrategy strategy_from_env() {
  const char* env = std::getenv("EMBER_CONV");
  if (env == nullptr || *env == '\0') return conv_cudnn_built_in() ? ConvStrategy::Cudnn : ConvStrategy::Im2col;
  const std::string v = env;
  if (v == "im2col") return ConvStrategy::Im2col;
  EMBER_CHECK(v == "cudnn", ConfigError, "EMBER_CONV: expected cudnn or im2col, got '", v, "'");
  EMBER_CHECK(conv_cudnn_built_in(), ConfigError, "EMBER_CONV=cudnn: ember was built without cuDNN");
  return ConvStrategy::Cudnn;
}

}  // namespace

const char* conv_strategy_name(ConvStrategy s) { return s == ConvStrategy::Cudnn ? "cudnn" : "im2col"; }

bool conv_cudnn_built_in() {
#if defined(EMBER_WITH_CUDNN)
  return true;
#else
  return false;
#endif
}

ConvStrategy conv_strategy() {
  int v = g_strategy.load(std::memory_order_acquire);
  if (v == kUnset) {
    int expected = kUnset;
    g_strategy.compare_exchange_strong(expected, static_cast<int>(strategy_from_env()), std::memory_order_acq_rel);
    v = g_strategy.load(std::memory_order_acquire);
  }
  return static_cast<ConvStrategy>(v);
}

void set_conv_strategy(ConvStrategy s) {
  EMBER_CHECK(s == ConvStrategy::Im2col || conv_cudnn_built_in(), ConfigError,
              "set_conv_strategy(cudnn): ember was built without cuDNN");
  g_strategy.store(static_cast<int>(s), std::memory_order_release);
}

int64_t set_im2col_chunk_bytes(int64_t bytes) {
  EMBER_CHECK(bytes > 0, ValueError, "set_im2col_chunk_bytes: the budget must be positive, got ", bytes);
  return g_chunk_bytes.exchange(bytes);
}

int64_t im2col_chunk_bytes() { return g_chunk_bytes.load(std::memory_order_relaxed); }

}  // namespace ember::cuda

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;

void check_on_device(const char* op, const Tensor& t, Device device, const char* what) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", what, " ", t.description(),
              " (expected ", device.str(), ")");
}

void check_dtype(const char* op, const Tensor& t, DType dtype, const char* what) {
  EMBER_CHECK(t.dtype() == dtype, DTypeError, op, ": ", what, " ", t.description(), " should have dtype ",
              dtype_name(dtype));
}

void check_output(const char* op, const Tensor& t, const Shape& shape, DType dtype, Device device, const char* what) {
  check_on_device(op, t, device, what);
  check_dtype(op, t, dtype, what);
  EMBER_CHECK(t.sizes() == shape, ShapeError, op, ": ", what, " ", t.description(), " should have shape ",
              shape_str(shape));
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": ", what, " ", t.description(), " must be contiguous");
}

// The geometry of x_shape * w_shape -> out_shape, checked as the front ends check it (ops_nn.cpp, ops_backward.cpp).
ConvShape checked_shape(const char* op, const Shape& xs, const Shape& ws, const Shape& os, const Conv2dParams& p) {
  EMBER_CHECK(xs.size() == 4 && ws.size() == 4 && os.size() == 4, ShapeError, op, ": expects 4-d x, weight and ",
              "output, got ", shape_str(xs), ", ", shape_str(ws), ", ", shape_str(os));
  EMBER_CHECK(p.groups > 0, ValueError, op, ": groups must be positive, got ", p.groups);
  for (int d = 0; d < 2; ++d)
    EMBER_CHECK(p.stride[d] > 0 && p.dilation[d] > 0 && p.padding[d] >= 0, ValueError, op,
                ": stride and dilation must be positive and padding non-negative");
  EMBER_CHECK(ws[1] * p.groups == xs[1] && ws[0] % p.groups == 0, ShapeError, op, ": x ", shape_str(xs), " and weight ",
              shape_str(ws), " do not match groups=", p.groups);
  EMBER_CHECK(ws[2] > 0 && ws[3] > 0, ShapeError, op, ": weight ", shape_str(ws), " has an empty kernel");
  const int64_t num_h = xs[2] + 2 * p.padding[0] - p.dilation[0] * (ws[2] - 1) - 1;
  const int64_t num_w = xs[3] + 2 * p.padding[1] - p.dilation[1] * (ws[3] - 1) - 1;
  const Shape expected{xs[0], ws[0], num_h < 0 ? 0 : num_h / p.stride[0] + 1, num_w < 0 ? 0 : num_w / p.stride[1] + 1};
  EMBER_CHECK(os == expected && expected[2] > 0 && expected[3] > 0, ShapeError, op, ": output ", shape_str(os),
              " does not match x ", shape_str(xs), " and weight ", shape_str(ws), " (expected ", shape_str(expected),
              ")");
  return conv_shape(xs, ws, os, p);
}

bool use_cudnn() { return ::ember::cuda::conv_strategy() == ::ember::cuda::ConvStrategy::Cudnn; }

void conv2d_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out) {
  const char* op = "conv2d";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  const DType dt = x.dtype();
  EMBER_CHECK(is_floating(dt), DTypeError, op,
              ": expects a floating x, got ", x.description());
  check_on_device(op, x, device, "x");
  check_on_device(op, weight, device, "weight");
  check_dtype(op, weight, dt, "weight");
  const ConvShape s = checked_shape(op, x.sizes(), weight.sizes(), out.sizes(), p);
  check_output(op, out, out.sizes(), dt, device, "out");
  if (bias.defined()) {
    check_on_device(op, bias, device, "bias");
    check_dtype(op, bias, dt, "bias");
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == s.o, ShapeError, op, ": bias ", bias.description(),
                " should have shape [", s.o, "]");
  }
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
#if defined(EMBER_WITH_CUDNN)
  if (use_cudnn() && conv2d_cudnn(x, weight, bias, s, out, device.index, stream)) return;
#endif
  conv2d_im2col(x, weight, bias, s, out, device.index, stream);
}

// x is read only for grad_w and weight only for grad_x; the other is a meta placeholder whose sizes alone are used.
void conv2d_backward_cuda(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                          const Tensor& grad_x, const Tensor& grad_w) {
  const char* op = "conv2d_backward";
  const Device device = grad_out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got grad_out ", grad_out.description());
  const DType dt = grad_out.dtype();
  EMBER_CHECK(is_floating(dt), DTypeError, op,
              ": expects a floating grad_out, got ", grad_out.description());
  const ConvShape s = checked_shape(op, x.sizes(), weight.sizes(), grad_out.sizes(), p);
  if (grad_x.defined()) {
    check_on_device(op, weight, device, "weight");
    check_dtype(op, weight, dt, "weight");
    check_output(op, grad_x, x.sizes(), dt, device, "grad_x");
  }
  if (grad_w.defined()) {
    check_on_device(op, x, device, "x");
    check_dtype(op, x, dt, "x");
    check_output(op, grad_w, weight.sizes(), dt, device, "grad_w");
  }
  const bool want_x = grad_x.defined() && grad_x.numel() > 0;
  const bool want_w = grad_w.defined() && grad_w.numel() > 0;
  if (!want_x && !want_w) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  if (grad_out.numel() == 0) {  // no products: both gradients are zero (all-zero bits in every floating dtype)
    if (want_x) EMBER_CUDA_CHECK(cudaMemsetAsync(grad_x.raw_data(), 0, static_cast<size_t>(grad_x.nbytes()), stream));
    if (want_w) EMBER_CUDA_CHECK(cudaMemsetAsync(grad_w.raw_data(), 0, static_cast<size_t>(grad_w.nbytes()), stream));
    return;
  }
  [[maybe_unused]] const bool cudnn = use_cudnn();
  if (want_x) {
    bool done = false;
#if defined(EMBER_WITH_CUDNN)
    done = cudnn && conv2d_input_grad_cudnn(grad_out, weight, s, grad_x, device.index, stream);
#endif
    if (!done) conv2d_input_grad_im2col(grad_out, weight, s, grad_x, device.index, stream);
  }
  if (want_w) {
    bool done = false;
#if defined(EMBER_WITH_CUDNN)
    done = cudnn && conv2d_weight_grad_cudnn(grad_out, x, s, grad_w, device.index, stream);
#endif
    if (!done) conv2d_weight_grad_im2col(grad_out, x, s, grad_w, device.index, stream);
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(conv2d, DeviceType::CUDA, conv2d_cuda);
EMBER_REGISTER_KERNEL(conv2d_backward, DeviceType::CUDA, conv2d_backward_cuda);

}  // namespace ember::kernels::cuda
