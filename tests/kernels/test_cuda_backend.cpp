// Tests of the CUDA backend skeleton: host<->device round trips for every dtype, strided/broadcast/cast copies, fill,
// arange, the cross-device Philox guarantee (rand/randn on cuda == on cpu), binary ops against float64 references,
// streams/events/device query; plus host-side checks of the device indexing helper and of the no-GPU behaviour.
// Device suites are instantiated for cuda only (cuda/... names, ctest label gpu) and skip without a GPU.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "tests/harness/op_harness.h"

#if defined(EMBER_WITH_CUDA)
#include <cuda_runtime.h>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/stream.h"
#endif

namespace ember::testing {
namespace {

const std::vector<DType> kAllDTypes = {DType::f32, DType::f16, DType::bf16, DType::f64,
                                       DType::i32, DType::i64, DType::u8,   DType::b8};

// Values every dtype holds exactly (small non-negative integers and halves fit f16/bf16/u8; bool sees != 0).
std::vector<double> exact_values(int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = static_cast<double>((i * 37) % 101);
    if (is_floating(dt) && i % 3 == 1) x += 0.5;
    if (dt == DType::b8) x = (i % 3 == 0) ? 0.0 : 1.0;
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}

// Element offset of row-major index `flat` in a view with the given sizes and strides (naive unravel).
int64_t naive_offset(const Shape& sizes, const Shape& strides, int64_t flat) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    off += (flat % sizes[d]) * strides[d];
    flat /= sizes[d];
  }
  return off;
}

// rand_input rounded to multiples of 1/4 (exact in every floating dtype for |x| <= 64), so that ties occur.
Tensor quantized_input(const Shape& shape, double lo, double hi) {
  std::vector<double> v = rand_input(shape, lo, hi).to_vector<double>();
  for (double& x : v) x = std::round(x * 4.0) / 4.0;
  return from_vector(v, shape);
}

// [a..., b...] for two 1-d CPU tensors of one dtype (the second converted into the first's dtype by to()).
Tensor cat_specials(const Tensor& a, const Tensor& b) {
  Tensor out = empty({a.numel() + b.numel()}, a.dtype());
  out.slice(0, 0, a.numel()).copy_(a);
  out.slice(0, a.numel(), a.numel() + b.numel()).copy_(b);
  return out;
}

// ---- host-side checks (run everywhere) -------------------------------------------------------------------------

