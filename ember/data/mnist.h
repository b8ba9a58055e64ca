// MNIST: the IDX file reader (raw or gzipped), a generated digit-like stand-in for machines without the data, and the
// standard normalisation. Invariant: a returned MnistData has images u8 [N, rows, cols] and labels i64 [N], N equal,
// on the CPU; the loader returns it only after the files passed every check (magic, dims, counts, exact length).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ember/core/tensor.h"

namespace ember::data {

struct MnistData {
  Tensor images;  // u8 [N, 28, 28] for MNIST (the files' rows and cols in general), 0 = background
  Tensor labels;  // i64 [N], digits 0..9
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// Loads the training (60000) or test (10000) set from `dir`, which holds the four files under their usual names
// (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-...; a '.' instead of the last '-' is accepted too), raw or
// with a .gz suffix. ValueError when the files are not there; FormatError naming the file when one is malformed.
MnistData load_mnist(const std::string& dir, bool train);

// The IDX parsers behind load_mnist, for one file each (raw or .gz by the file's suffix):
// images: magic 0x00000803, u32 big-endian N, rows, cols, then N*rows*cols bytes -> u8 [N, rows, cols];
// labels: magic 0x00000801, u32 big-endian N, then N bytes -> i64 [N].
// Every size the header declares is checked against the input's length before anything is allocated from it.
Tensor read_idx_images(const std::string& path);
Tensor read_idx_labels(const std::string& path);
// The same parsers over a file's bytes in memory (gzip-compressed when `gzipped`); `name` names the input in errors.
// The path versions above run the same code.
Tensor parse_idx_images(std::string_view bytes, bool gzipped = false, const std::string& name = "IDX bytes");
Tensor parse_idx_labels(std::string_view bytes, bool gzipped = false, const std::string& name = "IDX bytes");

// Whether this build reads .gz files (zlib was found at build time); without it they raise FormatError.
bool gzip_supported();

// n generated 28x28 digit images with labels drawn uniformly from 0..9: each class is a distinct seven-segment-like
// stroke figure, randomly shifted, scaled, slanted and thickened, with pixel noise. Deterministic in (n, seed); uses
// its own Philox stream, never the default generator.
MnistData synthetic_mnist(int64_t n, uint64_t seed = 0);

// MNIST's training-set statistics (pytorch/examples/mnist).
inline constexpr double kMnistMean = 0.1307;
inline constexpr double kMnistStd = 0.3081;

// u8 images [N, H, W] (or [N, 1, H, W]) -> f32 [N, 1, H, W] with (x / 255 - mean) / std, on the images' device.
Tensor normalize_mnist(const Tensor& images, double mean = kMnistMean, double std = kMnistStd);

}  // namespace ember::data
