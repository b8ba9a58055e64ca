// Structured pruning (structured_prune.h): Ln ranking of output channels, the checks, the physical shrinking of
// producers and consumers, the group inference for chains and MnistNet, and the masked dense model. Invariant: a call
// either raises before touching any module or applies every group; shrunk tensors replace the registered ones'
// contents through set_data, so every handle a layer or a state_dict holds stays valid.
#include "ember/nn/structured_prune.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <unordered_set>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"
#include "ember/memory/tags.h"
#include "ember/nn/prune.h"

namespace ember::nn {

// Note [Structured pruning]
// A group is a producer P (Conv2d weight [O, I, kh, kw] or Linear weight [O, I]) and the consumers of its O output
// channels. Output channel o is ranked by ||P.weight[o]||_p (PyTorch's ln_structured over dim 0; the bias does not
// count); the `amount` lowest are removed, ties removing the lower index first, one channel always kept. Shrinking
// keeps the rows `kept` of P.weight and P.bias, and on the consumer side:
//   Conv2d      weight[:, kept]                       in_channels = |kept|   (groups == 1 only)
//   Linear      weight[:, blocks kept of size f]      in_features = |kept| * f  (f = features_per_channel: a
//               flatten of [C, H, W] puts channel c at features [c*f, (c+1)*f))
//   BatchNorm2d weight, bias, running_mean, running_var [kept]; num_features = |kept|
// A removed channel's output is then simply absent: the result equals the masked dense model (mask_channels) in
// which that channel's producer row and bias are zero — so it carries 0, BatchNorm with zero weight and bias maps it
// to 0, and an activation with f(0) = 0 keeps it 0 — and the consumer therefore gets nothing from it. All groups are
// ranked on the weights as given (before any of them is shrunk: PyTorch's per-layer pruning of the original model),
// which is why a module may be the producer of one group and a consumer of another (different dims) but not the
// producer, or the consumer, of two groups. New tensors are allocated under the module's "PATH/parameters" tag.

namespace {

struct ConsumerPlan {
  Module* module = nullptr;
  Conv2d* conv = nullptr;
  Linear* linear = nullptr;
  BatchNorm2d* bn = nullptr;
  int64_t features_per_channel = 1;
};

struct GroupPlan {
  Module* producer = nullptr;
  Conv2d* conv = nullptr;
  Linear* linear = nullptr;
  int64_t channels = 0;
  std::vector<ConsumerPlan> consumers;
  std::vector<int64_t> kept;
};

const Tensor& producer_weight(const GroupPlan& g) { return g.conv ? g.conv->weight : g.linear->weight; }

void check_not_packed(const Module& m, bool packed, const Tensor& weight, const char* op, const char* role) {
  EMBER_CHECK(!packed && weight.defined(), ValueError, op, ": the ", role, " ", m.type_name(),
              " has a packed weight (unpack it before structured pruning)");
}

// A parameter with a live unstructured-pruning mask cannot be shrunk: its "NAME_mask" buffer (and the gradient hook
// holding it) would keep the old size.
void check_not_masked(const Module& m, const char* op, const char* role) {
  for (const auto& [name, t] : m.named_parameters(/*recurse=*/false)) {
    EMBER_CHECK(!is_pruned(m, name), ValueError, op, ": the ", role, " ", m.type_name(), ".", name,
                " is pruned with a live mask; call remove(module, \"", name,
                "\") first to make that pruning permanent");
  }
}

// Checks the groups' modules, kinds and shapes; nothing is modified.
std::vector<GroupPlan> plan_groups(const std::vector<ChannelGroup>& groups, const char* op) {
  std::vector<GroupPlan> plans;
  std::unordered_set<const Module*> producers, consumers;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ChannelGroup& group = groups[gi];
    EMBER_CHECK(group.producer != nullptr, ValueError, op, ": group ", gi, " has no producer");
    GroupPlan plan;
    plan.producer = group.producer.get();
    plan.conv = dynamic_cast<Conv2d*>(plan.producer);
    plan.linear = dynamic_cast<Linear*>(plan.producer);
    EMBER_CHECK(plan.conv != nullptr || plan.linear != nullptr, ValueError, op, ": group ", gi, "'s producer is a ",
                plan.producer->type_name(), "; only Conv2d and Linear output channels can be pruned");
    if (plan.conv != nullptr) {
      check_not_packed(*plan.conv, plan.conv->packed_weight != nullptr, plan.conv->weight, op, "producer");
      EMBER_CHECK(plan.conv->options.groups() == 1, ValueError, op, ": group ", gi, "'s producer is a grouped Conv2d (",
                  "groups=", plan.conv->options.groups(), "); only groups == 1 is supported");
      plan.channels = plan.conv->options.out_channels();
    } else {
      check_not_packed(*plan.linear, plan.linear->packed_weight != nullptr, plan.linear->weight, op, "producer");
      plan.channels = plan.linear->out_features;
    }
    EMBER_CHECK(producer_weight(plan).dim() >= 1 && producer_weight(plan).size(0) == plan.channels, ShapeError, op,
                ": group ", gi, "'s producer weight ", producer_weight(plan).description(), " does not have ",
                plan.channels, " output channels");
    EMBER_CHECK(producers.insert(plan.producer).second, ValueError, op, ": the ", plan.producer->type_name(),
                " of group ", gi, " is the producer of an earlier group too");

    for (size_t ci = 0; ci < group.consumers.size(); ++ci) {
      const ChannelConsumer& c = group.consumers[ci];
      EMBER_CHECK(c.module != nullptr, ValueError, op, ": group ", gi, " consumer ", ci, " is null");
      ConsumerPlan cp;
      cp.module = c.module.get();
      cp.conv = dynamic_cast<Conv2d*>(cp.module);
      cp.linear = dynamic_cast<Linear*>(cp.module);
      cp.bn = dynamic_cast<BatchNorm2d*>(cp.module);
      cp.features_per_channel = c.features_per_channel;
      EMBER_CHECK(cp.module != plan.producer, ValueError, op, ": group ", gi, "'s producer ",
                  plan.producer->type_name(), " is also its own consumer");
      EMBER_CHECK(cp.conv != nullptr || cp.linear != nullptr || cp.bn != nullptr, ValueError, op, ": group ", gi,
                  " consumer ", ci, " is a ", cp.module->type_name(),
                  "; consumers must be Conv2d, Linear or BatchNorm2d");
      EMBER_CHECK(c.features_per_channel >= 1, ValueError, op, ": group ", gi, " consumer ", ci,
                  " has features_per_channel ", c.features_per_channel, " (must be >= 1)");
      EMBER_CHECK(cp.linear != nullptr || c.features_per_channel == 1, ValueError, op, ": group ", gi, " consumer ",
                  ci, " (", cp.module->type_name(), ") takes channels, not features: features_per_channel must be 1");
      if (cp.conv != nullptr) {
        check_not_packed(*cp.conv, cp.conv->packed_weight != nullptr, cp.conv->weight, op, "consumer");
        EMBER_CHECK(cp.conv->options.groups() == 1, ValueError, op, ": group ", gi, " consumer ", ci,
                    " is a grouped Conv2d (groups=", cp.conv->options.groups(), "); only groups == 1 is supported");
        EMBER_CHECK(cp.conv->options.in_channels() == plan.channels, ShapeError, op, ": group ", gi, " consumer ", ci,
                    " Conv2d has ", cp.conv->options.in_channels(), " input channels but its producer ",
                    plan.producer->type_name(), " has ", plan.channels, " output channels");
      } else if (cp.linear != nullptr) {
        check_not_packed(*cp.linear, cp.linear->packed_weight != nullptr, cp.linear->weight, op, "consumer");
        EMBER_CHECK(cp.linear->in_features == plan.channels * c.features_per_channel, ShapeError, op, ": group ", gi,
                    " consumer ", ci, " Linear has in_features ", cp.linear->in_features, " but its producer ",
                    plan.producer->type_name(), " has ", plan.channels, " channels x ", c.features_per_channel,
                    " features per channel = ", plan.channels * c.features_per_channel);
      } else {
        EMBER_CHECK(cp.bn->num_features == plan.channels, ShapeError, op, ": group ", gi, " consumer ", ci,
                    " BatchNorm2d has ", cp.bn->num_features, " features but its producer ",
                    plan.producer->type_name(), " has ", plan.channels, " output channels");
      }
      EMBER_CHECK(consumers.insert(cp.module).second, ValueError, op, ": the ", cp.module->type_name(),
                  " consumer ", ci, " of group ", gi, " is a consumer in another group too (or listed twice)");
      plan.consumers.push_back(cp);
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

// t with dimension `dim` reduced to the blocks `kept` (block b covers [b*block, (b+1)*block)): runs of consecutive
// kept blocks are copied with one narrow each. A fresh contiguous tensor of t's dtype and device.
Tensor select_blocks(const Tensor& t, int64_t dim, const std::vector<int64_t>& kept, int64_t block) {
  Shape shape = t.sizes();
  shape[static_cast<size_t>(dim)] = static_cast<int64_t>(kept.size()) * block;
  Tensor out = empty(shape, TensorOptions(t.dtype(), t.device()));
  const Tensor src = t.detach();
  size_t i = 0;
  while (i < kept.size()) {
    size_t j = i + 1;
    while (j < kept.size() && kept[j] == kept[j - 1] + 1) ++j;
    const int64_t len = static_cast<int64_t>(j - i) * block;
    out.narrow(dim, static_cast<int64_t>(i) * block, len).copy_(src.narrow(dim, kept[i] * block, len));
    i = j;
  }
  return out;
}

// Replaces the contents of a registered tensor (when defined) by its selected blocks, allocated as m's parameters.
void shrink(const Module& m, const Tensor& t, int64_t dim, const std::vector<int64_t>& kept, int64_t block = 1) {
  if (!t.defined()) return;
  const memory::TagScope tag(memory::module_tag(m.memory_handle(), memory::Phase::Parameters));
  set_data(t, select_blocks(t, dim, kept, block));
}

Conv2dOptions with_channels(const Conv2dOptions& o, int64_t in, int64_t out) {
  return Conv2dOptions(in, out, o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias());
}

// The distinct modules of the given plans, in first-seen order.
std::vector<const Module*> modules_of(const std::vector<const GroupPlan*>& plans) {
  std::vector<const Module*> out;
  std::unordered_set<const Module*> seen;
  for (const GroupPlan* g : plans) {
    if (seen.insert(g->producer).second) out.push_back(g->producer);
    for (const ConsumerPlan& c : g->consumers) {
      if (seen.insert(c.module).second) out.push_back(c.module);
    }
  }
  return out;
}

int64_t count_parameters(const std::vector<const Module*>& modules) {
  int64_t n = 0;
  for (const Module* m : modules) n += m->num_parameters();
  return n;
}

int64_t count_bytes(const std::vector<const Module*>& modules) {
  int64_t n = 0;
  for (const Module* m : modules) n += m->parameter_bytes();
  return n;
}

void apply_group(const GroupPlan& g) {
  const std::vector<int64_t>& kept = g.kept;
  const auto n = static_cast<int64_t>(kept.size());
  if (g.conv != nullptr) {
    shrink(*g.conv, g.conv->weight, 0, kept);
    shrink(*g.conv, g.conv->bias, 0, kept);
    g.conv->options = with_channels(g.conv->options, g.conv->options.in_channels(), n);
  } else {
    shrink(*g.linear, g.linear->weight, 0, kept);
    shrink(*g.linear, g.linear->bias, 0, kept);
    g.linear->out_features = n;
  }
  for (const ConsumerPlan& c : g.consumers) {
    if (c.conv != nullptr) {
      shrink(*c.conv, c.conv->weight, 1, kept);
      c.conv->options = with_channels(c.conv->options, n, c.conv->options.out_channels());
    } else if (c.linear != nullptr) {
      shrink(*c.linear, c.linear->weight, 1, kept, c.features_per_channel);
      c.linear->in_features = n * c.features_per_channel;
    } else {
      for (const Tensor* t : {&c.bn->weight, &c.bn->bias, &c.bn->running_mean, &c.bn->running_var}) {
        shrink(*c.bn, *t, 0, kept);
      }
      c.bn->num_features = n;
    }
  }
}

}  // namespace

// ---- ranking ---------------------------------------------------------------------------------------------------

std::vector<double> channel_norms(const Tensor& weight, double p) {
  EMBER_CHECK(weight.defined() && weight.dim() >= 1, ValueError,
              "channel_norms: needs a weight with an output dim, got ",
              weight.defined() ? weight.description() : std::string("an undefined tensor"));
  EMBER_CHECK(p > 0.0 && !std::isnan(p), ValueError, "channel_norms: p must be > 0 (or infinity), got ", p);
  const int64_t channels = weight.size(0);
  const int64_t per = channels > 0 ? weight.numel() / channels : 0;
  const std::vector<double> w = weight.detach().to(Device::cpu(), DType::f64).contiguous().to_vector<double>();
  std::vector<double> norms(static_cast<size_t>(channels), 0.0);
  for (int64_t o = 0; o < channels; ++o) {
    double acc = 0.0;
    for (int64_t i = 0; i < per; ++i) {
      const double a = std::abs(w[static_cast<size_t>(o * per + i)]);
      if (std::isinf(p)) {
        acc = std::max(acc, a);
      } else if (p == 1.0) {
        acc += a;
      } else if (p == 2.0) {
        acc += a * a;
      } else {
        acc += std::pow(a, p);
      }
    }
    if (!std::isinf(p) && p != 1.0) acc = p == 2.0 ? std::sqrt(acc) : std::pow(acc, 1.0 / p);
    norms[static_cast<size_t>(o)] = acc;
  }
  return norms;
}

std::vector<int64_t> channels_to_keep(const std::vector<double>& norms, const PruneAmount& amount) {
  const auto channels = static_cast<int64_t>(norms.size());
  for (size_t i = 0; i < norms.size(); ++i)  // a NaN would break the strict weak order the sort relies on
    EMBER_CHECK(!std::isnan(norms[i]), ValueError, "structured pruning: channel ", i,
                " has a NaN norm (the weight holds NaN); cannot rank the channels");
  int64_t prune = amount.resolve(channels);
  prune = std::min(prune, std::max<int64_t>(channels - 1, 0));
  std::vector<int64_t> order(static_cast<size_t>(channels));
  std::iota(order.begin(), order.end(), 0);
  // Lowest norm first; equal norms: lower index first (so it is pruned first).
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return norms[static_cast<size_t>(a)] < norms[static_cast<size_t>(b)]; });
  std::vector<int64_t> kept(order.begin() + prune, order.end());
  std::sort(kept.begin(), kept.end());
  return kept;
}

// ---- pruning ---------------------------------------------------------------------------------------------------

StructuredPruneReport ln_structured(const std::vector<ChannelGroup>& groups, const PruneAmount& amount, double p) {
  std::vector<GroupPlan> plans = plan_groups(groups, "ln_structured");
  for (const GroupPlan& g : plans) {
    check_not_masked(*g.producer, "ln_structured", "producer");
    for (const ConsumerPlan& c : g.consumers) check_not_masked(*c.module, "ln_structured", "consumer");
  }
  EMBER_CHECK(p > 0.0 && !std::isnan(p), ValueError, "ln_structured: p must be > 0 (or infinity), got ", p);
  for (GroupPlan& g : plans) {
    try {
      g.kept = channels_to_keep(channel_norms(producer_weight(g), p), amount);
    } catch (const ValueError& e) {
      throw ValueError(std::string("ln_structured: ") + g.producer->type_name() + " with " +
                       std::to_string(g.channels) + " output channels: " + e.what());
    }
  }

  StructuredPruneReport report;
  std::vector<const GroupPlan*> all;
  for (const GroupPlan& g : plans) all.push_back(&g);
  const std::vector<const Module*> every = modules_of(all);
  report.parameters_before = count_parameters(every);
  report.parameter_bytes_before = count_bytes(every);

  NoGradGuard no_grad;
  for (const GroupPlan& g : plans) {
    const std::vector<const Module*> mods = modules_of({&g});
    PrunedChannelGroup r;
    r.producer = g.producer->memory_path();
    r.channels_before = g.channels;
    r.kept = g.kept;
    r.parameters_before = count_parameters(mods);
    apply_group(g);
    r.parameters_after = count_parameters(mods);
    report.groups.push_back(std::move(r));
  }
  report.parameters_after = count_parameters(every);
  report.parameter_bytes_after = count_bytes(every);
  return report;
}

std::string StructuredPruneReport::str() const {
  std::ostringstream os;
  for (const PrunedChannelGroup& g : groups) {
    os << g.producer << ": " << g.channels_before << " -> " << g.kept.size() << " channels, parameters "
       << g.parameters_before << " -> " << g.parameters_after << "\n";
  }
  os << "total: parameters " << parameters_before << " -> " << parameters_after << ", bytes "
     << parameter_bytes_before << " -> " << parameter_bytes_after << "\n";
  return os.str();
}

// ---- masked dense model ----------------------------------------------------------------------------------------

void mask_channels(const std::vector<ChannelGroup>& groups, const std::vector<std::vector<int64_t>>& kept,
                   bool mask_consumer_inputs) {
  const std::vector<GroupPlan> plans = plan_groups(groups, "mask_channels");
  EMBER_CHECK(kept.size() == plans.size(), ValueError, "mask_channels: ", plans.size(), " groups but ", kept.size(),
              " kept-channel lists");
  std::vector<std::vector<int64_t>> pruned(plans.size());
  for (size_t gi = 0; gi < plans.size(); ++gi) {
    std::vector<char> keep(static_cast<size_t>(plans[gi].channels), 0);
    for (int64_t k : kept[gi]) {
      EMBER_CHECK(k >= 0 && k < plans[gi].channels, IndexError, "mask_channels: group ", gi, " keeps channel ", k,
                  " of ", plans[gi].channels);
      keep[static_cast<size_t>(k)] = 1;
    }
    for (int64_t c = 0; c < plans[gi].channels; ++c) {
      if (keep[static_cast<size_t>(c)] == 0) pruned[gi].push_back(c);
    }
  }
  NoGradGuard no_grad;
  auto zero = [](const Tensor& t, int64_t dim, int64_t start, int64_t len) {
    if (t.defined()) t.detach().narrow(dim, start, len).zero_();
  };
  for (size_t gi = 0; gi < plans.size(); ++gi) {
    const GroupPlan& g = plans[gi];
    for (int64_t c : pruned[gi]) {
      zero(producer_weight(g), 0, c, 1);
      zero(g.conv ? g.conv->bias : g.linear->bias, 0, c, 1);
      for (const ConsumerPlan& cp : g.consumers) {
        if (cp.bn != nullptr) {
          zero(cp.bn->weight, 0, c, 1);
          zero(cp.bn->bias, 0, c, 1);
        } else if (mask_consumer_inputs && cp.conv != nullptr) {
          zero(cp.conv->weight, 1, c, 1);
        } else if (mask_consumer_inputs && cp.linear != nullptr) {
          zero(cp.linear->weight, 1, c * cp.features_per_channel, cp.features_per_channel);
        }
      }
    }
  }
}

void mask_channels(const std::vector<ChannelGroup>& groups, const StructuredPruneReport& report,
                   bool mask_consumer_inputs) {
  std::vector<std::vector<int64_t>> kept;
  for (const PrunedChannelGroup& g : report.groups) kept.push_back(g.kept);
  mask_channels(groups, kept, mask_consumer_inputs);
}

// ---- group inference ---------------------------------------------------------------------------------------------

namespace {

bool is_weighted(const Module* m) { return dynamic_cast<const Conv2d*>(m) || dynamic_cast<const Linear*>(m); }

bool is_elementwise(const Module* m) {
  return dynamic_cast<const ReLU*>(m) || dynamic_cast<const GELU*>(m) || dynamic_cast<const SiLU*>(m) ||
         dynamic_cast<const Tanh*>(m) || dynamic_cast<const Sigmoid*>(m) || dynamic_cast<const Identity*>(m) ||
         dynamic_cast<const Dropout*>(m);
}

bool is_pooling(const Module* m) {
  return dynamic_cast<const MaxPool2d*>(m) || dynamic_cast<const AvgPool2d*>(m) ||
         dynamic_cast<const AdaptiveAvgPool2d*>(m);
}

int64_t out_channels(const Module* m) {
  if (const auto* c = dynamic_cast<const Conv2d*>(m)) return c->options.out_channels();
  return dynamic_cast<const Linear*>(m)->out_features;
}

}  // namespace

std::vector<ChannelGroup> channel_groups(const Sequential& net) {
  std::vector<size_t> layers;
  for (size_t i = 0; i < net.size(); ++i) {
    if (is_weighted(net[i].get())) layers.push_back(i);
  }
  std::vector<ChannelGroup> groups;
  for (size_t li = 0; li + 1 < layers.size(); ++li) {
    const size_t a = layers[li], b = layers[li + 1];
    const Module* producer = net[a].get();
    const std::string between = "between " + producer->type_name() + " " + std::to_string(a) + " and " +
                                net[b]->type_name() + " " + std::to_string(b);
    ChannelGroup group{net[a], {}};
    bool flattened = false;
    for (size_t j = a + 1; j < b; ++j) {
      const Module* m = net[j].get();
      if (dynamic_cast<const BatchNorm2d*>(m) != nullptr) {
        EMBER_CHECK(!flattened, ValueError, "channel_groups: BatchNorm2d ", j, " after a Flatten ", between);
        group.consumers.push_back({net[j], 1});
      } else if (is_elementwise(m)) {
        // channel-preserving
      } else if (is_pooling(m)) {
        EMBER_CHECK(!flattened, ValueError, "channel_groups: ", m->type_name(), " ", j, " after a Flatten ", between);
      } else if (const auto* f = dynamic_cast<const Flatten*>(m)) {
        EMBER_CHECK(f->start_dim == 1 && f->end_dim == -1 && !flattened, ValueError, "channel_groups: Flatten ", j,
                    " (start_dim=", f->start_dim, ", end_dim=", f->end_dim, ") ", between,
                    ": only one Flatten(1, -1) keeps channels in contiguous blocks");
        flattened = true;
      } else {
        EMBER_CHECK(false, ValueError, "channel_groups: module ", j, " (", m->type_name(), ") ", between,
                    " does not preserve channels; build the groups by hand");
      }
    }
    const Module* consumer = net[b].get();
    int64_t per_channel = 1;
    if (const auto* lin = dynamic_cast<const Linear*>(consumer)) {
      const int64_t c = out_channels(producer);
      if (flattened) {
        EMBER_CHECK(c > 0 && lin->in_features % c == 0, ShapeError, "channel_groups: Linear ", b, " has in_features ",
                    lin->in_features, ", not a multiple of the ", c, " channels of ", producer->type_name(), " ", a);
        per_channel = lin->in_features / c;
      } else {
        EMBER_CHECK(dynamic_cast<const Linear*>(producer) != nullptr, ValueError, "channel_groups: the output of ",
                    "Conv2d ", a, " reaches Linear ", b, " without a Flatten (a Linear reads the last dim, not channels)");
      }
    } else {
      EMBER_CHECK(!flattened && dynamic_cast<const Conv2d*>(producer) != nullptr, ValueError, "channel_groups: Conv2d ",
                  b, " reads the output of ", producer->type_name(), " ", a, flattened ? " after a Flatten" : "",
                  " as channels; only a Conv2d's output is");
    }
    group.consumers.push_back({net[b], per_channel});
    groups.push_back(std::move(group));
  }
  return groups;
}

std::vector<ChannelGroup> channel_groups(const MnistNet& net) {
  EMBER_CHECK(net.conv1 && net.conv2 && net.fc1 && net.fc2, ValueError, "channel_groups: MnistNet is missing a layer");
  const int64_t c = net.conv2->options.out_channels();
  EMBER_CHECK(c > 0 && net.fc1->in_features % c == 0, ShapeError, "channel_groups: MnistNet fc1 has in_features ",
              net.fc1->in_features, ", not a multiple of conv2's ", c, " channels");
  return {
      ChannelGroup{net.conv1, {{net.conv2, 1}}},
      ChannelGroup{net.conv2, {{net.fc1, net.fc1->in_features / c}}},
      ChannelGroup{net.fc1, {{net.fc2, 1}}},
  };
}

}  // namespace ember::nn
