// View backward formulas. Reshape-like views and transposes map the gradient with the inverse view (no copy);
// slice/select scatter it into zeros of the base's shape; expand returns it whole and the engine sums it back
// (Note [Gradient validation]); as_strided scatter-adds through storage positions (overlapping views included).
#include "ember/autograd/view_functions.h"

#include <algorithm>
#include <optional>

#include "ember/autograd/function_node.h"
#include "ember/kernels/ops.h"

namespace ember::autograd {

namespace {

const char* view_op_name(ViewKind k) {
  switch (k) {
    case ViewKind::Reshape: return "view";
    case ViewKind::Transpose: return "transpose";
    case ViewKind::Permute: return "permute";
    case ViewKind::Slice: return "slice";
    case ViewKind::Select: return "select";
    case ViewKind::Expand: return "expand";
    case ViewKind::AsStrided: return "as_strided";
    case ViewKind::Alias: return "alias";
  }
  return "view";
}

// True when two elements of (sizes, strides) may share a storage position: sorted by stride, every dim of size > 1
// must step over everything the smaller dims span.
bool may_overlap(const Shape& sizes, const Shape& strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 1) dims.emplace_back(strides[i], sizes[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the largest offset the smaller dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return true;
    span += (size - 1) * stride;
  }
  return false;
}

// Note [as_strided backward over an overlapping base]
// Gradient of an as_strided view: each storage position of the view receives the sum of the gradient elements that
// map to it (embedding_backward is exactly that scatter-add); the base then reads its own positions. When several
// base elements share a position (the base is an expanded or overlapping view), each gets the position's gradient
// divided by their count: the backward of the base's own view sums them back to exactly one copy.
Tensor as_strided_backward(const Tensor& g, const Shape& base_sizes, const Shape& base_strides, int64_t base_offset,
                           const Shape& view_sizes, const Shape& view_strides, int64_t view_offset) {
  auto extent = [](const Shape& sz, const Shape& st, int64_t off) {
    int64_t last = off;
    for (size_t i = 0; i < sz.size(); ++i) {
      if (sz[i] == 0) return off;
      last += (sz[i] - 1) * st[i];
    }
    return last + 1;
  };
  // Positions are counted from the first storage element either geometry can touch, so the work is proportional to
  // the span of the two views, not to where they sit in the storage.
  const int64_t origin = std::min(base_offset, view_offset);
  base_offset -= origin;
  view_offset -= origin;
  const int64_t n = std::max(extent(base_sizes, base_strides, base_offset), extent(view_sizes, view_strides, view_offset));
  const Tensor positions = arange(0, n, 1, TensorOptions(DType::i64, g.device()))
                               .as_strided(view_sizes, view_strides, view_offset)
                               .contiguous()
                               .view({-1});
  Tensor storage_grad = ops::embedding_backward(g.contiguous().view({-1, 1}), positions, n).view({-1});
  if (may_overlap(base_sizes, base_strides)) {
    const Tensor base_positions = arange(0, n, 1, TensorOptions(DType::i64, g.device()))
                                      .as_strided(base_sizes, base_strides, base_offset)
                                      .contiguous()
                                      .view({-1});
    const Tensor ones_per_element = ones({base_positions.numel(), 1}, {storage_grad.dtype(), g.device()});
    const Tensor count = ops::embedding_backward(ones_per_element, base_positions, n).view({-1});
    storage_grad = ops::div(storage_grad, ops::clamp(count, 1.0, std::nullopt));
  }
  return storage_grad.as_strided(base_sizes, base_strides, base_offset).clone();
}

}  // namespace

void record_view_node(const Tensor& base, const Tensor& view, const ViewInfo& info) {
  auto node = make_node(view_op_name(info.kind), {&base});
  if (!node) return;
  const Shape base_sizes = base.sizes();
  switch (info.kind) {
    case ViewKind::Reshape:
      node->formula = [base_sizes](const BackwardContext&, const TensorList& g) -> TensorList {
        return {g[0].reshape(base_sizes)};
      };
      break;
    case ViewKind::Transpose: {
      const int64_t a = info.dims.at(0), b = info.dims.at(1);
      node->formula = [a, b](const BackwardContext&, const TensorList& g) -> TensorList {
        return {g[0].transpose(a, b)};
      };
      break;
    }
    case ViewKind::Permute: {
      std::vector<int64_t> inverse(info.dims.size());
      for (size_t i = 0; i < info.dims.size(); ++i) inverse[info.dims[i]] = static_cast<int64_t>(i);
      node->formula = [inverse](const BackwardContext&, const TensorList& g) -> TensorList {
        return {g[0].permute(inverse)};
      };
      break;
    }
    case ViewKind::Slice: {
      const int64_t dim = info.dim, start = info.start, step = info.step, len = view.size(info.dim);
      node->formula = [=](const BackwardContext&, const TensorList& g) -> TensorList {
        Tensor out = zeros(base_sizes, {g[0].dtype(), g[0].device()});
        if (len > 0) out.slice(dim, start, start + (len - 1) * step + 1, step).copy_(g[0]);
        return {out};
      };
      break;
    }
    case ViewKind::Select: {
      const int64_t dim = info.dim, index = info.start;
      node->formula = [=](const BackwardContext&, const TensorList& g) -> TensorList {
        Tensor out = zeros(base_sizes, {g[0].dtype(), g[0].device()});
        out.select(dim, index).copy_(g[0]);
        return {out};
      };
      break;
    }
    case ViewKind::Expand:
    case ViewKind::Alias:
      // Expand: the engine sums the gradient back to the base's shape.
      node->formula = [](const BackwardContext&, const TensorList& g) -> TensorList { return {g[0]}; };
      break;
    case ViewKind::AsStrided: {
      const Shape bst = base.strides(), vsz = view.sizes(), vst = view.strides();
      const int64_t boff = base.storage_offset(), voff = view.storage_offset();
      node->formula = [=](const BackwardContext&, const TensorList& g) -> TensorList {
        return {as_strided_backward(g[0], base_sizes, bst, boff, vsz, vst, voff)};
      };
      break;
    }
  }
  node->set_outputs({&view});
}

}  // namespace ember::autograd
