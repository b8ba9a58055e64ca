// Pruning, sparse and int8 kernels (ops_sparse.h, ops_quant.h) on every device against hand-written layouts, float64
// and exact-integer models, and (off the CPU) against the CPU kernel on the same inputs, bit for bit where the contract
// is exact; edge cases: n % 8 != 0, zero rows, .5 ties, empty dims, nnz == 0, index dtypes, non-finite inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "ember/ember.h"
#include "ember/kernels/ops_quant.h"
#include "ember/kernels/ops_sparse.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"
#include "tests/harness/op_harness.h"
#include "tests/kernels/compression_test_util.h"

namespace ember::testing {
namespace {

class CompressionKernels : public DeviceTest {};

std::vector<int64_t> ints(const Tensor& t) { return t.to_vector<int64_t>(); }
std::vector<double> doubles(const Tensor& t) { return t.to_vector<double>(); }

// Scales sqrt(k) into the absolute part of a tolerance (sums of k random-sign terms).
Tolerance widened(Tolerance t, int64_t k) {
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  return t;
}

// ---- bit-packed masks -------------------------------------------------------------------------------------------

// A bool [n] CPU mask with about half the bits set.
Tensor random_mask(int64_t n, uint64_t seed) {
  const std::vector<double> r = rand_input_seeded({n}, seed).to_vector<double>();
  std::vector<int32_t> v(r.size());
  for (size_t i = 0; i < r.size(); ++i) v[i] = r[i] > 0.0 ? 1 : 0;
  return from_vector<int32_t>(v, {n}).to(DType::b8);
}

// The packed bytes of a mask by the layout: bit i is bit i % 8 of byte i / 8, padding bits 0.
std::vector<int64_t> packed_by_hand(const std::vector<int64_t>& bits) {
  std::vector<int64_t> bytes((bits.size() + 7) / 8, 0);
  for (size_t i = 0; i < bits.size(); ++i)
    if (bits[i] != 0) bytes[i / 8] |= int64_t{1} << (i % 8);
  return bytes;
}

TEST_P(CompressionKernels, PackAndUnpackFollowTheBitLayout) {
  EMBER_REQUIRE_KERNEL(pack_mask_stub);
  EMBER_REQUIRE_KERNEL(unpack_mask_stub);
  for (int64_t n : {1, 7, 8, 9, 13, 64, 1000, 4099}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const Tensor mask = random_mask(n, 900 + static_cast<uint64_t>(n));
    const std::vector<int64_t> bits = ints(mask);
    const Tensor packed = ops::pack_mask(mask.to(device()));
    ASSERT_EQ(packed.dtype(), DType::u8);
    ASSERT_EQ(packed.device(), device());
    EXPECT_EQ(ints(packed), packed_by_hand(bits));
    if (!device().is_cpu()) {
      EXPECT_EQ(ints(packed), ints(ops::pack_mask(mask)));
    }
    const Tensor back = ops::unpack_mask(packed, {n});
    ASSERT_EQ(back.dtype(), DType::b8);
    EXPECT_EQ(ints(back), bits);
  }
  // Padding bits set by hand are ignored by unpack.
  const Tensor loose = from_vector<int32_t>({0xFF, 0xFE}, {2}).to(DType::u8).to(device());
  EXPECT_EQ(ints(ops::unpack_mask(loose, {9})), (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0}));
  // A 2-d mask packs in row-major order: [[1, 0, 0], [1, 1, 0]] -> bits 0, 3, 4 -> 0b00011001.
  const Tensor m2 = from_vector<int32_t>({1, 0, 0, 1, 1, 0}, {2, 3}).to(DType::b8).to(device());
  EXPECT_EQ(ints(ops::pack_mask(m2)), (std::vector<int64_t>{0x19}));
  EXPECT_EQ(ints(ops::unpack_mask(ops::pack_mask(m2), {2, 3})), ints(m2));
  EXPECT_EQ(ops::pack_mask(empty({0}, {DType::b8, device()})).numel(), 0);
  EXPECT_EQ(ops::unpack_mask(empty({0}, {DType::u8, device()}), {0, 3}).numel(), 0);
}

TEST_P(CompressionKernels, MaskedZeroKeepsSetBitsInEveryFloatingDtype) {
  EMBER_REQUIRE_KERNEL(masked_zero_stub);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (int64_t n : {11, 64, 1001}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      const Tensor mask = random_mask(n, 1200 + static_cast<uint64_t>(n));
      const std::vector<int64_t> bits = ints(mask);
      std::vector<double> v(static_cast<size_t>(n)), expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i % 50) - 20.5;
      // A NaN and an inf where the bit is set stay as they are: kept elements are not touched.
      for (int64_t i = 0; i < n; ++i)
        if (bits[static_cast<size_t>(i)] != 0) {
          v[static_cast<size_t>(i)] = std::numeric_limits<double>::quiet_NaN();
          break;
        }
      for (int64_t i = n - 1; i >= 0; --i)
        if (bits[static_cast<size_t>(i)] != 0) {
          v[static_cast<size_t>(i)] = -std::numeric_limits<double>::infinity();
          break;
        }
      for (size_t i = 0; i < v.size(); ++i) expected[i] = bits[i] != 0 ? v[i] : 0.0;
      const Tensor packed = ops::pack_mask(mask);
      Tensor t = from_vector(v, {n}).to(device(), dt);
      ops::masked_zero_(t, packed.to(device()));
      EXPECT_TRUE(allclose(t, from_vector(expected, {n}).to(dt), {0, 0}));
      if (!device().is_cpu()) {
        Tensor c = from_vector(v, {n}).to(dt);
        ops::masked_zero_(c, packed);
        EXPECT_TRUE(allclose(t, c, {0, 0}));
      }
    }
  Tensor none = empty({0}, {DType::f32, device()});
  EXPECT_NO_THROW(ops::masked_zero_(none, empty({0}, {DType::u8, device()})));
}

