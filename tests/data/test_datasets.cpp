// ImageDataset over hand-made image stacks (MNIST-style [N, H, W] and CIFAR-style [N, C, H, W]) and the CIFAR-10
// binary reader: tiny batch files assembled here byte by byte, every malformed file rejected with FormatError naming
// it (before anything is allocated when the size is wrong), pixels read back at known positions, the train/test
// loader with its two folder layouts, and missing files reported with ValueError.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ember/data/cifar.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/memory/allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;
using data::Cifar10Data;
using data::ImageDataset;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ember_datasets_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// --- ImageDataset -----------------------------------------------------------------------------------------------

TEST(ImageDataset, TwoDimImagesGainAChannelAndKeepTheirLabels) {
  // 3 images of 2x3 pixels: image n holds 10*n + pixel index.
  std::vector<uint8_t> px;
  for (int n = 0; n < 3; ++n)
    for (int p = 0; p < 6; ++p) px.push_back(static_cast<uint8_t>(10 * n + p));
  const ImageDataset ds(from_vector<uint8_t>(px, {3, 2, 3}), from_vector<int64_t>({7, 0, 4}, {3}));
  EXPECT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.height(), 2);
  EXPECT_EQ(ds.width(), 3);
  Generator rng(1);
  const data::Example ex = ds.get(2, rng);
  EXPECT_EQ(ex.data.sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(ex.data.dtype(), DType::u8);
  EXPECT_EQ(ex.data.to_vector<int64_t>(), (std::vector<int64_t>{20, 21, 22, 23, 24, 25}));
  EXPECT_EQ(ex.target.dim(), 0);
  EXPECT_EQ(ex.target.dtype(), DType::i64);
  EXPECT_EQ(ex.target.item<int64_t>(), 4);
  EXPECT_EQ(ds.get(0).target.item<int64_t>(), 7);  // the generator-less overload
  EXPECT_EQ(ds.get(1).data.to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 12, 13, 14, 15}));
}

TEST(ImageDataset, FourDimImagesAreReturnedChannelsFirst) {
  // 2 images, 3 channels, 2x2: value = 100*n + 10*c + 2*y + x.
  std::vector<uint8_t> px;
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 2; ++y)
        for (int x = 0; x < 2; ++x) px.push_back(static_cast<uint8_t>(100 * n + 10 * c + 2 * y + x));
  const ImageDataset ds(from_vector<uint8_t>(px, {2, 3, 2, 2}), from_vector<int64_t>({5, 9}, {2}));
  const data::Example ex = ds.get(1);
  EXPECT_EQ(ex.data.sizes(), (Shape{3, 2, 2}));
  EXPECT_EQ(ex.data.to_vector<int64_t>(),
            (std::vector<int64_t>{100, 101, 102, 103, 110, 111, 112, 113, 120, 121, 122, 123}));
  EXPECT_EQ(ex.target.item<int64_t>(), 9);
}

TEST(ImageDataset, IndexOutsideTheRangeIsAnIndexError) {
  const ImageDataset ds(zeros({4, 2, 2}, DType::u8), zeros({4}, DType::i64));
  EXPECT_THROW((void)ds.get(-1), IndexError);
  EXPECT_THROW((void)ds.get(4), IndexError);
  EXPECT_NO_THROW((void)ds.get(3));
}

TEST(ImageDataset, InconsistentTensorsAreRejected) {
  const Tensor images = zeros({4, 2, 2}, DType::u8), labels = zeros({4}, DType::i64);
  EXPECT_THROW(ImageDataset(zeros({4, 2, 2}, DType::f32), labels), DTypeError);
  EXPECT_THROW(ImageDataset(images, zeros({4}, DType::i32)), DTypeError);
  EXPECT_THROW(ImageDataset(zeros({4, 2}, DType::u8), labels), ShapeError);
  EXPECT_THROW(ImageDataset(zeros({4, 1, 2, 2, 1}, DType::u8), labels), ShapeError);
  EXPECT_THROW(ImageDataset(images, zeros({3}, DType::i64)), ShapeError);
  EXPECT_THROW(ImageDataset(images, zeros({4, 1}, DType::i64)), ShapeError);
  EXPECT_THROW(ImageDataset(Tensor(), labels), ValueError);
}

TEST(ImageDataset, FromMnistFilesAndFromSyntheticDigits) {
  // A 2-image, 2x2 IDX pair written by hand (Fashion-MNIST ships the same files under the same names).
  TempDir dir;
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  write_bytes(dir.path / "t10k-images-idx3-ubyte",
              be32(0x803) + be32(2) + be32(2) + be32(2) + std::string("\x01\x02\x03\x04\xfa\xfb\xfc\xfd", 8));
  write_bytes(dir.path / "t10k-labels-idx1-ubyte", be32(0x801) + be32(2) + std::string("\x03\x08", 2));
  const ImageDataset ds = ImageDataset::from(data::load_mnist(dir.path.string(), /*train=*/false));
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.get(1).data.sizes(), (Shape{1, 2, 2}));
  EXPECT_EQ(ds.get(1).data.to_vector<int64_t>(), (std::vector<int64_t>{250, 251, 252, 253}));
  EXPECT_EQ(ds.get(0).target.item<int64_t>(), 3);
  EXPECT_EQ(ds.get(1).target.item<int64_t>(), 8);

  const ImageDataset synth = ImageDataset::from(data::synthetic_mnist(6, 3));
  EXPECT_EQ(synth.size(), 6);
  EXPECT_EQ(synth.get(5).data.sizes(), (Shape{1, 28, 28}));
}

