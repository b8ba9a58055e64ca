// MNIST IDX reading (raw files directly, .gz through zlib when the build has it), the synthetic digit generator and
// normalisation. Invariant: a parsed file had exactly the bytes its header announces — no fewer, no more — and no
// size it declares is trusted before it is checked (Note [IDX bounds]).
#include "ember/data/mnist.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#if defined(EMBER_WITH_ZLIB)
#include <zlib.h>
#endif

#include "ember/base/error.h"
#include "ember/core/philox.h"
#include "ember/data/file_io.h"

namespace ember::data {

namespace {

using io::ends_with;
using io::is_file;

// Note [IDX bounds]
// Every size in an IDX header is checked before memory is allocated from it: the dims' product must be at most
// kMaxIdxBytes (1 TiB); a raw input must be exactly header + payload long (its length is known up front); a gzip
// input may announce at most kMaxDeflateRatio bytes per compressed byte (deflate's largest expansion is 1032:1), and
// its payload is still read in bounded chunks before the tensor is allocated, so memory grows only with bytes that
// really arrive. Gzip data is inflated from memory (a .gz path is read whole first: compressed files are small), so
// the path and the bytes entry points run the same code.
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 40;
constexpr uint64_t kMaxDeflateRatio = 1032;

// A sequential byte stream over a raw file, raw bytes in memory, or gzip data in memory (one or more concatenated
// members, as gzip writes them). read() returns the bytes it got: fewer than asked means the stream ended; a read
// error raises ValueError, corrupt, cut or trailing non-gzip data FormatError, each naming the input (`label`).
class ByteStream {
 public:
  // A raw file.
  ByteStream(const std::string& path, const std::string& label) : label_(label) {
    file_ = std::fopen(path.c_str(), "rb");
    EMBER_CHECK(file_ != nullptr, ValueError, "cannot open ", label_, ": ", std::strerror(errno));
  }
  // Bytes in memory, gzip-compressed when `gzipped`.
  ByteStream(std::string_view bytes, bool gzipped, const std::string& label)
      : label_(label), mem_(bytes), gzipped_(gzipped) {
    if (gzipped_) {
#if defined(EMBER_WITH_ZLIB)
      zs_ = std::make_unique<z_stream>();
      std::memset(zs_.get(), 0, sizeof(z_stream));
      EMBER_CHECK(inflateInit2(zs_.get(), 16 + MAX_WBITS) == Z_OK, Error, label_, ": cannot start zlib");
#else
      EMBER_THROW(FormatError, label_, " is gzipped and ember was built without zlib; gunzip it first");
#endif
    }
  }
  ~ByteStream() {
    if (file_) std::fclose(file_);
#if defined(EMBER_WITH_ZLIB)
    if (zs_) inflateEnd(zs_.get());
#endif
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  uint64_t read(void* dst, uint64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    if (file_) {
      uint64_t total = 0;
      while (total < n) {
        const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - total, 1u << 30));
        const size_t got = std::fread(p + total, 1, chunk, file_);
        EMBER_CHECK(!std::ferror(file_), ValueError, "cannot read ", label_, ": ", std::strerror(errno));
        total += got;
        if (got < chunk) break;
      }
      return total;
    }
    if (!gzipped_) {
      const uint64_t got = std::min<uint64_t>(n, mem_.size() - pos_);
      if (got > 0) std::memcpy(p, mem_.data() + pos_, got);
      pos_ += got;
      return got;
    }
    return inflate_into(p, n);
  }

  // Bytes left until the end of the stream (reads them).
  uint64_t drain() {
    std::vector<unsigned char> buf(1 << 16);
    uint64_t total = 0;
    for (;;) {
      const uint64_t got = read(buf.data(), buf.size());
      total += got;
      if (got < buf.size()) return total;
    }
  }

