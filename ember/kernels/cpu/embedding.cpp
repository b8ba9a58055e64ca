// CPU embedding kernels: row gather (forward) and row scatter-add (backward), for weights of any strides.
// Invariant: every index is checked against V before its row is touched; an out-of-range index raises IndexError
// and the kernel writes nothing further. f16/bf16 gradients are accumulated in float and rounded once per element.
#include <string>
#include <vector>

#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// Reads the n indices of a 1-d i32/i64 view as int64 and checks each against [0, v).
std::vector<int64_t> load_indices(const char* op, const Tensor& indices, int64_t v) {
  const int64_t n = indices.size(0), st = indices.stride(0);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  EMBER_DISPATCH_INDEX(indices.dtype(), op, [&] {
    const scalar_t* p = static_cast<const scalar_t*>(indices.raw_data());
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = static_cast<int64_t>(p[i * st]);
  });
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = idx[static_cast<size_t>(i)];
    EMBER_CHECK(k >= 0 && k < v, IndexError, op, ": index ", k, " (at flat position ", i,
                ") is out of range for an embedding of ", v, " rows");
  }
  return idx;
}

void embedding_kernel(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  const std::vector<int64_t> idx = load_indices("embedding", indices, weight.size(0));
  const int64_t n = out.size(0), d = out.size(1);
  const int64_t ws0 = weight.stride(0), ws1 = weight.stride(1);
  EMBER_DISPATCH_ALL(weight.dtype(), "embedding", [&] {
    const scalar_t* w = static_cast<const scalar_t*>(weight.raw_data());
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const scalar_t* row = w + idx[static_cast<size_t>(i)] * ws0;
      scalar_t* orow = o + i * d;
      for (int64_t j = 0; j < d; ++j) orow[j] = row[j * ws1];
    }
  });
}

template <class scalar_t>
void embedding_backward_typed(const Tensor& grad_out, const std::vector<int64_t>& idx, const Tensor& grad_weight) {
  using acc_t = op_math_t<scalar_t>;
  const int64_t v = grad_weight.size(0), d = grad_weight.size(1), n = grad_out.size(0);
  const int64_t gs0 = grad_out.stride(0), gs1 = grad_out.stride(1);
  const int64_t ws0 = grad_weight.stride(0), ws1 = grad_weight.stride(1);
  const scalar_t* g = static_cast<const scalar_t*>(grad_out.raw_data());
  scalar_t* w = static_cast<scalar_t*>(grad_weight.raw_data());
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    for (int64_t i = 0; i < n; ++i) {
      scalar_t* wrow = w + idx[static_cast<size_t>(i)] * ws0;
      const scalar_t* grow = g + i * gs0;
      for (int64_t j = 0; j < d; ++j) wrow[j * ws1] += grow[j * gs1];
    }
  } else {
    // Accumulate only the touched rows in float, then round each once.
    std::vector<int64_t> slot(static_cast<size_t>(v), -1);
    std::vector<int64_t> rows;
    for (int64_t k : idx)
      if (slot[static_cast<size_t>(k)] < 0) {
        slot[static_cast<size_t>(k)] = static_cast<int64_t>(rows.size());
        rows.push_back(k);
      }
    const size_t du = static_cast<size_t>(d);
    std::vector<acc_t> acc(rows.size() * du);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t j = 0; j < d; ++j) acc[r * du + static_cast<size_t>(j)] = static_cast<acc_t>(w[rows[r] * ws0 + j * ws1]);
    for (int64_t i = 0; i < n; ++i) {
      acc_t* arow = acc.data() + slot[static_cast<size_t>(idx[static_cast<size_t>(i)])] * d;
      const scalar_t* grow = g + i * gs0;
      for (int64_t j = 0; j < d; ++j) arow[j] += static_cast<acc_t>(grow[j * gs1]);
    }
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t j = 0; j < d; ++j) w[rows[r] * ws0 + j * ws1] = scalar_t(acc[r * du + static_cast<size_t>(j)]);
  }
}

void embedding_backward_kernel(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  const std::vector<int64_t> idx = load_indices("embedding_backward", indices, grad_weight.size(0));
  EMBER_DISPATCH_FLOAT(grad_weight.dtype(), "embedding_backward",
                       [&] { embedding_backward_typed<scalar_t>(grad_out, idx, grad_weight); });
}

}  // namespace

EMBER_REGISTER_KERNEL(embedding, DeviceType::CPU, embedding_kernel);
EMBER_REGISTER_KERNEL(embedding_backward, DeviceType::CPU, embedding_backward_kernel);

}  // namespace ember::kernels::cpu
