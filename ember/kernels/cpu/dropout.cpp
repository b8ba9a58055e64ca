// CPU dropout: element i (row-major position in the contiguous out) is kept iff
// philox_uniform_element(seed, offset, i) < 1 - p (Note [Philox stream] in ember/core/philox.h), so the CPU and CUDA
// kernels draw the same mask. Kept elements are x * (1 / (1 - p)) computed in op_math_t; dropped elements are 0.
#include "ember/core/philox.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

void dropout_kernel(const Tensor& in, double p, uint64_t seed, uint64_t offset, const Tensor& out,
                    const Tensor& mask) {
  EMBER_DISPATCH_FLOAT(in.dtype(), "dropout", [&] {
    using acc_t = op_math_t<scalar_t>;
    const double keep = 1.0 - p;  // the float uniform is compared in double, as the spec reads
    const acc_t scale = p < 1.0 ? static_cast<acc_t>(1.0 / (1.0 - p)) : acc_t(0);
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    bool* m = mask.defined() ? static_cast<bool*>(mask.raw_data()) : nullptr;
    const scalar_t* x = static_cast<const scalar_t*>(in.raw_data());
    // out is contiguous, so its element offset is the row-major index i that selects the Philox lane.
    strided_loop<2>(out.sizes(), {&out.strides(), &in.strides()},
                    [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& s) {
                      for (int64_t j = 0; j < n; ++j) {
                        const int64_t i = off[0] + j * s[0];
                        const bool kept =
                            static_cast<double>(philox_uniform_element(seed, offset, static_cast<uint64_t>(i))) < keep;
                        o[i] = kept ? scalar_t(static_cast<acc_t>(x[off[1] + j * s[1]]) * scale) : scalar_t(acc_t(0));
                        if (m) m[i] = kept;
                      }
                    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(dropout, DeviceType::CPU, dropout_kernel);

}  // namespace ember::kernels::cpu
