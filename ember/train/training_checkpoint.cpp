// Training checkpoints (training_checkpoint.h): the model's tensors under their own names (a plain safetensors reader
// finds the state dict), the other parts' under a group prefix ("optim.", "scaler.", "sched."), the manifest as JSON
// in the header, one atomic write; loading parses and validates everything,
// then applies it with a rollback. Invariant: a failed load leaves every part as it was (Note [Checkpoint load order]).
#include "ember/train/training_checkpoint.h"

#include <cxxabi.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <typeinfo>
#include <nlohmann/json.hpp>

#include "ember/base/atomic_file.h"
#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::train {

namespace {

using json = nlohmann::ordered_json;

// The unqualified class name of a dynamic type ("AdamW", "CosineWarmupLR").
std::string class_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && d != nullptr) ? std::string(d) : std::string(t.name());
  std::free(d);
  const size_t colon = out.rfind("::");
  return colon == std::string::npos ? out : out.substr(colon + 2);
}

void check_parts(const TrainingParts& p, const char* op) {
  EMBER_CHECK(p.model != nullptr, ValueError, op, ": no model given");
  EMBER_CHECK(!(p.trainer && p.optimizer), ValueError, op,
              ": give either a trainer (which holds its optimizer) or an optimizer, not both");
  EMBER_CHECK(!(p.trainer && p.scaler), ValueError, op, ": a trainer holds its own loss scaler; give no scaler");
  EMBER_CHECK(!p.scaler || p.optimizer, ValueError, op, ": a grad scaler is saved with an optimizer");
  std::set<std::string> names;
  for (const auto& [name, gen] : p.generators) {
    EMBER_CHECK(gen != nullptr, ValueError, op, ": generator '", name, "' is null");
    EMBER_CHECK(!name.empty() && names.insert(name).second, ValueError, op, ": generator name '", name,
                "' is empty or given twice");
  }
}

std::string model_kind(const TrainingParts& p) { return p.model_kind.empty() ? p.model->type_name() : p.model_kind; }

std::string optimizer_kind(const TrainingParts& p) {
  if (!p.optimizer_kind.empty()) return p.optimizer_kind;
  if (p.trainer) return std::string(amp_mode_name(p.trainer->mode())) + "/" + class_name(typeid(p.trainer->optimizer()));
  if (p.optimizer) return class_name(typeid(*p.optimizer));
  return "";
}

optim::StateDict optimizer_state(const TrainingParts& p) {
  if (p.trainer) return p.trainer->state_dict();
  if (p.optimizer) return p.optimizer->state_dict();
  return {};
}

// The scaler's entries (GradScaler::state_dict names), wherever the parts keep one.
optim::StateDict scaler_state(const TrainingParts& p) {
  if (p.trainer) return p.trainer->scaler_state_dict();
  if (p.scaler) return p.scaler->state_dict();
  return {};
}

std::optional<double> entry_value(const optim::StateDict& d, const std::string& name) {
  for (const auto& [n, t] : d)
    if (n == name && t.defined() && t.numel() == 1) return t.item_double();
  return std::nullopt;
}

// ---- reading ------------------------------------------------------------------------------------------------------

[[noreturn]] void malformed(const std::string& path, const std::string& why) {
  EMBER_THROW(FormatError, "training checkpoint '", path, "': ", why);
}

const json& field(const json& j, const char* key, const std::string& path, const char* where) {
  auto it = j.find(key);
  if (it == j.end()) malformed(path, std::string("the manifest has no ") + where + key);
  return *it;
}

