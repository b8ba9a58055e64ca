// The "csr" packed Linear (nn/sparse_linear.h): outputs against the dense layer and naive float64 loops, the bytes
// the packing saves (computed by hand), unpacking, sparsify_linears, state_dict round trips between packed layers,
// the lazy validation of loaded indices, and the typed errors of misuse.
#include <gtest/gtest.h>

#include <vector>

#include "ember/ember.h"
#include "ember/nn/layers.h"
#include "ember/nn/prune.h"
#include "ember/nn/sparse_linear.h"
#include "tests/harness/op_harness.h"

namespace ember::nn {
namespace {

using ::ember::testing::allclose;
using ::ember::testing::error_message;
using ::ember::testing::rand_input_seeded;

// y = x W^T + b in double, naive loops; x [B, K], w [N, K].
Tensor naive_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t B = x.size(0), K = x.size(1), N = w.size(0);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(B * N));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bv[n];
      for (int64_t k = 0; k < K; ++k) acc += xv[i * K + k] * wv[n * K + k];
      y[i * N + n] = acc;
    }
  return from_vector(y, {B, N});
}

bool has_key(const NamedTensors& named, const std::string& key) {
  for (const auto& [k, t] : named)
    if (k == key) return true;
  return false;
}

int64_t buffer_bytes(const Module& m) {
  int64_t n = 0;
  for (const auto& [k, t] : m.named_buffers()) n += t.nbytes();
  return n;
}

// A Linear with `count` of its weights pruned permanently (no mask left).
std::shared_ptr<Linear> pruned_linear(int64_t in, int64_t out, int64_t count) {
  auto l = std::make_shared<Linear>(in, out);
  l1_unstructured(*l, "weight", PruneAmount::count(count));
  remove(*l, "weight");
  return l;
}

TEST(SparseLinear, PackedOutputEqualsDenseAndBytesShrinkAsPredicted) {
  auto l = pruned_linear(20, 6, 60);  // 50% of 120
  const Tensor w = l->weight.detach().clone(), b = l->bias.detach().clone();
  const Tensor x = rand_input_seeded({5, 20}, 31).to(DType::f32);
  NoGradGuard no_grad;
  const Tensor y_dense = l->forward(x);
  EXPECT_EQ(l->parameter_bytes(), (120 + 6) * 4);

  to_sparse(*l);
  ASSERT_TRUE(l->packed_weight);
  EXPECT_EQ(l->packed_weight->format(), "csr");
  EXPECT_FALSE(l->weight.defined());
  EXPECT_FALSE(has_key(l->named_parameters(), "weight"));
  for (const char* k : {"weight_values", "weight_col_indices", "weight_row_ptr"})
    EXPECT_TRUE(has_key(l->state_dict(), k)) << k;
  // 60 nonzeros x (4-byte value + 2-byte i16 column) + 7 x 4-byte row pointers = 388 bytes for a 480-byte weight.
  EXPECT_EQ(l->packed_weight->nbytes(), 60 * 6 + 7 * 4);
  EXPECT_EQ(buffer_bytes(*l), 388);
  EXPECT_EQ(l->parameter_bytes(), 6 * 4);

  const Tensor y_sparse = l->forward(x);
  EXPECT_TRUE(allclose(y_sparse, y_dense, {1e-5, 1e-5}));
  EXPECT_TRUE(allclose(y_sparse, naive_linear(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64)), {1e-5, 1e-5}));
  EXPECT_TRUE(allclose(l->packed_weight->dense(), w, {0, 0}));
  // Leading batch dims.
  const Tensor x3 = rand_input_seeded({2, 3, 20}, 32).to(DType::f32);
  EXPECT_TRUE(allclose(l->forward(x3).reshape({6, 6}), naive_linear(x3.reshape({6, 20}).to(DType::f64),
                                                                     w.to(DType::f64), b.to(DType::f64)),
                       {1e-5, 1e-5}));
}

TEST(SparseLinear, I32IndicesAndAnotherDtypeKeepTheSameHandles) {
  auto l = pruned_linear(16, 4, 48);  // 16 of 64 left
  const Tensor w = l->weight.detach().clone();
  to_sparse(*l, DType::i32);
  EXPECT_EQ(l->packed_weight->nbytes(), 16 * 8 + 5 * 4);
  // to(f64) converts the floating buffer (weight_values) in place; the packed weight sees it.
  l->to(DType::f64);
  NoGradGuard no_grad;
  const Tensor x = rand_input_seeded({3, 16}, 33);
  const Tensor y = l->forward(x);
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_TRUE(allclose(y, naive_linear(x, w.to(DType::f64), l->bias.to(DType::f64)), {1e-12, 1e-12}));
}

