// Per-sample image transforms as plain loops over contiguous CPU data: byte copies for the dtype-agnostic ones (pad,
// crop, flip), typed loops for ToTensor, Normalize and the bilinear resize. Invariant: every output is freshly
// allocated and fully written; random draws happen only in the documented order on the generator passed in.
#include "ember/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "ember/base/error.h"
#include "ember/data/random.h"

namespace ember::data {

namespace {

// Python's round(): halves go to the even neighbour (torchvision's window sizes are int(round(...))).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }


// An image seen as `planes` planes of h x w elements (planes = C for [C, H, W], 1 for [H, W]).
struct Geometry {
  int64_t planes, h, w;
};

Geometry image_geometry(const Tensor& x, const char* op) {
  EMBER_CHECK(x.device().is_cpu(), DeviceError, op, ": expects a CPU tensor, got ", x.description());
  EMBER_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, op, ": expects an image [H, W] or [C, H, W], got ",
              x.description());
  if (x.dim() == 2) return {1, x.size(0), x.size(1)};
  return {x.size(0), x.size(1), x.size(2)};
}

// The shape of an image like `x` (same rank, same plane count) with planes of h x w.
Shape image_shape(const Tensor& x, int64_t h, int64_t w) {
  if (x.dim() == 2) return {h, w};
  return {x.size(0), h, w};
}

const char* bytes_of(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }
char* bytes_of_mut(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

void check_range(const std::pair<double, double>& r, const char* what) {
  EMBER_CHECK(r.first > 0 && r.second > 0 && r.first <= r.second, ValueError, "RandomResizedCrop: ", what,
              " must satisfy 0 < lo <= hi, got (", r.first, ", ", r.second, ")");
}

// Note [Bilinear resize]
// PyTorch's upsample_bilinear2d with align_corners = false and no antialiasing: output index d maps to the source
// coordinate s = (d + 0.5) * in / out - 0.5, clamped below at 0; its neighbours are i0 = floor(s) and
// i1 = min(i0 + 1, in - 1) with weights 1 - (s - i0) and s - i0. Rows and columns are independent, so the taps of
// each axis are computed once. When in == out, s == d exactly and the image comes back unchanged.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<double> lambda;  // weight of i1
};

Taps bilinear_taps(int64_t in, int64_t out) {
  Taps t;
  t.i0.resize(static_cast<size_t>(out));
  t.i1.resize(static_cast<size_t>(out));
  t.lambda.resize(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t d = 0; d < out; ++d) {
    const double s = std::max((static_cast<double>(d) + 0.5) * scale - 0.5, 0.0);
    const int64_t i0 = std::min(static_cast<int64_t>(s), in - 1);
    const auto k = static_cast<size_t>(d);
    t.i0[k] = i0;
    t.i1[k] = std::min(i0 + 1, in - 1);
    t.lambda[k] = s - static_cast<double>(i0);
  }
  return t;
}

template <class T, class Store>
void resize_planes(const T* src, int64_t planes, int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w,
                   Store store) {
  const Taps ty = bilinear_taps(in_h, out_h);
  const Taps tx = bilinear_taps(in_w, out_w);
  int64_t o = 0;
  for (int64_t p = 0; p < planes; ++p) {
    const T* plane = src + p * in_h * in_w;
    for (int64_t y = 0; y < out_h; ++y) {
      const auto ky = static_cast<size_t>(y);
      const T* r0 = plane + ty.i0[ky] * in_w;
      const T* r1 = plane + ty.i1[ky] * in_w;
      const double ly = ty.lambda[ky];
      for (int64_t x = 0; x < out_w; ++x, ++o) {
        const auto kx = static_cast<size_t>(x);
        const int64_t x0 = tx.i0[kx], x1 = tx.i1[kx];
        const double lx = tx.lambda[kx];
        const double top = (1.0 - lx) * static_cast<double>(r0[x0]) + lx * static_cast<double>(r0[x1]);
        const double bottom = (1.0 - lx) * static_cast<double>(r1[x0]) + lx * static_cast<double>(r1[x1]);
        store(o, (1.0 - ly) * top + ly * bottom);
      }
    }
  }
}

}  // namespace

// --- helpers --------------------------------------------------------------------------------------------------------

