// safetensors: round trips of every dtype (0-d and empty tensors, metadata, views, devices), the writer's bytes
// against a file assembled here by hand from the format's rules, every malformed header/buffer rejected with
// FormatError, truncations at every length, and the atomic write (no temporary left behind, old file kept on error).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ember/nn/safetensors.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using nn::NamedTensors;

// A fresh empty directory, removed with its contents at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ember_safetensors_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
    return names;
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file from its parts: the given header text (unpadded) and buffer.
std::string make_file(const std::string& header, const std::string& buffer) {
  return le64(header.size()) + header + buffer;
}

// The raw bytes of a CPU tensor in row-major order.
std::string tensor_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.nbytes()));
}

// One tensor of every dtype with hand-chosen values, plus 0-d and empty ones.
NamedTensors every_dtype() {
  return {
      {"f64", from_vector<double>({1.5, -2.25, 1e300, -0.0}, {2, 2})},
      {"f32", from_vector<float>({0.1f, -3.0f, 7.5f}, {3})},
      {"f16", from_vector<float>({1.0f, -0.5f, 65504.0f, 0.25f}, {1, 4}).to(DType::f16)},
      {"bf16", from_vector<float>({3.0f, -1.0f}, {2, 1}).to(DType::bf16)},
      {"i64", from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {4})},
      {"i32", from_vector<int32_t>({INT32_MIN, 42}, {2})},
      {"u8", from_vector<uint8_t>({0, 128, 255}, {3})},
      {"i8", from_vector<int8_t>({-128, -1, 0, 127}, {2, 2})},
      {"i16", from_vector<int16_t>({-32768, 7, 32767}, {3})},
      {"bool", from_vector<bool>({true, false, true, true}, {2, 2})},
      {"scalar_f32", from_vector<float>({4.5f}, {})},
      {"scalar_i64", from_vector<int64_t>({-7}, {})},
      {"empty_f32", empty({0}, {DType::f32})},
      {"empty_3d_bf16", empty({2, 0, 3}, {DType::bf16})},
      {"empty_bool", empty({0, 5}, {DType::b8})},
  };
}

void expect_same(const NamedTensors& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.dtype(), want[i].second.dtype());
    EXPECT_EQ(got[i].second.sizes(), want[i].second.sizes());
    EXPECT_TRUE(got[i].second.device().is_cpu());
    EXPECT_EQ(tensor_bytes(got[i].second), tensor_bytes(want[i].second));
  }
}

TEST(Safetensors, RoundTripEveryDtypeInMemoryAndOnDisk) {
  const NamedTensors tensors = every_dtype();
  const nn::SafetensorsMetadata meta = {{"format", "pt"}, {"step", "1200"}, {"note", "héllo \"quoted\""}};
  const std::string bytes = nn::serialize_safetensors(tensors, meta);
  expect_same(nn::deserialize_safetensors(bytes), tensors);
  EXPECT_EQ(nn::deserialize_safetensors_metadata(bytes), meta);

  TempDir dir;
  const fs::path file = dir.path / "model.safetensors";
  nn::save_safetensors(file.string(), tensors, meta);
  EXPECT_EQ(read_bytes(file), bytes);
  expect_same(nn::load_safetensors(file.string()), tensors);
  EXPECT_EQ(nn::read_safetensors_metadata(file.string()), meta);
}

TEST(Safetensors, KeepsSavedOrderAndPadsHeaderToEightBytes) {
  // Names out of alphabetical order come back in the order they were saved.
  const NamedTensors tensors = {{"z.weight", from_vector<float>({1, 2}, {2})},
                                {"a.bias", from_vector<float>({3}, {1})},
                                {"m", from_vector<int64_t>({4, 5, 6}, {3})}};
  for (size_t extra = 0; extra < 9; ++extra) {  // header lengths of every residue mod 8
    const nn::SafetensorsMetadata meta = {{"k", std::string(extra, 'x')}};
    const std::string bytes = nn::serialize_safetensors(tensors, meta);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 8 + 4 + 24);
    // The JSON ends at the last '}'; what follows is fewer than 8 spaces.
    const std::string header = bytes.substr(8, n);
    const size_t close = header.find_last_of('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_LT(n - 1 - close, 8u);
    EXPECT_EQ(header.substr(close + 1), std::string(n - 1 - close, ' '));
    expect_same(nn::deserialize_safetensors(bytes), tensors);
  }
}

