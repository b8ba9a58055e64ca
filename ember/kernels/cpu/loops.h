// Strided N-operand loops for the CPU reference kernels. Operands are views of one shape (inputs already expanded
// to the output shape, so broadcast dims have stride 0). Dims are coalesced where every operand is contiguous
// across them, so a dense tensor runs as one flat inner loop.
// Invariant: `inner` is called for every innermost run (or piece of one, when the loop is split over the CPU threads)
// with element offsets (not bytes) of its first element, each element once; map_elements_fast runs a
// unit-stride/broadcast run as a plain loop the compiler vectorises.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/core/tensor.h"
#include "ember/kernels/convert.h"

namespace ember::kernels::cpu {

template <size_t N>
struct LoopGeometry {
  Shape sizes;                                  // coalesced sizes, innermost last
  std::vector<std::array<int64_t, N>> strides;  // per dim, per operand (elements)
};

template <size_t N>
LoopGeometry<N> coalesce(const Shape& sizes, const std::array<const Shape*, N>& strides) {
  LoopGeometry<N> g;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;  // size-1 dims contribute nothing
    std::array<int64_t, N> st;
    for (size_t k = 0; k < N; ++k) st[k] = (*strides[k])[d];
    if (!g.sizes.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k) merge = merge && g.strides.back()[k] == st[k] * sizes[d];
      if (merge) {
        g.sizes.back() *= sizes[d];
        g.strides.back() = st;
        continue;
      }
    }
    g.sizes.push_back(sizes[d]);
    g.strides.push_back(st);
  }
  return g;
}

// Elements per chunk of an element-wise loop run on the CPU threads (Note [Parallel chunks] in core/parallel.h).
constexpr int64_t kElementGrain = int64_t{1} << 15;

// Calls inner(offsets, n, inner_strides) for every innermost run; offsets are relative to each operand's first element.
// The runs cover the elements in row-major order of the coalesced dims; with at least 2 * grain elements they are
// split into chunks at element boundaries (a run may be cut in two) that run on the CPU threads, so inner may only
// write its own elements and must not allocate tensors.
template <size_t N, class Inner>
void strided_loop(const Shape& sizes, const std::array<const Shape*, N>& strides, Inner&& inner,
                  int64_t grain = kElementGrain) {
  const int64_t total = numel_of(sizes);
  if (total == 0) return;
  const LoopGeometry<N> g = coalesce<N>(sizes, strides);
  const int64_t nd = static_cast<int64_t>(g.sizes.size());
  if (nd == 0) {
    inner(std::array<int64_t, N>{}, int64_t{1}, std::array<int64_t, N>{});
    return;
  }
  const int64_t inner_n = g.sizes[nd - 1];
  const std::array<int64_t, N> inner_st = g.strides[nd - 1];
  parallel::parallel_for(total, grain, [&](int64_t lo, int64_t hi) {
    // Index and offsets of element lo, then runs up to hi.
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
    std::array<int64_t, N> off{};
    int64_t rem = lo;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % g.sizes[d];
      rem /= g.sizes[d];
      for (size_t k = 0; k < N; ++k) off[k] += idx[d] * g.strides[d][k];
    }
    for (int64_t pos = lo; pos < hi;) {
      const int64_t n = std::min(inner_n - idx[nd - 1], hi - pos);
      inner(off, n, inner_st);
      pos += n;
      if (pos == hi) break;
      // The run reached the end of its row: back to the row's start, then the odometer increment over the outer dims.
      for (size_t k = 0; k < N; ++k) off[k] -= idx[nd - 1] * inner_st[k];
      idx[nd - 1] = 0;
      for (int64_t d = nd - 2; d >= 0; --d) {
        ++idx[d];
        for (size_t k = 0; k < N; ++k) off[k] += g.strides[d][k];
        if (idx[d] < g.sizes[d]) break;
        for (size_t k = 0; k < N; ++k) off[k] -= g.strides[d][k] * g.sizes[d];
        idx[d] = 0;
      }
    }
  });
}