// ---- CSR products ---------------------------------------------------------------------------------------------------

// The CSR form of dense2d (a CPU tensor) with the given index dtypes, on `device`.
CsrMatrix make_csr(const Tensor& dense2d, DType idx, DType row_ptr, Device device) {
  CsrMatrix m = ops::dense_to_csr(dense2d, idx);
  m.row_ptr = m.row_ptr.to(row_ptr);
  m.values = m.values.to(device);
  m.col_indices = m.col_indices.to(device);
  m.row_ptr = m.row_ptr.to(device);
  return m;
}

Tolerance product_tol(DType dt, int64_t k) {
  return widened(dt == DType::f64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-6}, k);
}

TEST_P(CompressionKernels, CsrLinearMatchesReferenceAndCpu) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  uint64_t seed = 3000;
  const int64_t K = 37, N = 19;
  for (DType dt : {DType::f32, DType::f64})
    for (DType idx : {DType::i16, DType::i32})
      for (DType rp : {DType::i32, DType::i64})
        for (int64_t B : {1, 6, 70})
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(idx) + " " + dtype_name(rp) +
                         " B=" + std::to_string(B) + " bias=" + std::to_string(with_bias));
            const Tensor w = random_sparse(N, K, 0.3, ++seed, {0, 5, 18}).to(dt).to(DType::f64);
            const Tensor x = rand_input_seeded({B, K}, ++seed).to(dt).to(DType::f64);
            const Tensor bias = with_bias ? rand_input_seeded({N}, ++seed).to(dt).to(DType::f64) : Tensor();
            const Tensor y = ops::csr_linear(x.to(device(), dt), make_csr(w.to(dt), idx, rp, device()),
                                             with_bias ? bias.to(device(), dt) : Tensor());
            ASSERT_EQ(y.dtype(), dt);
            ASSERT_EQ(y.sizes(), (Shape{B, N}));
            EXPECT_TRUE(allclose(y, naive_linear(x, w, bias), product_tol(dt, K)));
            if (!device().is_cpu()) {
              const Tensor yc = ops::csr_linear(x.to(dt), make_csr(w.to(dt), idx, rp, Device::cpu()),
                                                with_bias ? bias.to(dt) : Tensor());
              EXPECT_TRUE(allclose(y, yc, product_tol(dt, K)));
            }
          }
  // Leading batch dims.
  const Tensor w = random_sparse(5, 8, 0.5, 71).to(DType::f32);
  const Tensor x = rand_input_seeded({2, 3, 8}, 72).to(DType::f32);
  const Tensor y = ops::csr_linear(x.to(device()), make_csr(w, DType::i16, DType::i32, device()));
  ASSERT_EQ(y.sizes(), (Shape{2, 3, 5}));
  EXPECT_TRUE(allclose(y.reshape({6, 5}), naive_linear(x.reshape({6, 8}), w, Tensor()), product_tol(DType::f32, 8)));
}

