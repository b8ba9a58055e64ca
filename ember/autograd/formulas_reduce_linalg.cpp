// Differentiable reductions (sum, mean, amax, amin, var) and linear algebra (matmul, bmm, linear).
// Invariant: a reduction's gradient is the output gradient re-inserted at the reduced dims and EXPANDED to the
// input's shape (Note [Reduction gradients]); matmul's gradients may come back in the broadcast batch shape, which
// the engine sums to each operand's shape (Note [Gradient validation] in engine.cpp).
#include <algorithm>
#include <vector>

#include "ember/autograd/function_node.h"
#include "ember/autograd/autocast.h"
#include "ember/autograd/functions.h"

namespace ember {

using autograd::BackwardContext;
using autograd::forward_op;
using autograd::make_node;
using autograd::TensorList;

namespace {

// Note [Reduction gradients]
// Every reduction here maps x to out by collapsing `dims` (wrapped, sorted; empty = all; none for a 0-d x). Its
// gradient starts from g re-shaped to the keepdim form (size-1 dims unsqueezed back in ascending order when
// keepdim was false) and expanded to x's shape: a stride-0 view the engine hands on without copying. The engine's
// broadcast sum-back would also accept the keepdim form, but only by accident of shapes (it cannot tell which dims
// were reduced when keepdim is false), so formulas expand explicitly.
std::vector<int64_t> reduced_dims(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<int64_t> out;
  if (x.dim() == 0) return out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, x.dim(), op));
  std::sort(out.begin(), out.end());
  return out;
}

int64_t reduced_count(const Shape& sizes, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= sizes[static_cast<size_t>(d)];
  return n;
}

// t (the reduction's output shape) in keepdim form.
Tensor keepdim_form(Tensor t, const std::vector<int64_t>& dims, bool keepdim) {
  if (!keepdim)
    for (int64_t d : dims) t = t.unsqueeze(d);
  return t;
}

Tensor expand_reduced(const Tensor& g, const Shape& sizes, const std::vector<int64_t>& dims, bool keepdim) {
  return keepdim_form(g, dims, keepdim).expand(sizes);
}