TEST(CudaBackendHost, NoDeviceMeansZeroCountAndAllocationsThrow) {
  if (memory::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU; the no-GPU behaviour is not visible";
  EXPECT_EQ(memory::cuda::device_count(), 0);
  EXPECT_FALSE(memory::cuda::is_available());
  EXPECT_THROW(empty({4}, {DType::f32, Device::cuda(0)}), DeviceError);
  EXPECT_THROW(zeros({2, 3}, {DType::f16, Device::cuda(0)}), DeviceError);
  EXPECT_THROW(tensor({1.0f, 2.0f}).to(Device::cuda(0)), DeviceError);
  EXPECT_THROW(cuda::device_properties(0), DeviceError);
#if defined(EMBER_WITH_CUDA)
  EXPECT_THROW(cuda::Stream::create(0), DeviceError);
  EXPECT_THROW(cuda::Stream::default_stream(0), DeviceError);
  EXPECT_THROW(cuda::Event(), DeviceError);
#endif
}

#if defined(EMBER_WITH_CUDA)
TEST(CudaBackendHost, CudaCheckThrowsBackendErrorWithExpressionAndLocation) {
  try {
    EMBER_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "EMBER_CUDA_CHECK did not throw";
  } catch (const BackendError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;  // the expression
    EXPECT_NE(msg.find("invalid argument"), std::string::npos) << msg;       // the status
    EXPECT_NE(msg.find("test_cuda_backend.cpp"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(EMBER_CUDA_CHECK(cudaSuccess));
}
#endif

TEST(CudaBackendHost, OffsetCalculatorMatchesNaiveStridedOffsets) {
  // Operand 0: a contiguous output; 1: a permuted slice; 2: a broadcast (stride-0) view.
  const Tensor base = zeros({6, 8, 10}, DType::f32);
  const Tensor bcast_src = zeros({5, 1}, DType::f32);
  const std::vector<std::pair<Shape, std::function<Tensor()>>> cases = {
      {{5, 4, 3}, [&] { return base.slice(0, 0, 6, 2).permute({2, 1, 0}).slice(0, 0, 5).slice(1, 1, 5); }},
      {{1, 5, 3}, [&] { return base.select(0, 1).slice(0, 2, 7).slice(1, 0, 6, 2).unsqueeze(0); }},
      {{2, 3, 4, 5}, [&] { return base.slice(2, 0, 5).slice(1, 0, 4).slice(0, 0, 3).unsqueeze(0).expand({2, 3, 4, 5}); }},
  };
  for (const auto& [shape, make] : cases) {
    const Tensor out = empty(shape, DType::f32);
    const Tensor in = make();
    ASSERT_EQ(in.sizes(), shape);
    // Operand 2 broadcasts a [5] vector along every other dim where the last dim matches, else repeats operand 1.
    const Tensor b = shape.back() == 5 ? bcast_src.select(1, 0).expand(shape) : in;
    const auto calc = cuda::make_offset_calculator<3>({&out, &in, &b}, "test");
    EXPECT_LE(calc.dims, static_cast<int>(shape.size()));
    for (int64_t i = 0; i < numel_of(shape); ++i) {
      const auto o = calc.get(i);
      ASSERT_EQ(o.v[0], i) << "output offset at " << i << " of " << shape_str(shape);
      ASSERT_EQ(o.v[1], naive_offset(in.sizes(), in.strides(), i)) << "input offset at " << i;
      ASSERT_EQ(o.v[2], naive_offset(b.sizes(), b.strides(), i)) << "broadcast offset at " << i;
    }
  }
}

TEST(CudaBackendHost, OffsetCalculatorCoalescesAndLimitsDims) {
  const Tensor a = empty({4, 5, 6}, DType::f32), b = empty({4, 5, 6}, DType::f32);
  const auto dense = cuda::make_offset_calculator<2>({&a, &b}, "test");
  EXPECT_TRUE(dense.contiguous);
  EXPECT_EQ(dense.dims, 1);
  EXPECT_EQ(dense.sizes[0], 120);
  const Tensor t = empty({6, 5, 4}, DType::f32).permute({2, 1, 0});
  const auto tr = cuda::make_offset_calculator<2>({&a, &t}, "test");
  EXPECT_FALSE(tr.contiguous);
  EXPECT_EQ(tr.dims, 3);
  // 9 dims of size 2, every other element of a [4]*9 buffer: nothing can merge, which is more than the kernel supports.
  Shape big(9, 4);
  const Tensor s = empty(big, DType::f32);
  Tensor v = s;
  for (int64_t d = 0; d < 9; ++d) v = v.slice(d, 0, 4, 2);
  const Tensor o = empty(v.sizes(), DType::f32);
  EXPECT_THROW((cuda::make_offset_calculator<2>({&o, &v}, "test")), ShapeError);
  const Tensor scalar = empty({}, DType::f32);
  const auto sc = cuda::make_offset_calculator<1>({&scalar}, "test");
  EXPECT_TRUE(sc.contiguous);
  EXPECT_EQ(sc.get(0).v[0], 0);
}

// ---- device suites (cuda/... instances only) ----------------------------------------------------------------------

class CudaBackendTest : public DeviceTest {};

TEST_P(CudaBackendTest, RoundTripEveryDType) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<double> v = exact_values(1003, dt);
    const Tensor host = from_vector(v, {17, 59}).to(dt);
    const Tensor dev = host.to(device());
    EXPECT_EQ(dev.device(), device());
    EXPECT_EQ(dev.dtype(), dt);
    const Tensor back = dev.to(Device::cpu());
    EXPECT_EQ(back.device(), Device::cpu());
    ASSERT_EQ(back.nbytes(), host.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), static_cast<size_t>(host.nbytes())), 0);
    EXPECT_EQ(back.to_vector<double>(), v);
    // A non-contiguous host source and a non-contiguous host destination.
    const Tensor src_t = host.t();
    const Tensor dev_t = src_t.to(device());
    Tensor dst = zeros({59, 34}, dt).slice(1, 0, 34, 2);
    dst.copy_(dev_t);
    const std::vector<double> got = dst.to_vector<double>();
    for (int64_t i = 0; i < 59; ++i)
      for (int64_t j = 0; j < 17; ++j) ASSERT_EQ(got[i * 17 + j], v[j * 59 + i]) << "at " << i << "," << j;
  }
}

