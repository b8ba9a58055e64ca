// CPU kernels behind core's stubs: strided copy with dtype cast, fill, arange, and Philox uniform/normal draws.
// Invariant: every cast and fill value follows Note [Casts] (kernels/convert.h), as the CUDA kernels do.
#include <algorithm>
#include <cstring>

#include "ember/core/core_stubs.h"
#include "ember/core/parallel.h"
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

// Note [Random draws in chunks]
// Element i's value depends only on (seed, offset, i) (Note [Philox stream]), so the draw splits into chunks on the
// pool's threads with results independent of the thread count. A chunk starts at a multiple of 4 (align), where a
// counter's lanes begin, and computes each Philox counter once for the 4 uniforms (2 normals) it gives — not once
// per element — through the same element functions as the CUDA kernel (philox_uniform01, philox_normal_of).
constexpr int64_t kRandomGrain = int64_t{1} << 15;

void random_kernel(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset) {
  EMBER_DISPATCH_FLOAT(dst.dtype(), "random", [&] {
    scalar_t* p = static_cast<scalar_t*>(dst.raw_data());
    const int64_t n = dst.numel();
    using acc_t = op_math_t<scalar_t>;
    const acc_t low = static_cast<acc_t>(a), high = static_cast<acc_t>(b);
    const acc_t mean = static_cast<acc_t>(a), stddev = static_cast<acc_t>(b);
    const bool uniform = kind == RandomKind::Uniform;
    const int64_t per_counter = uniform ? 4 : 2;
    parallel::parallel_for(n, kRandomGrain, 4, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end;) {
        const uint64_t counter = static_cast<uint64_t>(i / per_counter);
        const PhiloxOut o = philox_at(seed, offset + counter);
        const int64_t stop = std::min(end, (i / per_counter + 1) * per_counter);
        for (; i < stop; ++i) {
          const int lane = static_cast<int>(i % per_counter);
          if (uniform) {
            const acc_t u = static_cast<acc_t>(philox_uniform01(o.v[lane]));
            p[i] = uniform_store<scalar_t>(low + (high - low) * u, low, high);  // Note [Uniform upper bound]
          } else {
            p[i] = scalar_t(mean + stddev * static_cast<acc_t>(philox_normal_of(o, lane * 2)));
          }
        }
      }
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(copy, DeviceType::CPU, copy_kernel);
EMBER_REGISTER_KERNEL(fill, DeviceType::CPU, fill_kernel);
EMBER_REGISTER_KERNEL(arange, DeviceType::CPU, arange_kernel);
EMBER_REGISTER_KERNEL(random, DeviceType::CPU, random_kernel);

}  // namespace ember::kernels::cpu
