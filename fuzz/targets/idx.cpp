// Fuzz target: the MNIST IDX readers (data::parse_idx_images / parse_idx_labels, raw or gzip-compressed). The first
// byte picks the reader (bit 0: labels) and the layer (bit 1: gzip); the rest is the file. Invariant checked: bytes
// are rejected with an ember::Error, or the tensor they give re-encodes to the same raw file (and for gzip input,
// the raw re-encoding parses to the same tensor).
#include <cstring>
#include <string>
#include <string_view>

#include "ember/base/error.h"
#include "ember/data/mnist.h"
#include "fuzz/fuzz_util.h"

using namespace ember;

namespace {

std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
}

// The raw IDX file of a parsed tensor: magic, big-endian dims, the u8 values.
std::string encode(const Tensor& t, bool labels) {
  std::string out = be32(labels ? 0x801 : 0x803);
  for (int64_t d : t.sizes()) out += be32(static_cast<uint32_t>(d));
  const Tensor u8 = t.to(DType::u8).contiguous();
  if (u8.numel() > 0) out.append(static_cast<const char*>(u8.raw_data()), static_cast<size_t>(u8.numel()));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool labels = data[0] & 1, gzipped = data[0] & 2;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (gzipped && !data::gzip_supported()) return 0;
  Tensor t;
  try {
    t = labels ? data::parse_idx_labels(bytes, gzipped) : data::parse_idx_images(bytes, gzipped);
  } catch (const Error&) {
    return 0;
  }
  FUZZ_CHECK(t.dim() == (labels ? 1 : 3), "rank");
  FUZZ_CHECK(t.dtype() == (labels ? DType::i64 : DType::u8), "dtype");
  if (labels) {  // values came from bytes
    const int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) FUZZ_CHECK(p[i] >= 0 && p[i] <= 255, "label byte range");
  }
  const std::string raw = encode(t, labels);
  if (!gzipped) {
    FUZZ_CHECK(raw == bytes, "a parsed raw file re-encodes to its own bytes");
  } else {
    const Tensor again = labels ? data::parse_idx_labels(raw) : data::parse_idx_images(raw);
    FUZZ_CHECK(encode(again, labels) == raw, "gzip and raw parse to the same tensor");
  }
  return 0;
}
