// Per-sample image transforms for CPU tensors (torchvision-like): ToTensor, Normalize, random flips and crops,
// RandomResizedCrop, Compose, and the pad/crop/resize/flip helpers they are built from. Invariant: images are
// channels-first ([C, H, W], or [H, W] where accepted), and every random draw comes from the generator passed in.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "ember/core/generator.h"
#include "ember/core/tensor.h"
#include "ember/data/dataset.h"

namespace ember::data {

// --- helpers (deterministic) --------------------------------------------------------------------------------------
// Each takes a CPU image of rank 2 ([H, W]) or 3 ([C, H, W]) of any dtype unless noted, returns a new contiguous
// tensor of the same rank and dtype (ShapeError for another rank, DeviceError off the CPU).

// The image with `left`/`top`/`right`/`bottom` columns/rows of the constant `fill` (cast to the image's dtype as
// Tensor::fill_ casts) added around it. ValueError for a negative padding.
Tensor pad_constant(const Tensor& x, int64_t left, int64_t top, int64_t right, int64_t bottom, double fill);
// The h x w window whose top-left corner is (top, left). IndexError when the window leaves the image, ValueError for
// h or w < 1.
Tensor crop(const Tensor& x, int64_t top, int64_t left, int64_t h, int64_t w);
// The image resized to h x w by bilinear interpolation, align_corners = false, no antialiasing (Note [Bilinear
// resize] in transforms.cpp). Floating dtypes keep their dtype; u8 results are rounded to nearest and clamped to
// [0, 255]; other dtypes: DTypeError. ValueError for h or w < 1.
Tensor resize_bilinear(const Tensor& x, int64_t h, int64_t w);
// The image mirrored along its last dimension.
Tensor hflip(const Tensor& x);

// --- transforms (each converts to Transform) ------------------------------------------------------------------------

// u8 [H, W] -> f32 [1, H, W] and u8 [C, H, W] -> f32 [C, H, W], values / 255. Floating input (f32/f64/f16/bf16)
// becomes f32 with its values unchanged (rank 2 also gains the channel dim). Other dtypes: DTypeError; other
// ranks: ShapeError. Always returns a new tensor.
class ToTensor {
 public:
  Tensor operator()(const Tensor& x, Generator& rng) const;
};

// f32 [C, H, W] -> (x - mean[c]) / std[c], a new tensor. One-element mean/std apply to every channel; otherwise
// their sizes must equal C (ShapeError). Empty vectors or a std <= 0: ValueError at construction. Non-f32 input:
// DTypeError; rank other than 3: ShapeError.
class Normalize {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor operator()(const Tensor& x, Generator& rng) const;

 private:
  std::vector<double> mean_, std_;
};

// Flips the last dim with probability p: always draws one uniform(rng) and flips when it is < p; otherwise returns
// x itself. Any dtype, rank 2 or 3. ValueError for p outside [0, 1].
class RandomHorizontalFlip {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor operator()(const Tensor& x, Generator& rng) const;

 private:
  double p_;
};

// Pads with the constant `fill`, then crops a random height x width window: the top offset randint(rng, Hp - height
// + 1) is drawn first, then the left one randint(rng, Wp - width + 1) (both drawn even when the range is 1, so every
// call consumes two draws). Any dtype, rank 2 or 3. ShapeError when the window exceeds the padded image; ValueError
// for a size < 1 or a negative padding.
class RandomCrop {
 public:
  RandomCrop(int64_t height, int64_t width, int64_t padding = 0, double fill = 0);
  // Paddings {left, top, right, bottom}, as torchvision's four-element padding.
  RandomCrop(int64_t height, int64_t width, std::array<int64_t, 4> padding, double fill = 0);
  Tensor operator()(const Tensor& x, Generator& rng) const;

 private:
  int64_t height_, width_;
  std::array<int64_t, 4> padding_;  // left, top, right, bottom
  double fill_;
};

// torchvision's RandomResizedCrop: a random window of relative area in `scale` and aspect ratio (w / h) in `ratio`
// (log-uniform) is picked as torchvision's get_params does (Note [RandomResizedCrop parameters] in transforms.cpp),
// then resized to height x width with resize_bilinear. Floating and u8 images, rank 2 or 3. ValueError for a size
// < 1 or a scale/ratio range with lo > hi or a non-positive bound.
class RandomResizedCrop {
 public:
  struct Window {
    int64_t top, left, h, w;
  };

  RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale = {0.08, 1.0},
                    std::pair<double, double> ratio = {3.0 / 4, 4.0 / 3});
  Tensor operator()(const Tensor& x, Generator& rng) const;
  // The window picked for an image of image_h x image_w (the draws operator() makes, in the same order).
  Window get_params(int64_t image_h, int64_t image_w, Generator& rng) const;

 private:
  int64_t height_, width_;
  std::pair<double, double> scale_, ratio_;
};

// Applies its transforms in order, each with the same generator. ValueError for an empty (null) Transform.
class Compose {
 public:
  explicit Compose(std::vector<Transform> transforms);
  Tensor operator()(const Tensor& x, Generator& rng) const;

 private:
  std::vector<Transform> transforms_;
};

}  // namespace ember::data
