// Token windows for language-model training: TextWindowDataset (random access over an id tensor in memory) and
// TextFileStream (byte-level ids streamed from a file too large to hold, one chunk at a time). Invariant: with L ids
// and block size T there are W = (L - 1) / T non-overlapping windows; window i is data = ids[i*T, i*T + T) and
// target = ids[i*T + 1, i*T + T + 1), both i64 [T]; a stream's shards together give every window exactly once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ember/core/tensor.h"
#include "ember/data/dataset.h"

namespace ember::data {

class TextWindowDataset final : public Dataset {
 public:
  // `ids`: a 1-d i64 CPU tensor (DTypeError / ShapeError / DeviceError otherwise). ValueError when block_size <= 0 or
  // the tensor holds no more than block_size ids (no window fits). Shares the tensor's storage.
  TextWindowDataset(Tensor ids, int64_t block_size);

  int64_t size() const override { return num_windows_; }
  // Window `index` (IndexError outside [0, size())): views of the ids tensor. `rng` is unused.
  Example get(int64_t index, Generator& rng) const override;
  using Dataset::get;

  int64_t block_size() const { return block_size_; }
  const Tensor& ids() const { return ids_; }

 private:
  Tensor ids_;
  int64_t block_size_ = 0;
  int64_t num_windows_ = 0;
};

// Note [Chunked byte stream]
// The file's bytes are the ids (0..255). Its W windows are grouped into chunks of K = chunk_windows consecutive
// windows: chunk c covers windows [c*K, min((c+1)*K, W)), i.e. bytes [c*K*T, c*K*T + n*T + 1) for its n windows.
// open(shard, num_shards, ...) streams chunks shard, shard + num_shards, shard + 2*num_shards, ...; so the shards
// partition the chunks and every window lies in exactly one shard. A stream holds one chunk at a time: it reads the
// chunk's bytes with one positioned read into a u8 tensor from ember::empty (so the CPU allocator accounts for it),
// emits its windows as freshly converted i64 [T] tensors (which do not keep the chunk alive), and releases the chunk
// before it reads the next. Memory is thus one buffer of chunk_bytes() = K*T + 1 bytes plus the examples the
// consumer still holds, whatever the file's size.
// With shuffle, the stream draws from Generator(sample_seed(seed, epoch, shard)) (random.h): first a permutation of
// the shard's chunk order, then, as each chunk is read, a permutation of the windows inside it. So the order is a
// function of (seed, epoch, shard) alone, reproducible and different from epoch to epoch; windows are mixed across
// the whole shard at chunk granularity and fully within a chunk (a shuffle buffer of K windows), never across shards.
class TextFileStream final : public IterableDataset {
 public:
  // ValueError when block_size <= 0, chunk_windows <= 0, the file cannot be read, or it holds no more than block_size
  // bytes. The file's size is taken here; if the file is later found shorter, a stream raises FormatError naming it.
  TextFileStream(std::string path, int64_t block_size, int64_t chunk_windows, bool shuffle = false);

  // ValueError unless num_shards > 0 and 0 <= shard < num_shards, or when the file cannot be opened any more.
  // A shard with no chunk (num_shards > num_chunks()) gives an empty stream.
  std::unique_ptr<ExampleStream> open(int64_t shard, int64_t num_shards, uint64_t seed,
                                      int64_t epoch) const override;

  int64_t num_windows() const { return num_windows_; }                     // W = (file_bytes - 1) / T
  int64_t num_chunks() const { return (num_windows_ + chunk_windows_ - 1) / chunk_windows_; }
  int64_t chunk_bytes() const { return chunk_windows_ * block_size_ + 1; }  // the buffer size K*T + 1
  int64_t file_bytes() const { return file_bytes_; }                        // as taken at construction
  int64_t block_size() const { return block_size_; }
  int64_t chunk_windows() const { return chunk_windows_; }
  bool shuffle() const { return shuffle_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t block_size_ = 0, chunk_windows_ = 0, file_bytes_ = 0, num_windows_ = 0;
  bool shuffle_ = false;
};

}  // namespace ember::data
