// CIFAR-10, binary version (https://www.cs.toronto.edu/~kriz/cifar.html): the batch-file reader, the train/test
// loader, the class names and the per-channel statistics. Invariant: a returned Cifar10Data has images u8
// [N, 3, 32, 32] and labels i64 [N] in 0..9 on the CPU, and came from files whose every byte was checked.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ember/core/tensor.h"

namespace ember::data {

struct Cifar10Data {
  Tensor images;  // u8 [N, 3, 32, 32], channels R, G, B, rows top to bottom
  Tensor labels;  // i64 [N], classes 0..9 (kCifar10Classes)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

inline constexpr int64_t kCifar10Side = 32;
inline constexpr int64_t kCifar10ImageBytes = 3 * kCifar10Side * kCifar10Side;  // 3072
inline constexpr int64_t kCifar10RecordBytes = 1 + kCifar10ImageBytes;          // label byte + pixels: 3073

inline constexpr std::array<const char*, 10> kCifar10Classes = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

// Per-channel (R, G, B) mean and standard deviation of the training set, on pixels scaled to [0, 1].
inline constexpr std::array<double, 3> kCifar10Mean = {0.4914, 0.4822, 0.4465};
inline constexpr std::array<double, 3> kCifar10Std = {0.2470, 0.2435, 0.2616};

// One batch file (data_batch_<k>.bin or test_batch.bin): records of 1 label byte and 3072 pixel bytes (1024 red,
// 1024 green, 1024 blue, each a row-major 32x32 plane). ValueError when the file cannot be opened; FormatError naming
// the file when it is empty, when its size is not a whole number of records (saying how many bytes are left over),
// or when a label is above 9. The size is checked before anything is allocated.
Cifar10Data read_cifar10_batch(const std::string& path);
// The same checks over a batch file's bytes in memory; `name` names the input in errors.
Cifar10Data parse_cifar10_batch(std::string_view bytes, const std::string& name = "CIFAR-10 bytes");

// The training set (data_batch_1.bin .. data_batch_5.bin, in that order: 50000 images) or the test set
// (test_batch.bin: 10000). `dir` holds the files or is the parent of cifar-10-batches-bin/ (the archive's folder).
// ValueError naming a missing file; FormatError as read_cifar10_batch. Reads straight into the result (no
// per-batch copies).
Cifar10Data load_cifar10(const std::string& dir, bool train);

}  // namespace ember::data
