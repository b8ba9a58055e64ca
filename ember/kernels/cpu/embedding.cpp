// CPU embedding kernels: row gather (forward) and row scatter-add (backward), for weights of any strides.
// Invariant: every index is checked against V before any row is touched; an out-of-range index raises IndexError
// and the kernel writes nothing. f16/bf16 gradients are accumulated in float and rounded once per element; that
// accumulator is host-allocator workspace (Note [Kernel workspace] in conv_pool.cpp).
#include <algorithm>
#include <type_traits>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// Checks the n indices of the 1-d i32/i64 view against [0, v), then calls f(idx) where idx(i) reads the i-th index
// in place as int64 (no copy of the indices is made).
template <class F>
void with_checked_indices(const char* op, const Tensor& indices, int64_t v, F&& f) {
  const int64_t n = indices.size(0), st = indices.stride(0);
  EMBER_DISPATCH_INDEX(indices.dtype(), op, [&] {
    const scalar_t* p = static_cast<const scalar_t*>(indices.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = static_cast<int64_t>(p[i * st]);
      EMBER_CHECK(k >= 0 && k < v, IndexError, op, ": index ", k, " (at flat position ", i,
                  ") is out of range for an embedding of ", v, " rows");
    }
    f([p, st](int64_t i) { return static_cast<int64_t>(p[i * st]); });
  });
}

void embedding_kernel(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  const int64_t n = out.size(0), d = out.size(1);
  const int64_t ws0 = weight.stride(0), ws1 = weight.stride(1);
  with_checked_indices("embedding", indices, weight.size(0), [&](auto idx) {
    EMBER_DISPATCH_ALL(weight.dtype(), "embedding", [&] {
      const scalar_t* w = static_cast<const scalar_t*>(weight.raw_data());
      scalar_t* o = static_cast<scalar_t*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        const scalar_t* row = w + idx(i) * ws0;
        scalar_t* orow = o + i * d;
        for (int64_t j = 0; j < d; ++j) orow[j] = row[j * ws1];
      }
    });
  });
}

template <class scalar_t, class Idx>
void embedding_backward_typed(const Tensor& grad_out, Idx idx, const Tensor& grad_weight) {
  using acc_t = op_math_t<scalar_t>;
  const int64_t v = grad_weight.size(0), d = grad_weight.size(1), n = grad_out.size(0);
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1);
  const int64_t ws0 = grad_weight.stride(0), ws1 = grad_weight.stride(1);
  const scalar_t* g = static_cast<const scalar_t*>(grad_out.raw_data());
  scalar_t* w = static_cast<scalar_t*>(grad_weight.raw_data());
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    for (int64_t i = 0; i < n; ++i) {
      scalar_t* wrow = w + idx(i) * ws0;
      const scalar_t* grow = g + i * gs0;
      for (int64_t j = 0; j < d; ++j) wrow[j * ws1] += grow[j * gs1];
    }
  } else {
    // Accumulate only the touched rows in float, then round each once. Workspace: slot[V] (accumulator row of each
    // weight row, -1 when untouched) and rows[<= min(n, V)] (the touched weight rows in first-touch order) as one
    // i64 tensor, and the f32 accumulator [touched, D].
    const int64_t max_rows = std::min(n, v);
    const Tensor index_ws = empty({v + max_rows}, TensorOptions(DType::i64, Device::cpu()));
    int64_t* slot = static_cast<int64_t*>(index_ws.raw_data());
    int64_t* rows = slot + v;
    std::fill(slot, slot + v, int64_t{-1});
    int64_t touched = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = idx(i);
      if (slot[k] < 0) {
        slot[k] = touched;
        rows[touched++] = k;
      }
    }
    const Tensor acc_ws = empty({touched * d}, TensorOptions(dtype_of_v<acc_t>, Device::cpu()));
    acc_t* acc = static_cast<acc_t*>(acc_ws.raw_data());
    for (int64_t r = 0; r < touched; ++r)
      for (int64_t j = 0; j < d; ++j) acc[r * d + j] = static_cast<acc_t>(w[rows[r] * ws0 + j * ws1]);
    for (int64_t i = 0; i < n; ++i) {
      acc_t* arow = acc + slot[idx(i)] * d;
      const scalar_t* grow = g + i * gs0;
      for (int64_t j = 0; j < d; ++j) arow[j] += static_cast<acc_t>(grow[j * gs1]);
    }
    for (int64_t r = 0; r < touched; ++r)
      for (int64_t j = 0; j < d; ++j) w[rows[r] * ws0 + j * ws1] = scalar_t(acc[r * d + j]);
  }
}

void embedding_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  with_checked_indices("embedding_backward", indices, grad_weight.size(0), [&](auto idx) {
    EMBER_DISPATCH_FLOAT(grad_weight.dtype(), "embedding_backward",
                         [&] { embedding_backward_typed<scalar_t>(grad_out, idx, grad_weight); });
  });
}

// embedding_backward_typed's workspace on meta (Note [Meta kernels] in kernels/stubs.h). The f32 accumulator holds
// one row per distinct index, which a meta run cannot count: it takes min(n, V) rows, the most there can be (exact
// when the indices cover that many rows, as a batch of tokens over a small vocabulary or distinct positions do).
void embedding_backward_meta_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  if (!is_reduced_float(grad_weight.dtype())) return;
  const int64_t v = grad_weight.size(0), d = grad_weight.size(1), n = grad_out.size(0);
  const int64_t max_rows = std::min(n, v);
  MetaWorkspace ws;
  ws.take(v + max_rows, DType::i64);
  ws.take(max_rows * d, DType::f32);
}

}  // namespace

EMBER_REGISTER_KERNEL(embedding, DeviceType::CPU, embedding_kernel);
EMBER_REGISTER_KERNEL(embedding_backward, DeviceType::CPU, embedding_backward_kernel);
EMBER_REGISTER_KERNEL(embedding_backward, DeviceType::Meta, embedding_backward_meta_kernel);

}  // namespace ember::kernels::cpu
