// PackedWeight: a compressed storage form for the weight of a Linear or Conv2d (CSR after pruning, int8 after
// quantization) that the layer's forward uses in place of its dense weight. Invariant: a packed layer has no "weight"
// parameter; the packed tensors are persistent buffers of the layer named "weight_*" (so to(), state_dict and the
// memory attribution see them), and the PackedWeight holds those very handles.
#pragma once

#include <cstdint>
#include <string>

#include "ember/core/tensor.h"

namespace ember::nn {

class Conv2dOptions;

class PackedWeight {
 public:
  virtual ~PackedWeight() = default;
  virtual std::string format() const = 0;  // "csr", "int8"
  // y = x W^T + bias for a Linear (x [..., in]). ValueError ("format F has no linear") unless overridden.
  virtual Tensor linear(const Tensor& x, const Tensor& bias) const;
  // conv2d of x [N, C, H, W] (or [C, H, W]) for a Conv2d with these options. ValueError unless overridden.
  virtual Tensor conv2d(const Tensor& x, const Tensor& bias, const Conv2dOptions& options) const;
  // The weight as a dense f32 tensor of its original shape (densified / dequantized), for checks and export.
  virtual Tensor dense() const = 0;
  // Bytes of the packed storage: the sum of its tensors' nbytes.
  virtual int64_t nbytes() const = 0;
};

// Note [Packed weights are for inference]
// A packed weight has no gradient. A packed layer's forward raises ValueError when grad mode is on and the input or
// the bias requires grad, instead of silently training nothing: run inference under NoGradGuard (or InferenceMode),
// or unpack the layer to train it.
void check_packed_inference(const std::string& layer, const PackedWeight& packed, const Tensor& x, const Tensor& bias);

}  // namespace ember::nn