 private:
#if defined(EMBER_WITH_ZLIB)
  uint64_t inflate_into(unsigned char* p, uint64_t n) {
    uint64_t total = 0;
    while (total < n && !gz_done_) {
      z_stream& zs = *zs_;
      if (zs.avail_in == 0 && pos_ < mem_.size()) {  // feed the next piece of input (at most 1 GiB at a time)
        const uint64_t piece = std::min<uint64_t>(mem_.size() - pos_, 1u << 30);
        zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(mem_.data() + pos_));
        zs.avail_in = static_cast<uInt>(piece);
        pos_ += piece;
      }
      const uInt want = static_cast<uInt>(std::min<uint64_t>(n - total, 1u << 30));
      zs.next_out = p + total;
      zs.avail_out = want;
      const int r = inflate(&zs, Z_NO_FLUSH);
      total += want - zs.avail_out;
      if (r == Z_STREAM_END) {
        const uint64_t left = zs.avail_in + (mem_.size() - pos_);
        if (left == 0) {
          gz_done_ = true;
        } else {
          // Another member follows (concatenated gzip files decompress to their concatenation); anything else
          // after the data is not gzip.
          unsigned char next[2];
          const uint64_t have = peek(next, 2);
          EMBER_CHECK(have == 2 && next[0] == 0x1f && next[1] == 0x8b, FormatError, label_, ": ", left,
                      " bytes after the end of the gzip data are not gzip data");
          EMBER_CHECK(inflateReset(&zs) == Z_OK, FormatError, label_, ": corrupt gzip data");
        }
      } else if (r == Z_BUF_ERROR) {
        EMBER_CHECK(!(zs.avail_in == 0 && pos_ == mem_.size()), FormatError, label_,
                    ": truncated gzip data (the compressed stream ends early)");
      } else if (r != Z_OK) {
        EMBER_THROW(FormatError, label_, ": corrupt gzip data (", zs.msg ? zs.msg : "zlib error", ")");
      }
    }
    return total;
  }
  // Copies up to n of the next unread input bytes (those zlib holds, then the rest) without consuming them.
  uint64_t peek(unsigned char* out, uint64_t n) const {
    uint64_t got = 0;
    for (uInt i = 0; i < zs_->avail_in && got < n; ++i) out[got++] = zs_->next_in[i];
    for (uint64_t at = pos_; at < mem_.size() && got < n; ++at) out[got++] = static_cast<unsigned char>(mem_[at]);
    return got;
  }
#else
  uint64_t inflate_into(unsigned char*, uint64_t) { return 0; }  // unreachable: the constructor threw
#endif

  std::string label_;
  std::FILE* file_ = nullptr;
  std::string_view mem_;
  uint64_t pos_ = 0;  // bytes of mem_ consumed (handed to zlib, for gzip)
  bool gzipped_ = false;
#if defined(EMBER_WITH_ZLIB)
  std::unique_ptr<z_stream> zs_;
  bool gz_done_ = false;
#endif
};

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

constexpr uint32_t kImagesMagic = 0x00000803;  // u8 data, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // u8 data, 1 dim

// What an IDX input is: its stream, its length when known up front (raw data), and its compressed length (gzip).
struct IdxInput {
  ByteStream& in;
  std::optional<uint64_t> raw_size;         // raw input: exact length
  std::optional<uint64_t> compressed_size;  // gzip input: compressed length
  const std::string& label;                 // "'path'" or "IDX bytes", for messages
};

