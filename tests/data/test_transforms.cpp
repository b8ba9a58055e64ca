// Image transforms: hand-computed outputs of the helpers (pad, crop, flip, bilinear resize), the random transforms
// against naive f64 references fed by the draws of a twin Generator in the documented order, and every typed error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/data/random.h"
#include "ember/data/transforms.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// Python 3's round() to an integer, written out: the nearest integer, halves to the even one.
int64_t py_round(double x) {
  const double f = std::floor(x);
  const double diff = x - f;
  if (diff < 0.5) return static_cast<int64_t>(f);
  if (diff > 0.5) return static_cast<int64_t>(f) + 1;
  return static_cast<int64_t>(f) % 2 == 0 ? static_cast<int64_t>(f) : static_cast<int64_t>(f) + 1;
}


using data::Compose;
using data::Normalize;
using data::RandomCrop;
using data::RandomHorizontalFlip;
using data::RandomResizedCrop;
using data::ToTensor;

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// A CPU image of the given shape and dtype with values v[i] = (i * 37 + 11) % 97 (distinct enough, exact in u8).
Tensor ramp(const Shape& shape, DType dtype) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37 + 11) % 97);
  return from_vector(v, shape).to(dtype);
}

// Naive bilinear resize of one plane (align_corners = false, no antialiasing), written from the formula.
std::vector<double> ref_resize(const std::vector<double>& img, int64_t H, int64_t W, int64_t oh, int64_t ow) {
  std::vector<double> out;
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x) {
      double sy = (y + 0.5) * static_cast<double>(H) / static_cast<double>(oh) - 0.5;
      double sx = (x + 0.5) * static_cast<double>(W) / static_cast<double>(ow) - 0.5;
      if (sy < 0) sy = 0;
      if (sx < 0) sx = 0;
      const int64_t y0 = static_cast<int64_t>(std::floor(sy)), x0 = static_cast<int64_t>(std::floor(sx));
      const int64_t y1 = y0 + 1 < H ? y0 + 1 : H - 1, x1 = x0 + 1 < W ? x0 + 1 : W - 1;
      const double ly = sy - y0, lx = sx - x0;
      const auto at = [&](int64_t r, int64_t c) { return img[static_cast<size_t>(r * W + c)]; };
      out.push_back((1 - ly) * ((1 - lx) * at(y0, x0) + lx * at(y0, x1)) +
                    ly * ((1 - lx) * at(y1, x0) + lx * at(y1, x1)));
    }
  return out;
}

// --- ToTensor / Normalize -------------------------------------------------------------------------------------------

TEST(TransformsToTensor, ScalesU8AndAddsTheChannelDim) {
  Generator g(1);
  const Tensor x = from_vector<uint8_t>({0, 51, 255, 102}, {2, 2});
  const Tensor y = ToTensor()(x, g);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.sizes(), (Shape{1, 2, 2}));
  const std::vector<float> v = y.to_vector<float>();
  EXPECT_FLOAT_EQ(v[0], 0.0f);
  EXPECT_FLOAT_EQ(v[1], 0.2f);
  EXPECT_FLOAT_EQ(v[2], 1.0f);
  EXPECT_FLOAT_EQ(v[3], 0.4f);
  // [C, H, W] keeps its shape; a non-contiguous view is read in logical order.
  const Tensor chw = from_vector<uint8_t>({255, 0, 51, 102, 204, 153}, {3, 2}).t().unsqueeze(0);  // [1, 2, 3]
  const Tensor z = ToTensor()(chw, g);
  EXPECT_EQ(z.sizes(), (Shape{1, 2, 3}));
  EXPECT_TRUE(allclose(z, from_vector<double>({1.0, 0.2, 0.8, 0.0, 0.4, 0.6}, {1, 2, 3}), {0, 1e-7}));
}

TEST(TransformsToTensor, FloatingInputKeepsItsValues) {
  Generator g(1);
  const Tensor x = from_vector<double>({-1.5, 0.25, 3.0, 1000.0, 0.0, 2.5}, {2, 1, 3});
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor y = ToTensor()(x.to(d), g);
    EXPECT_EQ(y.dtype(), DType::f32) << d;
    EXPECT_EQ(y.sizes(), (Shape{2, 1, 3})) << d;
    EXPECT_EQ(values(y), values(x)) << d;  // all exactly representable in every floating dtype
  }
  const Tensor f = from_vector<float>({1, 2}, {1, 2});
  const Tensor y = ToTensor()(f, g);
  EXPECT_EQ(y.sizes(), (Shape{1, 1, 2}));
  EXPECT_NE(y.raw_data(), f.raw_data());  // a new tensor, not a view of the input
}