int64_t get_int(const json& j, const char* key, const std::string& path, const char* where, int64_t min = 0) {
  const json& v = field(j, key, path, where);
  if (!v.is_number_integer()) malformed(path, std::string("the manifest's ") + where + key + " is not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    malformed(path, std::string("the manifest's ") + where + key + " is out of range");
  const int64_t x = v.get<int64_t>();
  if (x < min) malformed(path, std::string("the manifest's ") + where + key + " is out of range");
  return x;
}

uint64_t get_u64(const json& j, const char* key, const std::string& path, const char* where) {
  const json& v = field(j, key, path, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    malformed(path, std::string("the manifest's ") + where + key + " is not an unsigned integer");
  return v.get<uint64_t>();
}

std::string get_string(const json& j, const char* key, const std::string& path, const char* where) {
  const json& v = field(j, key, path, where);
  if (!v.is_string()) malformed(path, std::string("the manifest's ") + where + key + " is not a string");
  return v.get<std::string>();
}

TrainingCheckpointInfo parse_manifest(const nn::SafetensorsMetadata& meta, const std::string& path) {
  auto it = meta.find(kTrainingManifestKey);
  if (it == meta.end())
    malformed(path, std::string("no manifest (header metadata '") + kTrainingManifestKey +
                        "'): not a training checkpoint");
  const json j = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) malformed(path, "the manifest is not a JSON object");
  TrainingCheckpointInfo info;
  if (get_string(j, "format", path, "") != kTrainingCheckpointFormat)
    malformed(path, std::string("the manifest's format is not ") + kTrainingCheckpointFormat);
  info.version = get_int(j, "version", path, "", 1);
  if (info.version > kTrainingCheckpointVersion)
    malformed(path, "format version " + std::to_string(info.version) + " is newer than this build reads (" +
                        std::to_string(kTrainingCheckpointVersion) + ")");
  info.step = get_int(j, "step", path, "");
  info.model_kind = get_string(field(j, "model", path, ""), "kind", path, "model.");
  info.optimizer_kind = get_string(field(j, "optimizer", path, ""), "kind", path, "optimizer.");
  const json& sched = field(j, "scheduler", path, "");
  if (!sched.is_null()) info.scheduler_kind = get_string(sched, "kind", path, "scheduler.");
  if (!sched.is_null() && info.scheduler_kind.empty()) malformed(path, "the manifest's scheduler.kind is empty");
  const json& loader = field(j, "loader", path, "");
  if (!loader.is_null()) {
    if (!loader.is_object()) malformed(path, "the manifest's loader is not an object");
    data::LoaderState s;
    s.epoch = get_int(loader, "epoch", path, "loader.");
    s.batches_consumed = get_int(loader, "batches_consumed", path, "loader.");
    s.seed = get_u64(loader, "seed", path, "loader.");
    if (loader.contains("stream_shards")) s.stream_shards = get_int(loader, "stream_shards", path, "loader.");
    info.loader = s;
    info.loader_batches_per_epoch = get_int(loader, "batches_per_epoch", path, "loader.", -1);
    // Checked here, not left to DataLoader::load_state: that runs last, after the model has changed.
    if (info.loader_batches_per_epoch >= 0 && s.batches_consumed > info.loader_batches_per_epoch)
      malformed(path, "the manifest's loader.batches_consumed (" + std::to_string(s.batches_consumed) +
                          ") exceeds its batches_per_epoch (" + std::to_string(info.loader_batches_per_epoch) + ")");
  }
  const json& gens = field(j, "generators", path, "");
  if (!gens.is_object()) malformed(path, "the manifest's generators is not an object");
  for (const auto& [name, g] : gens.items()) {
    if (!g.is_object()) malformed(path, "the manifest's generator '" + name + "' is not an object");
    info.generators[name] = {get_u64(g, "seed", path, "generators.*."), get_u64(g, "offset", path, "generators.*.")};
  }
  const json& scaler = field(j, "scaler", path, "");
  if (!scaler.is_null()) {
    if (!scaler.is_object() || !field(scaler, "scale", path, "scaler.").is_number())
      malformed(path, "the manifest's scaler.scale is not a number");
    info.loss_scale = scaler["scale"].get<double>();
    info.growth_tracker = get_int(scaler, "growth_tracker", path, "scaler.");
  }
  const json& tensors = field(j, "tensors", path, "");
  if (!tensors.is_object()) malformed(path, "the manifest's tensors is not an object");
  for (const auto& [group, names] : tensors.items()) {
    if (!names.is_array()) malformed(path, "the manifest's tensors." + group + " is not a list");
    std::vector<std::string>& out = info.tensors[group];
    for (const json& n : names) {
      if (!n.is_string()) malformed(path, "the manifest's tensors." + group + " holds a non-string");
      out.push_back(n.get<std::string>());
    }
  }
  for (const auto& [key, value] : meta)
    if (key != kTrainingManifestKey) info.extra[key] = value;
  return info;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.good(), ValueError, "training checkpoint '", path, "': cannot open it for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EMBER_CHECK(!in.bad(), ValueError, "training checkpoint '", path, "': read failed");
  return bytes;
}

// The group prefixes of the file's tensor names, and the manifest's group names.
struct Group {
  const char* manifest;
  const char* prefix;
};
constexpr Group kGroups[] = {{"model", ""}, {"optimizer", "optim."}, {"scaler", "scaler."}, {"scheduler", "sched."}};

// The tensors the manifest lists in one group, by their names in the group (the file's names without the prefix), in
// the manifest's order. The caller has checked that the file holds exactly the manifest's names.
optim::StateDict group_tensors(const nn::NamedTensors& all, const TrainingCheckpointInfo& info, const Group& g) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : all) by_name[name] = &t;
  optim::StateDict out;
  auto it = info.tensors.find(g.manifest);
  if (it == info.tensors.end()) return out;
  for (const std::string& n : it->second) out.emplace_back(n, *by_name.at(g.prefix + n));
  return out;
}

}  // namespace