TEST_P(CompressionKernels, CsrLinearEdgeCases) {
  EMBER_REQUIRE_KERNEL(csr_linear_stub);
  const Tensor bias = from_vector<float>({1, -2, 3}, {3});
  for (DType idx : {DType::i16, DType::i32})
    for (DType rp : {DType::i32, DType::i64}) {
      SCOPED_TRACE(std::string(dtype_name(idx)) + " " + dtype_name(rp));
      // nnz == 0: the bias rows, or zeros.
      const CsrMatrix z = make_csr(zeros({3, 4}), idx, rp, device());
      ASSERT_EQ(z.nnz(), 0);
      const Tensor x = rand_input_seeded({5, 4}, 81).to(device(), DType::f32);
      EXPECT_TRUE(allclose(ops::csr_linear(x, z, bias.to(device())), bias.view({1, 3}).expand({5, 3}), {0, 0}));
      EXPECT_TRUE(allclose(ops::csr_linear(x, z), zeros({5, 3}), {0, 0}));
      // K == 0: every sum is empty.
      const CsrMatrix k0 = make_csr(zeros({3, 0}), idx, rp, device());
      const Tensor x0 = empty({2, 0}, {DType::f32, device()});
      EXPECT_TRUE(allclose(ops::csr_linear(x0, k0, bias.to(device())), bias.view({1, 3}).expand({2, 3}), {0, 0}));
      EXPECT_TRUE(allclose(ops::csr_linear(x0, k0), zeros({2, 3}), {0, 0}));
      // B == 0 and N == 0: empty results of the right shapes.
      const CsrMatrix m = make_csr(random_sparse(3, 4, 0.5, 82).to(DType::f32), idx, rp, device());
      EXPECT_EQ(ops::csr_linear(empty({0, 4}, {DType::f32, device()}), m).sizes(), (Shape{0, 3}));
      const CsrMatrix n0 = make_csr(zeros({0, 4}), idx, rp, device());
      EXPECT_EQ(ops::csr_linear(x, n0).sizes(), (Shape{5, 0}));
    }
}

TEST_P(CompressionKernels, CsrMatmulMatchesReferenceAndCpu) {
  EMBER_REQUIRE_KERNEL(csr_matmul_stub);
  uint64_t seed = 4000;
  const int64_t M = 21, K = 17;
  for (DType dt : {DType::f32, DType::f64})
    for (DType idx : {DType::i16, DType::i32})
      for (DType rp : {DType::i32, DType::i64})
        for (int64_t N : {1, 5, 33}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(idx) + " " + dtype_name(rp) +
                       " N=" + std::to_string(N));
          const Tensor a = random_sparse(M, K, 0.3, ++seed, {0, 7, 20}).to(dt).to(DType::f64);
          const Tensor d = rand_input_seeded({K, N}, ++seed).to(dt).to(DType::f64);
          const Tensor y = ops::csr_matmul(make_csr(a.to(dt), idx, rp, device()), d.to(device(), dt));
          ASSERT_EQ(y.dtype(), dt);
          EXPECT_TRUE(allclose(y, naive_matmul(a, d), product_tol(dt, K)));
          if (!device().is_cpu()) {
            const Tensor yc = ops::csr_matmul(make_csr(a.to(dt), idx, rp, Device::cpu()), d.to(dt));
            EXPECT_TRUE(allclose(y, yc, product_tol(dt, K)));
          }
        }
  for (DType idx : {DType::i16, DType::i32}) {
    SCOPED_TRACE(dtype_name(idx));
    // nnz == 0, K == 0: zeros.
    const Tensor ones_d = ones({4, 2}, {DType::f32, device()});
    EXPECT_TRUE(
        allclose(ops::csr_matmul(make_csr(zeros({3, 4}), idx, DType::i32, device()), ones_d), zeros({3, 2}), {0, 0}));
    EXPECT_TRUE(allclose(
        ops::csr_matmul(make_csr(zeros({3, 0}), idx, DType::i32, device()), empty({0, 2}, {DType::f32, device()})),
        zeros({3, 2}), {0, 0}));
    // M == 0 and N == 0.
    EXPECT_EQ(ops::csr_matmul(make_csr(zeros({0, 4}), idx, DType::i32, device()), ones_d).sizes(), (Shape{0, 2}));
    const CsrMatrix m = make_csr(random_sparse(3, 4, 0.5, 91).to(DType::f32), idx, DType::i32, device());
    EXPECT_EQ(ops::csr_matmul(m, empty({4, 0}, {DType::f32, device()})).sizes(), (Shape{3, 0}));
  }
}