// Reads an IDX u8 input with the given magic and dims(magic & 0xff) dims into a u8 tensor of those dims
// (Note [IDX bounds]).
Tensor read_idx_u8(const IdxInput& src, uint32_t magic, const char* kind) {
  ByteStream& in = src.in;
  const std::string& label = src.label;
  const int ndim = static_cast<int>(magic & 0xff);
  std::array<unsigned char, 4 + 4 * 3> header{};
  // The magic first, so that a file of the other kind is reported as such even when it is short.
  uint64_t got = in.read(header.data(), 4);
  EMBER_CHECK(got == 4, FormatError, label, ": truncated: ", got, " bytes, but an IDX ", kind,
              " file starts with a 4-byte magic number");
  const uint32_t m = be32(header.data());
  if (m != magic) {
    const char* hint = m == kImagesMagic ? " (that of an IDX image file)"
                       : m == kLabelsMagic ? " (that of an IDX label file)"
                       : (m >> 16) == 0x1f8b ? " (gzip data: name the file *.gz)"
                                             : "";
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08x, expected 0x%08x", m, magic);
    EMBER_THROW(FormatError, label, ": bad magic number ", buf, hint, "; not an IDX ", kind, " file");
  }
  const uint64_t dims_bytes = 4 * static_cast<uint64_t>(ndim);
  got = in.read(header.data() + 4, dims_bytes);
  EMBER_CHECK(got == dims_bytes, FormatError, label, ": truncated: the header ends after ", 4 + got,
              " bytes, an IDX ", kind, " file's has ", 4 + dims_bytes);
  Shape dims;
  __int128 bytes = 1;
  for (int i = 0; i < ndim; ++i) {
    const uint32_t d = be32(header.data() + 4 + 4 * i);
    EMBER_CHECK(i == 0 || d > 0, FormatError, label, ": dimension ", i, " is 0");
    dims.push_back(static_cast<int64_t>(d));
    bytes *= d;
  }
  EMBER_CHECK(bytes <= static_cast<__int128>(kMaxIdxBytes), FormatError, label, ": dims ", shape_str(dims),
              " announce an implausible ", static_cast<int64_t>(bytes), " bytes");
  const uint64_t payload = static_cast<uint64_t>(bytes);
  if (src.compressed_size) {
    const unsigned __int128 most = static_cast<unsigned __int128>(*src.compressed_size) * kMaxDeflateRatio;
    EMBER_CHECK(payload <= most, FormatError, label, ": truncated: the header announces ", shape_str(dims), " (",
                payload, " bytes of data) but ", *src.compressed_size,
                " bytes of gzip data cannot hold that many (deflate expands at most ", kMaxDeflateRatio, ":1)");
  }
  // A raw input must be exactly header + payload long: checked before the payload is allocated, so a forged header
  // cannot make the reader allocate gigabytes for a few bytes of file.
  if (src.raw_size) {
    const uint64_t expected = 4 + dims_bytes + payload;
    const uint64_t size = *src.raw_size;
    EMBER_CHECK(size >= expected, FormatError, label, ": truncated: the header announces ", shape_str(dims), " (",
                expected, " bytes with the header) but the file has ", size, " bytes");
    EMBER_CHECK(size == expected, FormatError, label, ": ", size - expected, " trailing bytes after the ", payload,
                " bytes of data the header announces (", shape_str(dims), ")");
  }
  Tensor t;
  if (src.raw_size) {
    t = empty(dims, {DType::u8, Device::cpu()});
    if (payload > 0) {
      const uint64_t have = in.read(t.raw_data(), payload);
      EMBER_CHECK(have == payload, FormatError, label, ": truncated: the header announces ", shape_str(dims), " (",
                  payload, " bytes of data) but the file ends after ", have);
    }
  } else {
    // A gzip stream (or a file without a size) is read in bounded chunks first, so memory grows only with bytes that really arrive; the
    // tensor is allocated once the whole payload is there.
    std::vector<uint8_t> buffer;
    constexpr uint64_t kChunk = uint64_t{16} << 20;
    while (buffer.size() < payload) {
      const uint64_t want = std::min<uint64_t>(kChunk, payload - buffer.size());
      const size_t at = buffer.size();
      buffer.resize(at + want);
      const uint64_t have = in.read(buffer.data() + at, want);
      EMBER_CHECK(have == want, FormatError, label, ": truncated: the header announces ", shape_str(dims), " (",
                  payload, " bytes of data) but the file ends after ", at + have);
    }
    t = empty(dims, {DType::u8, Device::cpu()});
    if (payload > 0) std::memcpy(t.raw_data(), buffer.data(), payload);
  }
  const uint64_t extra = in.drain();
  EMBER_CHECK(extra == 0, FormatError, label, ": ", extra, " trailing bytes after the ", payload,
              " bytes of data the header announces (", shape_str(dims), ")");
  return t;
}

Tensor parse_idx_bytes(std::string_view bytes, bool gzipped, const std::string& label, uint32_t magic,
                       const char* kind) {
  ByteStream in(bytes, gzipped, label);
  IdxInput src{in, std::nullopt, std::nullopt, label};
  if (gzipped)
    src.compressed_size = bytes.size();
  else
    src.raw_size = bytes.size();
  return read_idx_u8(src, magic, kind);
}

// A file at `path`: raw files are streamed (their size is known from stat), .gz files are read whole and inflated
// from memory.
Tensor read_idx_path(const std::string& path, uint32_t magic, const char* kind) {
  const std::string label = "'" + path + "'";
  if (ends_with(path, ".gz")) {
    EMBER_CHECK(gzip_supported(), FormatError, label, " is gzipped and ember was built without zlib; gunzip ", path,
                " first");
    const std::optional<int64_t> size = io::file_size(path);
    EMBER_CHECK(size.has_value(), ValueError, "cannot open ", label, ": no such file");
    const io::ReadOnlyFile file(path);
    std::string bytes(static_cast<size_t>(*size), '\0');
    const int64_t got = file.read_at(0, bytes.data(), *size);
    bytes.resize(static_cast<size_t>(got));
    return parse_idx_bytes(bytes, true, label, magic, kind);
  }
  ByteStream in(path, label);
  const std::optional<int64_t> size = io::file_size(path);
  IdxInput src{in, std::nullopt, std::nullopt, label};
  if (size) src.raw_size = static_cast<uint64_t>(*size);  // else (not a regular file): read in bounded chunks
  return read_idx_u8(src, magic, kind);
}