TEST_P(CudaBackendTest, StridedBroadcastAndCastCopyOnDevice) {
  const std::vector<double> v = exact_values(24, DType::f32);
  const Tensor src = from_vector(v, {4, 6}, {DType::f64, device()});
  // Transposed source, same dtype (bit-moving kernel) and cast to f32 and i32 (casting kernel).
  for (DType dt : {DType::f64, DType::f32, DType::i32, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor dst = empty({6, 4}, {dt, device()});
    dst.copy_(src.t());
    const std::vector<double> got = dst.to_vector<double>();
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        const double x = v[j * 6 + i];
        const double want = dt == DType::i32 ? std::trunc(x) : x;
        ASSERT_EQ(got[i * 4 + j], want) << "at " << i << "," << j;
      }
  }
  // Broadcast [4, 1] -> [3, 4, 5] into a non-contiguous destination (every other element of a bigger buffer).
  const Tensor col = from_vector(std::vector<double>{1.5, -2.0, 3.25, 8.0}, {4, 1}, {DType::f32, device()});
  Tensor buffer = full({3, 4, 10}, -7.0, {DType::bf16, device()});
  Tensor dst = buffer.slice(2, 0, 10, 2);
  dst.copy_(col);
  const std::vector<double> all = buffer.to_vector<double>();
  const double colv[4] = {1.5, -2.0, 3.25, 8.0};
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t c = 0; c < 10; ++c)
        ASSERT_EQ(all[(a * 4 + b) * 10 + c], c % 2 == 0 ? colv[b] : -7.0) << "at " << a << "," << b << "," << c;
}

TEST_P(CudaBackendTest, CastCopyEqualsCpuForEveryDTypePair) {
  // Every cast is defined (Note [Casts] in kernels/convert.h), so the sources include negatives, NaN, +-inf and
  // values outside every integer range, and both devices must agree bit for bit (but for NaN payloads, below).
  constexpr double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> specials = {std::numeric_limits<double>::quiet_NaN(), inf, -inf, 3e9, -3e9, 1e19, -1e19,
                                        255.9, -1.5, 300.0, -0.75, 65519.0, 70000.0};
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      std::vector<double> v = exact_values(257, from);
      if (from != DType::u8 && from != DType::b8)
        for (size_t i = 0; i < v.size(); i += 4) v[i] = -v[i] - (is_floating(from) ? 0.25 : 0.0);
      Tensor host = from_vector(v, {257}).to(from);
      if (is_floating(from)) {
        host = cat_specials(host, from_vector(specials, {static_cast<int64_t>(specials.size())}).to(from));
      } else if (from != DType::b8) {  // integers just inside and outside the narrower integer ranges
        const std::vector<int64_t> edges = {-1, 255, 256, -129, 300, (int64_t{1} << 31), -(int64_t{1} << 31) - 1,
                                            (int64_t{1} << 40) + 7, std::numeric_limits<int64_t>::min()};
        host = cat_specials(host, from_vector(edges, {static_cast<int64_t>(edges.size())}).to(from));
      }
      const Tensor expected = host.to(to);  // the CPU kernel is the reference device
      const Tensor actual = host.to(device()).to(to).cpu();
      ASSERT_EQ(actual.dtype(), to);
      if (!is_floating(to)) {
        EXPECT_EQ(std::memcmp(actual.raw_data(), expected.raw_data(), static_cast<size_t>(expected.nbytes())), 0);
        continue;
      }
      // A NaN's payload is outside the cast rules: the GPU's float conversions return its canonical NaN, x86 keeps
      // the payload. A NaN must stay a NaN; every other value matches bit for bit (widened to f64, which is exact).
      const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
      for (size_t i = 0; i < e.size(); ++i) {
        if (std::isnan(e[i])) {
          EXPECT_TRUE(std::isnan(a[i])) << "at " << i;
        } else {
          EXPECT_EQ(std::memcmp(&a[i], &e[i], sizeof(double)), 0) << "at " << i << ": " << a[i] << " vs " << e[i];
        }
      }
    }
  }
}

