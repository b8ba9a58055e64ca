// View operations (view/reshape/flatten/transpose/permute/slice/narrow/select/expand/squeeze/as_strided) and
// contiguous(): sizes, strides and offsets against hand-computed ones, values against index arithmetic written here.
// Invariant checked throughout: a view shares its base's storage (writes show through), a copy does not.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ember/core/tensor.h"
#include "tests/harness/op_harness.h"

using namespace ember;

namespace {

using Index = std::vector<int64_t>;

// Row-major enumeration of `sizes`, calling f(index) for each element: the expected values of a view.
std::vector<double> expected_values(const Shape& sizes, const std::function<double(const Index&)>& f) {
  std::vector<double> out;
  const int64_t n = numel_of(sizes);
  if (n == 0) return out;
  Index idx(sizes.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    out.push_back(f(idx));
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<double> iota(int64_t n, double start = 0.0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i);
  return v;
}

// arange(n) as f64, reshaped to `shape` (element at flat index k has value k).
Tensor base(const Shape& shape) { return from_vector(iota(numel_of(shape)), shape); }

bool same_storage(const Tensor& a, const Tensor& b) { return a.storage().get() == b.storage().get(); }

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

// ---- view ----------------------------------------------------------------------------------------------------

TEST(View, ContiguousShapesAndStrides) {
  Tensor a = arange(24);
  Tensor v = a.view({2, 3, 4});
  EXPECT_EQ(v.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(v.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(v.storage_offset(), 0);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_TRUE(same_storage(a, v));
  EXPECT_EQ(v.dtype(), DType::i64);
  EXPECT_EQ(v.to_vector<double>(), iota(24));
  EXPECT_EQ(v.view({4, 6}).strides(), (Shape{6, 1}));
  EXPECT_EQ(v.view({24}).strides(), (Shape{1}));
}

TEST(View, MinusOneInference) {
  Tensor a = base({24});
  EXPECT_EQ(a.view({-1, 6}).sizes(), (Shape{4, 6}));
  EXPECT_EQ(a.view({2, -1, 3}).sizes(), (Shape{2, 4, 3}));
  EXPECT_EQ(a.view({2, -1, 3}).strides(), (Shape{12, 3, 1}));
  EXPECT_EQ(a.view({-1}).sizes(), (Shape{24}));
  EXPECT_EQ(a.view({1, -1, 1}).sizes(), (Shape{1, 24, 1}));
  EXPECT_THROW(a.view({-1, -1}), ShapeError);
  EXPECT_THROW(a.view({-1, 5}), ShapeError);  // 24 is not divisible by 5
  EXPECT_THROW(a.view({5, 5}), ShapeError);   // wrong element count
  EXPECT_THROW(a.view({-2, 12}), ShapeError);
  EXPECT_THROW(a.view({25}), ShapeError);
  // Empty tensors: -1 alongside a zero size is ambiguous.
  Tensor e = zeros({0, 3});
  EXPECT_EQ(e.view({3, 0}).sizes(), (Shape{3, 0}));
  EXPECT_EQ(e.view({-1}).sizes(), (Shape{0}));
  EXPECT_EQ(e.view({-1, 3}).sizes(), (Shape{0, 3}));
  EXPECT_THROW(e.view({-1, 0}), ShapeError);
}

TEST(View, ZeroDim) {
  Tensor s = scalar_tensor(5.0, DType::f64);
  Tensor v = s.view({1, 1});
  EXPECT_EQ(v.sizes(), (Shape{1, 1}));
  EXPECT_EQ(v.to_vector<double>(), std::vector<double>{5.0});
  Tensor back = v.view({});
  EXPECT_EQ(back.dim(), 0);
  EXPECT_EQ(back.item<double>(), 5.0);
  EXPECT_EQ(s.view({-1}).sizes(), (Shape{1}));
  EXPECT_THROW(s.view({2}), ShapeError);
}

TEST(View, LegalViewsOfTransposedTensor) {
  // b[j][i][k] = a[i][j][k] = 12 i + 4 j + k; sizes {3, 2, 4}, strides {4, 12, 1}. The last dim is a contiguous
  // chunk of 4, so it can be re-split without a copy.
  Tensor b = base({2, 3, 4}).transpose(0, 1);
  ASSERT_EQ(b.strides(), (Shape{4, 12, 1}));
  Tensor v = b.view({3, 2, 2, 2});
  EXPECT_TRUE(same_storage(b, v));
  EXPECT_EQ(v.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_EQ(v.to_vector<double>(), expected_values({3, 2, 2, 2}, [](const Index& x) {
              return 12.0 * x[1] + 4.0 * x[0] + 2.0 * x[2] + x[3];
            }));
  // Unit dims can be inserted anywhere.
  Tensor u = b.view({3, 1, 2, 4, 1});
  EXPECT_TRUE(same_storage(b, u));
  EXPECT_EQ(u.to_vector<double>(), b.to_vector<double>());

  // t() of a {4, 6} matrix: sizes {6, 4}, strides {1, 6}. Splitting the (stride-6) last dim is legal.
  Tensor m = base({4, 6}).t();
  Tensor mv = m.view({6, 2, 2});
  EXPECT_EQ(mv.strides(), (Shape{1, 12, 6}));
  EXPECT_EQ(mv.to_vector<double>(), expected_values({6, 2, 2}, [](const Index& x) {
              return 6.0 * (2 * x[1] + x[2]) + x[0];  // m[r][c] = base[c][r] = 6 c + r
            }));

  // A column slice: sizes {4, 3}, strides {6, 1}; splitting dim 0 is legal, merging the two dims is not.
  Tensor s = base({4, 6}).slice(1, 0, 3);
  Tensor sv = s.view({2, 2, 3});
  EXPECT_EQ(sv.strides(), (Shape{12, 6, 1}));
  EXPECT_EQ(sv.to_vector<double>(), expected_values({2, 2, 3}, [](const Index& x) {
              return 6.0 * (2 * x[0] + x[1]) + x[2];
            }));
  EXPECT_THROW(s.view({12}), ShapeError);

  // An expanded tensor (stride 0) can split its broadcast dim.
  Tensor e = base({3, 1}).expand({3, 4});
  Tensor ev = e.view({3, 2, 2});
  EXPECT_EQ(ev.strides(), (Shape{1, 0, 0}));
  EXPECT_EQ(ev.to_vector<double>(), expected_values({3, 2, 2}, [](const Index& x) { return double(x[0]); }));
}

TEST(View, IllegalViewsSayUseReshape) {
  Tensor b = base({2, 3, 4}).transpose(0, 1);  // {3, 2, 4}, strides {4, 12, 1}
  EXPECT_THROW(b.view({3, 8}), ShapeError);
  EXPECT_THROW(b.view({24}), ShapeError);
  EXPECT_THROW(b.view({6, 4}), ShapeError);
  const std::string msg = error_message([&] { b.view({24}); });
  EXPECT_NE(msg.find("view"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reshape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2, 4]"), std::string::npos) << msg;
  EXPECT_THROW(base({4, 6}).t().view({24}), ShapeError);
  EXPECT_THROW(base({3, 1}).expand({3, 4}).view({12}), ShapeError);
}

// ---- reshape -------------------------------------------------------------------------------------------------

TEST(Reshape, ViewsWhenPossible) {
  Tensor a = base({2, 3, 4});
  Tensor r = a.reshape({6, -1});
  EXPECT_TRUE(same_storage(a, r));
  EXPECT_EQ(r.sizes(), (Shape{6, 4}));
  EXPECT_EQ(r.strides(), (Shape{4, 1}));
  // Non-contiguous but viewable: no copy either.
  Tensor b = a.transpose(0, 1);
  Tensor rb = b.reshape({3, 2, 2, 2});
  EXPECT_TRUE(same_storage(b, rb));
  EXPECT_EQ(rb.strides(), (Shape{4, 12, 2, 1}));
  // A write through the reshaped view shows in the base.
  a.reshape({24}).narrow(0, 5, 1).fill_(-1.0);
  EXPECT_EQ(a.to_vector<double>()[5], -1.0);
}

TEST(Reshape, CopiesWhenNeeded) {
  Tensor a = base({2, 3, 4});
  Tensor b = a.transpose(0, 1);  // {3, 2, 4}
  Tensor r = b.reshape({-1});
  EXPECT_FALSE(same_storage(b, r));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.sizes(), (Shape{24}));
  EXPECT_EQ(r.to_vector<double>(), expected_values({3, 2, 4}, [](const Index& x) {
              return 12.0 * x[1] + 4.0 * x[0] + x[2];
            }));
  // The copy is independent of the base.
  r.fill_(0.0);
  EXPECT_EQ(a.to_vector<double>(), iota(24));

  Tensor m = base({4, 6}).t();  // {6, 4}
  Tensor rm = m.reshape({4, 6});
  EXPECT_FALSE(same_storage(m, rm));
  EXPECT_EQ(rm.to_vector<double>(), expected_values({4, 6}, [](const Index& x) {
              const int64_t k = 6 * x[0] + x[1];  // flat index into m (6 x 4): m[k / 4][k % 4] = 6 (k % 4) + k / 4
              return 6.0 * (k % 4) + double(k / 4);
            }));
  EXPECT_THROW(m.reshape({5, 5}), ShapeError);
  EXPECT_THROW(m.reshape({-1, -1}), ShapeError);

  Tensor e = base({3, 1}).expand({3, 4});
  Tensor re = e.reshape({12});
  EXPECT_FALSE(same_storage(e, re));
  EXPECT_EQ(re.to_vector<double>(), expected_values({12}, [](const Index& x) { return double(x[0] / 4); }));
}

// ---- flatten -------------------------------------------------------------------------------------------------

TEST(Flatten, Ranges) {
  Tensor a = base({2, 3, 4});
  EXPECT_EQ(a.flatten().sizes(), (Shape{24}));
  EXPECT_EQ(a.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(a.flatten(0, 1).sizes(), (Shape{6, 4}));
  EXPECT_EQ(a.flatten(-2, -1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(a.flatten(1, 1).sizes(), (Shape{2, 3, 4}));
  EXPECT_TRUE(same_storage(a, a.flatten()));
  EXPECT_EQ(a.flatten().to_vector<double>(), iota(24));
  EXPECT_THROW(a.flatten(2, 1), IndexError);
  EXPECT_THROW(a.flatten(0, 3), IndexError);
  EXPECT_THROW(a.flatten(-4), IndexError);
  // 0-d flattens to one element.
  Tensor s = scalar_tensor(3.0);
  EXPECT_EQ(s.flatten().sizes(), (Shape{1}));
  EXPECT_EQ(s.flatten().item<double>(), 3.0);
  // A permuted tensor flattens through a copy, in its own row-major order.
  Tensor p = a.permute({2, 0, 1});
  Tensor f = p.flatten();
  EXPECT_FALSE(same_storage(p, f));
  EXPECT_EQ(f.to_vector<double>(), expected_values({4, 2, 3}, [](const Index& x) {
              return 12.0 * x[1] + 4.0 * x[2] + x[0];
            }));
  // Dims 1 and 2 of the transposed {3, 2, 4} (strides {12, 1}) cannot merge: copy. A one-dim range: a view.
  Tensor q = a.transpose(0, 1).flatten(1);
  EXPECT_EQ(q.sizes(), (Shape{3, 8}));
  EXPECT_FALSE(same_storage(a, q));
  Tensor w = a.permute({1, 0, 2}).flatten(0, 0);
  EXPECT_TRUE(same_storage(a, w));
  // Flattening the trailing contiguous dims of a transposed tensor stays a view.
  Tensor r = a.transpose(0, 1).flatten(2);
  EXPECT_TRUE(same_storage(a, r));
}

// ---- transpose / t / permute ---------------------------------------------------------------------------------

TEST(Transpose, StridesAndValues) {
  Tensor a = base({2, 3, 4});
  Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(same_storage(a, t));
  EXPECT_EQ(t.to_vector<double>(), expected_values({4, 3, 2}, [](const Index& x) {
              return 12.0 * x[2] + 4.0 * x[1] + x[0];
            }));
  Tensor n = a.transpose(-1, -2);
  EXPECT_EQ(n.sizes(), (Shape{2, 4, 3}));
  EXPECT_EQ(n.strides(), (Shape{12, 1, 4}));
  EXPECT_EQ(a.transpose(1, 1).strides(), (Shape{12, 4, 1}));
  EXPECT_THROW(a.transpose(0, 3), IndexError);
  EXPECT_THROW(a.transpose(-4, 0), IndexError);
  // 0-d: transpose(0, 0) is the identity, like PyTorch.
  EXPECT_EQ(scalar_tensor(1.0).transpose(0, -1).dim(), 0);
}

TEST(Transpose, T) {
  Tensor m = base({2, 3});
  Tensor t = m.t();
  EXPECT_EQ(t.sizes(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.t().strides(), (Shape{3, 1}));
  Tensor v = base({5});
  EXPECT_EQ(v.t().sizes(), (Shape{5}));
  EXPECT_TRUE(same_storage(v, v.t()));
  EXPECT_EQ(scalar_tensor(2.0).t().dim(), 0);
  EXPECT_THROW(base({2, 3, 4}).t(), ShapeError);
}

TEST(Permute, ElementByElement) {
  Tensor a = arange(24).view({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(same_storage(a, p));
  const std::vector<double> v = p.to_vector<double>();
  ASSERT_EQ(v.size(), 24u);
  size_t k = 0;
  for (int64_t d2 = 0; d2 < 4; ++d2)
    for (int64_t d0 = 0; d0 < 2; ++d0)
      for (int64_t d1 = 0; d1 < 3; ++d1) EXPECT_EQ(v[k++], double(d0 * 12 + d1 * 4 + d2)) << d2 << d0 << d1;
  // Negative dims; permuting back is the identity.
  Tensor q = a.permute({-1, -3, -2});
  EXPECT_EQ(q.strides(), p.strides());
  EXPECT_EQ(p.permute({1, 2, 0}).strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(p.permute({1, 2, 0}).to_vector<double>(), iota(24));
  EXPECT_THROW(a.permute({0, 1}), ShapeError);
  EXPECT_THROW(a.permute({0, 1, 2, 3}), ShapeError);
  EXPECT_THROW(a.permute({0, 0, 1}), IndexError);
  EXPECT_THROW(a.permute({0, -3, 1}), IndexError);  // -3 is dim 0 again
  EXPECT_THROW(a.permute({0, 1, 3}), IndexError);
  EXPECT_EQ(scalar_tensor(1.0).permute({}).dim(), 0);
}

// ---- slice / narrow / select ---------------------------------------------------------------------------------

TEST(Slice, PythonSemantics) {
  Tensor a = base({10});
  auto vals = [](const Tensor& t) { return t.to_vector<double>(); };
  EXPECT_EQ(vals(a.slice(0, 2, 8)), (std::vector<double>{2, 3, 4, 5, 6, 7}));   // a[2:8]
  EXPECT_EQ(vals(a.slice(0, 2, 8, 3)), (std::vector<double>{2, 5}));            // a[2:8:3]
  EXPECT_EQ(vals(a.slice(0, 1, 10, 4)), (std::vector<double>{1, 5, 9}));        // a[1:10:4]
  EXPECT_EQ(vals(a.slice(0, 0, 10, 4)), (std::vector<double>{0, 4, 8}));        // a[0:10:4]
  EXPECT_EQ(vals(a.slice(0, -3, 100)), (std::vector<double>{7, 8, 9}));         // a[-3:100]
  EXPECT_EQ(vals(a.slice(0, -100, 3)), (std::vector<double>{0, 1, 2}));         // a[-100:3]
  EXPECT_EQ(vals(a.slice(0, 3, -5)), (std::vector<double>{3, 4}));              // a[3:-5]
  EXPECT_EQ(vals(a.slice(0, -4, -1, 2)), (std::vector<double>{6, 8}));          // a[-4:-1:2]
  EXPECT_EQ(a.slice(0, 8, 2).numel(), 0);                                        // a[8:2]
  EXPECT_EQ(a.slice(0, 10, 20).numel(), 0);                                      // a[10:20]
  EXPECT_EQ(a.slice(0, 100, 200).numel(), 0);
  EXPECT_EQ(a.slice(0, 2, 8, 3).strides(), (Shape{3}));
  EXPECT_EQ(a.slice(0, 2, 8, 3).storage_offset(), 2);
  EXPECT_THROW(a.slice(0, 0, 5, 0), ValueError);
  EXPECT_THROW(a.slice(0, 0, 5, -1), ValueError);
  EXPECT_THROW(a.slice(1, 0, 5), IndexError);
  EXPECT_THROW(scalar_tensor(1.0).slice(0, 0, 1), IndexError);
}

TEST(Slice, TwoDimsWithStep) {
  Tensor a = base({4, 6});
  Tensor s = a.slice(1, 1, 6, 2);  // a[:, 1::2]
  EXPECT_EQ(s.sizes(), (Shape{4, 3}));
  EXPECT_EQ(s.strides(), (Shape{6, 2}));
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_TRUE(same_storage(a, s));
  EXPECT_EQ(s.to_vector<double>(), expected_values({4, 3}, [](const Index& x) { return 6.0 * x[0] + 1 + 2 * x[1]; }));
  // A slice of a slice composes offsets and steps: rows 1::2 of that.
  Tensor ss = s.slice(0, 1, 4, 2);
  EXPECT_EQ(ss.sizes(), (Shape{2, 3}));
  EXPECT_EQ(ss.strides(), (Shape{12, 2}));
  EXPECT_EQ(ss.storage_offset(), 7);
  EXPECT_EQ(ss.to_vector<double>(), expected_values({2, 3}, [](const Index& x) {
              return 6.0 * (1 + 2 * x[0]) + 1 + 2 * x[1];
            }));
  // Negative dim.
  EXPECT_EQ(a.slice(-1, 4, 6).sizes(), (Shape{4, 2}));
}

TEST(Narrow, BoundsAndValues) {
  Tensor a = base({10});
  EXPECT_EQ(a.narrow(0, 2, 3).to_vector<double>(), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(a.narrow(0, -3, 2).to_vector<double>(), (std::vector<double>{7, 8}));
  EXPECT_EQ(a.narrow(0, 0, 10).numel(), 10);
  EXPECT_EQ(a.narrow(0, 10, 0).numel(), 0);
  EXPECT_THROW(a.narrow(0, 8, 3), IndexError);
  EXPECT_THROW(a.narrow(0, 11, 0), IndexError);
  EXPECT_THROW(a.narrow(0, -11, 1), IndexError);
  EXPECT_THROW(a.narrow(0, 0, -1), IndexError);
  EXPECT_THROW(a.narrow(0, 0, 11), IndexError);
  EXPECT_THROW(a.narrow(1, 0, 1), IndexError);
  EXPECT_THROW(scalar_tensor(1.0).narrow(0, 0, 1), IndexError);
  Tensor m = base({4, 6});
  Tensor n = m.narrow(1, 2, 3);
  EXPECT_EQ(n.sizes(), (Shape{4, 3}));
  EXPECT_EQ(n.strides(), (Shape{6, 1}));
  EXPECT_EQ(n.storage_offset(), 2);
  EXPECT_EQ(n.to_vector<double>(), expected_values({4, 3}, [](const Index& x) { return 6.0 * x[0] + 2 + x[1]; }));
}

TEST(Select, RemovesDim) {
  Tensor a = base({2, 3, 4});
  Tensor s = a.select(1, 2);
  EXPECT_EQ(s.sizes(), (Shape{2, 4}));
  EXPECT_EQ(s.strides(), (Shape{12, 1}));
  EXPECT_EQ(s.storage_offset(), 8);
  EXPECT_EQ(s.to_vector<double>(), expected_values({2, 4}, [](const Index& x) { return 12.0 * x[0] + 8 + x[1]; }));
  Tensor l = a.select(-1, -1);
  EXPECT_EQ(l.sizes(), (Shape{2, 3}));
  EXPECT_EQ(l.strides(), (Shape{12, 4}));
  EXPECT_EQ(l.to_vector<double>(), expected_values({2, 3}, [](const Index& x) { return 12.0 * x[0] + 4 * x[1] + 3; }));
  Tensor e = base({5}).select(0, 3);
  EXPECT_EQ(e.dim(), 0);
  EXPECT_EQ(e.item<double>(), 3.0);
  EXPECT_THROW(a.select(1, 3), IndexError);
  EXPECT_THROW(a.select(1, -4), IndexError);
  EXPECT_THROW(a.select(3, 0), IndexError);
  EXPECT_THROW(scalar_tensor(1.0).select(0, 0), IndexError);
  EXPECT_THROW(zeros({0, 2}).select(0, 0), IndexError);
}

// ---- expand / squeeze / unsqueeze ----------------------------------------------------------------------------

TEST(Expand, StrideZeroAndErrors) {
  Tensor c = base({3, 1});
  Tensor e = c.expand({2, 3, 4});
  EXPECT_EQ(e.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(same_storage(c, e));
  EXPECT_EQ(e.to_vector<double>(), expected_values({2, 3, 4}, [](const Index& x) { return double(x[1]); }));
  EXPECT_EQ(c.expand({-1, 5}).sizes(), (Shape{3, 5}));
  EXPECT_EQ(c.expand({3, 1}).strides(), (Shape{1, 1}));
  EXPECT_EQ(c.broadcast_to({3, 2}).strides(), (Shape{1, 0}));
  EXPECT_EQ(c.expand({3, 0}).numel(), 0);
  EXPECT_THROW(c.expand({4, 1}), ShapeError);   // 3 -> 4
  EXPECT_THROW(c.expand({1}), ShapeError);      // fewer dims
  EXPECT_THROW(c.expand({-1, 3, 1}), ShapeError);  // -1 in a new leading dim
  EXPECT_THROW(base({2, 3}).expand({2, 6}), ShapeError);
  // 0-d expands to anything.
  Tensor s = scalar_tensor(4.0, DType::f64);
  Tensor se = s.expand({2, 3});
  EXPECT_EQ(se.strides(), (Shape{0, 0}));
  EXPECT_EQ(se.to_vector<double>(), std::vector<double>(6, 4.0));
}

TEST(Squeeze, AllAndOne) {
  Tensor a = base({1, 3, 1, 2});
  EXPECT_EQ(a.squeeze().sizes(), (Shape{3, 2}));
  EXPECT_EQ(a.squeeze().strides(), (Shape{2, 1}));
  EXPECT_EQ(a.squeeze(0).sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(a.squeeze(1).sizes(), (Shape{1, 3, 1, 2}));  // size 3: unchanged
  EXPECT_EQ(a.squeeze(-2).sizes(), (Shape{1, 3, 2}));
  EXPECT_TRUE(same_storage(a, a.squeeze()));
  EXPECT_EQ(a.squeeze().to_vector<double>(), iota(6));
  EXPECT_THROW(a.squeeze(4), IndexError);
  EXPECT_EQ(base({1, 1}).squeeze().dim(), 0);
  EXPECT_EQ(scalar_tensor(1.0).squeeze().dim(), 0);
  EXPECT_EQ(scalar_tensor(1.0).squeeze(0).dim(), 0);
}

TEST(Unsqueeze, StridesFollowPyTorch) {
  Tensor a = base({2, 3});
  EXPECT_EQ(a.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(a.unsqueeze(0).strides(), (Shape{6, 3, 1}));
  EXPECT_EQ(a.unsqueeze(1).sizes(), (Shape{2, 1, 3}));
  EXPECT_EQ(a.unsqueeze(1).strides(), (Shape{3, 3, 1}));
  EXPECT_EQ(a.unsqueeze(2).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(a.unsqueeze(2).strides(), (Shape{3, 1, 1}));
  EXPECT_EQ(a.unsqueeze(-1).sizes(), (Shape{2, 3, 1}));
  EXPECT_EQ(a.unsqueeze(-3).sizes(), (Shape{1, 2, 3}));
  EXPECT_THROW(a.unsqueeze(3), IndexError);
  EXPECT_THROW(a.unsqueeze(-4), IndexError);
  EXPECT_TRUE(a.unsqueeze(1).is_contiguous());
  EXPECT_EQ(a.unsqueeze(1).to_vector<double>(), iota(6));
  Tensor s = scalar_tensor(2.0).unsqueeze(0);
  EXPECT_EQ(s.sizes(), (Shape{1}));
  EXPECT_EQ(s.strides(), (Shape{1}));
  // Round trip with squeeze on a transposed tensor keeps strides.
  Tensor t = a.t().unsqueeze(1).squeeze(1);
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
}

// ---- as_strided ----------------------------------------------------------------------------------------------

TEST(AsStrided, WindowsAndBoundsCheck) {
  Tensor a = base({10});
  Tensor w = a.as_strided({3, 3}, {1, 1}, 0);  // overlapping sliding windows
  EXPECT_EQ(w.to_vector<double>(), expected_values({3, 3}, [](const Index& x) { return double(x[0] + x[1]); }));
  Tensor m = a.as_strided({3, 3}, {3, 1}, 1);  // last element addressed: 1 + 6 + 2 = 9
  EXPECT_EQ(m.storage_offset(), 1);
  EXPECT_EQ(m.to_vector<double>(), expected_values({3, 3}, [](const Index& x) { return 1.0 + 3 * x[0] + x[1]; }));
  EXPECT_THROW(a.as_strided({3, 3}, {3, 1}, 2), ShapeError);  // would address element 10
  EXPECT_THROW(a.as_strided({11}, {1}, 0), ShapeError);
  EXPECT_THROW(a.as_strided({2}, {-1}, 5), ShapeError);       // negative strides unsupported
  EXPECT_THROW(a.as_strided({2}, {1}, -1), ShapeError);
  EXPECT_THROW(a.as_strided({2, 2}, {1}, 0), ShapeError);     // sizes/strides length mismatch
  EXPECT_THROW(a.as_strided({-1}, {1}, 0), ShapeError);
  EXPECT_EQ(a.as_strided({0, 5}, {100, 100}, 0).numel(), 0);  // addresses nothing
  EXPECT_EQ(a.as_strided({}, {}, 9).item<double>(), 9.0);
  EXPECT_THROW(a.as_strided({}, {}, 10), ShapeError);
  // A view of a view: bounds are against the whole storage, not the view.
  Tensor n = a.narrow(0, 0, 2);
  EXPECT_EQ(n.as_strided({2}, {1}, 8).to_vector<double>(), (std::vector<double>{8, 9}));
}

// ---- contiguous ----------------------------------------------------------------------------------------------

TEST(Contiguous, EachKindOfView) {
  Tensor a = base({2, 3, 4});
  struct Case {
    const char* name;
    Tensor view;
    bool contiguous;
    std::function<double(const Index&)> value;
  };
  const std::vector<Case> cases = {
      {"transpose", a.transpose(0, 2), false, [](const Index& x) { return 12.0 * x[2] + 4 * x[1] + x[0]; }},
      {"permute", a.permute({1, 2, 0}), false, [](const Index& x) { return 12.0 * x[2] + 4 * x[0] + x[1]; }},
      {"slice_step", a.slice(2, 0, 4, 2), false, [](const Index& x) { return 12.0 * x[0] + 4 * x[1] + 2 * x[2]; }},
      {"slice_dim0", a.slice(0, 1, 2), true, [](const Index& x) { return 12.0 + 4 * x[1] + x[2]; }},
      {"narrow_inner", a.narrow(1, 1, 2), false, [](const Index& x) { return 12.0 * x[0] + 4 * (1 + x[1]) + x[2]; }},
      {"select_mid", a.select(1, 1), false, [](const Index& x) { return 12.0 * x[0] + 4 + x[1]; }},
      {"select_outer", a.select(0, 1), true, [](const Index& x) { return 12.0 + 4 * x[0] + x[1]; }},
      {"expand", a.select(2, 3).unsqueeze(2).expand({2, 3, 5}), false,
       [](const Index& x) { return 12.0 * x[0] + 4 * x[1] + 3; }},
      {"as_strided", a.as_strided({4, 3}, {2, 5}, 1), false, [](const Index& x) { return 1.0 + 2 * x[0] + 5 * x[1]; }},
      {"unsqueeze", a.unsqueeze(1), true, [](const Index& x) { return 12.0 * x[0] + 4 * x[2] + x[3]; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.view.is_contiguous(), c.contiguous);
    const std::vector<double> want = expected_values(c.view.sizes(), c.value);
    EXPECT_EQ(c.view.to_vector<double>(), want);
    Tensor k = c.view.contiguous();
    EXPECT_TRUE(k.is_contiguous());
    EXPECT_EQ(k.sizes(), c.view.sizes());
    EXPECT_EQ(k.to_vector<double>(), want);
    if (c.contiguous) {
      EXPECT_TRUE(k.is_same(c.view));  // no copy
    } else {
      EXPECT_FALSE(same_storage(k, a));
      EXPECT_EQ(k.strides(), contiguous_strides(k.sizes()));
      EXPECT_EQ(k.storage_offset(), 0);
    }
  }
}

TEST(Contiguous, EmptyAndZeroDim) {
  Tensor e = zeros({0, 3}).t();
  EXPECT_TRUE(e.is_contiguous());  // nothing to address
  EXPECT_EQ(e.contiguous().numel(), 0);
  Tensor s = scalar_tensor(6.0);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_TRUE(s.contiguous().is_same(s));
}

// ---- writes through views ------------------------------------------------------------------------------------

TEST(ViewWrites, FillAndCopyShowInBase) {
  Tensor a = zeros({3, 4}, DType::f64);
  a.t().select(0, 1).fill_(7.0);  // column 1
  a.slice(1, 0, 4, 2).copy_(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}));  // columns 0 and 2
  a.narrow(0, 2, 1).narrow(1, 3, 1).fill_(9.0);                                         // a[2][3]
  a.view({12}).slice(0, 3, 4).fill_(-1.0);                                               // a[0][3]
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{1, 7, 2, -1,  //
                                                        3, 7, 4, 0,   //
                                                        5, 7, 6, 9}));
  // A broadcasting copy into a transposed view: b.t() is {3, 2} and each of its rows receives {10, 20}.
  Tensor b = zeros({2, 3}, DType::f64);
  b.t().copy_(from_vector(std::vector<double>{10, 20}, {2}));
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{10, 10, 10, 20, 20, 20}));
  // An integer view takes writes too.
  Tensor c = arange(6).view({2, 3});
  c.select(1, 0).fill_(100);
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{100, 1, 2, 100, 4, 5}));
}

TEST(ViewWrites, ViewsShareVersionCounter) {
  Tensor a = zeros({4}, DType::f32);
  Tensor v = a.view({2, 2}).t();
  const int64_t v0 = a.version();
  EXPECT_EQ(v.version(), v0);
  v.fill_(1.0);
  EXPECT_EQ(a.version(), v0 + 1);
  a.slice(0, 0, 2).copy_(zeros({2}));
  EXPECT_EQ(v.version(), v0 + 2);
}

// ---- geometry through the op harness's non-contiguous helper -------------------------------------------------

TEST(ViewMeta, NoncontiguousInputIsAView) {
  Tensor t = ember::testing::noncontiguous_input({3, 4});
  EXPECT_EQ(t.sizes(), (Shape{3, 4}));
  EXPECT_FALSE(t.is_contiguous());
  // Its contiguous copy holds the same values in row-major order.
  const std::vector<double> v = t.to_vector<double>();
  Tensor k = t.contiguous();
  EXPECT_EQ(k.to_vector<double>(), v);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(t.select(0, i).select(0, j).item<double>(), v[i * 4 + j]);
}
