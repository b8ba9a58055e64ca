// MNIST: tiny IDX files assembled here byte by byte (raw, and gzipped with hand-made stored deflate blocks so zlib is
// not its own reference), every malformed file rejected with FormatError naming it, the real data set when it is
// present beside the project, the synthetic digits and normalisation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ember/data/mnist.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using data::MnistData;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ember_mnist_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}
std::string le16(uint32_t v) { return {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff)}; }
std::string le32(uint32_t v) { return le16(v & 0xffff) + le16(v >> 16); }

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels) {
  return be32(0x00000803) + be32(n) + be32(rows) + be32(cols) + std::string(pixels.begin(), pixels.end());
}
std::string idx_labels(const std::vector<uint8_t>& labels) {
  return be32(0x00000801) + be32(static_cast<uint32_t>(labels.size())) + std::string(labels.begin(), labels.end());
}

// CRC-32 (IEEE, reflected, as gzip's trailer uses), bit by bit.
uint32_t crc32(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// RFC 1952 gzip member holding RFC 1951 "stored" (uncompressed) deflate blocks.
std::string gzip_stored(const std::string& data) {
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(65535, data.size() - pos);
    const bool last = pos + len == data.size();
    out += static_cast<char>(last ? 1 : 0);
    out += le16(static_cast<uint32_t>(len)) + le16(static_cast<uint32_t>(~len & 0xffff));
    out += data.substr(pos, len);
    pos += len;
  } while (pos < data.size());
  return out + le32(crc32(data)) + le32(static_cast<uint32_t>(data.size()));
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 % 256);
  return v;
}

void expect_tiny(const MnistData& d) {
  ASSERT_EQ(d.images.dtype(), DType::u8);
  ASSERT_EQ(d.images.sizes(), (Shape{2, 3, 4}));
  ASSERT_EQ(d.labels.dtype(), DType::i64);
  ASSERT_EQ(d.labels.sizes(), (Shape{2}));
  EXPECT_EQ(d.size(), 2);
  const std::vector<uint8_t> px = iota_bytes(24);
  EXPECT_EQ(d.images.to_vector<int64_t>(), std::vector<int64_t>(px.begin(), px.end()));
  EXPECT_EQ(d.images.select(0, 1).select(0, 2).to_vector<int64_t>(), (std::vector<int64_t>{140, 147, 154, 161}));
  EXPECT_EQ(d.labels.to_vector<int64_t>(), (std::vector<int64_t>{7, 3}));
}