TEST_P(CudaBackendTest, FillEveryDTypeIncludingStridedViews) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double value = dt == DType::b8 ? 1.0 : (is_floating(dt) ? 2.5 : 7.0);
    Tensor t = zeros({5, 8}, {dt, device()});
    t.slice(1, 1, 8, 3).fill_(value);  // columns 1, 4, 7
    const std::vector<double> got = t.to_vector<double>();
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 8; ++j) ASSERT_EQ(got[i * 8 + j], j % 3 == 1 ? value : 0.0) << "at " << i << "," << j;
    EXPECT_EQ(full({3, 3}, value, {dt, device()}).to_vector<double>(), std::vector<double>(9, value));
  }
  // Integer fill keeps 64-bit values exact.
  const int64_t big = (int64_t{1} << 53) + 1;
  EXPECT_EQ(full({2}, big, {DType::i64, device()}).to_vector<int64_t>(), (std::vector<int64_t>{big, big}));
}

TEST_P(CudaBackendTest, ArangeMatchesHandComputedAndCpu) {
  const Tensor a = arange(0.0, 1.0, 0.1, {DType::f32, device()});
  ASSERT_EQ(a.numel(), 10);
  const std::vector<float> got = a.to_vector<float>();
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(got[i], static_cast<float>(0.0 + static_cast<double>(i) * 0.1)) << i;
  const Tensor b = arange(-5, 20, 3, {DType::i64, device()});
  EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{-5, -2, 1, 4, 7, 10, 13, 16, 19}));
  for (DType dt : {DType::f64, DType::f16, DType::bf16, DType::i32, DType::u8}) {
    SCOPED_TRACE(dtype_name(dt));
    const double stop = dt == DType::u8 ? 200.0 : 37.0;
    const Tensor c = arange(0.0, stop, dt == DType::u8 || dt == DType::i32 ? 1.0 : 0.37, {dt, device()});
    const Tensor r = arange(0.0, stop, dt == DType::u8 || dt == DType::i32 ? 1.0 : 0.37, {dt, Device::cpu()});
    ASSERT_EQ(c.numel(), r.numel());
    EXPECT_EQ(std::memcmp(c.cpu().raw_data(), r.raw_data(), static_cast<size_t>(r.nbytes())), 0);
  }
}

TEST_P(CudaBackendTest, RandomDrawsEqualCpuDrawsFromTheSameState) {
  Generator& g = default_generator();
  const PhiloxState saved = g.state();
  g.set_state({0x1234abcdull, 77});
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}}) {
      const PhiloxState st = g.state();
      const Tensor on_dev = uniform({n}, -1.5, 2.25, {dt, device()});
      const PhiloxState after_dev = g.state();
      g.set_state(st);
      const Tensor on_cpu = uniform({n}, -1.5, 2.25, {dt, Device::cpu()});
      EXPECT_EQ(g.state().offset, after_dev.offset);
      EXPECT_EQ(std::memcmp(on_dev.cpu().raw_data(), on_cpu.raw_data(), static_cast<size_t>(on_cpu.nbytes())), 0)
          << "uniform draws differ for n = " << n;
    }
  }
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const PhiloxState st = g.state();
    const Tensor on_dev = normal({2053}, 0.5, 2.0, {dt, device()});
    g.set_state(st);
    const Tensor on_cpu = normal({2053}, 0.5, 2.0, {dt, Device::cpu()});
    // The Box-Muller transform uses the device's logf/cosf: equal to within a few float ulps.
    EXPECT_TRUE(allclose(on_dev, on_cpu, {1e-6, 1e-6}));
  }
  g.set_state(saved);
}

