// MNIST IDX reading (raw files directly, .gz through zlib when the build has it), the synthetic digit generator and
// normalisation. Invariant: a parsed file had exactly the bytes its header announces — no fewer, no more.
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

// A sequential byte stream over a raw or gzipped file. read() returns the bytes it got: fewer than asked means the
// stream ended; a read error or corrupt compressed data raises FormatError / ValueError naming the file.
class ByteStream {
 public:
  explicit ByteStream(const std::string& path) : path_(path) {
    if (ends_with(path, ".gz")) {
#if defined(EMBER_WITH_ZLIB)
      gz_ = gzopen(path.c_str(), "rb");
      EMBER_CHECK(gz_ != nullptr, ValueError, "cannot open '", path, "': ", std::strerror(errno));
      gzbuffer(gz_, 1 << 17);
#else
      EMBER_THROW(FormatError, "'", path, "' is gzipped and ember was built without zlib; gunzip ", path, " first");
#endif
    } else {
      file_ = std::fopen(path.c_str(), "rb");
      EMBER_CHECK(file_ != nullptr, ValueError, "cannot open '", path, "': ", std::strerror(errno));
    }
  }
  ~ByteStream() {
    if (file_) std::fclose(file_);
#if defined(EMBER_WITH_ZLIB)
    if (gz_) gzclose_r(gz_);
#endif
  }
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  uint64_t read(void* dst, uint64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    uint64_t total = 0;
    while (total < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(n - total, 1u << 30));
      uint64_t got = 0;
#if defined(EMBER_WITH_ZLIB)
      if (gz_) {
        const int r = gzread(gz_, p + total, chunk);
        if (r < 0) {
          int code = 0;
          const char* msg = gzerror(gz_, &code);
          EMBER_THROW(FormatError, "'", path_, "': corrupt gzip data (", msg, ")");
        }
        got = static_cast<uint64_t>(r);
      }
#endif
      if (file_) {
        got = std::fread(p + total, 1, chunk, file_);
        EMBER_CHECK(!std::ferror(file_), ValueError, "cannot read '", path_, "': ", std::strerror(errno));
      }
      total += got;
      if (got < chunk) break;
    }
    return total;
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
  std::string path_;
  std::FILE* file_ = nullptr;
#if defined(EMBER_WITH_ZLIB)
  gzFile gz_ = nullptr;
#endif
};

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

constexpr uint32_t kImagesMagic = 0x00000803;  // u8 data, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // u8 data, 1 dim

// Reads an IDX u8 file with the given magic and dims(magic & 0xff) dims into a u8 tensor of those dims.
Tensor read_idx_u8(const std::string& path, uint32_t magic, const char* kind) {
  ByteStream in(path);
  const int ndim = static_cast<int>(magic & 0xff);
  std::array<unsigned char, 4 + 4 * 3> header{};
  // The magic first, so that a file of the other kind is reported as such even when it is short.
  uint64_t got = in.read(header.data(), 4);
  EMBER_CHECK(got == 4, FormatError, "'", path, "': truncated: ", got, " bytes, but an IDX ", kind,
              " file starts with a 4-byte magic number");
  const uint32_t m = be32(header.data());
  if (m != magic) {
    const char* hint = m == kImagesMagic ? " (that of an IDX image file)"
                       : m == kLabelsMagic ? " (that of an IDX label file)"
                       : (m >> 16) == 0x1f8b ? " (gzip data: name the file *.gz)"
                                             : "";
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08x, expected 0x%08x", m, magic);
    EMBER_THROW(FormatError, "'", path, "': bad magic number ", buf, hint, "; not an IDX ", kind, " file");
  }
  const uint64_t dims_bytes = 4 * static_cast<uint64_t>(ndim);
  got = in.read(header.data() + 4, dims_bytes);
  EMBER_CHECK(got == dims_bytes, FormatError, "'", path, "': truncated: the header ends after ", 4 + got,
              " bytes, an IDX ", kind, " file's has ", 4 + dims_bytes);
  Shape dims;
  __int128 bytes = 1;
  for (int i = 0; i < ndim; ++i) {
    const uint32_t d = be32(header.data() + 4 + 4 * i);
    EMBER_CHECK(i == 0 || d > 0, FormatError, "'", path, "': dimension ", i, " is 0");
    dims.push_back(static_cast<int64_t>(d));
    bytes *= d;
  }
  EMBER_CHECK(bytes <= (__int128{1} << 40), FormatError, "'", path, "': dims ", shape_str(dims),
              " announce an implausible ", static_cast<int64_t>(bytes), " bytes");
  const uint64_t payload = static_cast<uint64_t>(bytes);
  // A raw file must be exactly header + payload long: checked before the payload is allocated, so a forged header
  // cannot make the reader allocate gigabytes for a few bytes of file. (A gzip stream's length is known only by
  // reading it; there the payload is read in bounded chunks before the tensor is allocated.)
  bool sized = false;  // the payload's length was checked against the file's before reading
  if (!ends_with(path, ".gz")) {
    if (const std::optional<int64_t> file_bytes = io::file_size(path)) {
      sized = true;
      const uint64_t expected = 4 + dims_bytes + payload;
      const uint64_t size = static_cast<uint64_t>(*file_bytes);
      EMBER_CHECK(size >= expected, FormatError, "'", path, "': truncated: the header announces ", shape_str(dims),
                  " (", expected, " bytes with the header) but the file has ", size, " bytes");
      EMBER_CHECK(size == expected, FormatError, "'", path, "': ", size - expected, " trailing bytes after the ",
                  payload, " bytes of data the header announces (", shape_str(dims), ")");
    }
  }
  Tensor t;
  if (sized) {
    t = empty(dims, {DType::u8, Device::cpu()});
    if (payload > 0) {
      const uint64_t have = in.read(t.raw_data(), payload);
      EMBER_CHECK(have == payload, FormatError, "'", path, "': truncated: the header announces ", shape_str(dims),
                  " (", payload, " bytes of data) but the file ends after ", have);
    }
  } else {
    // A gzip stream (or a file without a size) is read in bounded chunks first, so memory grows only with bytes
    // that really arrive; the tensor is allocated once the whole payload is there.
    std::vector<uint8_t> buffer;
    constexpr uint64_t kChunk = uint64_t{16} << 20;
    while (buffer.size() < payload) {
      const uint64_t want = std::min<uint64_t>(kChunk, payload - buffer.size());
      const size_t at = buffer.size();
      buffer.resize(at + want);
      const uint64_t have = in.read(buffer.data() + at, want);
      EMBER_CHECK(have == want, FormatError, "'", path, "': truncated: the header announces ", shape_str(dims),
                  " (", payload, " bytes of data) but the file ends after ", at + have);
    }
    t = empty(dims, {DType::u8, Device::cpu()});
    if (payload > 0) std::memcpy(t.raw_data(), buffer.data(), payload);
  }
  const uint64_t extra = in.drain();
  EMBER_CHECK(extra == 0, FormatError, "'", path, "': ", extra, " trailing bytes after the ", payload,
              " bytes of data the header announces (", shape_str(dims), ")");
  return t;
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

Tensor read_idx_images(const std::string& path) { return read_idx_u8(path, kImagesMagic, "image"); }

Tensor read_idx_labels(const std::string& path) {
  const Tensor raw = read_idx_u8(path, kLabelsMagic, "label");
  return raw.to(DType::i64);
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