// ---- save ---------------------------------------------------------------------------------------------------------

void save_training_checkpoint(const std::string& path, const TrainingParts& parts, int64_t step,
                              const nn::SafetensorsMetadata& extra) {
  const char* op = "save_training_checkpoint";
  check_parts(parts, op);
  EMBER_CHECK(step >= 0, ValueError, op, ": step must be >= 0, got ", step);
  EMBER_CHECK(extra.count(kTrainingManifestKey) == 0, ValueError, op, ": the extra metadata may not use the key ",
              kTrainingManifestKey);
  nn::NamedTensors tensors;
  json names = json::object();
  auto add = [&](const Group& g, const optim::StateDict& d) {
    json list = json::array();
    for (const auto& [name, t] : d) {
      tensors.emplace_back(g.prefix + name, t);
      list.push_back(name);
    }
    names[g.manifest] = std::move(list);
  };
  add(kGroups[0], parts.model->state_dict());
  add(kGroups[1], optimizer_state(parts));
  if (parts.scaler) add(kGroups[2], parts.scaler->state_dict());
  if (parts.scheduler) add(kGroups[3], parts.scheduler->state_dict());

  json m;
  m["format"] = kTrainingCheckpointFormat;
  m["version"] = kTrainingCheckpointVersion;
  m["step"] = step;
  m["model"] = {{"kind", model_kind(parts)}};
  m["optimizer"] = {{"kind", optimizer_kind(parts)}};
  m["scheduler"] = parts.scheduler ? json{{"kind", class_name(typeid(*parts.scheduler))}} : json();
  if (parts.loader) {
    const data::LoaderState s = parts.loader->state();
    m["loader"] = {{"epoch", s.epoch},
                   {"batches_consumed", s.batches_consumed},
                   {"seed", s.seed},
                   {"stream_shards", s.stream_shards},
                   {"batches_per_epoch", parts.loader->num_batches()}};
  } else {
    m["loader"] = json();
  }
  json gens = json::object();
  for (const auto& [name, gen] : parts.generators) {
    const PhiloxState s = gen->state();
    gens[name] = {{"seed", s.seed}, {"offset", s.offset}};
  }
  m["generators"] = std::move(gens);
  const optim::StateDict sc = scaler_state(parts);
  const std::optional<double> scale = entry_value(sc, "scale"), tracker = entry_value(sc, "growth_tracker");
  m["scaler"] = scale ? json{{"scale", *scale}, {"growth_tracker", static_cast<int64_t>(tracker.value_or(0))}}
                      : json();
  m["tensors"] = std::move(names);

  nn::SafetensorsMetadata meta = extra;
  meta[kTrainingManifestKey] = m.dump();
  // One file, one rename: the tensors and the manifest become visible together (Note [Atomic replace]).
  write_file_atomically(path, nn::serialize_safetensors(tensors, meta));
}

// ---- load ---------------------------------------------------------------------------------------------------------

TrainingCheckpointInfo read_training_checkpoint_info(const std::string& path) {
  return parse_manifest(nn::read_safetensors_metadata(path), path);
}