TEST(TransformsNormalize, PerChannelAndBroadcastMeanStd) {
  Generator g(1);
  const Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 1, 2});
  const Tensor y = Normalize({1.0, 2.0}, {2.0, 0.5})(x, g);
  EXPECT_EQ(y.sizes(), (Shape{2, 1, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.0f, 0.5f, 2.0f, 4.0f}));
  const Tensor z = Normalize({0.5}, {0.25})(from_vector<float>({0, 0.5, 1, 0.75, 0.25, 1}, {3, 2, 1}), g);
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{-2, 0, 2, 1, -1, 2}));
  EXPECT_EQ(values(x), (std::vector<double>{1, 2, 3, 4}));  // input untouched
}

// --- helpers: flip, pad, crop, resize --------------------------------------------------------------------------------

TEST(FlipHelper, MirrorsTheLastDim) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor y = data::hflip(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 3}));
  EXPECT_EQ(values(y), (std::vector<double>{3, 2, 1, 6, 5, 4}));
  const Tensor c = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  EXPECT_EQ(data::hflip(c).to_vector<int64_t>(), (std::vector<int64_t>{2, 1, 4, 3, 6, 5, 8, 7}));
  const Tensor u = from_vector<uint8_t>({9, 8, 7, 6, 5, 4}, {3, 2}).t();  // non-contiguous [2, 3]: 9 7 5 / 8 6 4
  EXPECT_EQ(data::hflip(u).to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 9, 4, 6, 8}));
}

TEST(CropHelpers, PadThenCropAKnownWindow) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
  const Tensor p = data::pad_constant(x, 1, 1, 1, 1, -1);
  EXPECT_EQ(p.sizes(), (Shape{5, 5}));
  EXPECT_EQ(values(data::crop(p, 1, 0, 3, 3)), (std::vector<double>{-1, 1, 2, -1, 4, 5, -1, 7, 8}));
  EXPECT_EQ(values(data::crop(p, 2, 2, 3, 3)), (std::vector<double>{5, 6, -1, 8, 9, -1, -1, -1, -1}));
  // Asymmetric padding (left 2, top 0, right 0, bottom 1) of a 2-channel u8 image, fill cast to u8.
  const Tensor c = from_vector<uint8_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  const Tensor q = data::pad_constant(c, 2, 0, 0, 1, 7);
  EXPECT_EQ(q.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(q.dtype(), DType::u8);
  EXPECT_EQ(q.to_vector<int64_t>(),
            (std::vector<int64_t>{7, 7, 1, 2, 7, 7, 3, 4, 7, 7, 7, 7, 7, 7, 5, 6, 7, 7, 7, 8, 7, 7, 7, 7}));
  EXPECT_EQ(data::crop(c, 1, 0, 1, 2).to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 7, 8}));
  // The whole image and zero padding give the image back.
  EXPECT_EQ(values(data::crop(x, 0, 0, 3, 3)), values(x));
  EXPECT_EQ(values(data::pad_constant(x, 0, 0, 0, 0, 5)), values(x));
}

TEST(ResizeHelper, Bilinear2x2To4x4HandComputed) {
  const Tensor x = from_vector<float>({1, 2, 3, 4}, {1, 2, 2});
  const Tensor y = data::resize_bilinear(x, 4, 4);
  EXPECT_EQ(y.sizes(), (Shape{1, 4, 4}));
  EXPECT_EQ(y.dtype(), DType::f32);
  // Source coordinates along each axis: 0 (clamped from -0.25), 0.25, 0.75, 1.25 (neighbour clamped to 1).
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1.0f, 1.25f, 1.75f, 2.0f,    //
                                                      1.5f, 1.75f, 2.25f, 2.5f,    //
                                                      2.5f, 2.75f, 3.25f, 3.5f,    //
                                                      3.0f, 3.25f, 3.75f, 4.0f}));
  // Downsampling 4 -> 2 along a row: coordinates 0.5 and 2.5.
  const Tensor r = from_vector<double>({0, 4, 8, 12}, {1, 4});
  EXPECT_EQ(values(data::resize_bilinear(r, 1, 2)), (std::vector<double>{2, 10}));
}

