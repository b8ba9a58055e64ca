// CUDA dropout, registered for the `dropout` stub: input of any strides, contiguous out and (optional) bool mask.
// Invariant: element i (row-major position in out) is kept iff double(philox_uniform_element(seed, offset, i)) < 1 - p,
// computed from the same EMBER_HD Philox code as the CPU kernel (Note [Philox stream] in core/philox.h), and kept
// values are op_math_t(x) * scale with the CPU's scale, so mask and output equal the CPU kernel's bit for bit.
#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/core/philox.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;

// ---- kernel -----------------------------------------------------------------------------------------------------

// Note [Dropout lanes]: one Philox call yields the uniforms of four consecutive elements (lane i % 4 of counter
// offset + i / 4), so each thread takes a group of four, elements 4g .. 4g + 3 (fewer at the end), and calls Philox
// once: for i = 4g + l, philox_uniform_element(seed, offset, i) is philox_uniform01(philox_at(seed, offset + g).v[l]).
// `calc` maps the row-major position to the input's offset; out and mask are contiguous, so position i is offset i.
template <class T>
__global__ void dropout_kernel(const T* in, OffsetCalculator<1> calc, T* out, bool* mask, int64_t n, double keep,
                               op_math_t<T> scale, uint64_t seed, uint64_t offset) {
  using acc_t = op_math_t<T>;
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = grid_stride_begin(); g < groups; g += grid_stride_step()) {
    const PhiloxOut r = philox_at(seed, offset + static_cast<uint64_t>(g));
    EMBER_UNROLL
    for (int l = 0; l < 4; ++l) {
      const int64_t i = 4 * g + l;
      if (i >= n) break;
      // The float uniform compared in double, as the CPU kernel and the stub's contract do.
      const bool kept = static_cast<double>(philox_uniform01(r.v[l])) < keep;
      out[i] = kept ? T(static_cast<acc_t>(in[calc.get(i).v[0]]) * scale) : T(acc_t(0));
      if (mask != nullptr) mask[i] = kept;
    }
  }
}

// ---- launcher ---------------------------------------------------------------------------------------------------

template <class T>
void launch_dropout(const Tensor& in, double p, uint64_t seed, uint64_t offset, const Tensor& out, const Tensor& mask,
                    cudaStream_t stream) {
  using acc_t = op_math_t<T>;
  const int64_t n = out.numel();
  const double keep = 1.0 - p;
  const acc_t scale = p < 1.0 ? static_cast<acc_t>(1.0 / (1.0 - p)) : acc_t(0);  // as the CPU kernel rounds it
  const OffsetCalculator<1> calc = make_offset_calculator<1>({&in}, "dropout");
  const int64_t groups = (n + 3) / 4;
  dropout_kernel<T><<<grid_for(groups, out.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(in.raw_data()), calc, static_cast<T*>(out.raw_data()),
      mask.defined() ? static_cast<bool*>(mask.raw_data()) : nullptr, n, keep, scale, seed, offset);
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry point ------------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void dropout_cuda(const Tensor& in, double p, uint64_t seed, uint64_t offset, const Tensor& out, const Tensor& mask) {
  const char* op = "dropout";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  check_on_device(op, in, device);
  EMBER_CHECK(in.dtype() == out.dtype(), DTypeError, op, ": input ", in.description(), " and output ",
              out.description(), " differ in dtype");
  EMBER_CHECK(in.sizes() == out.sizes(), ShapeError, op, ": input ", in.description(), " and output ",
              out.description(), " differ in shape");
  EMBER_CHECK(out.is_contiguous(), ValueError, op, ": the CUDA kernel needs a contiguous output, got ",
              out.description());
  if (mask.defined()) {
    check_on_device(op, mask, device);
    EMBER_CHECK(mask.dtype() == DType::b8 && mask.sizes() == out.sizes() && mask.is_contiguous(), ValueError, op,
                ": mask ", mask.description(), " must be a contiguous bool tensor of the output's shape ",
                shape_str(out.sizes()));
  }
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(in.dtype(), op, [&] { launch_dropout<scalar_t>(in, p, seed, offset, out, mask, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(dropout, DeviceType::CUDA, dropout_cuda);

}  // namespace ember::kernels::cuda