// Note [Checkpoint load order]
// Everything that can be checked is checked before anything changes: the file parses completely (safetensors and
// manifest, FormatError), its tensor names are exactly the manifest's, the kinds match, the model's names, shapes and
// dtypes match, the scheduler's names match, the loader's epoch length matches and every generator is there
// (ValueError). Then the parts are written in order — optimizer (+ scaler), scheduler, model, generators, loader —
// where only the optimizer's load can still refuse (it validates its own dict completely before changing anything),
// and a snapshot of the optimizer, scaler and scheduler taken before is loaded back if a later step throws anyway.
// State the file holds for a part the caller did not give (optimizer, scaler, schedule, loader position, a generator)
// is refused too unless TrainingParts::partial is set: leaving it unread silently would make a resume inexact.
TrainingCheckpointInfo load_training_checkpoint(const std::string& path, const TrainingParts& parts) {
  const char* op = "load_training_checkpoint";
  check_parts(parts, op);
  const std::string bytes = read_file(path);
  nn::SafetensorsMetadata meta;
  nn::NamedTensors all;
  try {
    meta = nn::deserialize_safetensors_metadata(bytes);
  } catch (const FormatError& e) {
    malformed(path, e.what());
  }
  TrainingCheckpointInfo info = parse_manifest(meta, path);
  try {
    all = nn::deserialize_safetensors(bytes);
  } catch (const FormatError& e) {  // e.g. a truncated file
    malformed(path, e.what());
  }

  // The file's tensors are exactly the manifest's, group by group.
  std::set<std::string> listed;
  for (const auto& [group, names] : info.tensors) {
    const Group* g = nullptr;
    for (const Group& k : kGroups)
      if (group == k.manifest) g = &k;
    if (!g) malformed(path, "the manifest lists an unknown tensor group '" + group + "'");
    for (const std::string& n : names)
      if (!listed.insert(g->prefix + n).second) malformed(path, "the manifest lists tensor '" + n + "' twice");
  }
  for (const auto& [name, t] : all)
    if (!listed.erase(name)) malformed(path, "tensor '" + name + "' is not in the manifest");
  if (!listed.empty()) malformed(path, "tensor '" + *listed.begin() + "' of the manifest is missing from the file");

  auto mismatch = [&](const std::string& what) { EMBER_THROW(ValueError, op, ": '", path, "' ", what); };
  if (info.model_kind != model_kind(parts))
    mismatch("holds a " + info.model_kind + " model, not " + model_kind(parts));
  const bool has_optimizer = parts.trainer || parts.optimizer;
  if (has_optimizer && info.optimizer_kind != optimizer_kind(parts))
    mismatch("holds the state of a " + info.optimizer_kind + " optimizer, not " + optimizer_kind(parts));

  // Model: every name, shape and dtype (Module::load_state_dict would cast a dtype silently).
  const optim::StateDict model_state = group_tensors(all, info, kGroups[0]);
  {
    const nn::NamedTensors own = parts.model->state_dict();
    std::map<std::string, const Tensor*> given;
    for (const auto& [n, t] : model_state) given[n] = &t;
    for (const auto& [n, t] : own) {
      auto it = given.find(n);
      if (it == given.end()) mismatch("does not match the model: it has no tensor '" + n + "'");
      if (it->second->sizes() != t.sizes() || it->second->dtype() != t.dtype())
        mismatch("does not match the model: '" + n + "' is " + it->second->description() + " in the file, " +
                 t.description() + " in the model");
      given.erase(it);
    }
    if (!given.empty()) mismatch("does not match the model: the model has no tensor '" + given.begin()->first + "'");
  }
  // Scheduler: its kind and names (its values are checked by its load; names are all it can refuse besides).
  const optim::StateDict sched_state = group_tensors(all, info, kGroups[3]);
  if (parts.scheduler) {
    const std::string kind = class_name(typeid(*parts.scheduler));
    if (info.scheduler_kind != kind)
      mismatch("holds " + (info.scheduler_kind.empty() ? std::string("no lr schedule") : "a " + info.scheduler_kind) +
               ", not a " + kind);
    std::set<std::string> want, have;
    for (const auto& [n, t] : parts.scheduler->state_dict()) want.insert(n);
    for (const auto& [n, t] : sched_state) {
      if (!t.defined() || t.numel() != 1) mismatch("holds a malformed schedule entry '" + n + "'");
      have.insert(n);
    }
    if (want != have) mismatch("holds a schedule over another number of parameter groups");
  }
  // A disabled scaler has no state (its state_dict is empty, as in PyTorch): it saves none and takes none.
  const optim::StateDict scaler_entries = group_tensors(all, info, kGroups[2]);
  const bool scaler_on = parts.scaler && parts.scaler->is_enabled();
  if (scaler_on && scaler_entries.empty()) mismatch("holds no grad scaler state");
  if (parts.scaler && !scaler_on && !scaler_entries.empty())
    mismatch("holds grad scaler state, but the scaler given is disabled");
  if (parts.loader) {
    if (!info.loader) mismatch("holds no data-loader position");
    if (info.loader_batches_per_epoch != parts.loader->num_batches())
      mismatch("was saved from a loader with " + std::to_string(info.loader_batches_per_epoch) +
               " batches per epoch, this one has " + std::to_string(parts.loader->num_batches()));
    const int64_t shards = parts.loader->state().stream_shards;
    if (info.loader->stream_shards != 0 && info.loader->stream_shards != shards)
      mismatch("was saved from a streaming loader read in " + std::to_string(info.loader->stream_shards) +
               " shard(s) (num_workers), this one reads it in " + std::to_string(shards));
  }
  for (const auto& [name, gen] : parts.generators)
    if (!info.generators.count(name)) mismatch("holds no state of generator '" + name + "'");
  // State the file holds for a part not given: a resume without it would not be exact, so it is refused unless the
  // caller asks for a partial load.
  if (!parts.partial) {
    auto unread = [&](const std::string& what, const std::string& field) {
      mismatch("holds " + what + ", but no " + field +
               " was given to load it into (set TrainingParts::partial to load the parts given and leave it unread)");
    };
    if (!has_optimizer && !info.optimizer_kind.empty())
      unread("the state of a " + info.optimizer_kind + " optimizer", "trainer or optimizer");
    if (!parts.scaler && !scaler_entries.empty()) unread("grad scaler state", "scaler");
    if (!parts.scheduler && !info.scheduler_kind.empty()) unread("a " + info.scheduler_kind + " lr schedule", "scheduler");
    if (!parts.loader && info.loader) unread("a data-loader position", "loader");
    for (const auto& [name, state] : info.generators) {
      bool given = false;
      for (const auto& [n, gen] : parts.generators) given = given || n == name;
      if (!given) unread("the state of generator '" + name + "'", "generator named '" + name + "'");
    }
  }

  // Apply (Note [Checkpoint load order]).
  optim::StateDict optim_before, scaler_before, sched_before;
  for (const auto& [n, t] : optimizer_state(parts)) optim_before.emplace_back(n, t.clone());
  if (scaler_on) scaler_before = parts.scaler->state_dict();
  if (parts.scheduler) sched_before = parts.scheduler->state_dict();
  const optim::StateDict optim_state = group_tensors(all, info, kGroups[1]);
  if (parts.trainer) parts.trainer->load_state_dict(optim_state);  // validates completely first
  if (parts.optimizer) {
    if (scaler_on) optim::GradScaler(parts.scaler->options()).load_state_dict(scaler_entries);  // a dry run
    parts.optimizer->load_state_dict(optim_state);
  }
  try {
    if (scaler_on) parts.scaler->load_state_dict(scaler_entries);
    if (parts.scheduler) parts.scheduler->load_state_dict(sched_state);
    parts.model->load_state_dict(model_state, /*strict=*/true);
  } catch (...) {
    try {
      if (parts.trainer) parts.trainer->load_state_dict(optim_before);
      if (parts.optimizer) parts.optimizer->load_state_dict(optim_before);
      if (scaler_on) parts.scaler->load_state_dict(scaler_before);
      if (parts.scheduler) parts.scheduler->load_state_dict(sched_before);
    } catch (...) {
    }
    throw;
  }
  for (const auto& [name, gen] : parts.generators) gen->set_state(info.generators.at(name));
  if (parts.loader) parts.loader->load_state(*info.loader);
  return info;
}

}  // namespace ember::train