// The first of dir/<stem>{-,.}<kind>{,.gz} that exists.
std::string find_mnist_file(const std::string& dir, const std::string& stem, const std::string& kind) {
  std::vector<std::string> tried;
  for (const char* sep : {"-", "."}) {
    for (const char* suffix : {"", ".gz"}) {
      std::string p = dir + "/" + stem + sep + kind + suffix;
      if (is_file(p)) return p;
      tried.push_back(p);
    }
  }
  std::string list;
  for (const auto& p : tried) list += (list.empty() ? "" : ", ") + p;
  EMBER_THROW(ValueError, "load_mnist: no MNIST file in '", dir, "' (looked for ", list, ")");
}

}  // namespace

bool gzip_supported() {
#if defined(EMBER_WITH_ZLIB)
  return true;
#else
  return false;
#endif
}

Tensor read_idx_images(const std::string& path) { return read_idx_path(path, kImagesMagic, "image"); }

Tensor read_idx_labels(const std::string& path) { return read_idx_path(path, kLabelsMagic, "label").to(DType::i64); }

Tensor parse_idx_images(std::string_view bytes, bool gzipped, const std::string& name) {
  return parse_idx_bytes(bytes, gzipped, name, kImagesMagic, "image");
}

Tensor parse_idx_labels(std::string_view bytes, bool gzipped, const std::string& name) {
  return parse_idx_bytes(bytes, gzipped, name, kLabelsMagic, "label").to(DType::i64);
}

MnistData load_mnist(const std::string& dir, bool train) {
  const std::string stem = train ? "train" : "t10k";
  const std::string images_path = find_mnist_file(dir, stem + "-images", "idx3-ubyte");
  const std::string labels_path = find_mnist_file(dir, stem + "-labels", "idx1-ubyte");
  MnistData d;
  d.images = read_idx_images(images_path);
  d.labels = read_idx_labels(labels_path);
  EMBER_CHECK(d.images.size(0) == d.labels.size(0), FormatError, "load_mnist: '", images_path, "' holds ",
              d.images.size(0), " images but '", labels_path, "' holds ", d.labels.size(0), " labels");
  const int64_t* l = d.labels.data<int64_t>();
  for (int64_t i = 0; i < d.labels.numel(); ++i)
    EMBER_CHECK(l[i] >= 0 && l[i] <= 9, FormatError, "load_mnist: '", labels_path, "': label ", l[i], " at index ", i,
                " is not a digit 0..9");
  return d;
}

// --- synthetic digits ------------------------------------------------------------------------------------------

namespace {

// Strokes of each digit in a unit box (x right, y down): seven-segment figures, with 1 and 7 drawn differently so
// that every class has its own shape.
struct Stroke {
  float x0, y0, x1, y1;
};
constexpr Stroke kA{0, 0, 1, 0}, kB{1, 0, 1, 0.5f}, kC{1, 0.5f, 1, 1}, kD{0, 1, 1, 1}, kE{0, 0.5f, 0, 1},
    kF{0, 0, 0, 0.5f}, kG{0, 0.5f, 1, 0.5f};

const std::vector<Stroke>& digit_strokes(int digit) {
  static const std::vector<Stroke> kDigits[10] = {
      {kA, kB, kC, kD, kE, kF},                            // 0
      {{0.5f, 0, 0.5f, 1}, {0.5f, 0, 0.2f, 0.25f}},        // 1: a stem with a flag
      {kA, kB, kG, kE, kD},                                // 2
      {kA, kB, kG, kC, kD},                                // 3
      {kF, kG, kB, kC},                                    // 4
      {kA, kF, kG, kC, kD},                                // 5
      {kA, kF, kG, kE, kD, kC},                            // 6
      {kA, {1, 0, 0.35f, 1}},                              // 7: a bar and a diagonal
      {kA, kB, kC, kD, kE, kF, kG},                        // 8
      {kA, kB, kC, kD, kF, kG},                            // 9
  };
  return kDigits[digit];
}

float segment_distance(float px, float py, float x0, float y0, float x1, float y1) {
  const float dx = x1 - x0, dy = y1 - y0;
  const float len2 = dx * dx + dy * dy;
  float t = len2 > 0 ? ((px - x0) * dx + (py - y0) * dy) / len2 : 0.0f;
  t = std::clamp(t, 0.0f, 1.0f);
  const float ex = px - (x0 + t * dx), ey = py - (y0 + t * dy);
  return std::sqrt(ex * ex + ey * ey);
}

}  // namespace

