// Model state bytes and inference peaks (compression_report.h), read from the tensors and the allocator.
#include "ember/nn/compression_report.h"

#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ember/core/grad_mode.h"
#include "ember/core/storage.h"
#include "ember/memory/caching_allocator.h"
#include "ember/nn/layers.h"

namespace ember::nn {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The last component of a dotted name: "fc1.weight_values" -> "weight_values".
std::string leaf_name(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

// Bytes of the caching allocators' blocks that hold the given storages (their sizes as rounded by the allocator),
// each storage looked up in its own allocator; -1 when one comes from an allocator that is not a caching one (the
// pinned pool, a host allocator), whose rounding is unknown. By address, not by owner tag: every instance of a model
// class shares its tag path ("MnistNet/parameters"), so a tally by tag would count every live instance.
int64_t allocator_block_bytes(const std::unordered_set<const StorageImpl*>& storages) {
  std::unordered_map<memory::CachingAllocator*, std::unordered_set<uint64_t>> by_allocator;
  for (const StorageImpl* s : storages) {
    if (s->nbytes() == 0 || s->allocator() == nullptr) continue;  // nothing held (meta storages have no allocator)
    auto* caching = dynamic_cast<memory::CachingAllocator*>(s->allocator());
    if (caching == nullptr) return -1;
    by_allocator[caching].insert(reinterpret_cast<uint64_t>(s->allocation()));
  }
  int64_t bytes = 0;
  for (const auto& [caching, addresses] : by_allocator)
    for (const memory::SegmentSnapshot& seg : caching->snapshot())
      for (const memory::BlockSnapshot& b : seg.blocks)
        if (b.allocated && addresses.count(b.addr)) bytes += b.size;
  return bytes;
}

}  // namespace

ModelMemory model_memory(const Module& model) {
  ModelMemory m;
  std::unordered_set<const StorageImpl*> seen;
  Device device = Device::cpu();
  bool have_device = false;
  auto count = [&](const Tensor& t) {
    if (!have_device) {
      device = t.device();
      have_device = true;
    }
    if (seen.insert(t.storage().get()).second) m.total_bytes += t.storage()->nbytes();
  };
  auto& mutable_model = const_cast<Module&>(model);  // named_modules is not const; nothing is changed
  for (const auto& [name, t] : model.named_parameters()) {
    m.parameter_bytes += t.nbytes();
    count(t);
  }
  for (const auto& [name, t] : model.named_buffers()) {
    const std::string leaf = leaf_name(name);
    if (ends_with(leaf, "_mask"))
      m.mask_bytes += t.nbytes();
    else if (leaf.rfind("weight_", 0) == 0)
      m.packed_bytes += t.nbytes();
    else
      m.other_buffer_bytes += t.nbytes();
    count(t);
  }
  // Weights of the layers compression targets, dense or packed.
  std::unordered_set<const Module*> modules_seen;  // a layer shared in the tree is listed once per path
  for (const auto& [name, module] : mutable_model.named_modules()) {
    if (!modules_seen.insert(module.get()).second) continue;
    if (auto* lin = dynamic_cast<const Linear*>(module.get())) {
      m.weight_bytes += lin->packed_weight ? lin->packed_weight->nbytes() : lin->weight.nbytes();
    } else if (auto* conv = dynamic_cast<const Conv2d*>(module.get())) {
      m.weight_bytes += conv->packed_weight ? conv->packed_weight->nbytes() : conv->weight.nbytes();
    }
  }
  if (have_device && !device.is_meta()) m.allocator_bytes = allocator_block_bytes(seen);
  return m;
}

InferenceMemory measure_inference(Module& model, const Tensor& input) {
  InferenceMemory r;
  r.state_bytes = model_memory(model).total_bytes;
  const bool was_training = model.is_training();
  model.eval();
  struct RestoreMode {  // also when the forward throws
    Module& model;
    bool training;
    ~RestoreMode() { model.train(training); }
  } restore{model, was_training};
  memory::Allocator& alloc = allocator_for(input.device());
  {
    NoGradGuard no_grad;
    const int64_t before = alloc.stats().allocated_bytes;
    memory::PeakWindow window(alloc);
    {
      Tensor out = model.forward(input);
      (void)out;
    }
    r.forward_peak_bytes = window.peak() - before;
  }
  r.peak_bytes = r.state_bytes + r.forward_peak_bytes;
  return r;
}

namespace {

std::string kib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / 1024.0);
  return buf;
}

std::string ratio(int64_t now, int64_t base) {
  if (base <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(now) / static_cast<double>(base));
  return buf;
}

}  // namespace

std::string format_compression_table(const std::vector<CompressionRow>& rows) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-42s %9s %12s %12s %8s %12s %12s %8s %9s\n", "model", "accuracy",
                "weights KiB", "state KiB", "x state", "fwd peak KiB", "infer KiB", "x infer", "alloc KiB");
  out += line;
  if (rows.empty()) return out;
  const CompressionRow& base = rows.front();
  for (const CompressionRow& r : rows) {
    char acc[32] = "-";
    if (r.accuracy >= 0) std::snprintf(acc, sizeof acc, "%.2f%%", 100.0 * r.accuracy);
    std::snprintf(line, sizeof line, "%-42s %9s %12s %12s %8s %12s %12s %8s %9s\n", r.name.c_str(), acc,
                  kib(r.memory.weight_bytes).c_str(), kib(r.memory.total_bytes).c_str(),
                  ratio(r.memory.total_bytes, base.memory.total_bytes).c_str(),
                  kib(r.inference.forward_peak_bytes).c_str(), kib(r.inference.peak_bytes).c_str(),
                  ratio(r.inference.peak_bytes, base.inference.peak_bytes).c_str(),
                  r.memory.allocator_bytes < 0 ? "-" : kib(r.memory.allocator_bytes).c_str());
    out += line;
  }
  return out;
}

std::string compression_rows_json(const std::vector<CompressionRow>& rows) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const CompressionRow& r : rows) {
    nlohmann::ordered_json j;
    j["name"] = r.name;
    j["accuracy"] = r.accuracy;
    j["parameter_bytes"] = r.memory.parameter_bytes;
    j["packed_bytes"] = r.memory.packed_bytes;
    j["mask_bytes"] = r.memory.mask_bytes;
    j["other_buffer_bytes"] = r.memory.other_buffer_bytes;
    j["weight_bytes"] = r.memory.weight_bytes;
    j["state_bytes"] = r.memory.total_bytes;
    j["allocator_state_bytes"] = r.memory.allocator_bytes;
    j["forward_peak_bytes"] = r.inference.forward_peak_bytes;
    j["inference_peak_bytes"] = r.inference.peak_bytes;
    arr.push_back(std::move(j));
  }
  return arr.dump();
}

}  // namespace ember::nn
