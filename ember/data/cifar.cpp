// CIFAR-10 binary reading. Invariant: every file's size is validated (non-empty, whole records) before the result
// is allocated, and every label byte is checked to be a class 0..9 before the data is returned.
#include "ember/data/cifar.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "ember/base/error.h"
#include "ember/data/file_io.h"

namespace ember::data {

namespace {

constexpr const char* kArchiveFolder = "cifar-10-batches-bin";

// The number of records in an input of `size` bytes (`label` names it), from its size alone.
int64_t records_in(int64_t size, const std::string& label) {
  EMBER_CHECK(size > 0, FormatError, "CIFAR-10: ", label, " is empty; a batch file holds records of ",
              kCifar10RecordBytes, " bytes (1 label + ", kCifar10ImageBytes, " pixels)");
  const int64_t left_over = size % kCifar10RecordBytes;
  EMBER_CHECK(left_over == 0, FormatError, "CIFAR-10: ", label, " has ", size, " bytes, not a whole number of ",
              kCifar10RecordBytes, "-byte records: ", left_over, " bytes are left over after ",
              size / kCifar10RecordBytes, " records");
  return size / kCifar10RecordBytes;
}

// The number of records in the batch file at `path`, from its size alone.
int64_t count_records(const std::string& path) {
  const std::optional<int64_t> size = io::file_size(path);
  EMBER_CHECK(size.has_value(), ValueError, "CIFAR-10: no file '", path, "'");
  return records_in(*size, "'" + path + "'");
}

// Splits `count` whole records at `buf` (record `first` onwards) into images and labels, checking each label.
void split_records(const unsigned char* buf, int64_t first, int64_t count, const std::string& label, uint8_t* images,
                   int64_t* labels) {
  for (int64_t r = 0; r < count; ++r) {
    const unsigned char* rec = buf + r * kCifar10RecordBytes;
    const int64_t index = first + r;
    EMBER_CHECK(rec[0] <= 9, FormatError, "CIFAR-10: ", label, ": record ", index, " (byte ",
                index * kCifar10RecordBytes, ") has label ", static_cast<int>(rec[0]), ", not a class 0..9");
    labels[index] = rec[0];
    std::memcpy(images + index * kCifar10ImageBytes, rec + 1, kCifar10ImageBytes);
  }
}

// Reads the n records of `path` into images (n * 3072 bytes) and labels (n values), checking each label.
void read_records(const std::string& path, int64_t n, uint8_t* images, int64_t* labels) {
  const io::ReadOnlyFile file(path);
  const std::string label = "'" + path + "'";
  constexpr int64_t kRecordsPerRead = 256;  // 768 KiB of staging
  std::vector<unsigned char> buf(static_cast<size_t>(std::min(n, kRecordsPerRead) * kCifar10RecordBytes));
  for (int64_t first = 0; first < n; first += kRecordsPerRead) {
    const int64_t count = std::min(kRecordsPerRead, n - first);
    const int64_t want = count * kCifar10RecordBytes;
    const int64_t got = file.read_at(first * kCifar10RecordBytes, buf.data(), want);
    EMBER_CHECK(got == want, FormatError, "CIFAR-10: ", label, " was truncated while being read: it had ",
                n * kCifar10RecordBytes, " bytes but ends after ", first * kCifar10RecordBytes + got);
    split_records(buf.data(), first, count, label, images, labels);
  }
}

// Reads the given batch files, in order, into one Cifar10Data.
Cifar10Data read_files(const std::vector<std::string>& paths) {
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const std::string& p : paths) {
    counts.push_back(count_records(p));
    total += counts.back();
  }
  Cifar10Data d;
  d.images = empty({total, 3, kCifar10Side, kCifar10Side}, {DType::u8, Device::cpu()});
  d.labels = empty({total}, {DType::i64, Device::cpu()});
  int64_t at = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    read_records(paths[i], counts[i], d.images.data<uint8_t>() + at * kCifar10ImageBytes,
                 d.labels.data<int64_t>() + at);
    at += counts[i];
  }
  return d;
}

}  // namespace

Cifar10Data read_cifar10_batch(const std::string& path) { return read_files({path}); }

Cifar10Data parse_cifar10_batch(std::string_view bytes, const std::string& name) {
  const int64_t n = records_in(static_cast<int64_t>(bytes.size()), name);  // sized before anything is allocated
  Cifar10Data d;
  d.images = empty({n, 3, kCifar10Side, kCifar10Side}, {DType::u8, Device::cpu()});
  d.labels = empty({n}, {DType::i64, Device::cpu()});
  split_records(reinterpret_cast<const unsigned char*>(bytes.data()), 0, n, name, d.images.data<uint8_t>(),
                d.labels.data<int64_t>());
  return d;
}

Cifar10Data load_cifar10(const std::string& dir, bool train) {
  std::vector<std::string> names;
  if (train) {
    for (int k = 1; k <= 5; ++k) names.push_back("data_batch_" + std::to_string(k) + ".bin");
  } else {
    names.push_back("test_batch.bin");
  }
  // The files themselves, or the folder the archive unpacks to: whichever holds the first file.
  std::string base = dir;
  const std::string nested = dir + "/" + kArchiveFolder;
  if (!io::is_file(dir + "/" + names[0]) && io::is_directory(nested)) base = nested;
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    const std::string p = base + "/" + name;
    EMBER_CHECK(io::is_file(p), ValueError, "load_cifar10: missing ", train ? "training" : "test", " file '", p,
                "' (expected ", train ? "data_batch_1.bin .. data_batch_5.bin" : "test_batch.bin", " in '", dir,
                "' or in '", nested, "')");
    paths.push_back(p);
  }
  return read_files(paths);
}

}  // namespace ember::data
