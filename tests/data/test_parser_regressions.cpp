// The data parsers' in-memory entry points (parse_idx_images / parse_idx_labels / parse_cifar10_batch, the ones the
// fuzz targets drive) and their size bounds, plus the inputs the fuzz campaigns found (fuzz/regressions/), each as
// a typed-error case. Files are assembled byte by byte here; gzip uses hand-made stored blocks so zlib is not its own
// reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/data/cifar.h"
#include "ember/data/mnist.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}
std::string le16(uint32_t v) { return {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff)}; }
std::string le32(uint32_t v) { return le16(v & 0xffff) + le16(v >> 16); }

uint32_t crc32(const std::string& s) {  // IEEE, reflected, bit by bit
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// One RFC 1952 member of stored deflate blocks.
std::string gzip_stored(const std::string& data) {
  std::string out("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(65535, data.size() - pos);
    out += static_cast<char>(pos + len == data.size() ? 1 : 0);
    out += le16(static_cast<uint32_t>(len)) + le16(static_cast<uint32_t>(~len & 0xffff));
    out += data.substr(pos, len);
    pos += len;
  } while (pos < data.size());
  return out + le32(crc32(data)) + le32(static_cast<uint32_t>(data.size()));
}

std::string images_file(uint32_t n, uint32_t rows, uint32_t cols) {
  std::string s = be32(0x803) + be32(n) + be32(rows) + be32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s += static_cast<char>(i * 5 % 256);
  return s;
}

template <class Fn>
std::string format_error(Fn fn) {
  return error_message<FormatError>(fn);
}

int64_t peak_growth(const std::function<void()>& fn) {
  memory::cpu_allocator().reset_peak_stats();
  const int64_t before = memory::cpu_allocator().stats().allocated_bytes;
  fn();
  return memory::cpu_allocator().stats().peak_allocated_bytes - before;
}

TEST(ParserBytes, IdxFromMemoryRawAndGzip) {
  const std::string raw = images_file(2, 3, 4);
  const Tensor a = data::parse_idx_images(raw);
  EXPECT_EQ(a.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(a.to_vector<int64_t>()[23], 23 * 5);
  if (!data::gzip_supported()) {
    EXPECT_THROW((void)data::parse_idx_images(gzip_stored(raw), true), FormatError);
    GTEST_SKIP() << "built without zlib";
  }
  EXPECT_EQ(data::parse_idx_images(gzip_stored(raw), true).to_vector<int64_t>(), a.to_vector<int64_t>());
  // Concatenated members decompress to their concatenation, as gzip -d does.
  const Tensor two = data::parse_idx_images(gzip_stored(raw.substr(0, 9)) + gzip_stored(raw.substr(9)), true);
  EXPECT_EQ(two.to_vector<int64_t>(), a.to_vector<int64_t>());
  const Tensor labels = data::parse_idx_labels(gzip_stored(be32(0x801) + be32(3) + std::string("\x07\x00\x09", 3)),
                                               true, "my labels");
  EXPECT_EQ(labels.dtype(), DType::i64);
  EXPECT_EQ(labels.to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));
}

TEST(ParserBytes, IdxMalformedBytesAreFormatErrorsNamingTheInput) {
  const std::string raw = images_file(2, 3, 4);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(raw + "x", false, "in-memory"); }).find("in-memory"),
            std::string::npos);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(raw + "x"); }).find("1 trailing bytes"),
            std::string::npos);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(raw.substr(0, 30)); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_labels(raw); }).find("magic"), std::string::npos);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(""); }).find("truncated"), std::string::npos);
  if (!data::gzip_supported()) GTEST_SKIP() << "built without zlib";
  const std::string gz = gzip_stored(raw);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(gz.substr(0, gz.size() - 5), true); }).find("gzip"),
            std::string::npos);
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(gz + "junk", true); }).find("not gzip data"),
            std::string::npos);
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0x01;
  EXPECT_NE(format_error([&] { (void)data::parse_idx_images(bad_crc, true); }).find("corrupt gzip"),
            std::string::npos);
  EXPECT_THROW((void)data::parse_idx_images("", true), FormatError);
  EXPECT_THROW((void)data::parse_idx_images(raw, true), FormatError);  // raw bytes are not gzip
}

TEST(ParserBytes, IdxDeclaredSizesAreBoundedBeforeAllocating) {
  // Raw: 16 bytes announcing 2^32-1 x 255 x 255 images; gzip: a 30-byte member announcing 2^31-1 labels (more than
  // deflate's 1032:1 can expand 30 bytes to). Both refused without allocating more than a few KiB.
  const std::string forged = be32(0x803) + be32(0xffffffffu) + be32(255) + be32(255);
  int64_t grew = peak_growth([&] { EXPECT_THROW((void)data::parse_idx_images(forged), FormatError); });
  EXPECT_LT(grew, int64_t{1} << 20);
  if (!data::gzip_supported()) GTEST_SKIP() << "built without zlib";
  const std::string bomb = gzip_stored(be32(0x801) + be32(0x7fffffffu));
  std::string msg;
  grew = peak_growth([&] { msg = format_error([&] { (void)data::parse_idx_labels(bomb, true); }); });
  EXPECT_NE(msg.find("1032:1"), std::string::npos) << msg;
  EXPECT_LT(grew, int64_t{1} << 20);
}

std::string cifar_record(uint8_t label, uint8_t fill) { return std::string(1, static_cast<char>(label)) +
                                                               std::string(3072, static_cast<char>(fill)); }

TEST(ParserBytes, CifarFromMemory) {
  const data::Cifar10Data d = data::parse_cifar10_batch(cifar_record(3, 10) + cifar_record(9, 200));
  EXPECT_EQ(d.images.sizes(), (Shape{2, 3, 32, 32}));
  EXPECT_EQ(d.labels.to_vector<int64_t>(), (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(d.images.select(0, 1).to_vector<int64_t>(), std::vector<int64_t>(3072, 200));
  std::string msg = format_error([&] { (void)data::parse_cifar10_batch(""); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  msg = format_error([&] { (void)data::parse_cifar10_batch(cifar_record(1, 0) + "abc", "batch in memory"); });
  EXPECT_NE(msg.find("batch in memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 bytes are left over"), std::string::npos) << msg;
  msg = format_error([&] { (void)data::parse_cifar10_batch(cifar_record(1, 0) + cifar_record(10, 0)); });
  EXPECT_NE(msg.find("record 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 10"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ember::testing