// Expects FormatError whose message names `file` and contains `part`.
template <class Fn>
void expect_format_error(Fn fn, const std::string& file, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(Mnist, ParsesHandBuiltRawFiles) {
  TempDir dir;
  write_bytes(dir.path / "train-images-idx3-ubyte", idx_images(2, 3, 4, iota_bytes(24)));
  write_bytes(dir.path / "train-labels-idx1-ubyte", idx_labels({7, 3}));
  expect_tiny(data::load_mnist(dir.path.string(), true));
  EXPECT_THROW((void)data::load_mnist(dir.path.string(), false), ValueError);  // no t10k files
}

TEST(Mnist, AcceptsDotSeparatedNames) {
  TempDir dir;
  write_bytes(dir.path / "t10k-images.idx3-ubyte", idx_images(2, 3, 4, iota_bytes(24)));
  write_bytes(dir.path / "t10k-labels.idx1-ubyte", idx_labels({7, 3}));
  expect_tiny(data::load_mnist(dir.path.string(), false));
}

TEST(Mnist, ParsesHandBuiltGzipFiles) {
  TempDir dir;
  write_bytes(dir.path / "t10k-images-idx3-ubyte.gz", gzip_stored(idx_images(2, 3, 4, iota_bytes(24))));
  write_bytes(dir.path / "t10k-labels-idx1-ubyte.gz", gzip_stored(idx_labels({7, 3})));
  if (!data::gzip_supported()) {
    expect_format_error([&] { (void)data::load_mnist(dir.path.string(), false); }, "t10k-images-idx3-ubyte.gz",
                        "without zlib");
    GTEST_SKIP() << "ember was built without zlib";
  }
  expect_tiny(data::load_mnist(dir.path.string(), false));

  // Several stored blocks (a payload over 64 KiB).
  const std::vector<uint8_t> big = iota_bytes(100 * 28 * 28);
  write_bytes(dir.path / "big-images.gz", gzip_stored(idx_images(100, 28, 28, big)));
  const Tensor images = data::read_idx_images((dir.path / "big-images.gz").string());
  EXPECT_EQ(images.sizes(), (Shape{100, 28, 28}));
  EXPECT_EQ(images.to_vector<int64_t>(), std::vector<int64_t>(big.begin(), big.end()));
}

TEST(Mnist, MalformedFilesRaiseFormatErrorNamingTheFile) {
  TempDir dir;
  const auto file = [&](const std::string& name, const std::string& bytes) {
    write_bytes(dir.path / name, bytes);
    return (dir.path / name).string();
  };
  const std::string good = idx_images(2, 3, 4, iota_bytes(24));
  const auto images = [](const std::string& p) { return [p] { (void)data::read_idx_images(p); }; };
  const auto labels = [](const std::string& p) { return [p] { (void)data::read_idx_labels(p); }; };

  expect_format_error(images(file("labels-as-images", idx_labels({1, 2}))), "labels-as-images", "magic");
  expect_format_error(labels(file("images-as-labels", good)), "images-as-labels", "magic");
  expect_format_error(images(file("bad-magic", be32(0x00000804) + good.substr(4))), "bad-magic", "magic");
  expect_format_error(images(file("empty-file", "")), "empty-file", "truncated");
  expect_format_error(images(file("short-header", good.substr(0, 10))), "short-header", "truncated");
  expect_format_error(images(file("short-data", good.substr(0, good.size() - 1))), "short-data", "truncated");
  expect_format_error(images(file("trailing", good + "xy")), "trailing", "2 trailing bytes");
  expect_format_error(labels(file("labels-trailing", idx_labels({1, 2}) + "z")), "labels-trailing", "trailing");
  expect_format_error(labels(file("labels-short", idx_labels({1, 2, 3}).substr(0, 10))), "labels-short",
                      "truncated");
  expect_format_error(images(file("zero-rows", idx_images(2, 0, 4, {}))), "zero-rows", "is 0");
  expect_format_error(images(file("huge-dims", be32(0x803) + be32(0xffffffff) + be32(0xffffffff) + be32(9))),
                      "huge-dims", "implausible");

  // Files that are fine alone but disagree with each other, or hold a label that is not a digit.
  TempDir set;
  write_bytes(set.path / "train-images-idx3-ubyte", good);
  write_bytes(set.path / "train-labels-idx1-ubyte", idx_labels({1, 2, 3}));
  expect_format_error([&] { (void)data::load_mnist(set.path.string(), true); }, "train-labels-idx1-ubyte",
                      "3 labels");
  write_bytes(set.path / "train-labels-idx1-ubyte", idx_labels({1, 10}));
  expect_format_error([&] { (void)data::load_mnist(set.path.string(), true); }, "train-labels-idx1-ubyte",
                      "not a digit");

  if (data::gzip_supported()) {
    const std::string gz = gzip_stored(good);
    expect_format_error(images(file("cut.gz", gz.substr(0, gz.size() - 12))), "cut.gz", "");
    std::string bad_crc = gz;
    bad_crc[bad_crc.size() - 8] ^= 0x55;
    expect_format_error(images(file("crc.gz", bad_crc)), "crc.gz", "gzip");
    expect_format_error(images(file("trailing.gz", gzip_stored(good + "!"))), "trailing.gz", "1 trailing bytes");
  }
}

// Where the real data sets live beside the project (DESIGN.md: ../shared/data), or $EMBER_DATA_DIR.
fs::path shared_data_dir() {
  if (const char* env = std::getenv("EMBER_DATA_DIR")) return env;
  return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path() / "shared" / "data";
}

TEST(Mnist, RealDataWhenPresent) {
  const fs::path dir = shared_data_dir() / "mnist";
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz") && !fs::exists(dir / "train-images-idx3-ubyte"))
    GTEST_SKIP() << "no MNIST files in " << dir;
  if (!data::gzip_supported() && !fs::exists(dir / "train-images-idx3-ubyte"))
    GTEST_SKIP() << "ember was built without zlib and the MNIST files are gzipped";
  const MnistData train = data::load_mnist(dir.string(), true);
  EXPECT_EQ(train.images.sizes(), (Shape{60000, 28, 28}));
  EXPECT_EQ(train.labels.sizes(), (Shape{60000}));
  EXPECT_EQ(train.labels.slice(0, 0, 5).to_vector<int64_t>(), (std::vector<int64_t>{5, 0, 4, 1, 9}));
  const MnistData test = data::load_mnist(dir.string(), false);
  EXPECT_EQ(test.images.sizes(), (Shape{10000, 28, 28}));
  EXPECT_EQ(test.labels.slice(0, 0, 5).to_vector<int64_t>(), (std::vector<int64_t>{7, 2, 1, 0, 4}));
  // Every class is present in the training set, about 6000 times each (5421 .. 6742).
  std::vector<int64_t> counts(10, 0);
  for (int64_t l : train.labels.to_vector<int64_t>()) ++counts[static_cast<size_t>(l)];
  EXPECT_EQ(counts[1], 6742);
  EXPECT_EQ(counts[5], 5421);
  // The first image (a 5): the border is blank and the ink reaches 255.
  const std::vector<int64_t> first = train.images.select(0, 0).to_vector<int64_t>();
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(*std::max_element(first.begin(), first.end()), 255);
}

TEST(Mnist, NormalizeMatchesFormula) {
  const Tensor images = from_vector<uint8_t>({0, 255, 128, 51}, {1, 2, 2});
  const Tensor x = data::normalize_mnist(images);
  EXPECT_EQ(x.dtype(), DType::f32);
  EXPECT_EQ(x.sizes(), (Shape{1, 1, 2, 2}));
  const std::vector<double> want = {(0.0 - 0.1307) / 0.3081, (1.0 - 0.1307) / 0.3081,
                                    (128.0 / 255.0 - 0.1307) / 0.3081, (0.2 - 0.1307) / 0.3081};
  const std::vector<double> got = x.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  EXPECT_EQ(data::normalize_mnist(images.view({1, 1, 2, 2})).sizes(), (Shape{1, 1, 2, 2}));
  EXPECT_THROW((void)data::normalize_mnist(images.to(DType::f32)), DTypeError);
  EXPECT_THROW((void)data::normalize_mnist(images.view({4})), ShapeError);
}

TEST(Mnist, SyntheticDigitsAreDeterministicAndLearnable) {
  const MnistData a = data::synthetic_mnist(2000, 7);
  EXPECT_EQ(a.images.sizes(), (Shape{2000, 28, 28}));
  EXPECT_EQ(a.images.dtype(), DType::u8);
  EXPECT_EQ(a.labels.sizes(), (Shape{2000}));
  const MnistData b = data::synthetic_mnist(2000, 7);
  EXPECT_EQ(a.images.to_vector<int64_t>(), b.images.to_vector<int64_t>());
  EXPECT_EQ(a.labels.to_vector<int64_t>(), b.labels.to_vector<int64_t>());
  EXPECT_NE(a.labels.to_vector<int64_t>(), data::synthetic_mnist(2000, 8).labels.to_vector<int64_t>());
  EXPECT_EQ(data::synthetic_mnist(0, 1).images.sizes(), (Shape{0, 28, 28}));

  // Labels cover 0..9 about evenly; images have a blank-ish border and inked strokes.
  const std::vector<int64_t> labels = a.labels.to_vector<int64_t>();
  const std::vector<int64_t> px = a.images.to_vector<int64_t>();
  std::vector<int64_t> counts(10, 0);
  for (int64_t l : labels) {
    ASSERT_GE(l, 0);
    ASSERT_LE(l, 9);
    ++counts[static_cast<size_t>(l)];
  }
  for (int64_t c : counts) EXPECT_GT(c, 140);
  double mean = 0;
  for (int64_t v : px) mean += static_cast<double>(v) / 255.0;
  mean /= static_cast<double>(px.size());
  EXPECT_GT(mean, 0.05);  // MNIST's is 0.13
  EXPECT_LT(mean, 0.30);

  // The classes are separable: a nearest-class-mean classifier fitted on the first half labels the second half
  // mostly right (a CNN does far better; chance is 10%).
  const int64_t half = 1000, npx = 28 * 28;
  std::vector<double> means(10 * npx, 0.0);
  std::vector<double> fit_counts(10, 0.0);
  for (int64_t i = 0; i < half; ++i) {
    fit_counts[labels[i]] += 1;
    for (int64_t p = 0; p < npx; ++p) means[labels[i] * npx + p] += static_cast<double>(px[i * npx + p]);
  }
  for (int c = 0; c < 10; ++c)
    for (int64_t p = 0; p < npx; ++p) means[c * npx + p] /= std::max(fit_counts[c], 1.0);
  int64_t right = 0;
  for (int64_t i = half; i < 2 * half; ++i) {
    int best = -1;
    double best_d = 0;
    for (int c = 0; c < 10; ++c) {
      double dist = 0;
      for (int64_t p = 0; p < npx; ++p) {
        const double e = static_cast<double>(px[i * npx + p]) - means[c * npx + p];
        dist += e * e;
      }
      if (best < 0 || dist < best_d) best = c, best_d = dist;
    }
    right += best == labels[i];
  }
  std::printf("synthetic_mnist: nearest-mean accuracy %.3f\n", static_cast<double>(right) / half);
  EXPECT_GT(right, 700);
}

TEST(Mnist, ForgedHeaderIsRejectedBeforeAllocating) {
  // An 8-byte label file whose header claims 2^32 - 1 labels: refused from the file size, without allocating 4 GiB.
  TempDir dir;
  const std::string forged("\x00\x00\x08\x01\xff\xff\xff\xff", 8);
  write_bytes(dir.path / "forged", forged);
  memory::cpu_allocator().reset_peak_stats();
  const int64_t before = memory::cpu_allocator().stats().allocated_bytes;
  expect_format_error([&] { (void)data::read_idx_labels((dir.path / "forged").string()); }, "forged", "truncated");
  EXPECT_LT(memory::cpu_allocator().stats().peak_allocated_bytes - before, int64_t{1} << 20);
}

}  // namespace
}  // namespace ember::testing