// --- CIFAR-10 ---------------------------------------------------------------------------------------------------

constexpr int64_t kRecord = 3073;

// One record: the label byte, then 3072 pixel bytes, all zero except those set in `pixels` as (c, y, x, value).
struct Pixel {
  int c, y, x;
  uint8_t v;
};
std::string record(uint8_t label, const std::vector<Pixel>& pixels = {}) {
  std::string r(kRecord, '\0');
  r[0] = static_cast<char>(label);
  for (const Pixel& p : pixels) r[1 + 1024 * p.c + 32 * p.y + p.x] = static_cast<char>(p.v);
  return r;
}

TEST(Cifar10, ConstantsAreTheDatasetsOwn) {
  ASSERT_EQ(data::kCifar10Classes.size(), 10u);
  EXPECT_STREQ(data::kCifar10Classes[0], "airplane");
  EXPECT_STREQ(data::kCifar10Classes[3], "cat");
  EXPECT_STREQ(data::kCifar10Classes[9], "truck");
  EXPECT_DOUBLE_EQ(data::kCifar10Mean[0], 0.4914);
  EXPECT_DOUBLE_EQ(data::kCifar10Mean[2], 0.4465);
  EXPECT_DOUBLE_EQ(data::kCifar10Std[1], 0.2435);
  EXPECT_EQ(data::kCifar10RecordBytes, kRecord);
}

TEST(Cifar10, GoodBatchRoundTripsPixelsAtKnownPositions) {
  TempDir dir;
  const fs::path p = dir.path / "data_batch_1.bin";
  write_bytes(p, record(6, {{0, 0, 0, 11}, {0, 31, 31, 12}, {1, 2, 3, 13}}) +
                     record(9, {{2, 0, 31, 14}, {2, 31, 0, 15}, {1, 16, 5, 255}}) + record(0));
  const Cifar10Data d = data::read_cifar10_batch(p.string());
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.images.sizes(), (Shape{3, 3, 32, 32}));
  EXPECT_EQ(d.images.dtype(), DType::u8);
  EXPECT_EQ(d.labels.dtype(), DType::i64);
  EXPECT_EQ(d.labels.to_vector<int64_t>(), (std::vector<int64_t>{6, 9, 0}));
  const uint8_t* img = d.images.data<uint8_t>();
  auto at = [&](int n, int c, int y, int x) { return static_cast<int>(img[((n * 3 + c) * 32 + y) * 32 + x]); };
  EXPECT_EQ(at(0, 0, 0, 0), 11);   // red, top left
  EXPECT_EQ(at(0, 0, 31, 31), 12);  // red, bottom right
  EXPECT_EQ(at(0, 1, 2, 3), 13);    // green, row 2, column 3
  EXPECT_EQ(at(1, 2, 0, 31), 14);   // blue, top right
  EXPECT_EQ(at(1, 2, 31, 0), 15);   // blue, bottom left
  EXPECT_EQ(at(1, 1, 16, 5), 255);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < d.images.numel(); ++i) nonzero += img[i] != 0;
  EXPECT_EQ(nonzero, 6);  // nothing else was set

  const ImageDataset ds = ImageDataset::from(d);
  EXPECT_EQ(ds.size(), 3);
  const data::Example ex = ds.get(1);
  EXPECT_EQ(ex.data.sizes(), (Shape{3, 32, 32}));
  EXPECT_EQ(ex.target.item<int64_t>(), 9);
  EXPECT_EQ(ex.data.select(0, 2).select(0, 0).select(0, 31).item<int64_t>(), 14);
}

