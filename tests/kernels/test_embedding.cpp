// Tests of embedding (row gather) and embedding_backward (row scatter-add) against naive float64 loops written here,
// with hand-computed cases, repeated indices, i32/i64 indices, non-contiguous inputs, empty/0-d indices and every
// error path.
#include <string>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// out[..., :] = weight[indices[...], :], shape indices.shape + [D].
Tensor gather_ref(const Tensor& weight, const Tensor& indices) {
  const std::vector<double> w = weight.to_vector<double>();
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  const int64_t d = weight.size(1);
  std::vector<double> out;
  for (int64_t k : idx)
    for (int64_t j = 0; j < d; ++j) out.push_back(w[static_cast<size_t>(k * d + j)]);
  Shape shape = indices.sizes();
  shape.push_back(d);
  return from_vector(out, shape);
}

// grad[v, :] = sum over positions p with indices[p] == v of grad_out[p, :].
Tensor scatter_ref(const Tensor& grad_out, const Tensor& indices, int64_t v) {
  const std::vector<double> g = grad_out.to_vector<double>();
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  const int64_t d = grad_out.size(-1);
  std::vector<double> out(static_cast<size_t>(v * d), 0.0);
  for (size_t p = 0; p < idx.size(); ++p)
    for (int64_t j = 0; j < d; ++j) out[static_cast<size_t>(idx[p] * d + j)] += g[p * static_cast<size_t>(d) + j];
  return from_vector(out, {v, d});
}

class EmbeddingTest : public DeviceTest {};

TEST_P(EmbeddingTest, HandComputedGather) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  const Tensor w = from_vector<double>({0, 1, 10, 11, 20, 21}, {3, 2}).to(device());
  const Tensor idx = from_vector<int64_t>({2, 0, 2, 1}, {2, 2}).to(device());
  const Tensor out = embedding(w, idx);
  ASSERT_EQ(out.sizes(), (Shape{2, 2, 2}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{20, 21, 0, 1, 20, 21, 10, 11}));
}

TEST_P(EmbeddingTest, MatchesGatherReferenceI64) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  OpCase c{"embedding", {rand_input({11, 7}), rand_indices({3, 5}, 11)},
           [](const Inputs& in) { return embedding(in[0], in[1]); }};
  c.reference = [](const Inputs& in) { return gather_ref(in[0], in[1]); };
  check_op(c, device());
}

TEST_P(EmbeddingTest, MatchesGatherReferenceI32) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  OpCase c{"embedding", {rand_input({6, 4}), rand_indices({9}, 6).to(DType::i32)},
           [](const Inputs& in) { return embedding(in[0], in[1]); }};
  c.reference = [](const Inputs& in) { return gather_ref(in[0], in[1]); };
  check_op(c, device());
}

TEST_P(EmbeddingTest, NonContiguousWeightAndIndices) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  // The weight is a strided view; the indices are a transposed view, so their row-major order differs from memory.
  OpCase c{"embedding", {noncontiguous_input({8, 5}), rand_indices({4, 6}, 8)},
           [](const Inputs& in) { return embedding(in[0].t(), in[1].transpose(0, 1)); }};
  c.inputs[0] = c.inputs[0].t();  // stored [D, V], used as its transpose [V, D]
  c.reference = [](const Inputs& in) { return gather_ref(in[0].t(), in[1].transpose(0, 1)); };
  check_op(c, device());
}

TEST_P(EmbeddingTest, ZeroDimAndEmptyIndices) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  const Tensor w = from_vector<double>({0, 1, 10, 11, 20, 21}, {3, 2}).to(device());
  const Tensor scalar_idx = from_vector<int64_t>({1}, {}).to(device());
  const Tensor out0 = embedding(w, scalar_idx);
  ASSERT_EQ(out0.sizes(), (Shape{2}));
  EXPECT_EQ(out0.to_vector<double>(), (std::vector<double>{10, 11}));
  const Tensor empty_idx = empty({2, 0}, {DType::i64, device()});
  EXPECT_EQ(embedding(w, empty_idx).sizes(), (Shape{2, 0, 2}));
}

