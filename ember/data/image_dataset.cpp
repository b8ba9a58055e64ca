// ImageDataset's checks, sample access and factories from the MNIST and CIFAR-10 readers. Invariant: images_ is
// always 4-d (a 2-d image stack gains a unit channel dimension as a view) and labels_ contiguous, so get() is a
// select and one load.
#include "ember/data/image_dataset.h"

#include <utility>

#include "ember/base/error.h"
#include "ember/data/cifar.h"
#include "ember/data/mnist.h"

namespace ember::data {

ImageDataset::ImageDataset(Tensor images, Tensor labels) {
  EMBER_CHECK(images.defined() && labels.defined(), ValueError, "ImageDataset: images and labels must be defined");
  EMBER_CHECK(images.device().is_cpu() && labels.device().is_cpu(), DeviceError,
              "ImageDataset: images and labels must be on the CPU, got ", images.description(), " and ",
              labels.description());
  EMBER_CHECK(images.dtype() == DType::u8, DTypeError, "ImageDataset: images must be u8, got ",
              images.description());
  EMBER_CHECK(labels.dtype() == DType::i64, DTypeError, "ImageDataset: labels must be i64, got ",
              labels.description());
  EMBER_CHECK(images.dim() == 3 || images.dim() == 4, ShapeError,
              "ImageDataset: images must be [N, H, W] or [N, C, H, W], got ", shape_str(images.sizes()));
  EMBER_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0), ShapeError, "ImageDataset: labels must be [",
              images.size(0), "] for images ", shape_str(images.sizes()), ", got ", shape_str(labels.sizes()));
  images_ = images.dim() == 3 ? images.unsqueeze(1) : std::move(images);
  labels_ = labels.contiguous();
}

ImageDataset ImageDataset::from(const MnistData& data) { return ImageDataset(data.images, data.labels); }

ImageDataset ImageDataset::from(const Cifar10Data& data) { return ImageDataset(data.images, data.labels); }

Example ImageDataset::get(int64_t index, Generator& /*rng*/) const {
  EMBER_CHECK(index >= 0 && index < size(), IndexError, "ImageDataset: index ", index, " is out of range for ",
              size(), " images");
  Tensor target = empty({}, {DType::i64, Device::cpu()});
  *target.data<int64_t>() = labels_.data<int64_t>()[index];
  return {images_.select(0, index), std::move(target)};
}

}  // namespace ember::data