// ---- quantization -----------------------------------------------------------------------------------------------

// Note [Symmetric per-channel int8] evaluated on the host for w [O, R] (values read as f64): scale = f32(max|w|) /
// 127 in f32 (1 when not > 0), q = clamp(nearbyint(w / scale), -127, 127) with the quotient in f64.
struct QuantModel {
  std::vector<int64_t> q;
  std::vector<double> scale;
};
QuantModel quantize_model(const Tensor& w) {
  const int64_t o = w.size(0), r = o == 0 ? 0 : w.numel() / o;
  const std::vector<double> v = doubles(w.contiguous());
  QuantModel m;
  for (int64_t i = 0; i < o; ++i) {
    double amax = 0.0;
    for (int64_t j = 0; j < r; ++j) amax = std::max(amax, std::fabs(v[static_cast<size_t>(i * r + j)]));
    float s = static_cast<float>(amax) / 127.0f;
    if (!(s > 0.0f)) s = 1.0f;
    m.scale.push_back(s);
    for (int64_t j = 0; j < r; ++j) {
      const double qv = std::nearbyint(v[static_cast<size_t>(i * r + j)] / static_cast<double>(s));
      m.q.push_back(static_cast<int64_t>(std::clamp(qv, -127.0, 127.0)));
    }
  }
  return m;
}

TEST_P(CompressionKernels, QuantizeMatchesTheContractBitForBit) {
  EMBER_REQUIRE_KERNEL(quantize_per_channel_stub);
  std::vector<double> base = rand_input_seeded({6, 37}, 5000, -2.0, 2.0).to_vector<double>();
  for (int64_t j = 0; j < 37; ++j) base[static_cast<size_t>(2 * 37 + j)] = 0.0;  // an all-zero row
  base[3 * 37 + 7] = 1e4;                                                        // one huge value
  base[5 * 37 + 11] = -3.0;                                                      // a negative row maximum
  for (int64_t j = 0; j < 37; ++j) base[static_cast<size_t>(4 * 37 + j)] = j % 2 ? 1e-44 : -1e-44;  // max/127 -> 0
  const std::vector<Tensor> weights = {from_vector(base, {6, 37}), rand_input_seeded({1, 1}, 5001),
                                       rand_input_seeded({300, 513}, 5002, -5.0, 5.0),
                                       rand_input_seeded({5, 3, 3, 2}, 5003), empty({3, 0}, {DType::f64})};
  for (const Tensor& w64 : weights)
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(w64.sizes()));
      const Tensor w = w64.to(dt);
      const QuantizedPerChannel r = ops::quantize_per_channel_symmetric(w.to(device()));
      ASSERT_EQ(r.q.dtype(), DType::i8);
      ASSERT_EQ(r.q.sizes(), w.sizes());
      ASSERT_EQ(r.scale.dtype(), DType::f32);
      const QuantModel m = quantize_model(w.reshape({w.size(0), w.numel() / w.size(0)}));
      EXPECT_EQ(ints(r.q), m.q);
      EXPECT_EQ(doubles(r.scale), m.scale);
      if (!device().is_cpu()) {
        const QuantizedPerChannel c = ops::quantize_per_channel_symmetric(w);
        EXPECT_EQ(ints(r.q), ints(c.q));
        EXPECT_EQ(doubles(r.scale), doubles(c.scale));
      }
    }
  // Ties: row 0 has scale exactly 1 and row 1 exactly 2, so the quotients land on .5 and round half to even.
  const Tensor ties = from_vector<float>({127, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, -0.5f, 126.5f,  //
                                          -254, 5, 7, 1, 3, -3, 253, 0},
                                         {2, 8});
  const QuantizedPerChannel t = ops::quantize_per_channel_symmetric(ties.to(device()));
  EXPECT_EQ(doubles(t.scale), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(ints(t.q), (std::vector<int64_t>{127, 2, 4, -2, 0, 2, 0, 126, -127, 2, 4, 0, 2, -2, 126, 0}));
  // No rows: nothing to do.
  EXPECT_EQ(ops::quantize_per_channel_symmetric(empty({0, 4}, {DType::f32, device()})).scale.numel(), 0);
}

