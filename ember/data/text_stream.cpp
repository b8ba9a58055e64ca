// TextWindowDataset and TextFileStream with its per-shard stream (Note [Chunked byte stream] in text_stream.h).
// Invariant: a stream owns at most one chunk buffer at any time, and the examples it returns never alias it.
#include "ember/data/text_stream.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "ember/base/error.h"
#include "ember/data/file_io.h"
#include "ember/data/random.h"

namespace ember::data {

// --- TextWindowDataset ------------------------------------------------------------------------------------------

TextWindowDataset::TextWindowDataset(Tensor ids, int64_t block_size) {
  EMBER_CHECK(ids.defined(), ValueError, "TextWindowDataset: the ids tensor is undefined");
  EMBER_CHECK(ids.device().is_cpu(), DeviceError, "TextWindowDataset: ids must be on the CPU, got ",
              ids.description());
  EMBER_CHECK(ids.dtype() == DType::i64, DTypeError, "TextWindowDataset: ids must be i64, got ", ids.description());
  EMBER_CHECK(ids.dim() == 1, ShapeError, "TextWindowDataset: ids must be 1-d, got ", shape_str(ids.sizes()));
  EMBER_CHECK(block_size > 0, ValueError, "TextWindowDataset: block_size must be > 0, got ", block_size);
  const int64_t length = ids.size(0);
  EMBER_CHECK(length > block_size, ValueError, "TextWindowDataset: ", length, " ids hold no window of block_size ",
              block_size, " (a window needs block_size + 1 ids)");
  ids_ = std::move(ids);
  block_size_ = block_size;
  num_windows_ = (length - 1) / block_size;
}

Example TextWindowDataset::get(int64_t index, Generator& /*rng*/) const {
  EMBER_CHECK(index >= 0 && index < num_windows_, IndexError, "TextWindowDataset: index ", index,
              " is out of range for ", num_windows_, " windows");
  const int64_t start = index * block_size_;
  return {ids_.narrow(0, start, block_size_), ids_.narrow(0, start + 1, block_size_)};
}

// --- TextFileStream ---------------------------------------------------------------------------------------------

namespace {

struct StreamGeometry {
  std::string path;
  int64_t block_size, chunk_windows, file_bytes, num_windows;
};

class ChunkStream final : public ExampleStream {
 public:
  ChunkStream(StreamGeometry g, int64_t shard, int64_t num_shards, bool shuffle, uint64_t seed, int64_t epoch)
      : g_(std::move(g)), file_(g_.path), shard_(shard), num_shards_(num_shards), shuffle_(shuffle),
        gen_(sample_seed(seed, epoch, shard)) {
    const int64_t chunks = (g_.num_windows + g_.chunk_windows - 1) / g_.chunk_windows;
    my_chunks_ = shard < chunks ? (chunks - shard + num_shards - 1) / num_shards : 0;
    if (shuffle_) chunk_order_ = permutation(my_chunks_, gen_);
  }

  std::optional<Example> next() override {
    while (pos_ >= chunk_count_) {
      chunk_ = Tensor();  // release the spent chunk before the next one is allocated
      if (next_chunk_ >= my_chunks_) return std::nullopt;
      const int64_t j = next_chunk_++;
      load(shard_ + num_shards_ * (shuffle_ ? chunk_order_[static_cast<size_t>(j)] : j));
    }
    const int64_t w = shuffle_ ? window_order_[static_cast<size_t>(pos_)] : pos_;
    ++pos_;
    const int64_t t = g_.block_size;
    const uint8_t* bytes = chunk_.data<uint8_t>() + w * t;
    Tensor data = empty({t}, {DType::i64, Device::cpu()});
    Tensor target = empty({t}, {DType::i64, Device::cpu()});
    int64_t* d = data.data<int64_t>();
    int64_t* y = target.data<int64_t>();
    for (int64_t k = 0; k < t; ++k) {
      d[k] = bytes[k];
      y[k] = bytes[k + 1];
    }
    return Example{std::move(data), std::move(target)};
  }

