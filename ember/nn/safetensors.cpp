// safetensors reading and writing: header JSON through nlohmann-json, tensor bytes copied straight between files and
// CPU tensors. Invariant: a parsed header's entries tile the byte buffer exactly, in data order
// (Note [safetensors validation]); the writer only produces such files.
#include "ember/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/base/atomic_file.h"
#include "ember/base/error.h"
#include "ember/core/tensor.h"

namespace ember::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; ember copies tensor bytes as they are");

// Note [safetensors validation]
// The format (github.com/huggingface/safetensors, README "Format") is: u64 little-endian N; N bytes of a UTF-8 JSON
// object; the byte buffer. Every key but "__metadata__" (an object of string -> string) names a tensor:
// {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, offsets relative to the buffer. A loader must not
// trust any of it, so before a single tensor byte is read we check, as the reference implementation does:
//   - the header: at most 100 MB (kMaxHeaderBytes) and inside the file; valid JSON nested at most kMaxHeaderDepth
//     deep (a valid header nests 3 deep; the limit bounds the parser's memory and the error messages' recursion on
//     a hostile header); an object; no duplicate keys;
//   - each entry: exactly the three keys with the right JSON types; a dtype ember has; non-negative dims whose
//     byte count fits in int64; begin <= end <= buffer size; end - begin == numel * itemsize;
//   - coverage: sorted by begin, the entries tile [0, buffer size) with no gap, no overlap and no trailing bytes.
// BOOL bytes must also be 0 or 1 (any other byte is not a C++ bool). The writer pads the header with spaces to a
// multiple of 8 bytes (as the reference writer does, so the buffer starts aligned) and stores tensors in the
// order given, so loading returns them in that order.

namespace {

using Json = nlohmann::ordered_json;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxHeaderDepth = 16;
constexpr const char* kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in data order
  SafetensorsMetadata metadata;
};

// Random access to the bytes of a file or of a buffer in memory.
struct ByteSource {
  std::string where;  // "safetensors file 'x.safetensors'" or "safetensors bytes", for messages
  uint64_t size = 0;
  std::function<void(uint64_t offset, void* dst, uint64_t n)> read;
};

std::string json_type(const Json& j) { return j.type_name(); }