Tensor pad_constant(const Tensor& x, int64_t left, int64_t top, int64_t right, int64_t bottom, double fill) {
  const Geometry g = image_geometry(x, "pad_constant");
  EMBER_CHECK(left >= 0 && top >= 0 && right >= 0 && bottom >= 0, ValueError,
              "pad_constant: paddings must be >= 0, got left ", left, ", top ", top, ", right ", right, ", bottom ",
              bottom);
  const int64_t oh = g.h + top + bottom, ow = g.w + left + right;
  Tensor out = empty(image_shape(x, oh, ow), TensorOptions(x.dtype(), Device::cpu()));
  if (out.numel() == 0) return out;
  // The fill value in the output's dtype, converted as fill_ converts a Scalar.
  const Tensor fill_value = full({}, Scalar(fill), TensorOptions(x.dtype(), Device::cpu()));
  const int64_t isz = x.itemsize();
  char* dst = bytes_of_mut(out);
  const int64_t n = out.numel();
  if (isz == 1) {
    std::memset(dst, *bytes_of(fill_value), static_cast<size_t>(n));
  } else {  // the first element, then doubling copies of what is already filled
    std::memcpy(dst, bytes_of(fill_value), static_cast<size_t>(isz));
    for (int64_t done = 1; done < n; done *= 2)
      std::memcpy(dst + done * isz, dst, static_cast<size_t>(std::min(done, n - done) * isz));
  }
  if (x.numel() == 0) return out;
  const Tensor src = x.contiguous();
  const char* s = bytes_of(src);
  const auto row_bytes = static_cast<size_t>(g.w * isz);
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t y = 0; y < g.h; ++y)
      std::memcpy(dst + ((p * oh + y + top) * ow + left) * isz, s + (p * g.h + y) * g.w * isz, row_bytes);
  return out;
}

Tensor crop(const Tensor& x, int64_t top, int64_t left, int64_t h, int64_t w) {
  const Geometry g = image_geometry(x, "crop");
  EMBER_CHECK(h >= 1 && w >= 1, ValueError, "crop: the window size must be >= 1, got ", h, " x ", w);
  EMBER_CHECK(top >= 0 && left >= 0 && top + h <= g.h && left + w <= g.w, IndexError, "crop: window (top ", top,
              ", left ", left, ", ", h, " x ", w, ") leaves the image ", x.description());
  Tensor out = empty(image_shape(x, h, w), TensorOptions(x.dtype(), Device::cpu()));
  if (out.numel() == 0) return out;
  const Tensor src = x.contiguous();
  const int64_t isz = x.itemsize();
  const char* s = bytes_of(src);
  char* dst = bytes_of_mut(out);
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t y = 0; y < h; ++y)
      std::memcpy(dst + (p * h + y) * w * isz, s + ((p * g.h + top + y) * g.w + left) * isz,
                  static_cast<size_t>(w * isz));
  return out;
}

Tensor resize_bilinear(const Tensor& x, int64_t h, int64_t w) {
  const Geometry g = image_geometry(x, "resize_bilinear");
  EMBER_CHECK(h >= 1 && w >= 1, ValueError, "resize_bilinear: the output size must be >= 1, got ", h, " x ", w);
  EMBER_CHECK(is_floating(x.dtype()) || x.dtype() == DType::u8, DTypeError,
              "resize_bilinear: expects a floating or u8 image, got ", x.description());
  EMBER_CHECK(g.h >= 1 && g.w >= 1, ShapeError, "resize_bilinear: cannot resize an empty image ", x.description());
  Tensor out = empty(image_shape(x, h, w), TensorOptions(x.dtype(), Device::cpu()));
  if (out.numel() == 0) return out;
  const Tensor src = x.contiguous();
  if (x.dtype() == DType::u8) {
    uint8_t* o = out.data<uint8_t>();
    resize_planes(src.data<uint8_t>(), g.planes, g.h, g.w, h, w, [o](int64_t i, double v) {
      o[i] = static_cast<uint8_t>(std::floor(std::clamp(v, 0.0, 255.0) + 0.5));
    });
    return out;
  }
  EMBER_DISPATCH_FLOAT(x.dtype(), "resize_bilinear", [&] {
    scalar_t* o = out.data<scalar_t>();
    resize_planes(src.data<scalar_t>(), g.planes, g.h, g.w, h, w, [o](int64_t i, double v) {
      o[i] = static_cast<scalar_t>(static_cast<op_math_t<scalar_t>>(v));
    });
  });
  return out;
}