 private:
  void load(int64_t chunk) {
    const int64_t t = g_.block_size;
    const int64_t first = chunk * g_.chunk_windows;
    const int64_t count = std::min(g_.chunk_windows, g_.num_windows - first);
    const int64_t offset = first * t;
    const int64_t nbytes = count * t + 1;
    chunk_ = empty({nbytes}, {DType::u8, Device::cpu()});
    const int64_t got = file_.read_at(offset, chunk_.raw_data(), nbytes);
    if (got != nbytes) {
      chunk_ = Tensor();
      EMBER_THROW(FormatError, "TextFileStream: '", g_.path, "' was truncated while streaming: chunk ", chunk,
                  " needs bytes [", offset, ", ", offset + nbytes, ") but the file ends at byte ", offset + got,
                  " (it had ", g_.file_bytes, " bytes when the dataset was made)");
    }
    chunk_count_ = count;
    pos_ = 0;
    if (shuffle_) window_order_ = permutation(count, gen_);
  }

  StreamGeometry g_;
  io::ReadOnlyFile file_;
  int64_t shard_, num_shards_;
  bool shuffle_;
  Generator gen_;
  int64_t my_chunks_ = 0, next_chunk_ = 0;  // chunks of this shard; the next one to read (index into the shard's)
  std::vector<int64_t> chunk_order_;        // with shuffle: the shard's chunks (0..my_chunks_-1) in reading order
  Tensor chunk_;                            // u8 bytes of the current chunk, or undefined
  int64_t chunk_count_ = 0, pos_ = 0;       // windows in the current chunk; windows emitted from it
  std::vector<int64_t> window_order_;       // with shuffle: the current chunk's windows in emitting order
};

}  // namespace

TextFileStream::TextFileStream(std::string path, int64_t block_size, int64_t chunk_windows, bool shuffle)
    : path_(std::move(path)), block_size_(block_size), chunk_windows_(chunk_windows), shuffle_(shuffle) {
  EMBER_CHECK(block_size > 0, ValueError, "TextFileStream: block_size must be > 0, got ", block_size);
  EMBER_CHECK(chunk_windows > 0, ValueError, "TextFileStream: chunk_windows must be > 0, got ", chunk_windows);
  EMBER_CHECK(chunk_windows <= (std::numeric_limits<int64_t>::max() - 1) / block_size, ValueError,
              "TextFileStream: a chunk of ", chunk_windows, " windows of ", block_size, " bytes is too large");
  const std::optional<int64_t> size = io::file_size(path_);
  EMBER_CHECK(size.has_value(), ValueError, "TextFileStream: '", path_, "' is not a readable file");
  { const io::ReadOnlyFile probe(path_); }  // ValueError now, not at the first open(), when it cannot be opened
  file_bytes_ = *size;
  EMBER_CHECK(file_bytes_ > block_size, ValueError, "TextFileStream: '", path_, "' has ", file_bytes_,
              " bytes, no window of block_size ", block_size, " (a window needs block_size + 1 bytes)");
  num_windows_ = (file_bytes_ - 1) / block_size;
}

std::unique_ptr<ExampleStream> TextFileStream::open(int64_t shard, int64_t num_shards, uint64_t seed,
                                                    int64_t epoch) const {
  EMBER_CHECK(num_shards > 0, ValueError, "TextFileStream::open: num_shards must be > 0, got ", num_shards);
  EMBER_CHECK(shard >= 0 && shard < num_shards, ValueError, "TextFileStream::open: shard ", shard,
              " is outside [0, ", num_shards, ")");
  return std::make_unique<ChunkStream>(
      StreamGeometry{path_, block_size_, chunk_windows_, file_bytes_, num_windows_}, shard, num_shards, shuffle_, seed,
      epoch);
}

}  // namespace ember::data