MnistData synthetic_mnist(int64_t n, uint64_t seed) {
  EMBER_CHECK(n >= 0, ValueError, "synthetic_mnist: n must be >= 0, got ", n);
  constexpr int64_t kSide = 28;
  constexpr uint64_t kCountersPerImage = 256;  // 2 for the figure's parameters, 196 for per-pixel noise
  MnistData d;
  d.images = empty({n, kSide, kSide}, {DType::u8, Device::cpu()});
  d.labels = empty({n}, {DType::i64, Device::cpu()});
  uint8_t* img = d.images.data<uint8_t>();
  int64_t* lab = d.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t base = static_cast<uint64_t>(i) * kCountersPerImage;
    const PhiloxOut p0 = philox_at(seed, base), p1 = philox_at(seed, base + 1);
    const int digit = static_cast<int>(p0.v[0] % 10);
    const float u[6] = {philox_uniform01(p0.v[1]), philox_uniform01(p0.v[2]), philox_uniform01(p0.v[3]),
                        philox_uniform01(p1.v[0]), philox_uniform01(p1.v[1]), philox_uniform01(p1.v[2])};
    const float cx = 14.0f + (u[0] - 0.5f) * 4.0f, cy = 14.0f + (u[1] - 0.5f) * 4.0f;  // centre, +-2 px
    const float scale = 0.85f + 0.3f * u[2];
    const float w = 11.0f * scale, h = 18.0f * scale;
    const float slant = (u[3] - 0.5f) * 0.5f;       // shear: x moves by slant * h across the height
    const float half_width = 0.7f + 0.6f * u[4];    // stroke half thickness in pixels
    const float peak = 200.0f + 55.0f * u[5];
    std::vector<Stroke> strokes = digit_strokes(digit);
    for (Stroke& s : strokes) {  // unit box -> pixels
      auto map = [&](float& x, float& y) {
        const float yy = cy + (y - 0.5f) * h;
        x = cx + (x - 0.5f) * w - slant * (y - 0.5f) * h;
        y = yy;
      };
      map(s.x0, s.y0);
      map(s.x1, s.y1);
    }
    uint8_t* out = img + i * kSide * kSide;
    for (int64_t pix = 0; pix < kSide * kSide; ++pix) {
      const float px = static_cast<float>(pix % kSide) + 0.5f, py = static_cast<float>(pix / kSide) + 0.5f;
      float dist = std::numeric_limits<float>::max();
      for (const Stroke& s : strokes) dist = std::min(dist, segment_distance(px, py, s.x0, s.y0, s.x1, s.y1));
      const float ink = std::clamp(1.0f - (dist - half_width), 0.0f, 1.0f);  // one-pixel soft edge
      const PhiloxOut pn = philox_at(seed, base + 2 + static_cast<uint64_t>(pix / 4));
      const float noise = (philox_uniform01(pn.v[pix % 4]) - 0.5f) * 40.0f;
      const float v = ink * peak + noise * (0.25f + ink);
      out[pix] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 255.0f)));
    }
    lab[i] = digit;
  }
  return d;
}

Tensor normalize_mnist(const Tensor& images, double mean, double std) {
  EMBER_CHECK(images.dtype() == DType::u8, DTypeError, "normalize_mnist: images must be u8, got ",
              dtype_name(images.dtype()));
  EMBER_CHECK(images.dim() == 3 || (images.dim() == 4 && images.size(1) == 1), ShapeError,
              "normalize_mnist: images must be [N, H, W] or [N, 1, H, W], got ", shape_str(images.sizes()));
  EMBER_CHECK(std > 0, ValueError, "normalize_mnist: std must be > 0, got ", std);
  const Tensor src = images.to(Device::cpu()).contiguous();
  const int64_t n = images.size(0), hgt = images.size(-2), wid = images.size(-1);
  Tensor out = empty({n, 1, hgt, wid}, {DType::f32, Device::cpu()});
  const uint8_t* s = src.data<uint8_t>();
  float* o = out.data<float>();
  const double inv = 1.0 / std;
  for (int64_t i = 0; i < src.numel(); ++i) o[i] = static_cast<float>((s[i] / 255.0 - mean) * inv);
  return out.to(images.device());
}

}  // namespace ember::data