Tensor hflip(const Tensor& x) {
  const Geometry g = image_geometry(x, "hflip");
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype(), Device::cpu()));
  if (out.numel() == 0) return out;
  const Tensor src = x.contiguous();
  const int64_t isz = x.itemsize();
  const char* s = bytes_of(src);
  char* dst = bytes_of_mut(out);
  auto flip_rows = [&](auto element) {  // element: an integer type of the itemsize
    using E = decltype(element);
    const E* in = reinterpret_cast<const E*>(s);
    E* o = reinterpret_cast<E*>(dst);
    for (int64_t r = 0; r < g.planes * g.h; ++r)
      for (int64_t c = 0; c < g.w; ++c) o[r * g.w + c] = in[r * g.w + g.w - 1 - c];
  };
  switch (isz) {
    case 1: flip_rows(uint8_t{}); break;
    case 2: flip_rows(uint16_t{}); break;
    case 4: flip_rows(uint32_t{}); break;
    case 8: flip_rows(uint64_t{}); break;
    default:
      for (int64_t r = 0; r < g.planes * g.h; ++r)
        for (int64_t c = 0; c < g.w; ++c)
          std::memcpy(dst + (r * g.w + c) * isz, s + (r * g.w + g.w - 1 - c) * isz, static_cast<size_t>(isz));
  }
  return out;
}

// --- ToTensor -------------------------------------------------------------------------------------------------------

Tensor ToTensor::operator()(const Tensor& x, Generator& /*rng*/) const {
  EMBER_CHECK(x.device().is_cpu(), DeviceError, "ToTensor: expects a CPU tensor, got ", x.description());
  EMBER_CHECK(x.dtype() == DType::u8 || is_floating(x.dtype()), DTypeError,
              "ToTensor: expects a u8 or floating image, got ", x.description());
  EMBER_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, "ToTensor: expects an image [H, W] or [C, H, W], got ",
              x.description());
  const Shape shape = x.dim() == 2 ? Shape{1, x.size(0), x.size(1)} : x.sizes();
  Tensor out = empty(shape, TensorOptions(DType::f32, Device::cpu()));
  if (out.numel() == 0) return out;
  const Tensor src = x.contiguous();
  float* o = out.data<float>();
  const int64_t n = out.numel();
  if (x.dtype() == DType::u8) {
    const uint8_t* s = src.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(s[i]) / 255.0f;
    return out;
  }
  EMBER_DISPATCH_FLOAT(x.dtype(), "ToTensor", [&] {
    const scalar_t* s = src.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(s[i]);
  });
  return out;
}

// --- Normalize ------------------------------------------------------------------------------------------------------

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  EMBER_CHECK(!mean_.empty() && !std_.empty(), ValueError, "Normalize: mean and std must not be empty (got ",
              mean_.size(), " and ", std_.size(), " values)");
  for (size_t c = 0; c < std_.size(); ++c)
    EMBER_CHECK(std_[c] > 0, ValueError, "Normalize: std must be > 0, got std[", c, "] = ", std_[c]);
}

Tensor Normalize::operator()(const Tensor& x, Generator& /*rng*/) const {
  EMBER_CHECK(x.device().is_cpu(), DeviceError, "Normalize: expects a CPU tensor, got ", x.description());
  EMBER_CHECK(x.dtype() == DType::f32, DTypeError, "Normalize: expects an f32 image (apply ToTensor first), got ",
              x.description());
  EMBER_CHECK(x.dim() == 3, ShapeError, "Normalize: expects an image [C, H, W], got ", x.description());
  const int64_t channels = x.size(0);
  const auto per_channel = [&](const std::vector<double>& v, const char* name) {
    EMBER_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == channels, ShapeError, "Normalize: ", name,
                " has ", v.size(), " values for ", channels, " channels of ", x.description());
  };
  per_channel(mean_, "mean");
  per_channel(std_, "std");
  Tensor out = empty(x.sizes(), TensorOptions(DType::f32, Device::cpu()));
  if (out.numel() == 0) return out;
  const Tensor src = x.contiguous();
  const float* s = src.data<float>();
  float* o = out.data<float>();
  const int64_t plane = x.size(1) * x.size(2);
  for (int64_t c = 0; c < channels; ++c) {
    const double m = mean_.size() == 1 ? mean_[0] : mean_[static_cast<size_t>(c)];
    const double sd = std_.size() == 1 ? std_[0] : std_[static_cast<size_t>(c)];
    for (int64_t i = c * plane; i < (c + 1) * plane; ++i) o[i] = static_cast<float>((s[i] - m) / sd);
  }
  return out;
}

// --- RandomHorizontalFlip -------------------------------------------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, "RandomHorizontalFlip: p must lie in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::operator()(const Tensor& x, Generator& rng) const {
  image_geometry(x, "RandomHorizontalFlip");
  return uniform(rng) < p_ ? hflip(x) : x;
}

// --- RandomCrop -----------------------------------------------------------------------------------------------------

RandomCrop::RandomCrop(int64_t height, int64_t width, int64_t padding, double fill)
    : RandomCrop(height, width, {padding, padding, padding, padding}, fill) {}

