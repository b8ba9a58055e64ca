// Finite-difference gradient checks (grad_check.h). Invariant: the numeric side perturbs one element at a time of a
// dense copy of each input and evaluates the op with grad mode off; the analytic side sees the inputs with their
// original strides.
#include "tests/harness/grad_check.h"

#include <cmath>
#include <sstream>

#include "ember/autograd/engine.h"

namespace ember::testing {

namespace {

bool differentiated(const GradCase& c, size_t i) {
  const Tensor& t = c.inputs[i];
  if (!t.defined() || !is_floating(t.dtype())) return false;
  if (c.wrt.empty()) return true;
  for (size_t k : c.wrt)
    if (k == i) return true;
  return false;
}

Tolerance dtype_tolerance(const GradCase& c, DType dt) {
  if (c.dtype_tolerance) return c.dtype_tolerance(dt);
  switch (dt) {
    case DType::f32: return {1e-4, 1e-5};
    case DType::f16: return {2e-2, 2e-2};
    case DType::bf16: return {5e-2, 5e-2};
    default: return {1e-12, 1e-12};
  }
}

// Leaves for the differentiated inputs (dtype/device converted, strides kept; a broadcast input's leaf is its
// compact form, expanded again for the op) and the op's inputs built from them.
struct Prepared {
  Inputs leaves;  // undefined where not differentiated
  Inputs args;
};

Prepared prepare(const GradCase& c, DType dt, Device device) {
  Prepared p;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (!differentiated(c, i)) {
      p.leaves.emplace_back();
      p.args.push_back(t.defined() && is_floating(t.dtype()) ? convert_keep_strides(t, dt, device)
                       : t.defined()                         ? t.to(device)
                                                             : t);
      continue;
    }
    Tensor conv = convert_keep_strides(t, dt, device);
    Tensor leaf = conv;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.strides()[d] == 0 && t.sizes()[d] > 1) leaf = leaf.narrow(d, 0, 1);
    leaf = leaf.detach();
    leaf.requires_grad_();
    p.leaves.push_back(leaf);
    p.args.push_back(leaf.sizes() == t.sizes() ? leaf : leaf.expand(t.sizes()));
  }
  return p;
}

double weighted_sum(const Tensor& out, const std::vector<double>& v) {
  const std::vector<double> o = out.to_vector<double>();
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * v[i];
  return s;
}

}  // namespace

void check_grad(const GradCase& c, Device device) {
  SCOPED_TRACE("grad check of " + c.name + " on " + device.str());
  // Analytic gradients in f64.
  Prepared p = prepare(c, DType::f64, device);
  const Tensor out = c.fn(p.args);
  ASSERT_TRUE(out.defined() && is_floating(out.dtype())) << c.name << " must return a floating tensor";
  ASSERT_TRUE(out.requires_grad()) << c.name << ": the output does not require grad (no node was recorded)";
  const Tensor v = rand_input(out.sizes());
  const std::vector<double> vw = v.to_vector<double>();
  Inputs wrt;
  for (const Tensor& l : p.leaves)
    if (l.defined()) wrt.push_back(l);
  const Inputs grads = autograd::grad({out}, wrt, {v.to(device)}, false, /*allow_unused=*/true);

  // Numeric gradients: perturb a dense copy of each leaf.
  size_t k = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!p.leaves[i].defined()) continue;
    const Tensor& leaf = p.leaves[i];
    const Tensor analytic = grads[k].defined() ? grads[k].cpu() : zeros(leaf.sizes(), DType::f64);
    ++k;
    ASSERT_EQ(analytic.sizes(), leaf.sizes()) << "gradient shape of input " << i;
    ASSERT_EQ(analytic.dtype(), DType::f64) << "gradient dtype of input " << i;
    Tensor dense = leaf.detach().cpu().contiguous().clone();
    double* data = dense.data<double>();
    std::vector<double> numeric(static_cast<size_t>(dense.numel()));
    for (int64_t j = 0; j < dense.numel(); ++j) {
      const double x0 = data[j];
      double f[2];
      for (int side = 0; side < 2; ++side) {
        data[j] = x0 + (side == 0 ? c.eps : -c.eps);
        Inputs args = p.args;
        const Tensor moved = dense.to(device);
        args[i] = moved.sizes() == c.inputs[i].sizes() ? moved : moved.expand(c.inputs[i].sizes());
        NoGradGuard no_grad;
        f[side] = weighted_sum(c.fn(args), vw);
      }
      data[j] = x0;
      numeric[static_cast<size_t>(j)] = (f[0] - f[1]) / (2 * c.eps);
    }
    EXPECT_TRUE(allclose(analytic, from_vector(numeric, leaf.sizes()), c.tolerance))
        << c.name << ": d/d input " << i << " (" << leaf.description() << ") vs finite differences";
  }

  // The same backward in lower precisions, against the f64 gradients of the rounded inputs.
  for (DType dt : c.dtypes) {
    SCOPED_TRACE(std::string("dtype ") + dtype_name(dt));
    Prepared low = prepare(c, dt, device);
    Inputs rounded_inputs;
    GradCase rc = c;
    for (const Tensor& t : c.inputs)
      rounded_inputs.push_back(t.defined() && is_floating(t.dtype())
                                   ? convert_keep_strides(convert_keep_strides(t, dt, Device::cpu()), DType::f64,
                                                          Device::cpu())
                                   : t);
    rc.inputs = rounded_inputs;
    Prepared ref = prepare(rc, DType::f64, device);
    const Tensor out_low = c.fn(low.args);
    const Tensor out_ref = c.fn(ref.args);
    Inputs wrt_low, wrt_ref;
    for (size_t i = 0; i < low.leaves.size(); ++i)
      if (low.leaves[i].defined()) {
        wrt_low.push_back(low.leaves[i]);
        wrt_ref.push_back(ref.leaves[i]);
      }
    const Tensor v_low = v.to(device, dt);
    const Inputs g_low = autograd::grad({out_low}, wrt_low, {v_low}, false, true);
    const Inputs g_ref = autograd::grad({out_ref}, wrt_ref, {v_low.to(DType::f64)}, false, true);
    for (size_t i = 0; i < g_low.size(); ++i) {
      if (!g_ref[i].defined()) continue;
      ASSERT_TRUE(g_low[i].defined()) << c.name << ": no " << dtype_name(dt) << " gradient for input " << i;
      EXPECT_EQ(g_low[i].dtype(), dt) << c.name << ": gradient dtype for input " << i;
      EXPECT_TRUE(allclose(g_low[i], g_ref[i], dtype_tolerance(c, dt)))
          << c.name << ": " << dtype_name(dt) << " gradient of input " << i << " vs f64";
    }
  }
}

}  // namespace ember::testing
