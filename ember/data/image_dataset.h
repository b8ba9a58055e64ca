// ImageDataset: a random-access Dataset over a stack of u8 images and their i64 class labels (MNIST, Fashion-MNIST,
// CIFAR-10, or any tensors of that form). Invariant: images are u8 [N, H, W] or [N, C, H, W] and labels i64 [N] on
// the CPU, N equal; get(i) returns a [C, H, W] view of image i (C = 1 for 2-d images) and its label as an i64 0-d.
#pragma once

#include <cstdint>

#include "ember/core/tensor.h"
#include "ember/data/dataset.h"

namespace ember::data {

struct MnistData;
struct Cifar10Data;

class ImageDataset final : public Dataset {
 public:
  // DTypeError unless images are u8 and labels i64; ShapeError unless images are 3-d or 4-d and labels are [N] with
  // N = images.size(0); DeviceError for tensors off the CPU. Shares the tensors' storage (no copy).
  ImageDataset(Tensor images, Tensor labels);
  // MNIST and Fashion-MNIST (same IDX layout): u8 [N, 28, 28] -> samples u8 [1, 28, 28].
  static ImageDataset from(const MnistData& data);
  // CIFAR-10: u8 [N, 3, 32, 32] -> samples u8 [3, 32, 32].
  static ImageDataset from(const Cifar10Data& data);

  int64_t size() const override { return labels_.numel(); }
  // data: image `index` as u8 [C, H, W] (a view of the images tensor); target: its label, i64 0-d. IndexError
  // outside [0, size()). `rng` is unused: the images are stored, not generated.
  Example get(int64_t index, Generator& rng) const override;
  using Dataset::get;

  const Tensor& images() const { return images_; }  // u8 [N, C, H, W] (a [N, 1, H, W] view for 2-d images)
  const Tensor& labels() const { return labels_; }  // i64 [N], contiguous
  int64_t channels() const { return images_.size(1); }
  int64_t height() const { return images_.size(2); }
  int64_t width() const { return images_.size(3); }

 private:
  Tensor images_, labels_;
};

}  // namespace ember::data
