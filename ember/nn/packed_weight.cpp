// PackedWeight defaults and the inference-only check (packed_weight.h).
#include "ember/nn/packed_weight.h"

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::nn {

Tensor PackedWeight::linear(const Tensor& x, const Tensor& bias) const {
  EMBER_THROW(ValueError, "packed weight format '", format(), "' has no linear (it packs a Conv2d weight)");
}

Tensor PackedWeight::conv2d(const Tensor& x, const Tensor& bias, const Conv2dOptions& options) const {
  EMBER_THROW(ValueError, "packed weight format '", format(), "' has no conv2d (it packs a Linear weight)");
}

void check_packed_inference(const std::string& layer, const PackedWeight& packed, const Tensor& x,
                            const Tensor& bias) {
  const bool wants_grad = x.requires_grad() || (bias.defined() && bias.requires_grad());
  EMBER_CHECK(!(GradMode::is_enabled() && wants_grad), ValueError, layer, " has a packed '", packed.format(),
              "' weight, which has no gradient: run inference under NoGradGuard, or unpack the layer to train it");
}

}  // namespace ember::nn