// out[i] = f(a[i], b[i]) with a, b broadcast to a common shape; naive float64 loops.
Tensor ref_binary(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  const Shape out = broadcast_shapes(a.sizes(), b.sizes(), "test");
  const Tensor ae = a.expand(out), be = b.expand(out);
  const std::vector<double> av = ae.contiguous().to_vector<double>(), bv = be.contiguous().to_vector<double>();
  std::vector<double> r(av.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(av[i], bv[i]);
  return from_vector(r, out);
}

TEST_P(CudaBackendTest, BinaryOpsMatchFloat64ReferenceWithBroadcastAndStrides) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    std::function<double(double, double)> ref;
  };
  const std::vector<Op> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double x, double y) { return x > y ? x : y; }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double x, double y) { return x < y ? x : y; }},
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](double x, double y) { return x == y ? 1.0 : 0.0; }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](double x, double y) { return x != y ? 1.0 : 0.0; }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](double x, double y) { return x < y ? 1.0 : 0.0; }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](double x, double y) { return x <= y ? 1.0 : 0.0; }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](double x, double y) { return x > y ? 1.0 : 0.0; }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](double x, double y) { return x >= y ? 1.0 : 0.0; }},
  };
  for (const Op& op : ops) {
    SCOPED_TRACE(op.name);
    // Broadcast: a [3, 1, 5] with b [4, 5]. Values of b in [0.5, 2] keep division well conditioned; quantised
    // values give exact ties, so eq/le/ge see both outcomes.
    const Tensor a = quantized_input({3, 1, 5}, -2.0, 2.0);
    const Tensor b = quantized_input({4, 5}, 0.5, 2.0);
    const OpCase c{op.name, {a, b}, [&op](const Inputs& in) { return op.fn(in[0], in[1]); },
                   [&op](const Inputs& in) { return ref_binary(in[0], in[1], op.ref); }};
    check_op(c, device());
    // Non-contiguous on the device: transposed a [5, 4] and a strided slice of b [5, 8] -> [5, 4].
    const OpCase s{std::string(op.name) + " strided",
                   {quantized_input({4, 5}, -2.0, 2.0), quantized_input({5, 8}, 0.5, 2.0)},
                   [&op](const Inputs& in) { return op.fn(in[0].t(), in[1].slice(1, 0, 8, 2)); },
                   [&op](const Inputs& in) { return ref_binary(in[0].t(), in[1].slice(1, 0, 8, 2), op.ref); }};
    check_op(s, device());
  }
}

TEST_P(CudaBackendTest, IntegerAndBoolBinaryOpsAreExact) {
  EMBER_REQUIRE_KERNEL(binary_stub);
  const std::vector<int64_t> av = {-7, 0, 3, 100000, 42, -1};
  const std::vector<int64_t> bv = {2, -5, 3, 7, -42, 9};
  for (DType dt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = from_vector(av, {6}, {dt, device()}), b = from_vector(bv, {6}, {dt, device()});
    EXPECT_EQ(add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{-5, -5, 6, 100007, 0, 8}));
    EXPECT_EQ(sub(a, b).to_vector<int64_t>(), (std::vector<int64_t>{-9, 5, 0, 99993, 84, -10}));
    EXPECT_EQ(mul(a, b).to_vector<int64_t>(), (std::vector<int64_t>{-14, 0, 9, 700000, -1764, -9}));
    EXPECT_EQ(maximum(a, b).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 3, 100000, 42, 9}));
    EXPECT_EQ(lt(a, b).to_vector<bool>(), (std::vector<bool>{true, false, false, false, false, true}));
    const Tensor q = div(a, b);  // true division: f32
    EXPECT_EQ(q.dtype(), DType::f32);
    EXPECT_FLOAT_EQ(q.to_vector<float>()[0], -3.5f);
  }
  const Tensor p = from_vector(std::vector<bool>{true, true, false, false}, {4}, {DType::b8, device()});
  const Tensor r = from_vector(std::vector<bool>{true, false, true, false}, {4}, {DType::b8, device()});
  EXPECT_EQ(add(p, r).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));  // logical or
  EXPECT_EQ(mul(p, r).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));  // logical and
  EXPECT_EQ(eq(p, r).to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
}