TEST(Safetensors, ViewsAreSavedAsContiguousRowMajor) {
  // [[0, 1, 2], [3, 4, 5]] transposed: rows [0, 3], [1, 4], [2, 5].
  const Tensor base = from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor t = base.t();
  ASSERT_FALSE(t.is_contiguous());
  const NamedTensors got = nn::deserialize_safetensors(nn::serialize_safetensors({{"t", t}}));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second.sizes(), (Shape{3, 2}));
  EXPECT_EQ(got[0].second.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST(Safetensors, EmptyStateDict) {
  // An empty header is "{}" padded to 8 bytes.
  const std::string bytes = nn::serialize_safetensors({});
  EXPECT_EQ(bytes, le64(8) + "{}      ");
  EXPECT_TRUE(nn::deserialize_safetensors(bytes).empty());
}

// The file the format's rules give for {"a": f32 [1.0, -2.5], "b": u8 [[1, 2, 3]]} with metadata format=pt, assembled
// here by hand: compact JSON with "__metadata__" first, each entry's keys in the order dtype, shape, data_offsets
// (as the reference writer emits them), padded with spaces to a multiple of 8, then the little-endian data.
std::string hand_written_file() {
  const std::string json =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1,3],"data_offsets":[8,11]}})";
  std::string header = json;
  while (header.size() % 8 != 0) header += ' ';
  EXPECT_EQ(json.size(), 140u);
  EXPECT_EQ(header.size(), 144u);
  const std::string buffer = std::string("\x00\x00\x80\x3f", 4)   // 1.0f  = 0x3f800000
                             + std::string("\x00\x00\x20\xc0", 4)  // -2.5f = 0xc0200000
                             + std::string("\x01\x02\x03", 3);
  return std::string("\x90\x00\x00\x00\x00\x00\x00\x00", 8) + header + buffer;  // 144 = 0x90
}

TEST(Safetensors, WriterMatchesHandWrittenFileByteForByte) {
  const std::string expected = hand_written_file();
  const NamedTensors tensors = {{"a", from_vector<float>({1.0f, -2.5f}, {2})},
                                {"b", from_vector<uint8_t>({1, 2, 3}, {1, 3})}};
  EXPECT_EQ(nn::serialize_safetensors(tensors, {{"format", "pt"}}), expected);
  TempDir dir;
  nn::save_safetensors((dir.path / "x.safetensors").string(), tensors, {{"format", "pt"}});
  EXPECT_EQ(read_bytes(dir.path / "x.safetensors"), expected);
}

TEST(Safetensors, ReaderParsesHandWrittenFile) {
  TempDir dir;
  write_bytes(dir.path / "x.safetensors", hand_written_file());
  const NamedTensors got = nn::load_safetensors((dir.path / "x.safetensors").string());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, "a");
  EXPECT_EQ(got[0].second.dtype(), DType::f32);
  EXPECT_EQ(got[0].second.to_vector<float>(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(got[1].first, "b");
  EXPECT_EQ(got[1].second.dtype(), DType::u8);
  EXPECT_EQ(got[1].second.sizes(), (Shape{1, 3}));
  EXPECT_EQ(got[1].second.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(nn::read_safetensors_metadata((dir.path / "x.safetensors").string()),
            (nn::SafetensorsMetadata{{"format", "pt"}}));
}

TEST(Safetensors, LoadOrdersByDataOffset) {
  // Header lists b before a, but a's bytes come first; an empty tensor sits between them.
  const std::string header = R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[1,1]},)"
                             R"("a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})";
  const NamedTensors got = nn::deserialize_safetensors(make_file(header, "\x07\x08\x09"));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, "a");
  EXPECT_EQ(got[0].second.dim(), 0);
  EXPECT_EQ(got[0].second.item<uint8_t>(), 7);
  EXPECT_EQ(got[1].first, "e");
  EXPECT_EQ(got[2].first, "b");
  EXPECT_EQ(got[2].second.to_vector<int64_t>(), (std::vector<int64_t>{8, 9}));
}

