// Finite-difference gradient checks of the view and copy methods of Tensor (view/reshape, transpose, permute, slice,
// narrow, select, expand, squeeze/unsqueeze, flatten, t, as_strided including overlapping and 0-stride views,
// clone, contiguous, to(dtype)) and chains of them; each is multiplied by a random tensor so the gradients differ
// from element to element.
#include "tests/harness/grad_check.h"

namespace ember::testing {
namespace {

class ViewGrad : public DeviceTest {};

// The view applied to input 0, times input 1 (a random tensor of the view's shape).
GradCase view_case(const std::string& name, Tensor input, const Shape& out_shape,
                   std::function<Tensor(const Tensor&)> view) {
  return GradCase{name, {std::move(input), rand_input(out_shape)},
                  [view = std::move(view)](const Inputs& in) { return view(in[0]) * in[1]; }};
}

TEST_P(ViewGrad, ReshapeLike) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(copy_stub);
  check_grad(view_case("view", rand_input({2, 6}), {3, 4}, [](const Tensor& x) { return x.view({3, 4}); }),
             device());
  check_grad(view_case("view -1", rand_input({2, 3, 2}), {6, 2}, [](const Tensor& x) { return x.view({-1, 2}); }),
             device());
  check_grad(view_case("reshape (view)", rand_input({4, 3}), {2, 6}, [](const Tensor& x) { return x.reshape({2, 6}); }),
             device());
  // A non-contiguous input: reshape copies, then views.
  check_grad(view_case("reshape (copy)", noncontiguous_input({4, 3}), {12},
                       [](const Tensor& x) { return x.reshape({12}); }),
             device());
  check_grad(view_case("flatten", rand_input({2, 3, 4}), {2, 12}, [](const Tensor& x) { return x.flatten(1); }),
             device());
  check_grad(view_case("flatten all", noncontiguous_input({2, 3, 2}), {12},
                       [](const Tensor& x) { return x.flatten(); }),
             device());
  check_grad(view_case("squeeze", rand_input({3, 1, 4, 1}), {3, 4}, [](const Tensor& x) { return x.squeeze(); }),
             device());
  check_grad(view_case("squeeze dim", rand_input({3, 1, 4}), {3, 4}, [](const Tensor& x) { return x.squeeze(1); }),
             device());
  check_grad(view_case("unsqueeze", noncontiguous_input({3, 4}), {3, 1, 4},
                       [](const Tensor& x) { return x.unsqueeze(1); }),
             device());
  check_grad(view_case("unsqueeze last", rand_input({3}), {3, 1}, [](const Tensor& x) { return x.unsqueeze(-1); }),
             device());
}

TEST_P(ViewGrad, TransposePermute) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  check_grad(view_case("transpose", rand_input({3, 4}), {4, 3}, [](const Tensor& x) { return x.transpose(0, 1); }),
             device());
  check_grad(view_case("transpose 3d", noncontiguous_input({2, 3, 4}), {4, 3, 2},
                       [](const Tensor& x) { return x.transpose(0, 2); }),
             device());
  check_grad(view_case("t", rand_input({2, 5}), {5, 2}, [](const Tensor& x) { return x.t(); }), device());
  check_grad(view_case("permute", rand_input({2, 3, 4}), {4, 2, 3},
                       [](const Tensor& x) { return x.permute({2, 0, 1}); }),
             device());
  check_grad(view_case("permute negative dims", noncontiguous_input({2, 3, 4}), {3, 4, 2},
                       [](const Tensor& x) { return x.permute({-2, -1, 0}); }),
             device());
}

TEST_P(ViewGrad, SliceNarrowSelect) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(copy_stub);
  EMBER_REQUIRE_KERNEL(fill_stub);
  check_grad(view_case("slice", rand_input({6, 4}), {3, 4}, [](const Tensor& x) { return x.slice(0, 1, 4); }),
             device());
  check_grad(view_case("slice step", rand_input({7, 4}), {3, 4}, [](const Tensor& x) { return x.slice(0, 1, 7, 2); }),
             device());
  check_grad(view_case("slice step last dim", noncontiguous_input({3, 8}), {3, 3},
                       [](const Tensor& x) { return x.slice(1, 0, 8, 3); }),
             device());
  check_grad(view_case("slice negative bounds", rand_input({5, 3}), {2, 3},
                       [](const Tensor& x) { return x.slice(0, -3, -1); }),
             device());
  check_grad(view_case("narrow", noncontiguous_input({4, 5}), {4, 2}, [](const Tensor& x) { return x.narrow(1, 2, 2); }),
             device());
  check_grad(view_case("select", rand_input({3, 4}), {4}, [](const Tensor& x) { return x.select(0, 1); }), device());
  check_grad(view_case("select last", noncontiguous_input({3, 4, 2}), {3, 2},
                       [](const Tensor& x) { return x.select(1, -1); }),
             device());
}

TEST_P(ViewGrad, Expand) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  check_grad(view_case("expand", rand_input({3, 1}), {3, 4}, [](const Tensor& x) { return x.expand({3, 4}); }),
             device());
  check_grad(view_case("expand new dims", rand_input({1, 4}), {2, 3, 4},
                       [](const Tensor& x) { return x.expand({2, 3, -1}); }),
             device());
  check_grad(view_case("broadcast_to", noncontiguous_input({3}), {2, 3},
                       [](const Tensor& x) { return x.broadcast_to({2, 3}); }),
             device());
}