// Parses and validates the header JSON of a file whose byte buffer holds buffer_size bytes.
Header parse_header(std::string_view text, uint64_t buffer_size, const std::string& where) {
  // Duplicate keys are not valid safetensors (a JSON object maps each name once); nlohmann-json would silently
  // keep one of them, so a parser callback tracks the keys of every open object.
  std::vector<std::set<std::string>> open_objects;
  const Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start)
      EMBER_CHECK(depth < kMaxHeaderDepth, FormatError, where, ": the header nests more than ", kMaxHeaderDepth,
                  " levels deep");
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      EMBER_CHECK(open_objects.back().insert(key).second, FormatError, where, ": duplicate key \"", key,
                  "\" in the header");
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    EMBER_THROW(FormatError, where, ": header is not valid JSON (", e.what(), ")");
  }
  EMBER_CHECK(j.is_object(), FormatError, where, ": header is a JSON ", json_type(j), ", not an object");

  Header h;
  for (const auto& [name, value] : j.items()) {
    if (name == kMetadataKey) {
      EMBER_CHECK(value.is_object(), FormatError, where, ": \"__metadata__\" is a JSON ", json_type(value),
                  ", not an object");
      for (const auto& [k, v] : value.items()) {
        EMBER_CHECK(v.is_string(), FormatError, where, ": \"__metadata__\" value of \"", k, "\" is a JSON ",
                    json_type(v), ", not a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string what = where + ": tensor \"" + name + "\"";
    EMBER_CHECK(value.is_object(), FormatError, what, " is a JSON ", json_type(value), ", not an object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      EMBER_CHECK(value.contains(key), FormatError, what, " has no \"", key, "\"");
    for (const auto& [key, unused] : value.items())
      EMBER_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", FormatError, what,
                  " has an unknown key \"", key, "\"");

    Entry e;
    e.name = name;
    const Json& dtype = value["dtype"];
    EMBER_CHECK(dtype.is_string(), FormatError, what, ": \"dtype\" is a JSON ", json_type(dtype), ", not a string");
    try {
      e.dtype = parse_safetensors_dtype(dtype.get<std::string>());
    } catch (const FormatError& err) {
      EMBER_THROW(FormatError, what, ": ", err.what());
    }

    const Json& shape = value["shape"];
    EMBER_CHECK(shape.is_array(), FormatError, what, ": \"shape\" is a JSON ", json_type(shape), ", not an array");
    // Every dim must fit in int64 and so must the byte count of the non-zero dims together (ember computes the
    // strides of a shape even when it is empty); a zero dim makes the tensor empty.
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    uint64_t nonzero_bytes = static_cast<uint64_t>(ember::itemsize(e.dtype));
    bool empty_shape = false;
    for (const Json& d : shape) {
      EMBER_CHECK(d.is_number_integer(), FormatError, what, ": shape entry ", d.dump(), " is not an integer");
      EMBER_CHECK(d.is_number_unsigned(), FormatError, what, ": shape entry ", d.dump(), " is negative");
      const uint64_t n = d.get<uint64_t>();
      EMBER_CHECK(n <= kMax, FormatError, what, ": dimension ", n, " overflows int64");
      e.shape.push_back(static_cast<int64_t>(n));
      if (n == 0) {
        empty_shape = true;
        continue;
      }
      EMBER_CHECK(nonzero_bytes <= kMax / n, FormatError, what, ": shape ", shape.dump(), " overflows int64 bytes");
      nonzero_bytes *= n;
    }
    const uint64_t nbytes = empty_shape ? 0 : nonzero_bytes;

    const Json& offsets = value["data_offsets"];
    EMBER_CHECK(offsets.is_array() && offsets.size() == 2, FormatError, what,
                ": \"data_offsets\" must be an array [begin, end], got ", offsets.dump());
    for (const Json& o : offsets)
      EMBER_CHECK(o.is_number_unsigned(), FormatError, what, ": data offset ", o.dump(),
                  " is not a non-negative integer");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    EMBER_CHECK(e.begin <= e.end, FormatError, what, ": data_offsets [", e.begin, ", ", e.end, "] end before begin");
    EMBER_CHECK(e.end <= buffer_size, FormatError, what, ": data_offsets [", e.begin, ", ", e.end,
                "] reach past the end of the ", buffer_size, "-byte buffer");
    EMBER_CHECK(e.end - e.begin == nbytes, FormatError, what, ": data_offsets [", e.begin, ", ", e.end, "] hold ",
                e.end - e.begin, " bytes but ", dtype_name(e.dtype), shape_str(e.shape), " needs ", nbytes);
    h.entries.push_back(std::move(e));
  }

  // Coverage: the entries must tile the buffer (stable sort: empty tensors at one offset keep the header's order).
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Entry& e : h.entries) {
    EMBER_CHECK(e.begin >= cursor, FormatError, where, ": tensor \"", e.name, "\" (bytes [", e.begin, ", ", e.end,
                ")) overlaps the tensor before it (which ends at ", cursor, ")");
    EMBER_CHECK(e.begin == cursor, FormatError, where, ": ", e.begin - cursor, " bytes at [", cursor, ", ", e.begin,
                ") of the buffer belong to no tensor");
    cursor = e.end;
  }
  EMBER_CHECK(cursor == buffer_size, FormatError, where, ": ", buffer_size - cursor,
              " trailing bytes after the last tensor (the buffer holds ", buffer_size, " bytes, the tensors ", cursor,
              ")");
  return h;
}