TEST_P(EmbeddingTest, OutOfRangeIndexIsIndexError) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  const Tensor w = zeros({5, 3}, {DType::f32, device()});
  for (int64_t bad : {int64_t{5}, int64_t{-1}, int64_t{1000}}) {
    const Tensor idx = from_vector<int64_t>({0, bad, 2}, {3}).to(device());
    try {
      embedding(w, idx);
      ADD_FAILURE() << "no error for index " << bad;
    } catch (const IndexError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("5"), std::string::npos) << msg;
      EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
    }
  }
  const Tensor idx32 = from_vector<int32_t>({7}, {1}).to(device());
  EXPECT_THROW(embedding(w, idx32), IndexError);
}

// Rows wider than a warp and not a multiple of 32, more positions than rows.
TEST_P(EmbeddingTest, WideRowsManyPositions) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  OpCase c{"embedding", {rand_input({50, 77}), rand_indices({8, 33}, 50).to(DType::i32)},
           [](const Inputs& in) { return embedding(in[0], in[1]); }};
  c.reference = [](const Inputs& in) { return gather_ref(in[0], in[1]); };
  check_op(c, device());
}

// The error names the first bad index in the row-major order of the indices (here a transposed view: 9 is at flat
// position 3 of the logical [3, 2] tensor), whatever the layout.
TEST_P(EmbeddingTest, OutOfRangeNamesTheFirstBadPosition) {
  EMBER_REQUIRE_KERNEL(embedding_stub);
  const Tensor w = zeros({6, 4}, {DType::f16, device()});
  const Tensor idx = from_vector<int32_t>({0, 1, 2, 3, 9, 7}, {2, 3}).to(device()).t();  // [[0, 3], [1, 9], [2, 7]]
  const std::string msg = error_message<IndexError>([&] { embedding(w, idx); });
  EXPECT_NE(msg.find("index 9 (at flat position 3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("6 rows"), std::string::npos) << msg;
}

EMBER_INSTANTIATE_DEVICE_TESTS(EmbeddingTest);

class EmbeddingBackwardTest : public DeviceTest {};

TEST_P(EmbeddingBackwardTest, HandComputedRepeatedIndicesAddUp) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  const Tensor g = from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}).to(device());
  const Tensor idx = from_vector<int64_t>({1, 1, 3}, {3}).to(device());
  const Tensor gw = embedding_backward(g, idx, 4);
  ASSERT_EQ(gw.sizes(), (Shape{4, 2}));
  EXPECT_EQ(gw.to_vector<double>(), (std::vector<double>{0, 0, 4, 6, 0, 0, 5, 6}));
}

TEST_P(EmbeddingBackwardTest, MatchesScatterReference) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  // 30 positions over 5 rows: many repeats; row count 7 leaves untouched rows that must stay zero.
  for (DType idt : {DType::i64, DType::i32}) {
    OpCase c{"embedding_backward", {rand_input({5, 6, 4}), rand_indices({5, 6}, 5).to(idt)},
             [](const Inputs& in) { return embedding_backward(in[0], in[1], 7); }};
    c.reference = [](const Inputs& in) { return scatter_ref(in[0], in[1], 7); };
    c.tolerance = [](DType dt) {
      Tolerance t = default_tolerance(dt);
      if (dt == DType::f32) t.atol = 1e-5;
      return t;
    };
    check_op(c, device());
  }
}

TEST_P(EmbeddingBackwardTest, NonContiguousGradOut) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  OpCase c{"embedding_backward", {noncontiguous_input({4, 3, 5}), rand_indices({4, 3}, 6)},
           [](const Inputs& in) { return embedding_backward(in[0].transpose(0, 1), in[1].t(), 6); }};
  c.reference = [](const Inputs& in) { return scatter_ref(in[0].transpose(0, 1), in[1].t(), 6); };
  c.inputs[0] = c.inputs[0].transpose(0, 1);  // stored [3, 4, 5]; used as [4, 3, 5] -> transposed back to [3, 4, 5]
  c.inputs[1] = c.inputs[1].t();
  check_op(c, device());
}

TEST_P(EmbeddingBackwardTest, EmptyIndicesGiveZeros) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  const Tensor g = empty({0, 3}, {DType::f32, device()});
  const Tensor idx = empty({0}, {DType::i64, device()});
  const Tensor gw = embedding_backward(g, idx, 4);
  ASSERT_EQ(gw.sizes(), (Shape{4, 3}));
  EXPECT_EQ(gw.to_vector<double>(), std::vector<double>(12, 0.0));
}