TEST(ResizeHelper, SameSizeIsTheIdentity) {
  for (DType d : {DType::f32, DType::f64, DType::u8}) {
    const Tensor x = ramp({3, 5, 7}, d);
    const Tensor y = data::resize_bilinear(x, 5, 7);
    EXPECT_EQ(y.dtype(), d);
    EXPECT_EQ(values(y), values(x)) << d;
  }
}

TEST(ResizeHelper, U8RoundsToNearest) {
  // 1 x 2 -> 1 x 4: weights (1, 0), (0.75, 0.25), (0.25, 0.75), (0, 1).
  const Tensor a = data::resize_bilinear(from_vector<uint8_t>({0, 255}, {1, 2}), 1, 4);
  EXPECT_EQ(a.dtype(), DType::u8);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 64, 191, 255}));  // 63.75, 191.25
  const Tensor b = data::resize_bilinear(from_vector<uint8_t>({0, 2}, {1, 2}), 1, 4);
  EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 2}));  // 0.5 and 1.5 round up
}

TEST(ResizeHelper, MatchesNaiveReference) {
  const Tensor x = ramp({2, 7, 5}, DType::f64);
  const Tensor y = data::resize_bilinear(x, 4, 9);
  const std::vector<double> xv = values(x), yv = values(y);
  for (int64_t c = 0; c < 2; ++c) {
    const std::vector<double> plane(xv.begin() + c * 35, xv.begin() + (c + 1) * 35);
    const std::vector<double> ref = ref_resize(plane, 7, 5, 4, 9);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(yv[static_cast<size_t>(c) * 36 + i], ref[i], 1e-12);
  }
}

// --- RandomHorizontalFlip -------------------------------------------------------------------------------------------

TEST(RandomFlip, OneUniformDrawDecides) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  const std::vector<double> flipped = {3, 2, 1, 6, 5, 4};
  const RandomHorizontalFlip flip(0.5);
  int flips = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Generator g(seed), twin(seed);
    const Tensor y = flip(x, g);
    const bool expect_flip = data::uniform(twin) < 0.5;
    flips += expect_flip;
    EXPECT_EQ(values(y), expect_flip ? flipped : values(x)) << "seed " << seed;
    EXPECT_EQ(g.state().offset, twin.state().offset) << "seed " << seed;  // exactly one draw
    Generator again(seed);
    EXPECT_EQ(values(flip(x, again)), values(y));
  }
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, 40);
}

TEST(RandomFlip, FrequencyIsNearP) {
  const Tensor x = from_vector<uint8_t>({1, 2}, {1, 2});
  for (double p : {0.0, 0.3, 1.0}) {
    const RandomHorizontalFlip flip(p);
    int flips = 0;
    for (uint64_t seed = 0; seed < 2000; ++seed) {
      Generator g(seed);
      flips += flip(x, g).to_vector<int64_t>()[0] == 2;
    }
    EXPECT_NEAR(flips / 2000.0, p, 0.05) << "p " << p;  // ~5 standard deviations at p = 0.3
  }
}

// --- RandomCrop -----------------------------------------------------------------------------------------------------

// The expected RandomCrop output: draws top then left from a twin generator, reads the padded image naively.
std::vector<double> ref_random_crop(const Tensor& x, int64_t th, int64_t tw, int64_t pl, int64_t pt, int64_t pr,
                                    int64_t pb, double fill, Generator& twin) {
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const int64_t top = data::randint(twin, H + pt + pb - th + 1);
  const int64_t left = data::randint(twin, W + pl + pr - tw + 1);
  const std::vector<double> xv = values(x);
  std::vector<double> out;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < th; ++y)
      for (int64_t xx = 0; xx < tw; ++xx) {
        const int64_t sy = top + y - pt, sx = left + xx - pl;
        const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
        out.push_back(inside ? xv[static_cast<size_t>((c * H + sy) * W + sx)] : fill);
      }
  return out;
}

TEST(RandomCropTransform, MatchesReferenceWithSymmetricPadding) {
  const Tensor x = ramp({2, 5, 6}, DType::f32);
  const RandomCrop rc(4, 5, 1, -3.5);
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Generator g(seed), twin(seed);
    const Tensor y = rc(x, g);
    EXPECT_EQ(y.sizes(), (Shape{2, 4, 5}));
    EXPECT_EQ(values(y), ref_random_crop(x, 4, 5, 1, 1, 1, 1, -3.5, twin)) << "seed " << seed;
    EXPECT_EQ(g.state().offset, twin.state().offset);
  }
}