// Note [Unit-stride fast path]
// map_elements_fast is map_elements plus a fast path per innermost run: when the output's stride is 1 and each
// input's is 1 or 0 (broadcast), the run is a plain indexed loop with the broadcast inputs loaded once before it,
// which the compiler vectorises (a dense tensor is one such run after coalescing; x * rstd[..., None] is one per
// row). The loop reads in[i] before it writes out[i], so an output that is exactly an input (in-place ops) stays
// correct, and GCC's runtime alias check admits that case. Other runs take the strided loop. The cost is one loop
// body per broadcast pattern (2^inputs) per functor, so only the hot (op, dtype) pairs use it, with the op fixed at
// compile time: a functor that switches on a runtime op per element cannot vectorise.
namespace detail {

template <unsigned Mask, class Out, class... In, class F, size_t... K>
void unit_stride_run(Out* op, const std::tuple<const In*...>& ip, int64_t n, F& f, std::index_sequence<K...>) {
  const std::tuple<In...> scalar{std::get<K>(ip)[0]...};  // the broadcast inputs' one value (n >= 1)
  auto load = [&]<size_t I>(std::integral_constant<size_t, I>, int64_t i) {
    if constexpr (((Mask >> I) & 1u) != 0)
      return std::get<I>(scalar);
    else
      return std::get<I>(ip)[i];
  };
  for (int64_t i = 0; i < n; ++i) op[i] = f(load(std::integral_constant<size_t, K>{}, i)...);
}

// Calls body(integral_constant<unsigned, M>) for the M in Ms equal to mask.
template <class Body, unsigned... Ms>
void dispatch_mask(unsigned mask, Body&& body, std::integer_sequence<unsigned, Ms...>) {
  (void)((mask == Ms ? (body(std::integral_constant<unsigned, Ms>{}), true) : false) || ...);
}

template <bool Fast, class Out, class... In, class F>
void map_elements_impl(const Tensor& out, const std::array<Tensor, sizeof...(In)>& ins, F& f) {
  constexpr size_t N = sizeof...(In) + 1;
  std::array<const Shape*, N> st;
  st[0] = &out.strides();
  for (size_t k = 0; k < sizeof...(In); ++k) st[k + 1] = &ins[k].strides();
  Out* o = static_cast<Out*>(out.raw_data());
  std::array<void*, sizeof...(In)> bases;
  for (size_t k = 0; k < sizeof...(In); ++k) bases[k] = ins[k].raw_data();
  strided_loop<N>(out.sizes(), st, [&](const std::array<int64_t, N>& off, int64_t n, const std::array<int64_t, N>& s) {
    [&]<size_t... K>(std::index_sequence<K...>) {
      Out* op = o + off[0];
      const std::tuple<const In*...> ip{static_cast<const In*>(bases[K]) + off[K + 1]...};
      if constexpr (Fast) {
        bool unit = s[0] == 1;
        unsigned mask = 0;  // bit k: input k is broadcast along the run
        for (size_t k = 1; k < N; ++k) {
          unit = unit && (s[k] == 0 || s[k] == 1);
          if (s[k] == 0) mask |= 1u << (k - 1);
        }
        if (unit) {
          dispatch_mask(
              mask,
              [&](auto m) {
                unit_stride_run<decltype(m)::value, Out, In...>(op, ip, n, f, std::index_sequence<K...>{});
              },
              std::make_integer_sequence<unsigned, (1u << sizeof...(In))>{});
          return;
        }
      }
      for (int64_t i = 0; i < n; ++i) op[i * s[0]] = f(std::get<K>(ip)[i * s[K + 1]]...);
    }
    (std::index_sequence_for<In...>{});
  });
}

}  // namespace detail

// Element-wise map over operands of one shape: out[i] = f(in0[i], in1[i], ...) with In... and Out the storage types.
// Every run takes the strided loop; kernels whose functor is one op in a hot dtype use map_elements_fast instead.
template <class Out, class... In, class F>
void map_elements(const Tensor& out, const std::array<Tensor, sizeof...(In)>& ins, F&& f) {
  detail::map_elements_impl<false, Out, In...>(out, ins, f);
}

// map_elements with the unit-stride fast path (Note [Unit-stride fast path]).
template <class Out, class... In, class F>
void map_elements_fast(const Tensor& out, const std::array<Tensor, sizeof...(In)>& ins, F&& f) {
  detail::map_elements_impl<true, Out, In...>(out, ins, f);
}

// The outputs z in [lo, hi) of one convolution/pooling tap whose input column z * stride + offset lies in [0, extent)
// (offset = tap * dilation - padding): the in-bounds outputs of a tap are one contiguous range, so im2col and col2im
// loop over it without a bounds test per element. 0 <= lo <= hi <= out_extent; lo == hi when the tap reads only
// padding.
struct TapRange {
  int64_t lo, hi;
};
inline TapRange tap_range(int64_t offset, int64_t stride, int64_t extent, int64_t out_extent) {
  const int64_t lo = offset >= 0 ? 0 : std::min(out_extent, (-offset + stride - 1) / stride);
  const int64_t hi = offset >= extent ? 0 : std::min(out_extent, (extent - 1 - offset) / stride + 1);
  return {lo, std::max(lo, hi)};
}

// Converts between storage types: the one cast of Note [Casts] (kernels/convert.h), shared with the CUDA kernels.
using ::ember::kernels::convert;

}  // namespace ember::kernels::cpu