TEST_P(CompressionKernels, QuantizeRejectsNonFiniteWeights) {
  EMBER_REQUIRE_KERNEL(quantize_per_channel_stub);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf})
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(bad));
      std::vector<double> v = rand_input_seeded({4, 9}, 5100).to_vector<double>();
      v[2 * 9 + 4] = bad;  // in row 2; rows 0 and 1 are fine
      const Tensor w = from_vector(v, {4, 9}).to(device(), dt);
      EXPECT_NE(error_message<ValueError>([&] { ops::quantize_per_channel_symmetric(w); }).find("non-finite"),
                std::string::npos);
    }
  // An f64 row maximum beyond the f32 range of the scales.
  const Tensor huge = from_vector<double>({1.0, 2.0, 1e300, 3.0}, {2, 2}).to(device());
  EXPECT_THROW(ops::quantize_per_channel_symmetric(huge), ValueError);
  // The error is per call: a good weight quantizes afterwards.
  const Tensor good = rand_input_seeded({3, 5}, 5101).to(device(), DType::f32);
  EXPECT_EQ(ints(ops::quantize_per_channel_symmetric(good).q), quantize_model(good.cpu()).q);
}

TEST_P(CompressionKernels, DequantizeMatchesTheF32Product) {
  EMBER_REQUIRE_KERNEL(dequantize_per_channel_stub);
  std::vector<int8_t> qv;
  for (int i = 0; i < 7 * 33; ++i) qv.push_back(static_cast<int8_t>((i * 37) % 256 - 128));  // -128 .. 127
  const Tensor q = from_vector<int8_t>(qv, {7, 33});
  const std::vector<double> sd = rand_input_seeded({7}, 5200, 1e-3, 2.0).to_vector<double>();
  std::vector<float> sf(sd.begin(), sd.end());
  const Tensor s = from_vector<float>(sf, {7});
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // The product in f32 (exact f64 for f64), then rounded to dt.
    std::vector<float> p32(qv.size());
    std::vector<double> p64(qv.size());
    for (size_t i = 0; i < qv.size(); ++i) {
      p32[i] = static_cast<float>(qv[i]) * sf[i / 33];
      p64[i] = static_cast<double>(qv[i]) * static_cast<double>(sf[i / 33]);
    }
    const Tensor expected = dt == DType::f64 ? from_vector(p64, {7, 33}) : from_vector(p32, {7, 33}).to(dt);
    const Tensor d = ops::dequantize_per_channel(q.to(device()), s.to(device()), dt);
    ASSERT_EQ(d.dtype(), dt);
    EXPECT_TRUE(allclose(d, expected, {0, 0}));
    if (!device().is_cpu()) {
      EXPECT_TRUE(allclose(d, ops::dequantize_per_channel(q, s, dt), {0, 0}));
    }
  }
  EXPECT_EQ(
      ops::dequantize_per_channel(empty({0, 3}, {DType::i8, device()}), empty({0}, {DType::f32, device()})).numel(), 0);
}

// ---- weight-only int8 linear ----------------------------------------------------------------------------------------

// y[m, n] = sum_k x[m, k] * q[n, k] * s[n] + b[n] in f64 from the int8 weights and f32 scales.
Tensor ref_weight_linear(const Tensor& x, const Tensor& q, const Tensor& s, const Tensor& b) {
  const int64_t k = q.size(1), n = q.size(0), m = x.numel() / std::max<int64_t>(k, 1);
  const std::vector<double> xv = doubles(x), qv = doubles(q), sv = doubles(s);
  const std::vector<double> bv = b.defined() ? doubles(b) : std::vector<double>(static_cast<size_t>(n), 0.0);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t t = 0; t < k; ++t)
        acc += xv[static_cast<size_t>(i * k + t)] * (qv[static_cast<size_t>(j * k + t)] * sv[static_cast<size_t>(j)]);
      y[static_cast<size_t>(i * n + j)] = acc + bv[static_cast<size_t>(j)];
    }
  Shape shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  return from_vector(y, shape);
}