// amax/amin: the gradient is shared evenly among the elements equal to the extremum (PyTorch's amax rule).
Tensor extremum_reduce(const char* name, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim,
                       bool is_max) {
  Tensor out = forward_op(name, {&x}, [&] {
    return is_max ? ops::amax(x, dims_in, keepdim) : ops::amin(x, dims_in, keepdim);
  });
  if (auto node = make_node(name, {&x})) {
    node->save(x);
    node->save(out);
    node->formula = [dims = reduced_dims(x, dims_in, name), keepdim](const BackwardContext& c,
                                                                      const TensorList& g) -> TensorList {
      const Tensor x = c.saved(0);
      const Tensor hit = ops::eq(x, keepdim_form(c.saved(1), dims, keepdim));  // x's shape, bool
      Tensor share = keepdim_form(g[0], dims, keepdim);
      if (!dims.empty()) share = ops::div(share, ops::sum(hit, dims, /*keepdim=*/true).to(share.dtype()));
      // where, not a multiply: a NaN extremum matches nothing, and its 1/0 share must not turn into 0 * inf.
      return {ops::where(hit, share, scalar_tensor(0, {share.dtype(), share.device()}))};
    };
    node->set_outputs({&out});
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (autocast::should_cast({&x})) {
    autocast::BodyGuard body;
    return sum(autocast::fp32(x), dims_in, keepdim);
  }
  Tensor out = forward_op("sum", {&x}, [&] { return ops::sum(x, dims_in, keepdim); });
  if (auto node = make_node("sum", {&x})) {
    node->formula = [dims = reduced_dims(x, dims_in, "sum"), keepdim](const BackwardContext& c,
                                                                       const TensorList& g) -> TensorList {
      return {expand_reduced(g[0], c.input(0).sizes, dims, keepdim)};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (autocast::should_cast({&x})) {
    autocast::BodyGuard body;
    return mean(autocast::fp32(x), dims_in, keepdim);
  }
  Tensor out = forward_op("mean", {&x}, [&] { return ops::mean(x, dims_in, keepdim); });
  if (auto node = make_node("mean", {&x})) {
    node->formula = [dims = reduced_dims(x, dims_in, "mean"), keepdim](const BackwardContext& c,
                                                                        const TensorList& g) -> TensorList {
      const Shape& sizes = c.input(0).sizes;
      const double n = static_cast<double>(reduced_count(sizes, dims));
      return {expand_reduced(ops::div(g[0], n), sizes, dims, keepdim)};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum_reduce("amax", x, dims, keepdim, true);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum_reduce("amin", x, dims, keepdim, false);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  if (autocast::should_cast({&x})) {
    autocast::BodyGuard body;
    return var(autocast::fp32(x), dims_in, correction, keepdim);
  }
  Tensor out = forward_op("var", {&x}, [&] { return ops::var(x, dims_in, correction, keepdim); });
  if (auto node = make_node("var", {&x})) {
    node->save(x);
    node->formula = [dims = reduced_dims(x, dims_in, "var"), correction, keepdim](
                        const BackwardContext& c, const TensorList& g) -> TensorList {
      // d var / dx = 2 (x - mean) / (N - correction); N <= correction gives inf/NaN, as the forward does.
      const Tensor x = c.saved(0);
      const double scale = 2.0 / static_cast<double>(reduced_count(x.sizes(), dims) - correction);
      const Tensor centered = dims.empty() ? ops::sub(x, x) : ops::sub(x, ops::mean(x, dims, /*keepdim=*/true));
      return {ops::mul(centered, keepdim_form(ops::mul(g[0], scale), dims, keepdim))};
    };
    node->set_outputs({&out});
  }
  return out;
}

// Note [Matmul gradients]
// With 1-d operands promoted as in the forward (a [K] -> [1, K], b [K] -> [K, 1]) and g given back the size-1 dims
// the forward squeezed, every case is ga = g @ b^T and gb = a^T @ g. Batch dims that broadcast come back in the
// broadcast shape and the engine sums them to each operand's shape. When b has at most 2 dims, gb folds a's leading
// dims into one GEMM ([P, K]^T @ [P, N]) instead of a batched product summed afterwards.
Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast::should_cast({&a, &b})) {
    autocast::BodyGuard body;
    return matmul(autocast::lower(a), autocast::lower(b));
  }
  Tensor out = forward_op("matmul", {&a, &b}, [&] { return ops::matmul(a, b); });
  if (auto node = make_node("matmul", {&a, &b})) {
    node->save(node->needs_grad(1) ? a : Tensor());
    node->save(node->needs_grad(0) ? b : Tensor());
    node->formula = [a_dim = a.dim(), b_dim = b.dim()](const BackwardContext& c, const TensorList& g) -> TensorList {
      Tensor g2 = g[0];
      if (b_dim == 1) g2 = g2.unsqueeze(-1);
      if (a_dim == 1) g2 = g2.unsqueeze(-2);
      Tensor ga, gb;
      if (c.needs_grad(0)) {
        const Tensor b = c.saved(1);
        const Tensor b2 = b_dim == 1 ? b.unsqueeze(-1) : b;
        ga = ops::matmul(g2, b2.transpose(-1, -2));  // [..., M, K]
        if (a_dim == 1) ga = ga.squeeze(-2);
      }
      if (c.needs_grad(1)) {
        const Tensor a = c.saved(0);
        const Tensor a2 = a_dim == 1 ? a.unsqueeze(0) : a;
        if (b_dim <= 2) {
          const int64_t K = a2.size(-1), N = g2.size(-1);
          const int64_t P = numel_of(Shape(a2.sizes().begin(), a2.sizes().end() - 1));
          gb = ops::matmul(a2.reshape({P, K}).t(), g2.reshape({P, N}));  // [K, N]
        } else {
          gb = ops::matmul(a2.transpose(-1, -2), g2);  // [batch..., K, N]
        }
        if (b_dim == 1) gb = gb.squeeze(-1);
      }
      return {ga, gb};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (autocast::should_cast({&a, &b})) {
    autocast::BodyGuard body;
    return bmm(autocast::lower(a), autocast::lower(b));
  }
  Tensor out = forward_op("bmm", {&a, &b}, [&] { return ops::bmm(a, b); });
  if (auto node = make_node("bmm", {&a, &b})) {
    node->save(node->needs_grad(1) ? a : Tensor());
    node->save(node->needs_grad(0) ? b : Tensor());
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      return {c.needs_grad(0) ? ops::bmm(g[0], c.saved(1).transpose(1, 2)) : Tensor(),
              c.needs_grad(1) ? ops::bmm(c.saved(0).transpose(1, 2), g[0]) : Tensor()};
    };
    node->set_outputs({&out});
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast::should_cast({&x, &weight})) {
    autocast::BodyGuard body;
    return linear(autocast::lower(x), autocast::lower(weight), autocast::lower(bias));
  }
  Tensor out = forward_op("linear", {&x, &weight, &bias}, [&] { return ops::linear(x, weight, bias); });
  if (auto node = make_node("linear", {&x, &weight, &bias})) {
    node->save(node->needs_grad(1) ? x : Tensor());
    node->save(node->needs_grad(0) ? weight : Tensor());
    node->formula = [](const BackwardContext& c, const TensorList& g) -> TensorList {
      // x [..., in], weight [out, in], g [..., out]; rows = the product of x's leading dims (1 for a 1-d x).
      const Shape& xs = c.input(0).sizes;
      const int64_t in = xs.back(), out_features = c.input(1).sizes[0];
      const int64_t rows = numel_of(Shape(xs.begin(), xs.end() - 1));
      Tensor gx, gw, gb;
      if (c.needs_grad(0)) gx = ops::matmul(g[0], c.saved(1));  // [..., in]
      if (c.needs_grad(1) || c.needs_grad(2)) {
        const Tensor g_flat = g[0].reshape({rows, out_features});
        if (c.needs_grad(1)) gw = ops::matmul(g_flat.t(), c.saved(0).reshape({rows, in}));  // [out, in]
        if (c.needs_grad(2)) gb = ops::sum(g_flat, {0});                                      // [out]
      }
      return {gx, gw, gb};
    };
    node->set_outputs({&out});
  }
  return out;
}

}  // namespace ember