TEST(RandomCropTransform, FourPaddingsU8AndSameSeedSameOutput) {
  const Tensor x = ramp({3, 4, 4}, DType::u8);
  const RandomCrop rc(4, 4, {2, 0, 1, 3}, 200);  // left 2, top 0, right 1, bottom 3
  for (uint64_t seed = 0; seed < 30; ++seed) {
    Generator g(seed), twin(seed), again(seed);
    const Tensor y = rc(x, g);
    EXPECT_EQ(y.dtype(), DType::u8);
    EXPECT_EQ(values(y), ref_random_crop(x, 4, 4, 2, 0, 1, 3, 200, twin)) << "seed " << seed;
    EXPECT_EQ(values(rc(x, again)), values(y));
  }
  // A [H, W] image; a crop of the full padded size still draws twice (both offsets 0).
  const Tensor x2 = ramp({3, 3}, DType::i64);
  Generator g(7);
  const Tensor y = RandomCrop(5, 5, 1, 0)(x2, g);
  EXPECT_EQ(y.sizes(), (Shape{5, 5}));
  EXPECT_EQ(values(data::crop(y, 1, 1, 3, 3)), values(x2));
  Generator twin(7);
  data::randint(twin, 1);
  data::randint(twin, 1);
  EXPECT_EQ(g.state().offset, twin.state().offset);
}

// --- RandomResizedCrop ----------------------------------------------------------------------------------------------

struct Window {
  int64_t top, left, h, w;
};

// torchvision's get_params written out again for the test, drawing from a twin generator.
Window ref_rrc_params(int64_t H, int64_t W, double s0, double s1, double r0, double r1, Generator& twin) {
  for (int i = 0; i < 10; ++i) {
    const double target = H * W * data::uniform(twin, s0, s1);
    const double aspect = std::exp(data::uniform(twin, std::log(r0), std::log(r1)));
    const int64_t w = py_round(std::sqrt(target * aspect)), h = py_round(std::sqrt(target / aspect));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      const int64_t top = data::randint(twin, H - h + 1);
      return {top, data::randint(twin, W - w + 1), h, w};
    }
  }
  const double in_ratio = static_cast<double>(W) / H;
  int64_t w = W, h = H;
  if (in_ratio < r0) h = py_round(w / r0);
  if (in_ratio > r1) w = py_round(h * r1);
  return {(H - h) / 2, (W - w) / 2, h, w};
}

// Crop `win` of each plane of x (f64 values) and resize it naively to oh x ow.
std::vector<double> ref_rrc(const Tensor& x, Window win, int64_t oh, int64_t ow) {
  const int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  const std::vector<double> xv = values(x);
  std::vector<double> out;
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> sub;
    for (int64_t y = 0; y < win.h; ++y)
      for (int64_t xx = 0; xx < win.w; ++xx) sub.push_back(xv[static_cast<size_t>((c * H + win.top + y) * W + win.left + xx)]);
    const std::vector<double> r = ref_resize(sub, win.h, win.w, oh, ow);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

TEST(RandomResizedCropTransform, MatchesTorchvisionParamsAndNaiveResize) {
  const Tensor x = ramp({3, 10, 14}, DType::f32);
  const RandomResizedCrop rrc(5, 7);
  int distinct_windows = 0;
  Window last{-1, -1, -1, -1};
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Generator g(seed), twin(seed), params_gen(seed);
    const Window win = ref_rrc_params(10, 14, 0.08, 1.0, 3.0 / 4, 4.0 / 3, twin);
    const RandomResizedCrop::Window got = rrc.get_params(10, 14, params_gen);
    EXPECT_EQ(got.top, win.top);
    EXPECT_EQ(got.left, win.left);
    EXPECT_EQ(got.h, win.h);
    EXPECT_EQ(got.w, win.w);
    const Tensor y = rrc(x, g);
    EXPECT_EQ(y.sizes(), (Shape{3, 5, 7}));
    EXPECT_EQ(y.dtype(), DType::f32);
    EXPECT_TRUE(allclose(y, from_vector(ref_rrc(x, win, 5, 7), {3, 5, 7}), {1e-6, 1e-5})) << "seed " << seed;
    EXPECT_EQ(g.state().offset, twin.state().offset);
    distinct_windows += win.top != last.top || win.h != last.h || win.w != last.w;
    last = win;
  }
  EXPECT_GT(distinct_windows, 20);
}

