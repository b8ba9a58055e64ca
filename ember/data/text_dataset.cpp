// CharDataset: strict UTF-8 decoding into code points, the sorted vocabulary, and nanoGPT-style random batches whose
// offsets come from ember's Philox generator. Invariant: data_ holds ids < vocab_size() for every character.
#include "ember/data/text_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ember/base/error.h"
#include "ember/core/philox.h"
#include "ember/data/file_io.h"

namespace ember::data {

namespace {

// Decodes UTF-8 strictly (no overlong forms, surrogates or code points past U+10FFFF); FormatError at the first
// invalid byte.
std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len;
    char32_t cp, min;
    if ((b0 & 0xe0) == 0xc0) {
      len = 2, cp = b0 & 0x1f, min = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, cp = b0 & 0x0f, min = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, cp = b0 & 0x07, min = 0x10000;
    } else {
      EMBER_THROW(FormatError, "CharDataset: invalid UTF-8 byte 0x", std::hex, static_cast<int>(b0), std::dec,
                  " at byte ", i);
    }
    EMBER_CHECK(i + len <= s.size(), FormatError, "CharDataset: truncated UTF-8 sequence at byte ", i);
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      EMBER_CHECK((b & 0xc0) == 0x80, FormatError, "CharDataset: invalid UTF-8 continuation byte at byte ", i + k);
      cp = (cp << 6) | (b & 0x3f);
    }
    EMBER_CHECK(cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff), FormatError,
                "CharDataset: invalid UTF-8 sequence (overlong, surrogate or out of range) at byte ", i);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string char_repr(char32_t cp) {
  std::string s;
  if (cp >= 0x20 && cp != 0x7f) {
    append_utf8(s, cp);
    return "'" + s + "'";
  }
  std::ostringstream os;
  os << "U+" << std::hex << static_cast<uint32_t>(cp);
  return os.str();
}

}  // namespace

CharDataset::CharDataset(std::string_view text, double train_fraction) {
  EMBER_CHECK(!text.empty(), ValueError, "CharDataset: the text is empty");
  EMBER_CHECK(train_fraction > 0.0 && train_fraction < 1.0, ValueError,
              "CharDataset: train_fraction must be in (0, 1), got ", train_fraction);
  const std::vector<char32_t> cps = decode_utf8(text);
  chars_ = cps;
  std::sort(chars_.begin(), chars_.end());
  chars_.erase(std::unique(chars_.begin(), chars_.end()), chars_.end());
  for (size_t i = 0; i < chars_.size(); ++i) index_[chars_[i]] = static_cast<int64_t>(i);

  const int64_t n = static_cast<int64_t>(cps.size());
  data_ = empty({n}, {DType::i64, Device::cpu()});
  int64_t* d = data_.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) d[i] = index_.at(cps[static_cast<size_t>(i)]);
  // nanoGPT: n = len(data); train = data[:int(n * 0.9)]; val = data[int(n * 0.9):].
  const int64_t cut = static_cast<int64_t>(static_cast<double>(n) * train_fraction);
  train_ = data_.slice(0, 0, cut);
  val_ = data_.slice(0, cut, n);
}

CharDataset CharDataset::from_file(const std::string& path, double train_fraction) {
  EMBER_CHECK(!io::is_directory(path), ValueError, "CharDataset: '", path, "' is a directory; give a text file");
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), ValueError, "CharDataset: cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  EMBER_CHECK(!in.bad(), ValueError, "CharDataset: cannot read '", path, "'");
  const std::string text = ss.str();
  EMBER_CHECK(!text.empty(), ValueError, "CharDataset: '", path, "' is empty");
  try {
    return CharDataset(text, train_fraction);
  } catch (const FormatError& e) {
    EMBER_THROW(FormatError, "'", path, "': ", e.what());
  }
}

