// What pruning and quantization save, measured: a model's state bytes (dense parameters, packed weights, other
// buffers — exact tensor bytes and the allocator's block bytes under the model's "PATH/parameters" tags) and the peak
// memory of one inference forward, read from the allocator. Invariant: every number here is measured on the live
// model, never computed from layer sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/nn/module.h"

namespace ember::nn {

struct ModelMemory {
  int64_t parameter_bytes = 0;  // nbytes of the (dense) parameters
  int64_t mask_bytes = 0;       // nbytes of pruning masks (buffers named "*_mask")
  int64_t packed_bytes = 0;     // nbytes of other buffers named "weight_*": packed weights (CSR, int8 + scales)
  int64_t other_buffer_bytes = 0;  // every other buffer (BatchNorm statistics, ...)
  int64_t weight_bytes = 0;     // the weights of Linear and Conv2d layers, dense or packed (what compression targets)
  // nbytes of every distinct storage above (a tensor shared by two modules counts once).
  int64_t total_bytes = 0;
  // The caching allocators' bytes in the blocks holding these storages (rounded to their block sizes; by address,
  // so other live instances of the model's class do not count); -1 when a storage comes from another kind of
  // allocator (the pinned pool, a host allocator).
  int64_t allocator_bytes = -1;
};
ModelMemory model_memory(const Module& model);

struct InferenceMemory {
  int64_t state_bytes = 0;          // model_memory().total_bytes at the time of the run
  int64_t forward_peak_bytes = 0;   // the allocator's peak above its level before the forward (activations, scratch)
  int64_t peak_bytes = 0;           // state_bytes + forward_peak_bytes: what inference needs beyond its input
};
// One forward of `input` in eval mode without gradients; the module's train/eval mode is restored afterwards.
InferenceMemory measure_inference(Module& model, const Tensor& input);

// One row of a before/after table.
struct CompressionRow {
  std::string name;              // "dense", "50% unstructured + CSR", ...
  ModelMemory memory;
  InferenceMemory inference;
  double accuracy = -1;          // in [0, 1]; < 0: not measured
};
// A fixed-width text table (bytes in KiB, ratios against the first row) and the same as one JSON array.
std::string format_compression_table(const std::vector<CompressionRow>& rows);
std::string compression_rows_json(const std::vector<CompressionRow>& rows);

}  // namespace ember::nn
