// model_memory / measure_inference (compression_report.h) on small models with hand-counted bytes.
#include <gtest/gtest.h>

#include "ember/ember.h"
#include "ember/nn/compression_report.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"

namespace ember::nn {
namespace {

TEST(CompressionReport, CountsParametersBuffersAndWeights) {
  auto net = std::make_shared<Sequential>(std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(),
                                          std::make_shared<Linear>(16, 4));
  ModelMemory m = model_memory(*net);
  EXPECT_EQ(m.parameter_bytes, 4 * (8 * 16 + 16 + 16 * 4 + 4));
  EXPECT_EQ(m.weight_bytes, 4 * (8 * 16 + 16 * 4));
  EXPECT_EQ(m.total_bytes, m.parameter_bytes);
  EXPECT_EQ(m.packed_bytes, 0);
  // The caching allocator's blocks holding the four tensors (512, 64, 256, 16 bytes): 512-byte blocks each.
  EXPECT_EQ(m.allocator_bytes, 4 * 512);
  // Another live instance of the same class (the same owner tags) does not count.
  auto twin = std::make_shared<Sequential>(std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(),
                                           std::make_shared<Linear>(16, 4));
  EXPECT_EQ(model_memory(*net).allocator_bytes, 4 * 512);
  EXPECT_EQ(model_memory(*twin).allocator_bytes, 4 * 512);
  // A storage from an allocator of another kind (the pinned pool): its rounding is unknown, so no allocator bytes.
  auto pinned = std::make_shared<Linear>(2, 2);
  pinned->register_buffer("staging", empty_pinned({256}));
  EXPECT_EQ(model_memory(*pinned).allocator_bytes, -1);

  // Buffers are sorted by name: a mask, a packed weight, anything else.
  auto lin = net->at<Linear>(0);
  lin->register_buffer("weight_mask", zeros({16}, {DType::u8}));
  lin->register_buffer("weight_codes", zeros({10}, {DType::i8}));
  lin->register_buffer("stats", zeros({3}));
  m = model_memory(*net);
  EXPECT_EQ(m.mask_bytes, 16);
  EXPECT_EQ(m.packed_bytes, 10);
  EXPECT_EQ(m.other_buffer_bytes, 12);
  EXPECT_EQ(m.total_bytes, m.parameter_bytes + 16 + 10 + 12);
}

TEST(CompressionReport, SharedStorageCountsOnce) {
  auto a = std::make_shared<Linear>(4, 4, false);
  auto b = std::make_shared<Linear>(4, 4, false);
  auto net = std::make_shared<Sequential>(a, b);
  b->remove_parameter("weight");
  b->weight = b->register_parameter("weight", a->weight);  // tied
  EXPECT_EQ(model_memory(*net).total_bytes, 4 * 16);
}

TEST(CompressionReport, InferencePeakIsMeasuredAndModeRestored) {
  manual_seed(0);
  auto net = std::make_shared<Sequential>(std::make_shared<Linear>(32, 64), std::make_shared<ReLU>(),
                                          std::make_shared<Linear>(64, 8));
  net->train();
  const Tensor x = randn({4, 32});
  const InferenceMemory r = measure_inference(*net, x);
  EXPECT_TRUE(net->is_training());
  EXPECT_EQ(r.state_bytes, model_memory(*net).total_bytes);
  // At least the first layer's output [4, 64] f32 is alive at some point.
  EXPECT_GE(r.forward_peak_bytes, 4 * 64 * 4);
  EXPECT_EQ(r.peak_bytes, r.state_bytes + r.forward_peak_bytes);

  std::vector<CompressionRow> rows = {{"dense", model_memory(*net), r, 0.99}, {"half", model_memory(*net), r, -1}};
  rows[1].memory.total_bytes /= 2;
  const std::string table = format_compression_table(rows);
  EXPECT_NE(table.find("99.00%"), std::string::npos) << table;
  EXPECT_NE(table.find("0.500"), std::string::npos) << table;
  const std::string json = compression_rows_json(rows);
  EXPECT_NE(json.find("\"inference_peak_bytes\""), std::string::npos) << json;
}

}  // namespace
}  // namespace ember::nn