TEST_P(EmbeddingBackwardTest, OutOfRangeIndexIsIndexError) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  const Tensor g = ones({2, 3}, {DType::f32, device()});
  try {
    embedding_backward(g, from_vector<int64_t>({0, 9}, {2}).to(device()), 4);
    ADD_FAILURE() << "no error for index 9";
  } catch (const IndexError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4"), std::string::npos) << msg;
  }
  EXPECT_THROW(embedding_backward(g, from_vector<int64_t>({-2, 0}, {2}).to(device()), 4), IndexError);
}

// Long runs of repeated indices (600 positions over 5 rows) and rows wider than a warp (70 columns): every row's
// gradients are summed in full, untouched rows stay zero.
TEST_P(EmbeddingBackwardTest, LongRunsAndWideRows) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  for (DType idt : {DType::i64, DType::i32}) {
    OpCase c{"embedding_backward", {rand_input({20, 30, 70}), rand_indices({20, 30}, 5).to(idt)},
             [](const Inputs& in) { return embedding_backward(in[0], in[1], 8); }};
    c.reference = [](const Inputs& in) { return scatter_ref(in[0], in[1], 8); };
    c.tolerance = [](DType dt) {
      Tolerance t = default_tolerance(dt);
      if (dt == DType::f32) t.atol = 1e-4;  // sums of ~120 terms
      return t;
    };
    check_op(c, device());
  }
}

TEST_P(EmbeddingBackwardTest, OutOfRangeNamesTheFirstBadPosition) {
  EMBER_REQUIRE_KERNEL(embedding_backward_stub);
  const Tensor g = ones({5, 2}, {DType::bf16, device()});
  const Tensor idx = from_vector<int64_t>({1, 0, -4, 3, 8}, {5}).to(device());
  const std::string msg = error_message<IndexError>([&] { embedding_backward(g, idx, 4); });
  EXPECT_NE(msg.find("embedding_backward: index -4 (at flat position 2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 rows"), std::string::npos) << msg;
}

EMBER_INSTANTIATE_DEVICE_TESTS(EmbeddingBackwardTest);

TEST(EmbeddingErrors, BadShapesDTypesDevices) {
  const Tensor w = zeros({5, 3});
  const Tensor idx = from_vector<int64_t>({0, 1}, {2});
  EXPECT_THROW(embedding(zeros({5}), idx), ShapeError);
  EXPECT_THROW(embedding(zeros({5, 3, 2}), idx), ShapeError);
  EXPECT_THROW(embedding(w, from_vector<double>({0, 1}, {2})), DTypeError);
  EXPECT_THROW(embedding(w, from_vector<uint8_t>({0, 1}, {2})), DTypeError);
  EXPECT_THROW(embedding(zeros({5, 3}, {DType::f32, Device::meta()}), idx), DeviceError);

  const Tensor g = zeros({2, 3});
  EXPECT_THROW(embedding_backward(zeros({3, 3}), idx, 5), ShapeError);     // leading dims differ
  EXPECT_THROW(embedding_backward(zeros({2}), idx, 5), ShapeError);        // no trailing dim
  EXPECT_THROW(embedding_backward(zeros({2, 3, 1}), idx, 5), ShapeError);  // one dim too many
  EXPECT_THROW(embedding_backward(g, from_vector<float>({0, 1}, {2}), 5), DTypeError);
  EXPECT_THROW(embedding_backward(zeros({2, 3}, {DType::i64}), idx, 5), DTypeError);
  EXPECT_THROW(embedding_backward(g, idx, -1), ValueError);
  EXPECT_THROW(embedding_backward(zeros({2, 3}, {DType::f32, Device::meta()}), idx, 5), DeviceError);
}

TEST(EmbeddingErrors, MetaTensorsGiveShapesOnly) {
  const Tensor w = empty({5, 3}, {DType::f16, Device::meta()});
  const Tensor idx = empty({4, 2}, {DType::i64, Device::meta()});
  const Tensor out = embedding(w, idx);
  EXPECT_EQ(out.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(out.dtype(), DType::f16);
  EXPECT_TRUE(out.device().is_meta());
}

}  // namespace
}  // namespace ember::testing