TEST_P(CompressionKernels, WeightLinearMatchesReferenceAndCpu) {
  EMBER_REQUIRE_KERNEL(int8_weight_linear_stub);
  struct Case {
    Shape x;
    int64_t n;
    std::vector<DType> dtypes;
  };
  const std::vector<DType> all = {DType::f32, DType::f64, DType::f16, DType::bf16};
  // {129, 1100} x 64: several weight tiles (59 f32 rows of 1100 per 256 KiB); {2, 70000} x 3: one f32 / f64 row
  // exceeds the block, so K is split as well.
  for (const Case& c :
       {Case{{3, 5, 40}, 7, all}, Case{{1, 16}, 1, all}, Case{{129, 1100}, 64, {DType::f32, DType::bf16}},
        Case{{2, 70000}, 3, {DType::f32, DType::f64}}}) {
    const int64_t k = c.x.back();
    const QuantizedPerChannel w =
        ops::quantize_per_channel_symmetric(rand_input_seeded({c.n, k}, 6000 + static_cast<uint64_t>(k)));
    const Tensor b = rand_input_seeded({c.n}, 6100).to(DType::f32);
    for (DType dt : c.dtypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(c.x));
      const Tensor x = rand_input_seeded(c.x, 6200 + static_cast<uint64_t>(k)).to(dt);
      const Tolerance tol = widened(default_tolerance(dt), k);
      for (bool with_bias : {true, false}) {
        const Tensor bias = with_bias ? b : Tensor();
        const Tensor y = ops::int8_weight_linear(x.to(device()), w.q.to(device()), w.scale.to(device()),
                                                 with_bias ? b.to(device()) : Tensor());
        ASSERT_EQ(y.dtype(), dt);
        ASSERT_EQ(y.device(), device());
        EXPECT_TRUE(allclose(y, ref_weight_linear(x, w.q, w.scale, bias), tol)) << "bias=" << with_bias;
        if (!device().is_cpu()) {
          EXPECT_TRUE(allclose(y, ops::int8_weight_linear(x, w.q, w.scale, bias), tol)) << "bias=" << with_bias;
        }
      }
    }
  }
}

TEST_P(CompressionKernels, WeightLinearEmptyDims) {
  EMBER_REQUIRE_KERNEL(int8_weight_linear_stub);
  const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(rand_input_seeded({4, 6}, 6300).to(device()));
  EXPECT_EQ(ops::int8_weight_linear(empty({0, 6}, {DType::f32, device()}), w.q, w.scale).sizes(), (Shape{0, 4}));
  // K = 0: every sum is empty, the result is the bias (or zeros).
  const Tensor q0 = empty({3, 0}, TensorOptions(DType::i8, device()));
  const Tensor b = from_vector<float>({1, 2, 3}, {3}).to(device());
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = empty({2, 0}, {dt, device()});
    EXPECT_EQ(doubles(ops::int8_weight_linear(x, q0, ones({3}, {DType::f32, device()}), b)),
              (std::vector<double>{1, 2, 3, 1, 2, 3}));
    EXPECT_EQ(doubles(ops::int8_weight_linear(x, q0, ones({3}, {DType::f32, device()}))),
              (std::vector<double>(6, 0.0)));
  }
}