TEST(Cifar10, MalformedFilesAreFormatErrorsNamingTheFile) {
  TempDir dir;
  const fs::path p = dir.path / "bad_batch.bin";
  const std::string name = p.string();

  write_bytes(p, "");
  std::string msg = error_message<FormatError>([&] { (void)data::read_cifar10_batch(name); });
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;

  write_bytes(p, record(1) + record(2) + std::string(5, '\x07'));  // 5 bytes left over
  msg = error_message<FormatError>([&] { (void)data::read_cifar10_batch(name); });
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 bytes are left over"), std::string::npos) << msg;

  write_bytes(p, record(1).substr(0, 100));  // shorter than one record
  msg = error_message<FormatError>([&] { (void)data::read_cifar10_batch(name); });
  EXPECT_NE(msg.find("100 bytes are left over"), std::string::npos) << msg;

  write_bytes(p, record(1) + record(2) + record(3).substr(0, kRecord - 1));  // one byte short
  msg = error_message<FormatError>([&] { (void)data::read_cifar10_batch(name); });
  EXPECT_NE(msg.find(std::to_string(kRecord - 1) + " bytes are left over"), std::string::npos) << msg;

  for (int label : {10, 255}) {
    write_bytes(p, record(9) + record(static_cast<uint8_t>(label)));
    msg = error_message<FormatError>([&] { (void)data::read_cifar10_batch(name); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find("label " + std::to_string(label)), std::string::npos) << msg;
    EXPECT_NE(msg.find("record 1"), std::string::npos) << msg;
  }

  EXPECT_THROW((void)data::read_cifar10_batch((dir.path / "absent.bin").string()), ValueError);
}

TEST(Cifar10, SizeIsCheckedBeforeAnythingIsAllocated) {
  // A big file of the wrong size: the reader must refuse it without allocating its ~3 MB of images.
  TempDir dir;
  const fs::path p = dir.path / "big.bin";
  write_bytes(p, std::string(static_cast<size_t>(kRecord * 1000 + 1), '\0'));
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  const int64_t before = alloc.stats().allocated_bytes;
  memory::PeakWindow window(alloc);
  EXPECT_THROW((void)data::read_cifar10_batch(p.string()), FormatError);
  EXPECT_EQ(window.peak(), before) << "the malformed file was allocated for before its size was checked";
}

// Writes the training files (record k overall: label k % 10, red pixel (0, 0) = k) and the test file (labels 9, 8,
// ...; green pixel (1, 1) = 200).
void write_cifar_tree(const fs::path& folder, const std::vector<int>& train_counts, int test_count) {
  fs::create_directories(folder);
  int label = 0;
  for (size_t k = 0; k < train_counts.size(); ++k) {
    std::string bytes;
    for (int i = 0; i < train_counts[k]; ++i, ++label)
      bytes += record(static_cast<uint8_t>(label % 10), {{0, 0, 0, static_cast<uint8_t>(label)}});
    write_bytes(folder / ("data_batch_" + std::to_string(k + 1) + ".bin"), bytes);
  }
  std::string test;
  for (int i = 0; i < test_count; ++i) test += record(static_cast<uint8_t>(9 - i), {{1, 1, 1, 200}});
  write_bytes(folder / "test_batch.bin", test);
}

TEST(Cifar10, LoaderConcatenatesTheTrainingBatchesInOrder) {
  TempDir dir;
  write_cifar_tree(dir.path, {1, 2, 1, 1, 3}, 2);
  for (const fs::path& where : {dir.path, dir.path / "."}) {
    const Cifar10Data train = data::load_cifar10(where.string(), /*train=*/true);
    ASSERT_EQ(train.size(), 8);
    EXPECT_EQ(train.images.sizes(), (Shape{8, 3, 32, 32}));
    EXPECT_EQ(train.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    for (int n = 0; n < 8; ++n) EXPECT_EQ(train.images.data<uint8_t>()[n * 3072], n) << "image " << n;
  }
  const Cifar10Data test = data::load_cifar10(dir.path.string(), /*train=*/false);
  ASSERT_EQ(test.size(), 2);
  EXPECT_EQ(test.labels.to_vector<int64_t>(), (std::vector<int64_t>{9, 8}));
  EXPECT_EQ(test.images.data<uint8_t>()[3072 + 1024 + 32 + 1], 200);
}

TEST(Cifar10, LoaderAcceptsTheParentOfTheArchiveFolder) {
  TempDir dir;
  write_cifar_tree(dir.path / "cifar-10-batches-bin", {2, 1, 1, 1, 1}, 3);
  EXPECT_EQ(data::load_cifar10(dir.path.string(), true).size(), 6);
  EXPECT_EQ(data::load_cifar10(dir.path.string(), false).size(), 3);
  EXPECT_EQ(data::load_cifar10((dir.path / "cifar-10-batches-bin").string(), false).size(), 3);
}

TEST(Cifar10, MissingFilesAreValueErrorsNamingThem) {
  TempDir dir;
  std::string msg = error_message<ValueError>([&] { (void)data::load_cifar10(dir.path.string(), true); });
  EXPECT_NE(msg.find("data_batch_1.bin"), std::string::npos) << msg;
  msg = error_message<ValueError>([&] { (void)data::load_cifar10(dir.path.string(), false); });
  EXPECT_NE(msg.find("test_batch.bin"), std::string::npos) << msg;

  write_cifar_tree(dir.path, {1, 1, 1, 1, 1}, 1);
  fs::remove(dir.path / "data_batch_3.bin");
  msg = error_message<ValueError>([&] { (void)data::load_cifar10(dir.path.string(), true); });
  EXPECT_NE(msg.find((dir.path / "data_batch_3.bin").string()), std::string::npos) << msg;
  EXPECT_EQ(data::load_cifar10(dir.path.string(), false).size(), 1);  // the test set is still complete

  // A malformed file among good ones is still a FormatError naming it.
  write_bytes(dir.path / "data_batch_3.bin", record(1) + "xyz");
  msg = error_message<FormatError>([&] { (void)data::load_cifar10(dir.path.string(), true); });
  EXPECT_NE(msg.find("data_batch_3.bin"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ember::testing