// Reads and validates the length prefix and the header; returns the header and the buffer's offset in the source.
Header read_header(const ByteSource& src, uint64_t* buffer_start) {
  EMBER_CHECK(src.size >= 8, FormatError, src.where, ": ", src.size,
              " bytes is too short for the 8-byte header length");
  unsigned char prefix[8];
  src.read(0, prefix, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  EMBER_CHECK(n <= kMaxHeaderBytes, FormatError, src.where, ": header length ", n, " is over the ", kMaxHeaderBytes,
              "-byte limit (not a safetensors file?)");
  EMBER_CHECK(n <= src.size - 8, FormatError, src.where, ": header length ", n, " reaches past the end of the ",
              src.size, "-byte file");
  std::string text(n, '\0');
  src.read(8, text.data(), n);
  *buffer_start = 8 + n;
  return parse_header(text, src.size - 8 - n, src.where);
}

SafetensorsMetadata read_metadata(const ByteSource& src) {
  uint64_t start = 0;
  return read_header(src, &start).metadata;
}

NamedTensors read_tensors(const ByteSource& src, Device device) {
  uint64_t start = 0;
  const Header h = read_header(src, &start);
  NamedTensors out;
  out.reserve(h.entries.size());
  for (const Entry& e : h.entries) {
    Tensor t = empty(e.shape, {e.dtype, Device::cpu()});
    const uint64_t n = e.end - e.begin;
    if (n > 0) {
      src.read(start + e.begin, t.raw_data(), n);
      if (e.dtype == DType::b8) {
        const auto* p = static_cast<const unsigned char*>(t.raw_data());
        for (uint64_t i = 0; i < n; ++i)
          EMBER_CHECK(p[i] <= 1, FormatError, src.where, ": tensor \"", e.name, "\" (BOOL) holds byte ",
                      static_cast<int>(p[i]), " at element ", i, "; BOOL bytes must be 0 or 1");
      }
    }
    out.emplace_back(e.name, t.to(device));
  }
  return out;
}

ByteSource memory_source(std::string_view bytes) {
  ByteSource s;
  s.where = "safetensors bytes";
  s.size = bytes.size();
  s.read = [bytes](uint64_t offset, void* dst, uint64_t n) { std::memcpy(dst, bytes.data() + offset, n); };
  return s;
}

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

std::string errno_text() { return std::strerror(errno); }

// Runs fn with a ByteSource over the file at `path`.
template <class Fn>
auto with_file_source(const std::string& path, const char* op, Fn fn) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  EMBER_CHECK(f.fd >= 0, ValueError, op, ": cannot open '", path, "': ", errno_text());
  struct stat st{};
  EMBER_CHECK(::fstat(f.fd, &st) == 0, ValueError, op, ": cannot stat '", path, "': ", errno_text());
  EMBER_CHECK(S_ISREG(st.st_mode), ValueError, op, ": '", path, "' is not a regular file");
  ByteSource s;
  s.where = "safetensors file '" + path + "'";
  s.size = static_cast<uint64_t>(st.st_size);
  const int fd = f.fd;
  s.read = [fd, path, op](uint64_t offset, void* dst, uint64_t n) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd, p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      EMBER_CHECK(got >= 0, ValueError, op, ": cannot read '", path, "': ", errno_text());
      EMBER_CHECK(got > 0, FormatError, op, ": '", path, "' was truncated while it was read");
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<uint64_t>(got);
    }
  };
  return fn(s);
}

// --- writing ---------------------------------------------------------------------------------------------------

// The header text (padded) and the tensors to write after it, made before any byte is written.
struct Plan {
  std::string header;  // JSON + padding spaces; its length is a multiple of 8
  std::vector<Tensor> tensors;
};