TEST_P(CompressionKernels, WeightLinearHoldsOneBlockOfDequantizedWeight) {
  EMBER_REQUIRE_KERNEL(int8_weight_linear_stub);
  const int64_t n = 4096, k = 4096, m = 4;  // the f32 weight would be 64 MiB
  const Tensor q = full({n, k}, 3, TensorOptions(DType::i8, device()));
  const Tensor s = full({n}, 0.5, TensorOptions(DType::f32, device()));
  const Tensor x = rand_input_seeded({m, k}, 6400).to(device(), DType::f32);
  memory::Allocator& a = device().is_cpu() ? memory::cpu_allocator() : memory::cuda::allocator(device().index);
  Tensor y;
  const int64_t rise = peak_rise(a, [&] { y = ops::int8_weight_linear(x, q, s); });
  const int64_t out_bytes = m * n * 4;
  EXPECT_GE(rise, out_bytes + kInt8DequantBlockBytes);  // one dequantized block, from the allocator
  // The rest is GEMM scratch: CPU panels, or a cuBLASLt workspace of at most 32 MiB (blas.cu); never the weight.
  EXPECT_LE(rise, out_bytes + kInt8DequantBlockBytes + (33 << 20)) << "more than one block of f32 weight held";
  EXPECT_LT(rise, n * k * 4) << "the whole f32 weight was held";
  // Every output is 1.5 * sum_k x[m, k].
  const std::vector<double> xv = doubles(x), yv = doubles(y);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0.0;
    for (int64_t t = 0; t < k; ++t) sum += xv[static_cast<size_t>(i * k + t)];
    for (int64_t j = 0; j < n; j += 511) EXPECT_NEAR(yv[static_cast<size_t>(i * n + j)], 1.5 * sum, 1e-3);
  }
}

// ---- int8 x int8 linear ---------------------------------------------------------------------------------------------

TEST_P(CompressionKernels, DynamicLinearMatchesIntegerModelAndCpu) {
  EMBER_REQUIRE_KERNEL(int8_dynamic_linear_stub);
  struct Case {
    Shape x;
    int64_t n;
  };
  // K = 33, 50, 9: the byte loads; K = 256, 128: whole words; 130 and 70 rows / outputs: several 64 x 64 tiles.
  for (const Case& c :
       {Case{{4, 33}, 11}, Case{{2, 3, 50}, 11}, Case{{130, 9}, 11}, Case{{70, 256}, 70}, Case{{65, 128}, 130}}) {
    const int64_t k = c.x.back();
    const QuantizedPerChannel w =
        ops::quantize_per_channel_symmetric(rand_input_seeded({c.n, k}, 7000 + static_cast<uint64_t>(k)));
    const Tensor b = rand_input_seeded({c.n}, 7100).to(DType::f32);
    const Tensor x = rand_input_seeded(c.x, 7200 + static_cast<uint64_t>(k), -3.0, 3.0).to(DType::f32);
    const Tensor x2 = x.reshape({-1, k});
    for (std::optional<float> act : {std::optional<float>(), std::optional<float>(2.0f / 127.0f)})
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(shape_str(c.x) + (act ? " static" : " dynamic") + (with_bias ? " bias" : ""));
        const Tensor bias = with_bias ? b : Tensor();
        const Tensor y = ops::int8_dynamic_linear(x.to(device()), w.q.to(device()), w.scale.to(device()),
                                                  with_bias ? b.to(device()) : Tensor(), act);
        ASSERT_EQ(y.dtype(), DType::f32);
        // The integer sums are exact on both sides; only the f32 scaling and bias add round.
        EXPECT_TRUE(allclose(y.reshape({-1, c.n}), ref_dynamic_linear(x2, w.q, w.scale, bias, act), {1e-6, 1e-6}));
        if (!device().is_cpu()) {
          EXPECT_TRUE(allclose(y, ops::int8_dynamic_linear(x, w.q, w.scale, bias, act), {1e-6, 1e-6}));
        }
      }
  }
}