TEST_P(ViewGrad, AsStrided) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  check_grad(view_case("as_strided transpose", rand_input({3, 4}), {4, 3},
                       [](const Tensor& x) { return x.as_strided({4, 3}, {1, 4}, 0); }),
             device());
  check_grad(view_case("as_strided offset", rand_input({12}), {2, 3},
                       [](const Tensor& x) { return x.as_strided({2, 3}, {4, 1}, 2); }),
             device());
  // Sliding windows: every element of the middle is seen by several windows.
  check_grad(view_case("as_strided overlapping", rand_input({8}), {6, 3},
                       [](const Tensor& x) { return x.as_strided({6, 3}, {1, 1}, 0); }),
             device());
  // A 0 stride: every row is the same storage.
  check_grad(view_case("as_strided zero stride", rand_input({5}), {3, 4},
                       [](const Tensor& x) { return x.as_strided({3, 4}, {0, 1}, 1); }),
             device());
  // as_strided of a view of the leaf (a slice): positions are storage positions, the leaf gets its own back.
  check_grad(view_case("as_strided of a slice", rand_input({10}), {2, 2},
                       [](const Tensor& x) { return x.slice(0, 2, 8).as_strided({2, 2}, {3, 1}, 3); }),
             device());
}

TEST_P(ViewGrad, Copies) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(copy_stub);
  check_grad(view_case("clone", rand_input({3, 4}), {3, 4}, [](const Tensor& x) { return x.clone(); }), device());
  check_grad(view_case("clone non-contiguous", noncontiguous_input({3, 4}), {3, 4},
                       [](const Tensor& x) { return x.clone(); }),
             device());
  check_grad(view_case("contiguous of a transpose", rand_input({3, 4}), {4, 3},
                       [](const Tensor& x) { return x.t().contiguous(); }),
             device());
  check_grad(view_case("contiguous non-contiguous", noncontiguous_input({2, 3, 2}), {2, 3, 2},
                       [](const Tensor& x) { return x.contiguous(); }),
             device());
  check_grad(view_case("alias", rand_input({3}), {3}, [](const Tensor& x) { return x.alias(); }), device());
  // to(dtype) round trip through f32: the rounding perturbs the finite differences, so a wide step (exact for
  // this linear function) and an f32-sized tolerance.
  GradCase rt = view_case("to f32 and back", noncontiguous_input({3, 4}), {3, 4},
                          [](const Tensor& x) { return x.to(DType::f32).to(DType::f64); });
  rt.eps = 1e-2;
  rt.tolerance = {1e-5, 1e-6};
  rt.dtypes = {};
  check_grad(rt, device());
}

TEST_P(ViewGrad, Chains) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(copy_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  check_grad(view_case("t reshape slice unsqueeze expand", rand_input({3, 4}), {2, 2, 6},
                       [](const Tensor& x) {
                         return x.t().reshape({2, 6}).slice(1, 0, 6).unsqueeze(0).expand({2, 2, 6});
                       }),
             device());
  check_grad(view_case("permute select narrow flatten", noncontiguous_input({2, 3, 4}), {6},
                       [](const Tensor& x) { return x.permute({2, 1, 0}).select(0, 2).narrow(0, 0, 3).flatten(); }),
             device());
  check_grad(view_case("slice step transpose view", rand_input({6, 4}), {8},
                       [](const Tensor& x) { return x.slice(0, 0, 6, 3).transpose(0, 1).contiguous().view({8}); }),
             device());
  // The same leaf through two different views, added: gradients from both views accumulate.
  GradCase two{"two views of one leaf", {rand_input({4, 4}), rand_input({4, 4}), rand_input({2, 4})},
               [](const Inputs& in) {
                 return in[0].t() * in[1] + (in[0].slice(0, 1, 3) * in[2]).expand({2, 2, 4}).select(0, 1).view({2, 4})
                                                .unsqueeze(0)
                                                .expand({2, 2, 4})
                                                .reshape({4, 4});
               }};
  check_grad(two, device());
  // A 0-stride as_strided view followed by a transpose and mul with itself.
  GradCase self{"as_strided squared", {rand_input({7})}, [](const Inputs& in) {
                  const Tensor v = in[0].as_strided({3, 3}, {2, 1}, 0);
                  return v * v.t();
                }};
  check_grad(self, device());
}

TEST_P(ViewGrad, AsStridedOfAnOverlappingBase) {
  // The base itself overlaps (an expanded tensor): each storage position's gradient must reach the leaf once,
  // not once per base element that aliases it.
  EMBER_REQUIRE_KERNEL(binary_stub);
  EMBER_REQUIRE_KERNEL(reduce_stub);
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  check_grad(view_case("as_strided of an expand", rand_input({3}), {3},
                       [](const Tensor& x) { return x.expand({2, 3}).as_strided({3}, {1}, 0); }),
             device());
  check_grad(view_case("as_strided of an expanded column", rand_input({4, 1}), {2, 3},
                       [](const Tensor& x) { return x.expand({4, 3}).as_strided({2, 3}, {1, 0}, 1); }),
             device());
  check_grad(view_case("as_strided of an overlapping as_strided", rand_input({6}), {2, 2},
                       [](const Tensor& x) { return x.as_strided({4, 3}, {1, 1}, 0).as_strided({2, 2}, {2, 1}, 1); }),
             device());
}

EMBER_INSTANTIATE_DEVICE_TESTS(ViewGrad);

}  // namespace
}  // namespace ember::testing
