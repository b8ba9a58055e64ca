// CharDataset: vocabulary and encoding worked out by hand, UTF-8 handling, the 90/10 split, batches checked against
// the text at the drawn offsets (y is x shifted by one), reproducibility from a seed, and Tiny Shakespeare's published
// numbers (nanoGPT shakespeare_char) when the file is present beside the project.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ember/data/text_dataset.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using data::CharDataset;
using data::Split;

TEST(CharDataset, VocabularyAndEncodingByHand) {
  const CharDataset ds("hello world\n");
  // Sorted distinct characters: '\n' ' ' d e h l o r w.
  EXPECT_EQ(ds.vocab_size(), 9);
  EXPECT_EQ(ds.chars(), (std::vector<char32_t>{'\n', ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w'}));
  EXPECT_EQ(ds.length(), 12);
  EXPECT_EQ(ds.encode("hello"), (std::vector<int64_t>{4, 3, 5, 5, 6}));
  EXPECT_EQ(ds.encode("world\n"), (std::vector<int64_t>{8, 6, 7, 5, 2, 0}));
  EXPECT_EQ(ds.decode(std::vector<int64_t>{8, 6, 7, 5, 2}), "world");
  EXPECT_EQ(ds.data().to_vector<int64_t>(), (std::vector<int64_t>{4, 3, 5, 5, 6, 1, 8, 6, 7, 5, 2, 0}));
  EXPECT_EQ(ds.decode(ds.data()), "hello world\n");
  EXPECT_EQ(ds.decode(from_vector<int32_t>({4, 6}, {2})), "ho");
  EXPECT_THROW((void)ds.encode("hex"), ValueError);
  EXPECT_THROW((void)ds.decode(std::vector<int64_t>{9}), IndexError);
  EXPECT_THROW((void)ds.decode(std::vector<int64_t>{-1}), IndexError);
}

TEST(CharDataset, Utf8CharactersAreSingleTokens) {
  const std::string text = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x94\xa5!";  // "héllo € 🔥!"
  const CharDataset ds(text);
  EXPECT_EQ(ds.length(), 10);
  // ' ' '!' h l o é € 🔥
  EXPECT_EQ(ds.chars(), (std::vector<char32_t>{' ', '!', 'h', 'l', 'o', 0xe9, 0x20ac, 0x1f525}));
  EXPECT_EQ(ds.encode("\xc3\xa9\xe2\x82\xac"), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(ds.decode(ds.data()), text);
  EXPECT_THROW(CharDataset("ab\xff"), FormatError);
  EXPECT_THROW(CharDataset("ab\xc3"), FormatError);            // truncated sequence
  EXPECT_THROW(CharDataset("\xc0\xaf"), FormatError);          // overlong '/'
  EXPECT_THROW(CharDataset("\xed\xa0\x80"), FormatError);      // surrogate
  EXPECT_THROW(CharDataset(""), ValueError);
  EXPECT_THROW(CharDataset("abc", 1.0), ValueError);
}

TEST(CharDataset, SplitIsFirstNinetyPercent) {
  std::string text;
  for (int i = 0; i < 105; ++i) text += static_cast<char>('a' + i % 26);
  const CharDataset ds(text);
  // int(105 * 0.9) = 94
  EXPECT_EQ(ds.split_length(Split::train), 94);
  EXPECT_EQ(ds.split_length(Split::val), 11);
  EXPECT_EQ(ds.decode(ds.split_data(Split::train)), text.substr(0, 94));
  EXPECT_EQ(ds.decode(ds.split_data(Split::val)), text.substr(94));
}

TEST(CharDataset, BatchesAreWindowsAtDrawnOffsets) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += static_cast<char>(' ' + (i * 37 + i / 7) % 90);
  const CharDataset ds(text);
  const std::vector<int64_t> train = ds.split_data(Split::train).to_vector<int64_t>();
  const int64_t B = 6, T = 16;
  Generator offsets_gen(1234), batch_gen(1234);
  const std::vector<int64_t> offsets = ds.draw_offsets(Split::train, B, T, offsets_gen);
  const auto [x, y] = ds.get_batch(Split::train, B, T, batch_gen);
  ASSERT_EQ(x.dtype(), DType::i64);
  ASSERT_EQ(x.sizes(), (Shape{B, T}));
  ASSERT_EQ(y.sizes(), (Shape{B, T}));
  const std::vector<int64_t> xv = x.to_vector<int64_t>(), yv = y.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t o = offsets[b];
    ASSERT_GE(o, 0);
    ASSERT_LT(o, static_cast<int64_t>(train.size()) - T);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(xv[b * T + t], train[o + t]);
      EXPECT_EQ(yv[b * T + t], train[o + t + 1]);
      if (t + 1 < T) EXPECT_EQ(yv[b * T + t], xv[b * T + t + 1]);
    }
  }
  // Same seed, same batch; the generator advances, so the next batch differs.
  const auto [x1, y1] = ds.get_batch(Split::train, B, T, uint64_t{99});
  const auto [x2, y2] = ds.get_batch(Split::train, B, T, uint64_t{99});
  EXPECT_EQ(x1.to_vector<int64_t>(), x2.to_vector<int64_t>());
  EXPECT_EQ(y1.to_vector<int64_t>(), y2.to_vector<int64_t>());
  const auto [x3, y3] = ds.get_batch(Split::train, B, T, batch_gen);
  EXPECT_NE(x3.to_vector<int64_t>(), xv);
}

TEST(CharDataset, OffsetsCoverTheWholeRange) {
  // val holds 20 ids; block 4 leaves offsets 0..15, each must be drawn and none outside.
  std::string text(200, 'a');
  for (size_t i = 0; i < text.size(); i += 3) text[i] = 'b';
  const CharDataset ds(text);
  ASSERT_EQ(ds.split_length(Split::val), 20);
  Generator gen(5);
  std::set<int64_t> seen;
  for (int rep = 0; rep < 50; ++rep)
    for (int64_t o : ds.draw_offsets(Split::val, 32, 4, gen)) {
      ASSERT_GE(o, 0);
      ASSERT_LT(o, 16);
      seen.insert(o);
    }
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_THROW((void)ds.get_batch(Split::val, 2, 20, gen), ValueError);  // 20 ids, block 20: no window
  EXPECT_NO_THROW((void)ds.get_batch(Split::val, 2, 19, gen));
  EXPECT_THROW((void)ds.get_batch(Split::val, 0, 4, gen), ValueError);
}

TEST(CharDataset, FromFile) {
  const fs::path p = fs::temp_directory_path() / ("ember_chars_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(p, std::ios::binary);
    out << "abcabc\nxyz";
  }
  const CharDataset ds = CharDataset::from_file(p.string());
  EXPECT_EQ(ds.vocab_size(), 7);
  EXPECT_EQ(ds.length(), 10);
  fs::remove(p);
  EXPECT_THROW((void)CharDataset::from_file(p.string()), ValueError);
  try {  // a directory is named as one, not read as an empty text
    (void)CharDataset::from_file(fs::temp_directory_path().string());
    ADD_FAILURE() << "a directory was read";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

fs::path shared_data_dir() {
  if (const char* env = std::getenv("EMBER_DATA_DIR")) return env;
  return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path() / "shared" / "data";
}

TEST(CharDataset, TinyShakespeareWhenPresent) {
  const fs::path file = shared_data_dir() / "tinyshakespeare" / "input.txt";
  if (!fs::exists(file)) GTEST_SKIP() << "no " << file;
  const CharDataset ds = CharDataset::from_file(file.string());
  // nanoGPT data/shakespeare_char/prepare.py: length 1,115,394; vocab 65; train 1,003,854; val 111,540.
  EXPECT_EQ(ds.length(), 1115394);
  EXPECT_EQ(ds.vocab_size(), 65);
  EXPECT_EQ(ds.split_length(Split::train), 1003854);
  EXPECT_EQ(ds.split_length(Split::val), 111540);
  std::vector<int64_t> all(65);
  for (int64_t i = 0; i < 65; ++i) all[i] = i;
  EXPECT_EQ(ds.decode(all), "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(ds.decode(ds.data().slice(0, 0, 14)), "First Citizen:");
  const auto [x, y] = ds.get_batch(Split::train, 12, 64, uint64_t{1337});
  EXPECT_EQ(x.sizes(), (Shape{12, 64}));
}

}  // namespace
}  // namespace ember::testing
