// Structured pruning: removes whole output channels (Conv2d) / output features (Linear) ranked by the Ln norm of
// their weight slices, and physically shrinks the producer and every consumer that reads those channels (the next
// layer's input side, BatchNorm2d), giving a smaller dense model. Invariant: the shrunk model computes what the
// "masked dense model" computes (mask_channels), and nothing is modified when a call raises.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/nn/prune_amount.h"

namespace ember::nn {

// A module that reads the producer's channels.
struct ChannelConsumer {
  // Conv2d (its input channels; groups == 1), Linear (its input features) or BatchNorm2d (its channels: weight, bias,
  // running_mean, running_var).
  std::shared_ptr<Module> module;
  // For a Linear after a flatten of [C, H, W]: H*W input features per channel, in channel-major blocks.
  int64_t features_per_channel = 1;
};

// The producer whose output channels are pruned and the modules that read them.
struct ChannelGroup {
  std::shared_ptr<Module> producer;  // Conv2d (groups == 1) or Linear
  std::vector<ChannelConsumer> consumers;
};

// What ln_structured did to one group.
struct PrunedChannelGroup {
  std::string producer;          // the producer's memory path ("MnistNet.conv1", "Sequential.0")
  int64_t channels_before = 0;
  std::vector<int64_t> kept;     // original indices of the kept channels, ascending (size = channels after)
  // Parameters of the group's modules (producer + consumers, each once), counted just before and just after this
  // group was shrunk. Groups are applied in order, so a module shared by two groups (the consumer of one, the
  // producer of the next, like MnistNet's conv2) counts in both.
  int64_t parameters_before = 0, parameters_after = 0;
};

struct StructuredPruneReport {
  std::vector<PrunedChannelGroup> groups;
  // Over every module of every group, each once: before any change and after all of them.
  int64_t parameters_before = 0, parameters_after = 0;
  int64_t parameter_bytes_before = 0, parameter_bytes_after = 0;
  std::string str() const;  // one line per group and a total line
};

// The Ln norm of each output slice weight[o] (over all other dims), in float64: p > 0, or +infinity (max |w|).
// ValueError for another p (NaN, <= 0) or an undefined / 0-d weight.
std::vector<double> channel_norms(const Tensor& weight, double p = 2.0);

// The channels kept when `amount` (resolved against norms.size()) of the lowest-norm ones are pruned: ties prune the
// lower index first, at least one channel is kept (when there is one). Ascending indices.
std::vector<int64_t> channels_to_keep(const std::vector<double>& norms, const PruneAmount& amount);

// PyTorch's prune.ln_structured(module, "weight", amount, n=p, dim=0) per group, made permanent and physical (see
// Note [Structured pruning] in structured_prune.cpp). Every group is ranked on the weights as they are at the call
// (before any shrinking) and every argument is checked before anything changes. Registered tensor handles stay the
// same TensorImpls (set_data); their .grad is dropped. Optimizers built before the call hold state of the old
// shapes: build them again afterwards.
// Errors: ValueError (producer not Conv2d/Linear, grouped Conv2d, unsupported consumer, a packed layer, a parameter
// still pruned with a live unstructured mask (prune.h's remove() first), a module produced or consumed by two groups,
// p invalid, a count above the channel count), ShapeError (a consumer whose
// input size does not match the producer's channels × features_per_channel).
StructuredPruneReport ln_structured(const std::vector<ChannelGroup>& groups, const PruneAmount& amount,
                                    double p = 2.0);

// The groups of a chain: every Conv2d/Linear but the last is a producer, and the next Conv2d/Linear its consumer.
// Between them: BatchNorm2d (a consumer), channel-preserving layers (ReLU, GELU, SiLU, Tanh, Sigmoid, Identity,
// Dropout, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d: passed through) and at most one Flatten(1, -1) (the next layer
// must then be a Linear; its features_per_channel is in_features / channels). Anything else: ValueError naming it.
std::vector<ChannelGroup> channel_groups(const Sequential& net);
// MnistNet: conv1 -> {conv2}, conv2 -> {fc1, fc1.in_features / conv2's channels (144)}, fc1 -> {fc2}.
std::vector<ChannelGroup> channel_groups(const MnistNet& net);

// The "masked dense model" of a pruning: in each group, the producer's weight rows and bias of the channels not in
// kept[g] are zeroed, as are BatchNorm2d consumers' weight and bias of those channels, and (when
// mask_consumer_inputs) the Conv2d/Linear consumers' input slices of those channels. Shapes are unchanged. With
// activations that map 0 to 0 between producer and consumer, masking the consumer inputs changes nothing (PyTorch's
// prune.ln_structured masks only the producer); with Sigmoid the pruned channels would otherwise feed 0.5.
void mask_channels(const std::vector<ChannelGroup>& groups, const std::vector<std::vector<int64_t>>& kept,
                   bool mask_consumer_inputs = true);
// The same with the kept channels of a report (groups in the report's order).
void mask_channels(const std::vector<ChannelGroup>& groups, const StructuredPruneReport& report,
                   bool mask_consumer_inputs = true);

}  // namespace ember::nn