TEST(RandomResizedCropTransform, U8IsRoundedToNearest) {
  const Tensor x = ramp({1, 9, 9}, DType::u8);
  const RandomResizedCrop rrc(6, 4, {0.3, 0.9}, {0.5, 2.0});
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Generator g(seed), twin(seed);
    const Window win = ref_rrc_params(9, 9, 0.3, 0.9, 0.5, 2.0, twin);
    const Tensor y = rrc(x, g);
    EXPECT_EQ(y.dtype(), DType::u8);
    const std::vector<double> ref = ref_rrc(x, win, 6, 4), yv = values(y);
    for (size_t i = 0; i < ref.size(); ++i) {
      // Exact halves (frequent: integer pixels, quarter weights) may land on either side of the tie in floating point.
      const bool tie = std::abs(ref[i] - std::floor(ref[i]) - 0.5) < 1e-9;
      if (tie) EXPECT_NEAR(yv[i], ref[i], 0.5 + 1e-9) << "seed " << seed << " i " << i;
      else EXPECT_EQ(yv[i], std::floor(ref[i] + 0.5)) << "seed " << seed << " i " << i;
    }
  }
}

TEST(RandomResizedCropTransform, FullScaleUnitRatioTakesTheWholeImage) {
  const Tensor x = ramp({2, 6, 6}, DType::f32);
  const RandomResizedCrop same(6, 6, {1.0, 1.0}, {1.0, 1.0});
  const RandomResizedCrop smaller(3, 3, {1.0, 1.0}, {1.0, 1.0});
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Generator g(seed), h(seed);
    const RandomResizedCrop::Window win = same.get_params(6, 6, h);
    EXPECT_EQ(win.top, 0);
    EXPECT_EQ(win.left, 0);
    EXPECT_EQ(win.h, 6);
    EXPECT_EQ(win.w, 6);
    EXPECT_EQ(values(same(x, g)), values(x));
    EXPECT_TRUE(allclose(smaller(x, g), from_vector(ref_rrc(x, {0, 0, 6, 6}, 3, 3), {2, 3, 3}), {1e-6, 1e-5}));
  }
}

TEST(RandomResizedCropTransform, FallbackIsTheCentredCrop) {
  // No 1:1 window of area >= 40 fits a 2 x 40 image (or a 40 x 2 one): the centred 2 x 2 window is taken after ten
  // attempts of two uniform draws each.
  const RandomResizedCrop rrc(2, 2, {0.5, 1.0}, {1.0, 1.0});
  const Tensor wide = ramp({2, 40}, DType::f32);
  const Tensor tall = ramp({1, 40, 2}, DType::f64);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    Generator g(seed);
    EXPECT_EQ(values(rrc(wide, g)), values(data::crop(wide, 0, 19, 2, 2)));
    EXPECT_EQ(g.state().offset, 20u);
    const Tensor y = rrc(tall, g);
    EXPECT_EQ(y.sizes(), (Shape{1, 2, 2}));
    EXPECT_EQ(values(y), values(tall.narrow(1, 19, 2)));
  }
  // A ratio range impossible for a wide image with a free scale: width clamped to h * max ratio.
  Generator g(3);
  const RandomResizedCrop::Window win = RandomResizedCrop(4, 4, {0.9, 1.0}, {0.5, 2.0}).get_params(5, 100, g);
  EXPECT_EQ(win.h, 5);
  EXPECT_EQ(win.w, 10);
  EXPECT_EQ(win.top, 0);
  EXPECT_EQ(win.left, 45);
}

// --- Compose --------------------------------------------------------------------------------------------------------

TEST(TransformsCompose, AppliesInOrderWithOneGenerator) {
  const data::Transform pipeline = Compose({ToTensor(), Normalize({0.5}, {0.5}), RandomHorizontalFlip(1.0)});
  Generator g(1);
  const Tensor y = pipeline(from_vector<uint8_t>({0, 51, 255}, {1, 3}), g);
  EXPECT_EQ(y.sizes(), (Shape{1, 1, 3}));
  EXPECT_TRUE(allclose(y, from_vector<double>({1.0, -0.6, -1.0}, {1, 1, 3}), {0, 1e-6}));
  // Crop then flip draw top, left, then the flip's uniform, all from the same generator.
  const Tensor x = ramp({1, 6, 6}, DType::f32);
  const Compose cf({RandomCrop(4, 4), RandomHorizontalFlip(0.5)});
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Generator a(seed), twin(seed);
    const int64_t top = data::randint(twin, 3), left = data::randint(twin, 3);
    const bool flip = data::uniform(twin) < 0.5;
    const Tensor window = data::crop(x, top, left, 4, 4);
    EXPECT_EQ(values(cf(x, a)), values(flip ? data::hflip(window) : window)) << "seed " << seed;
    EXPECT_EQ(a.state().offset, twin.state().offset);
  }
  Generator e(0);
  EXPECT_EQ(values(Compose({})(x, e)), values(x));
}