TEST_P(CompressionKernels, DynamicLinearIntegerSumsAreExact) {
  EMBER_REQUIRE_KERNEL(int8_dynamic_linear_stub);
  // act_scale 1, unit weight scales, no bias and integer activations: out = the int32 sum itself (|sum| < 2^24, so
  // exact in f32), compared bit for bit. -128 weights included (a weight loaded from a file may hold it).
  for (int64_t k : {9, 256, 1000}) {
    const int64_t m = 67, n = 66;
    std::vector<float> xv(static_cast<size_t>(m * k));
    std::vector<int8_t> qv(static_cast<size_t>(n * k + 1));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(static_cast<int64_t>((i * 7919) % 255) - 127);
    for (size_t i = 0; i < qv.size(); ++i) qv[i] = static_cast<int8_t>(static_cast<int64_t>((i * 104729) % 256) - 128);
    const Tensor x = from_vector<float>(xv, {m, k});
    const Tensor qflat = from_vector<int8_t>(qv, {n * k + 1});
    std::vector<double> expected(static_cast<size_t>(m * n));
    // Aligned q, and q starting one byte into its buffer (rows not 4-byte aligned even when k % 4 == 0).
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " offset=" + std::to_string(offset));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          int64_t acc = 0;
          for (int64_t t = 0; t < k; ++t)
            acc +=
                static_cast<int64_t>(xv[static_cast<size_t>(i * k + t)]) * qv[static_cast<size_t>(offset + j * k + t)];
          expected[static_cast<size_t>(i * n + j)] = static_cast<double>(acc);
        }
      const Tensor q = qflat.to(device()).narrow(0, offset, n * k).view({n, k});
      const Tensor y = ops::int8_dynamic_linear(x.to(device()), q, ones({n}, {DType::f32, device()}), Tensor(), 1.0f);
      EXPECT_TRUE(allclose(y, from_vector(expected, {m, n}), {0, 0}));
    }
  }
}

TEST_P(CompressionKernels, DynamicLinearRoundsTiesToEvenAndClamps) {
  EMBER_REQUIRE_KERNEL(int8_dynamic_linear_stub);
  // act_scale 0.5: x / 0.5 lands on .5 for most values; q is the identity, so out[n] = qx[n] * 0.5.
  const std::vector<float> xv = {0.25f, 0.75f, -0.25f, -1.25f, 1.25f, 63.25f, 63.75f, -100.0f, 2.25f};
  const int64_t k = static_cast<int64_t>(xv.size());
  std::vector<int8_t> eye(static_cast<size_t>(k * k), 0);
  for (int64_t i = 0; i < k; ++i) eye[static_cast<size_t>(i * k + i)] = 1;
  const Tensor q = from_vector<int8_t>(eye, {k, k}).to(device());
  const Tensor s = ones({k}, {DType::f32, device()});
  const Tensor y = ops::int8_dynamic_linear(from_vector<float>(xv, {1, k}).to(device()), q, s, Tensor(), 0.5f);
  // qx = 0, 2, -0, -2, 2, 126, 127 (128 clamped), -127 (-200 clamped), 4.
  EXPECT_EQ(doubles(y), (std::vector<double>{0, 1, 0, -1, 1, 63, 63.5, -63.5, 2}));
  // An all-zero input in dynamic mode: act_scale 1, the result is the bias; K == 0 likewise.
  const Tensor b = from_vector<float>({1, -2, 3, 0, 5, 6, 7, 8, 9}, {9}).to(device());
  EXPECT_EQ(doubles(ops::int8_dynamic_linear(zeros({2, k}, {DType::f32, device()}), q, s, b)),
            (std::vector<double>{1, -2, 3, 0, 5, 6, 7, 8, 9, 1, -2, 3, 0, 5, 6, 7, 8, 9}));
  const Tensor q0 = empty({3, 0}, TensorOptions(DType::i8, device()));
  EXPECT_EQ(doubles(ops::int8_dynamic_linear(empty({2, 0}, {DType::f32, device()}), q0,
                                             ones({3}, {DType::f32, device()}), b.narrow(0, 0, 3))),
            (std::vector<double>{1, -2, 3, 1, -2, 3}));
  EXPECT_EQ(ops::int8_dynamic_linear(empty({0, k}, {DType::f32, device()}), q, s).sizes(), (Shape{0, k}));
  // Non-finite activations are rejected in both modes; the next call is unaffected.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (std::optional<float> act : {std::optional<float>(), std::optional<float>(0.5f)}) {
      std::vector<float> v = xv;
      v[3] = bad;
      EXPECT_THROW(ops::int8_dynamic_linear(from_vector<float>(v, {1, k}).to(device()), q, s, Tensor(), act),
                   ValueError);
    }
  EXPECT_EQ(doubles(ops::int8_dynamic_linear(from_vector<float>(xv, {1, k}).to(device()), q, s, Tensor(), 0.5f)),
            (std::vector<double>{0, 1, 0, -1, 1, 63, 63.5, -63.5, 2}));
}

EMBER_INSTANTIATE_DEVICE_TESTS(CompressionKernels);

}  // namespace
}  // namespace ember::testing
