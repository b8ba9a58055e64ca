// Dispatch stubs that core itself calls (copies, fills, factories). Kernels register per-device implementations.
// Contract shared by all: the tensors passed are on one device (checked by the caller); kernels may assume it.
#pragma once

#include <cstdint>

#include "ember/core/dispatch.h"
#include "ember/core/scalar.h"
#include "ember/core/tensor.h"

namespace ember {

// dst[i] = cast(src[i]) for same-shaped views on one device; any strides; dtypes may differ.
using CopyFn = void (*)(const Tensor& src, const Tensor& dst);
// dst[i] = value for every element of the view.
using FillFn = void (*)(const Tensor& dst, Scalar value);
// dst (contiguous) element i = start + i * step: in int64 when dst is an integer dtype and start/step are integers
// (exact over the whole i64 range), else in double.
using ArangeFn = void (*)(const Tensor& dst, Scalar start, Scalar step);
enum class RandomKind { Uniform, Normal };
// dst (contiguous) element i: Uniform -> a + (b - a) * u_i; Normal -> a + b * z_i  (Note [Philox stream]).
using RandomFn = void (*)(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset);

EMBER_DECLARE_STUB(copy, CopyFn);
EMBER_DECLARE_STUB(fill, FillFn);
EMBER_DECLARE_STUB(arange, ArangeFn);
EMBER_DECLARE_STUB(random, RandomFn);

}  // namespace ember