std::vector<int64_t> CharDataset::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  for (char32_t cp : decode_utf8(text)) {
    const auto it = index_.find(cp);
    EMBER_CHECK(it != index_.end(), ValueError, "CharDataset::encode: character ", char_repr(cp),
                " is not in the vocabulary");
    ids.push_back(it->second);
  }
  return ids;
}

std::string CharDataset::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    EMBER_CHECK(id >= 0 && id < vocab_size(), IndexError, "CharDataset::decode: id ", id,
                " is outside the vocabulary [0, ", vocab_size(), ")");
    append_utf8(out, chars_[static_cast<size_t>(id)]);
  }
  return out;
}

std::string CharDataset::decode(const Tensor& ids) const {
  EMBER_CHECK(is_integral(ids.dtype()) && ids.dtype() != DType::b8, DTypeError,
              "CharDataset::decode: ids must have an integer dtype, got ", dtype_name(ids.dtype()));
  return decode(ids.to_vector<int64_t>());
}

std::vector<int64_t> CharDataset::draw_offsets(Split split, int64_t batch_size, int64_t block_size,
                                               Generator& gen) const {
  EMBER_CHECK(batch_size > 0 && block_size > 0, ValueError, "CharDataset::get_batch: batch_size (", batch_size,
              ") and block_size (", block_size, ") must be positive");
  // x and y together hold 2 * batch_size * block_size ids: refuse sizes whose byte count overflows before any
  // host vector is sized from them (a huge batch then fails as a typed OutOfMemoryError from the allocator).
  int64_t ids = 0, bytes = 0;
  EMBER_CHECK(!__builtin_mul_overflow(batch_size, block_size, &ids) && !__builtin_mul_overflow(ids, int64_t{16}, &bytes),
              ValueError, "CharDataset::get_batch: batch_size ", batch_size, " x block_size ", block_size,
              " is too large");
  const int64_t len = split_length(split);
  EMBER_CHECK(len > block_size, ValueError, "CharDataset::get_batch: the ", split == Split::train ? "train" : "val",
              " split holds ", len, " characters, not more than block_size ", block_size);
  // One Philox counter per offset: 64 random bits mapped onto [0, range) by a multiply-high (Lemire), like
  // torch.randint(len - block_size, (batch_size,)).
  const uint64_t range = static_cast<uint64_t>(len - block_size);
  const PhiloxState st = gen.reserve(static_cast<uint64_t>(batch_size));
  std::vector<int64_t> offsets(static_cast<size_t>(batch_size));
  for (int64_t b = 0; b < batch_size; ++b) {
    const PhiloxOut o = philox_at(st.seed, st.offset + static_cast<uint64_t>(b));
    const uint64_t bits = (static_cast<uint64_t>(o.v[1]) << 32) | o.v[0];
    offsets[static_cast<size_t>(b)] = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * range) >> 64);
  }
  return offsets;
}

std::pair<Tensor, Tensor> CharDataset::get_batch(Split split, int64_t batch_size, int64_t block_size, Generator& gen,
                                                 Device device) const {
  Tensor x = empty({batch_size, block_size}, {DType::i64, Device::cpu()});  // first: a huge batch is a typed OOM
  Tensor y = empty({batch_size, block_size}, {DType::i64, Device::cpu()});
  const std::vector<int64_t> offsets = draw_offsets(split, batch_size, block_size, gen);
  const Tensor& src = split_data(split);  // a contiguous view
  const int64_t* d = src.data<int64_t>();
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t* w = d + offsets[static_cast<size_t>(b)];
    std::memcpy(px + b * block_size, w, static_cast<size_t>(block_size) * sizeof(int64_t));
    std::memcpy(py + b * block_size, w + 1, static_cast<size_t>(block_size) * sizeof(int64_t));
  }
  return {x.to(device), y.to(device)};
}

std::pair<Tensor, Tensor> CharDataset::get_batch(Split split, int64_t batch_size, int64_t block_size, uint64_t seed,
                                                 Device device) const {
  Generator gen(seed);
  return get_batch(split, batch_size, block_size, gen, device);
}

}  // namespace ember::data