TEST_P(CudaBackendTest, UnaryOpsMatchFloat64Reference) {
  EMBER_REQUIRE_KERNEL(unary_stub);
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
    std::function<double(double)> ref;
  };
  const std::vector<Op> ops = {
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.25); },
       [](double x) { return x < -0.5 ? -0.5 : (x > 0.25 ? 0.25 : x); }},
  };
  for (const Op& op : ops) {
    SCOPED_TRACE(op.name);
    const auto reference = [&op](const Inputs& in) {
      const std::vector<double> v = in[0].t().contiguous().to_vector<double>();
      std::vector<double> r(v.size());
      for (size_t i = 0; i < v.size(); ++i) r[i] = op.ref(v[i]);
      return from_vector(r, {7, 6});
    };
    const OpCase c{op.name, {rand_input({6, 7})}, [&op](const Inputs& in) { return op.fn(in[0].t()); }, reference};
    check_op(c, device());
  }
  const Tensor xi = from_vector(std::vector<int32_t>{-3, 0, 5, -100}, {4}, {DType::i32, device()});
  EXPECT_EQ(abs(xi).to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 5, 100}));
  EXPECT_EQ(clamp(xi, -4.0, 2.0).to_vector<int64_t>(), (std::vector<int64_t>{-3, 0, 2, -4}));
}

#if defined(EMBER_WITH_CUDA)
TEST_P(CudaBackendTest, StreamEventRoundTripAndDeviceQuery) {
  const int dev = device().index;
  const cuda::DeviceProperties& p = cuda::device_properties(dev);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.sm_count, 0);
  EXPECT_GT(p.total_memory, 0);
  EXPECT_GE(p.major, 3);
  EXPECT_EQ(&p, &cuda::device_properties(dev)) << "properties are cached";
  std::printf("[ember] %s\n", p.summary().c_str());

  cuda::Stream s = cuda::Stream::create(dev);
  EXPECT_TRUE(s.owns());
  EXPECT_NE(s.get(), nullptr);
  cuda::Event start, end;
  const int64_t n = 1 << 22;
  void* buf = nullptr;
  EMBER_CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(n)));
  start.record(s);
  EMBER_CUDA_CHECK(cudaMemsetAsync(buf, 0x5a, static_cast<size_t>(n), s.get()));
  end.record(s);
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_TRUE(s.query());
  EXPECT_GE(cuda::Event::elapsed_ms(start, end), 0.0f);
  std::vector<unsigned char> host(static_cast<size_t>(n));
  EMBER_CUDA_CHECK(cudaMemcpyAsync(host.data(), buf, static_cast<size_t>(n), cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  EXPECT_EQ(host.front(), 0x5a);
  EXPECT_EQ(host.back(), 0x5a);
  EMBER_CUDA_CHECK(cudaFree(buf));

  cuda::Stream moved = std::move(s);
  EXPECT_TRUE(moved.owns());
  EXPECT_FALSE(s.owns());  // a moved-from stream owns nothing
  const cuda::Stream def = cuda::current_stream(dev);
  EXPECT_TRUE(def.is_default());
  EXPECT_FALSE(def.owns());
  def.synchronize();

  int before = -1, inside = -1, after = -1;
  EMBER_CUDA_CHECK(cudaGetDevice(&before));
  {
    cuda::DeviceGuard guard(dev);
    EMBER_CUDA_CHECK(cudaGetDevice(&inside));
  }
  EMBER_CUDA_CHECK(cudaGetDevice(&after));
  EXPECT_EQ(inside, dev);
  EXPECT_EQ(after, before);
}
#endif

INSTANTIATE_TEST_SUITE_P(cuda, CudaBackendTest, ::testing::Values(Device::cuda(0)), device_param_name);

}  // namespace
}  // namespace ember::testing
