// Character-level text dataset (nanoGPT's shakespeare_char): the vocabulary is the sorted set of distinct characters
// (Unicode code points of UTF-8 text), the text is encoded once to i64 ids, the first 90% is the training split and
// the rest validation. Invariant: every id in the encoded data is < vocab_size(), and decode(encode(s)) == s.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/generator.h"
#include "ember/core/tensor.h"

namespace ember::data {

enum class Split { train, val };

class CharDataset {
 public:
  // ValueError for an empty text or a train_fraction outside (0, 1); FormatError for text that is not UTF-8.
  explicit CharDataset(std::string_view text, double train_fraction = 0.9);
  // Reads the whole file (ValueError when it cannot be read).
  static CharDataset from_file(const std::string& path, double train_fraction = 0.9);

  int64_t vocab_size() const { return static_cast<int64_t>(chars_.size()); }
  const std::vector<char32_t>& chars() const { return chars_; }  // id -> code point, ascending
  int64_t length() const { return data_.numel(); }                // characters in the text

  // Text -> ids (ValueError naming a character outside the vocabulary); ids -> text (IndexError when out of range).
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string decode(const Tensor& ids) const;  // any integer dtype and shape, read in row-major order

  // The whole encoded text and its splits: i64 1-d CPU tensors (the splits are views of data()).
  const Tensor& data() const { return data_; }
  const Tensor& split_data(Split split) const { return split == Split::train ? train_ : val_; }
  int64_t split_length(Split split) const { return split_data(split).numel(); }

  // A batch of batch_size windows of block_size + 1 consecutive ids at random offsets in [0, len - block_size) of
  // the split (nanoGPT's get_batch): x = window[:-1], y = window[1:], both i64 [batch_size, block_size] on `device`.
  // Offsets come from `gen`'s Philox stream (advancing it), or from a fresh Generator(seed): same seed, same batch.
  // ValueError when the split holds no more than block_size ids.
  std::pair<Tensor, Tensor> get_batch(Split split, int64_t batch_size, int64_t block_size, Generator& gen,
                                      Device device = Device::cpu()) const;
  std::pair<Tensor, Tensor> get_batch(Split split, int64_t batch_size, int64_t block_size, uint64_t seed,
                                      Device device = Device::cpu()) const;
  // The offsets get_batch would draw (for tests and for inspecting a run).
  std::vector<int64_t> draw_offsets(Split split, int64_t batch_size, int64_t block_size, Generator& gen) const;

 private:
  std::vector<char32_t> chars_;
  std::unordered_map<char32_t, int64_t> index_;
  Tensor data_, train_, val_;
};

}  // namespace ember::data