Plan plan_file(const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  Plan plan;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    EMBER_CHECK(!name.empty(), ValueError, "save_safetensors: empty tensor name");
    EMBER_CHECK(name != kMetadataKey, ValueError, "save_safetensors: \"", name,
                "\" is reserved for the metadata and cannot name a tensor");
    EMBER_CHECK(seen.insert(name).second, ValueError, "save_safetensors: duplicate tensor name \"", name, "\"");
    EMBER_CHECK(t.defined(), ValueError, "save_safetensors: tensor \"", name, "\" is undefined");
    EMBER_CHECK(!t.device().is_meta(), ValueError, "save_safetensors: tensor \"", name,
                "\" is on the meta device and has no data");
    const uint64_t nbytes = static_cast<uint64_t>(t.nbytes());
    Json e = Json::object();
    e["dtype"] = safetensors_dtype_name(t.dtype());
    e["shape"] = t.sizes();
    e["data_offsets"] = {offset, offset + nbytes};
    header[name] = std::move(e);
    offset += nbytes;
    plan.tensors.push_back(t);
  }
  try {
    plan.header = header.dump();
  } catch (const Json::exception& e) {
    EMBER_THROW(ValueError, "save_safetensors: a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  plan.header.append((8 - plan.header.size() % 8) % 8, ' ');
  return plan;
}

// Streams the file through sink(bytes, n): the length prefix, the header, then one tensor at a time (each copied to
// a contiguous CPU tensor just before it is written, so at most one host copy is alive).
void write_file(const Plan& plan, const std::function<void(const void*, uint64_t)>& sink) {
  unsigned char prefix[8];
  uint64_t n = plan.header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) prefix[i] = static_cast<unsigned char>(n & 0xff);
  sink(prefix, 8);
  sink(plan.header.data(), plan.header.size());
  for (const Tensor& t : plan.tensors) {
    if (t.numel() == 0) continue;
    const Tensor host = t.detach().to(Device::cpu()).contiguous();
    sink(host.raw_data(), static_cast<uint64_t>(host.nbytes()));
  }
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::b8: return "BOOL";
    case DType::i8: return "I8";
    case DType::i16: return "I16";
  }
  EMBER_THROW(DTypeError, "safetensors: no safetensors dtype for ", dtype_name(dtype));
}

DType parse_safetensors_dtype(const std::string& name) {
  static const std::pair<const char*, DType> kKnown[] = {
      {"F64", DType::f64}, {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
      {"I64", DType::i64}, {"I32", DType::i32}, {"U8", DType::u8},   {"BOOL", DType::b8},
      {"I8", DType::i8},   {"I16", DType::i16}};
  for (const auto& [n, d] : kKnown)
    if (name == n) return d;
  static const char* kOther[] = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                 "F6_E3M2", "F4", "C64"};
  for (const char* n : kOther)
    EMBER_CHECK(name != n, FormatError, "safetensors dtype ", name,
                " is not supported by ember (it has F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  EMBER_THROW(FormatError, "unknown safetensors dtype \"", name, "\"");
}

std::string serialize_safetensors(const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  const Plan plan = plan_file(tensors, metadata);
  std::string out;
  write_file(plan, [&](const void* p, uint64_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  const Plan plan = plan_file(tensors, metadata);  // argument errors before any file is touched
  write_file_atomically(path, [&](const AtomicFileWrite& write) {  // Note [Atomic replace]
    write_file(plan, [&](const void* data, uint64_t n) { write(data, static_cast<int64_t>(n)); });
  });
}

NamedTensors deserialize_safetensors(std::string_view bytes, Device device) {
  return read_tensors(memory_source(bytes), device);
}

NamedTensors load_safetensors(const std::string& path, Device device) {
  return with_file_source(path, "load_safetensors", [&](const ByteSource& s) { return read_tensors(s, device); });
}

SafetensorsMetadata deserialize_safetensors_metadata(std::string_view bytes) {
  return read_metadata(memory_source(bytes));
}

SafetensorsMetadata read_safetensors_metadata(const std::string& path) {
  return with_file_source(path, "read_safetensors_metadata", [&](const ByteSource& s) { return read_metadata(s); });
}

}  // namespace ember::nn