TEST(SparseLinear, ToDenseRestoresTheParameter) {
  auto l = pruned_linear(6, 3, 9);
  const Tensor w = l->weight.detach().clone();
  to_sparse(*l);
  to_dense(*l);
  EXPECT_FALSE(l->packed_weight);
  ASSERT_TRUE(l->weight.defined());
  EXPECT_TRUE(l->weight.requires_grad());
  EXPECT_TRUE(has_key(l->named_parameters(), "weight"));
  EXPECT_TRUE(l->named_buffers().empty());
  EXPECT_TRUE(allclose(l->weight, w, {0, 0}));
  // Trainable again.
  sum(l->forward(ones({2, 6}))).backward();
  EXPECT_TRUE(l->weight.grad().defined());
}

TEST(SparseLinear, MisuseRaises) {
  auto l = std::make_shared<Linear>(8, 4);
  l1_unstructured(*l, "weight", PruneAmount::fraction(0.5));
  EXPECT_NE(error_message<ValueError>([&] { to_sparse(*l); }).find("remove"), std::string::npos);
  remove(*l, "weight");
  to_sparse(*l);
  EXPECT_NE(error_message<ValueError>([&] { to_sparse(*l); }).find("already packed"), std::string::npos);
  // Packed weights have no gradient: forward in grad mode with a bias that requires grad raises.
  error_message<ValueError>([&] { l->forward(ones({1, 8})); });
  Linear dense(3, 3);
  error_message<ValueError>([&] { to_dense(dense); });
  // Pruning a packed Linear: it has no weight parameter.
  error_message<ValueError>([&] { l1_unstructured(*l, "weight", PruneAmount::count(1)); });
}

TEST(SparseLinear, SparsifyLinearsPacksTheSparseOnes) {
  auto model = std::make_shared<Sequential>(std::make_shared<Linear>(8, 8), std::make_shared<ReLU>(),
                                            std::make_shared<Linear>(8, 4));
  auto first = model->at<Linear>(0);
  l1_unstructured(*first, "weight", PruneAmount::fraction(0.5));
  remove(*first, "weight");
  const Tensor x = rand_input_seeded({2, 8}, 34).to(DType::f32);
  NoGradGuard no_grad;
  const Tensor y = model->forward(x);
  EXPECT_EQ(sparsify_linears(*model, 0.4), (std::vector<std::string>{"0"}));
  EXPECT_TRUE(first->packed_weight);
  EXPECT_FALSE(model->at<Linear>(2)->packed_weight);
  EXPECT_TRUE(allclose(model->forward(x), y, {1e-5, 1e-5}));
  EXPECT_EQ(sparsify_linears(*model), (std::vector<std::string>{"2"}));  // min 0: the rest; packed ones skipped
  error_message<ValueError>([&] { sparsify_linears(*model, 1.5); });
}

TEST(SparseLinear, StateDictRoundTripBetweenPackedLayers) {
  // Same architecture, same pruning count: the same nnz, other values and positions.
  auto a = pruned_linear(10, 5, 25), b = pruned_linear(10, 5, 25);
  to_sparse(*a);
  to_sparse(*b);
  const Tensor x = rand_input_seeded({4, 10}, 35).to(DType::f32);
  NoGradGuard no_grad;
  EXPECT_FALSE(allclose(b->forward(x), a->forward(x), {1e-5, 1e-5}));
  b->load_state_dict(a->state_dict());
  EXPECT_TRUE(allclose(b->forward(x), a->forward(x), {0, 0}));
  EXPECT_TRUE(allclose(b->packed_weight->dense(), a->packed_weight->dense(), {0, 0}));

  // Indices from a corrupted state are caught before they reach the kernel.
  NamedTensors bad = a->state_dict();
  for (auto& [k, t] : bad)
    if (k == "weight_col_indices") {
      t = t.clone();
      t.data<int16_t>()[0] = 10;  // column 10 of 10
    }
  b->load_state_dict(bad);
  EXPECT_NE(error_message<IndexError>([&] { b->forward(x); }).find("out of range"), std::string::npos);
  b->load_state_dict(a->state_dict());
  EXPECT_TRUE(allclose(b->forward(x), a->forward(x), {0, 0}));
}

}  // namespace
}  // namespace ember::nn