RandomCrop::RandomCrop(int64_t height, int64_t width, std::array<int64_t, 4> padding, double fill)
    : height_(height), width_(width), padding_(padding), fill_(fill) {
  EMBER_CHECK(height >= 1 && width >= 1, ValueError, "RandomCrop: the size must be >= 1, got ", height, " x ", width);
  for (const int64_t p : padding_)
    EMBER_CHECK(p >= 0, ValueError, "RandomCrop: paddings must be >= 0, got {", padding_[0], ", ", padding_[1], ", ",
                padding_[2], ", ", padding_[3], "}");
}

Tensor RandomCrop::operator()(const Tensor& x, Generator& rng) const {
  const Geometry g = image_geometry(x, "RandomCrop");
  const auto [left, top, right, bottom] = padding_;
  const int64_t hp = g.h + top + bottom, wp = g.w + left + right;
  EMBER_CHECK(height_ <= hp && width_ <= wp, ShapeError, "RandomCrop: a ", height_, " x ", width_,
              " crop does not fit the padded ", hp, " x ", wp, " image ", x.description());
  const bool padded = left != 0 || top != 0 || right != 0 || bottom != 0;
  const Tensor src = padded ? pad_constant(x, left, top, right, bottom, fill_) : x;
  const int64_t i = randint(rng, hp - height_ + 1);  // top first, then left (torchvision's order)
  const int64_t j = randint(rng, wp - width_ + 1);
  return crop(src, i, j, height_, width_);
}

// --- RandomResizedCrop ----------------------------------------------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale,
                                     std::pair<double, double> ratio)
    : height_(height), width_(width), scale_(scale), ratio_(ratio) {
  EMBER_CHECK(height >= 1 && width >= 1, ValueError, "RandomResizedCrop: the size must be >= 1, got ", height, " x ",
              width);
  check_range(scale_, "scale");
  check_range(ratio_, "ratio");
}

// Note [RandomResizedCrop parameters]
// torchvision's RandomResizedCrop.get_params, draw for draw: up to 10 attempts, each drawing the area fraction
// uniform(scale) and then log(aspect) uniform(log ratio); w = round(sqrt(area * aspect)), h = round(sqrt(area /
// aspect)); the first attempt with 0 < w <= W and 0 < h <= H draws top = randint(H - h + 1), then left =
// randint(W - w + 1). Without a fitting attempt, the centred crop of the whole image clamped to the ratio range is
// taken (no draw). Unlike torchvision, the fallback sides are kept >= 1 so an extreme ratio never yields an empty
// window.
RandomResizedCrop::Window RandomResizedCrop::get_params(int64_t image_h, int64_t image_w, Generator& rng) const {
  const double area = static_cast<double>(image_h) * static_cast<double>(image_w);
  const double log_r0 = std::log(ratio_.first), log_r1 = std::log(ratio_.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(rng, scale_.first, scale_.second);
    const double aspect = std::exp(uniform(rng, log_r0, log_r1));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= image_w && 0 < h && h <= image_h) {
      const int64_t top = randint(rng, image_h - h + 1);
      const int64_t left = randint(rng, image_w - w + 1);
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(image_w) / static_cast<double>(image_h);
  int64_t w = image_w, h = image_h;
  if (in_ratio < ratio_.first) {
    h = round_half_even(static_cast<double>(w) / ratio_.first);
  } else if (in_ratio > ratio_.second) {
    w = round_half_even(static_cast<double>(h) * ratio_.second);
  }
  h = std::clamp<int64_t>(h, 1, image_h);
  w = std::clamp<int64_t>(w, 1, image_w);
  return {(image_h - h) / 2, (image_w - w) / 2, h, w};
}

Tensor RandomResizedCrop::operator()(const Tensor& x, Generator& rng) const {
  const Geometry g = image_geometry(x, "RandomResizedCrop");
  EMBER_CHECK(is_floating(x.dtype()) || x.dtype() == DType::u8, DTypeError,
              "RandomResizedCrop: expects a floating or u8 image, got ", x.description());
  EMBER_CHECK(g.h >= 1 && g.w >= 1, ShapeError, "RandomResizedCrop: cannot crop an empty image ", x.description());
  const Window win = get_params(g.h, g.w, rng);
  return resize_bilinear(crop(x, win.top, win.left, win.h, win.w), height_, width_);
}

// --- Compose --------------------------------------------------------------------------------------------------------

Compose::Compose(std::vector<Transform> transforms) : transforms_(std::move(transforms)) {
  for (size_t i = 0; i < transforms_.size(); ++i)
    EMBER_CHECK(static_cast<bool>(transforms_[i]), ValueError, "Compose: transform ", i, " is empty");
}

Tensor Compose::operator()(const Tensor& x, Generator& rng) const {
  Tensor y = x;
  for (const Transform& t : transforms_) y = t(y, rng);
  return y;
}

}  // namespace ember::data
