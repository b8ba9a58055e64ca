// CPU kernels behind core's stubs: strided copy with dtype cast, fill, arange, and Philox uniform/normal draws.
// Invariant: every cast and fill value follows Note [Casts] (kernels/convert.h), as the CUDA kernels do.
#include <cstring>

#include "ember/core/core_stubs.h"
#include "ember/core/philox.h"
#include "ember/kernels/cpu/loops.h"

namespace ember::kernels::cpu {
namespace {

void copy_kernel(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.raw_data(), src.raw_data(), static_cast<size_t>(dst.nbytes()));
    return;
  }
  EMBER_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using out_t = scalar_t;
    EMBER_DISPATCH_ALL(src.dtype(), "copy", [&] {
      map_elements<out_t, scalar_t>(dst, {src}, [](scalar_t v) { return convert<out_t>(v); });
    });
  });
}

void fill_kernel(const Tensor& dst, Scalar value) {
  EMBER_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    const scalar_t v = convert_scalar<scalar_t>(value);
    map_elements<scalar_t>(dst, {}, [v]() { return v; });
  });
}

void arange_kernel(const Tensor& dst, Scalar start, Scalar step) {
  const bool int_path = is_integral(dst.dtype()) && start.is_integral() && step.is_integral();
  EMBER_DISPATCH_ALL(dst.dtype(), "arange", [&] {
    scalar_t* p = static_cast<scalar_t*>(dst.raw_data());
    if (int_path) {
      const int64_t s = start.to_int(), st = step.to_int();
      for (int64_t i = 0; i < dst.numel(); ++i) p[i] = convert<scalar_t>(s + i * st);
    } else {
      const double s = start.to_double(), st = step.to_double();
      for (int64_t i = 0; i < dst.numel(); ++i) p[i] = convert<scalar_t>(s + static_cast<double>(i) * st);
    }
  });
}

void random_kernel(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset) {
  EMBER_DISPATCH_FLOAT(dst.dtype(), "random", [&] {
    scalar_t* p = static_cast<scalar_t*>(dst.raw_data());
    const int64_t n = dst.numel();
    using acc_t = op_math_t<scalar_t>;
    if (kind == RandomKind::Uniform) {
      const acc_t low = static_cast<acc_t>(a), high = static_cast<acc_t>(b);
      for (int64_t i = 0; i < n; ++i) {
        const acc_t u = static_cast<acc_t>(philox_uniform_element(seed, offset, static_cast<uint64_t>(i)));
        p[i] = uniform_store<scalar_t>(low + (high - low) * u, low, high);  // Note [Uniform upper bound]
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const acc_t z = static_cast<acc_t>(philox_normal_element(seed, offset, static_cast<uint64_t>(i)));
        p[i] = scalar_t(static_cast<acc_t>(a) + static_cast<acc_t>(b) * z);
      }
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(copy, DeviceType::CPU, copy_kernel);
EMBER_REGISTER_KERNEL(fill, DeviceType::CPU, fill_kernel);
EMBER_REGISTER_KERNEL(arange, DeviceType::CPU, arange_kernel);
EMBER_REGISTER_KERNEL(random, DeviceType::CPU, random_kernel);

}  // namespace ember::kernels::cpu