// --- malformed files -----------------------------------------------------------------------------------------------

struct Malformed {
  const char* what;
  std::string bytes;
  const char* message;  // a part of the FormatError's text
  bool in_header = true;  // false: only reading the tensors' bytes finds it
};

std::string entry(const std::string& name, const std::string& body) { return "\"" + name + "\":" + body; }

std::vector<Malformed> malformed_cases() {
  const std::string f32x2 = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string buf8(8, '\0');
  return {
      {"shorter than 8 bytes", "abc", "too short"},
      {"empty file", "", "too short"},
      {"header over 100 MB", le64(100'000'001) + "{}", "limit"},
      {"header past the end", le64(100) + "{}      ", "past the end"},
      {"invalid JSON", make_file(R"({"a":)", ""), "not valid JSON"},
      {"invalid UTF-8 in JSON", make_file("{\"\xff\":1}", ""), "not valid JSON"},
      {"header is an array", make_file("[1,2]", ""), "not an object"},
      {"entry is a number", make_file("{" + entry("a", "3") + "}", ""), "not an object"},
      {"missing dtype", make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", buf8), "no \"dtype\""},
      {"missing shape", make_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", buf8), "no \"shape\""},
      {"missing data_offsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", buf8), "no \"data_offsets\""},
      {"unknown key", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", buf8),
       "unknown key"},
      {"dtype not a string", make_file(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", buf8),
       "not a string"},
      {"unknown dtype", make_file(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", buf8), "Q4"},
      {"unsupported dtype", make_file(R"({"a":{"dtype":"U16","shape":[8],"data_offsets":[0,8]}})", buf8),
       "U16 is not supported"},
      {"shape not an array", make_file(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", buf8),
       "not an array"},
      {"shape float", make_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", buf8),
       "not an integer"},
      {"negative dim", make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", buf8), "negative"},
      {"shape overflow",
       make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", buf8),
       "overflows"},
      {"dim past int64",
       make_file(R"({"a":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", ""), "overflows"},
      {"empty but overflowing",
       make_file(R"({"a":{"dtype":"F64","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", ""),
       "overflows"},
      {"offsets not an array", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":8}})", buf8),
       "[begin, end]"},
      {"one offset", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", buf8), "[begin, end]"},
      {"negative offset", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]}})", buf8),
       "non-negative"},
      {"end before begin", make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[6,4]}})", buf8),
       "end before begin"},
      {"end past buffer", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", buf8),
       "past the end"},
      {"size mismatch", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", buf8.substr(0, 4)),
       "needs 8"},
      {"overlap",
       make_file("{" + entry("a", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})") + "," +
                     entry("b", R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})") + "}",
                 std::string(12, '\0')),
       "overlaps"},
      {"gap",
       make_file("{" + entry("a", R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})") + "," +
                     entry("b", R"({"dtype":"F32","shape":[1],"data_offsets":[8,12]})") + "}",
                 std::string(12, '\0')),
       "belong to no tensor"},
      {"gap at start", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", buf8),
       "belong to no tensor"},
      {"trailing bytes", make_file("{" + entry("a", f32x2) + "}", buf8 + "xyz"), "3 trailing bytes"},
      {"duplicate tensor", make_file("{" + entry("a", f32x2) + "," + entry("a", f32x2) + "}", buf8), "duplicate"},
      {"duplicate inner key",
       make_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", buf8), "duplicate"},
      {"metadata not an object", make_file(R"({"__metadata__":[1]})", ""), "__metadata__"},
      {"metadata value not a string", make_file(R"({"__metadata__":{"step":3}})", ""), "not a string"},
      {"bool byte 2",
       make_file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)), "0 or 1",
       false},
  };
}

