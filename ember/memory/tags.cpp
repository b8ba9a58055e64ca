// Tag interning (mutex-protected table), interned module paths, and the thread-local module / phase / raw tag.
// Invariant: names_[id] is the name of tag id; index 0 is the empty name (kUntagged). An InternedModule's per-phase
// tag cache holds 0 until computed and then the id of "PATH/PHASE" forever, so entering a scope never builds a string.
#include "ember/memory/tags.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ember/base/error.h"

namespace ember::memory {

struct InternedModule {
  std::string path;
  mutable std::atomic<TagId> tags[kNumPhases] = {};  // 0: not computed yet
};

namespace {
struct TagTable {
  std::mutex mutex;
  std::vector<std::string> names{""};
  std::unordered_map<std::string, TagId> ids{{"", kUntagged}};
};
TagTable& table() {
  static TagTable* t = new TagTable();  // never destroyed: allocations may be tagged during static teardown
  return *t;
}

struct ModuleTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::unique_ptr<InternedModule>> modules;
  InternedModule empty;  // the "" module (nullptr handles resolve to it)
};
ModuleTable& modules() {
  static ModuleTable* t = new ModuleTable();  // never destroyed: handles are stable for the process
  return *t;
}

// Every allocation reads these (current_tag). The initial-exec model makes each read one %fs-relative load; a shared
// library's default model calls __tls_get_addr (33 instructions of a 512 B allocate + free pair under callgrind). It
// needs libember's TLS in the static block, which holds a library loaded at start or dlopen'ed into the space glibc
// reserves for that (these 24 bytes fit it).
#define EMBER_HOT_TLS thread_local __attribute__((tls_model("initial-exec")))
EMBER_HOT_TLS ModuleHandle t_module = nullptr;
EMBER_HOT_TLS Phase t_phase = Phase::Other;
EMBER_HOT_TLS TagId t_raw_tag = kUntagged;  // a TagScope's tag
EMBER_HOT_TLS bool t_raw_active = false;
EMBER_HOT_TLS TagId t_cached = kUntagged;   // the tag of (t_module, t_phase) when !t_dirty
EMBER_HOT_TLS bool t_dirty = false;
#undef EMBER_HOT_TLS

TagId tag_of(ModuleHandle module, Phase phase) {
  if (module == nullptr && phase == Phase::Other) return kUntagged;
  const InternedModule& m = module != nullptr ? *module : modules().empty;
  std::atomic<TagId>& slot = m.tags[static_cast<int>(phase)];
  TagId id = slot.load(std::memory_order_acquire);
  if (id == kUntagged) {
    id = intern_tag(m.path + "/" + phase_name(phase));
    slot.store(id, std::memory_order_release);  // racing threads store the same id
  }
  return id;
}
}  // namespace

TagId intern_tag(const std::string& name) {
  TagTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.ids.find(name);
  if (it != t.ids.end()) return it->second;
  // Names are never forgotten (ids live in the allocators' blocks), so the table is bounded: a program has a few
  // hundred module paths x phases; only hostile input (trace files full of distinct tags) gets near the bound.
  EMBER_CHECK(t.names.size() < kMaxTags, ValueError, "memory tags: more than ", kMaxTags,
              " distinct owner tags in this process; refusing '", name.substr(0, 64), "'");
  const TagId id = static_cast<TagId>(t.names.size());
  t.names.push_back(name);
  t.ids.emplace(name, id);
  return id;
}

std::string tag_name(TagId id) {
  TagTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return id < t.names.size() ? t.names[id] : std::string("<unknown tag>");
}

TagId current_tag() {
  if (t_raw_active) return t_raw_tag;
  if (t_dirty) {
    t_cached = tag_of(t_module, t_phase);
    t_dirty = false;
  }
  return t_cached;
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Parameters: return "parameters";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Data: return "data";
    case Phase::Workspace: return "workspace";
    case Phase::Other: return "other";
  }
  return "other";
}

ModuleHandle intern_module(const std::string& path) {
  if (path.empty()) return nullptr;
  ModuleTable& t = modules();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::unique_ptr<InternedModule>& slot = t.modules[path];
  if (!slot) {
    slot = std::make_unique<InternedModule>();
    slot->path = path;
  }
  return slot.get();
}

const std::string& module_path(ModuleHandle module) {
  return module != nullptr ? module->path : modules().empty.path;
}

ModuleHandle current_module() { return t_module; }
TagId module_tag(ModuleHandle module, Phase phase) { return tag_of(module, phase); }
Phase current_phase() { return t_phase; }

std::pair<std::string, std::string> split_tag(const std::string& name) {
  const size_t slash = name.rfind('/');
  if (slash != std::string::npos) {
    const std::string phase = name.substr(slash + 1);
    for (int p = 0; p < kNumPhases; ++p)
      if (phase == phase_name(static_cast<Phase>(p))) return {name.substr(0, slash), phase};
  }
  return {name, "other"};
}

ModuleScope::ModuleScope(ModuleHandle module) : previous_module_(t_module), previous_phase_(t_phase) {
  t_module = module;
  if (t_phase == Phase::Other) t_phase = Phase::Forward;
  t_dirty = true;
}

ModuleScope::~ModuleScope() {
  t_module = previous_module_;
  t_phase = previous_phase_;
  t_dirty = true;
}

PhaseScope::PhaseScope(Phase phase) : previous_(t_phase) {
  t_phase = phase;
  t_dirty = true;
}

PhaseScope::~PhaseScope() {
  t_phase = previous_;
  t_dirty = true;
}

TagScope::TagScope(TagId tag) : previous_(t_raw_tag), previous_active_(t_raw_active) {
  t_raw_tag = tag;
  t_raw_active = true;
}

TagScope::~TagScope() {
  t_raw_tag = previous_;
  t_raw_active = previous_active_;
}

}  // namespace ember::memory