// --- errors ---------------------------------------------------------------------------------------------------------

TEST(TransformsErrors, BadArgumentsRaiseTypedErrors) {
  Generator g(0);
  const Tensor img = ramp({1, 4, 4}, DType::f32);
  // ToTensor
  const std::string msg = error_message<DTypeError>([&] { ToTensor()(ramp({2, 2}, DType::i64), g); });
  EXPECT_NE(msg.find("ToTensor"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i64[2, 2]"), std::string::npos) << msg;
  EXPECT_THROW(ToTensor()(ramp({4}, DType::u8), g), ShapeError);
  EXPECT_THROW(ToTensor()(ramp({1, 1, 2, 2}, DType::f32), g), ShapeError);
  // Normalize
  EXPECT_THROW(Normalize({}, {1.0}), ValueError);
  EXPECT_THROW(Normalize({0.0}, {}), ValueError);
  EXPECT_THROW(Normalize({0.0}, {0.0}), ValueError);
  EXPECT_THROW(Normalize({0.0, 0.0}, {1.0, -1.0}), ValueError);
  EXPECT_THROW(Normalize({0.0, 0.0}, {1.0})(img, g), ShapeError);
  EXPECT_THROW(Normalize({0.0}, {1.0, 1.0, 1.0})(ramp({2, 2, 2}, DType::f32), g), ShapeError);
  EXPECT_THROW(Normalize({0.0}, {1.0})(img.to(DType::f64), g), DTypeError);
  EXPECT_THROW(Normalize({0.0}, {1.0})(ramp({4, 4}, DType::f32), g), ShapeError);
  // RandomHorizontalFlip
  EXPECT_THROW(RandomHorizontalFlip(-0.1), ValueError);
  EXPECT_THROW(RandomHorizontalFlip(1.5), ValueError);
  EXPECT_THROW(RandomHorizontalFlip()(ramp({4}, DType::f32), g), ShapeError);
  // RandomCrop
  EXPECT_THROW(RandomCrop(5, 4)(img, g), ShapeError);
  EXPECT_THROW(RandomCrop(4, 7, 1)(img, g), ShapeError);
  EXPECT_NO_THROW(RandomCrop(6, 6, 1)(img, g));
  EXPECT_THROW(RandomCrop(0, 4), ValueError);
  EXPECT_THROW(RandomCrop(4, 4, -1), ValueError);
  EXPECT_THROW(RandomCrop(4, 4, {0, 0, -2, 0}), ValueError);
  EXPECT_THROW(RandomCrop(2, 2)(ramp({1, 1, 4, 4}, DType::f32), g), ShapeError);
  // RandomResizedCrop
  EXPECT_THROW(RandomResizedCrop(4, 4, {0.9, 0.5}), ValueError);
  EXPECT_THROW(RandomResizedCrop(4, 4, {0.0, 1.0}), ValueError);
  EXPECT_THROW(RandomResizedCrop(4, 4, {0.5, 1.0}, {2.0, 1.0}), ValueError);
  EXPECT_THROW(RandomResizedCrop(4, 4, {0.5, 1.0}, {-1.0, 1.0}), ValueError);
  EXPECT_THROW(RandomResizedCrop(0, 4), ValueError);
  EXPECT_THROW(RandomResizedCrop(2, 2)(ramp({1, 4, 4}, DType::i64), g), DTypeError);
  // helpers
  EXPECT_THROW(data::crop(img, -1, 0, 2, 2), IndexError);
  EXPECT_THROW(data::crop(img, 0, 3, 2, 2), IndexError);
  EXPECT_THROW(data::crop(img, 3, 0, 2, 2), IndexError);
  EXPECT_THROW(data::crop(img, 0, 0, 0, 2), ValueError);
  EXPECT_THROW(data::pad_constant(img, 0, -1, 0, 0, 0), ValueError);
  EXPECT_THROW(data::resize_bilinear(img, 0, 3), ValueError);
  EXPECT_THROW(data::resize_bilinear(ramp({2, 2}, DType::i32), 3, 3), DTypeError);
  EXPECT_THROW(data::hflip(ramp({3}, DType::f32)), ShapeError);
  // Compose
  EXPECT_THROW(Compose({ToTensor(), data::Transform{}}), ValueError);
}

}  // namespace
}  // namespace ember::testing