TEST(Safetensors, MalformedInputRaisesFormatError) {
  TempDir dir;
  for (const Malformed& c : malformed_cases()) {
    SCOPED_TRACE(c.what);
    try {
      (void)nn::deserialize_safetensors(c.bytes);
      ADD_FAILURE() << "no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
    // Same through a file, whose name the message carries.
    const fs::path file = dir.path / "bad.safetensors";
    write_bytes(file, c.bytes);
    try {
      (void)nn::load_safetensors(file.string());
      ADD_FAILURE() << "no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
    }
    if (c.in_header) EXPECT_THROW((void)nn::read_safetensors_metadata(file.string()), FormatError);
  }
}

TEST(Safetensors, EveryTruncationRaisesFormatError) {
  const std::string bytes = nn::serialize_safetensors(every_dtype(), {{"a", "b"}});
  TempDir dir;
  const fs::path file = dir.path / "cut.safetensors";
  for (size_t len = 0; len < bytes.size(); ++len) {
    SCOPED_TRACE(len);
    EXPECT_THROW((void)nn::deserialize_safetensors(std::string_view(bytes).substr(0, len)), FormatError);
    if (len % 7 == 0) {  // through a file as well, on a sample of lengths
      write_bytes(file, bytes.substr(0, len));
      EXPECT_THROW((void)nn::load_safetensors(file.string()), FormatError);
    }
  }
}

// --- writing -------------------------------------------------------------------------------------------------------

TEST(Safetensors, BadNamesAndTensorsRaiseValueError) {
  const Tensor t = from_vector<float>({1}, {1});
  EXPECT_THROW((void)nn::serialize_safetensors({{"a", t}, {"a", t}}), ValueError);
  EXPECT_THROW((void)nn::serialize_safetensors({{"__metadata__", t}}), ValueError);
  EXPECT_THROW((void)nn::serialize_safetensors({{"", t}}), ValueError);
  EXPECT_THROW((void)nn::serialize_safetensors({{"u", Tensor()}}), ValueError);
  EXPECT_THROW((void)nn::serialize_safetensors({{"m", empty({2}, {DType::f32, Device::meta()})}}), ValueError);
  EXPECT_THROW((void)nn::serialize_safetensors({{"bad\xff", t}}), ValueError);
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryAndKeepsOldFileOnError) {
  TempDir dir;
  const fs::path file = dir.path / "ckpt.safetensors";
  nn::save_safetensors(file.string(), {{"w", from_vector<float>({1, 2}, {2})}});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));
  EXPECT_EQ(fs::status(file).permissions() & fs::perms::owner_read, fs::perms::owner_read);

  // Overwriting replaces the file.
  nn::save_safetensors(file.string(), {{"w", from_vector<float>({3, 4, 5}, {3})}});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));
  EXPECT_EQ(nn::load_safetensors(file.string())[0].second.to_vector<float>(), (std::vector<float>{3, 4, 5}));

  // A failed save (duplicate names) leaves the old file as it was and nothing else.
  const std::string before = read_bytes(file);
  const Tensor t = from_vector<float>({9}, {1});
  EXPECT_THROW(nn::save_safetensors(file.string(), {{"a", t}, {"a", t}}), ValueError);
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));

  // A directory that does not exist: an error, and no file appears anywhere.
  EXPECT_THROW(nn::save_safetensors((dir.path / "missing" / "x.safetensors").string(), {{"a", t}}), Error);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));
}

TEST(Safetensors, MissingFileRaisesValueError) {
  TempDir dir;
  EXPECT_THROW((void)nn::load_safetensors((dir.path / "nope.safetensors").string()), ValueError);
  EXPECT_THROW((void)nn::load_safetensors(dir.path.string()), ValueError);  // a directory
}

// Saving from and loading to a device (the cuda instance runs on a GPU machine).
class SafetensorsDeviceTest : public DeviceTest {};

TEST_P(SafetensorsDeviceTest, RoundTripThroughDevice) {
  const NamedTensors host = every_dtype();
  NamedTensors on_device;
  for (const auto& [name, t] : host) on_device.emplace_back(name, t.to(device()));
  const NamedTensors loaded = nn::deserialize_safetensors(nn::serialize_safetensors(on_device), device());
  ASSERT_EQ(loaded.size(), host.size());
  NamedTensors back;
  for (const auto& [name, t] : loaded) {
    EXPECT_EQ(t.device(), device());
    back.emplace_back(name, t.cpu());
  }
  expect_same(back, host);
}

EMBER_INSTANTIATE_DEVICE_TESTS(SafetensorsDeviceTest);

}  // namespace
}  // namespace ember::testing
