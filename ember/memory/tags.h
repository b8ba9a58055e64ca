// Ownership tags for allocations (DESIGN.md §6): a tag is an interned string "MODULE/PHASE" such as
// "GPT.blocks.3.attn/forward". Upper layers set this thread's module (ModuleScope) and phase (PhaseScope); every
// allocation made on the thread inside them carries the tag into the allocator's blocks, statistics and trace.
// Invariants: tag 0 is "untagged" (module "" and phase Other); ids and interned module paths are stable for the life
// of the process; all scope state is thread-local (a worker thread sets its own scopes).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace ember::memory {

using TagId = uint32_t;
inline constexpr TagId kUntagged = 0;

// Thread-safe. ValueError once the process holds kMaxTags distinct names (names are never forgotten).
TagId intern_tag(const std::string& name);
inline constexpr size_t kMaxTags = size_t{1} << 20;
std::string tag_name(TagId id);             // "" for kUntagged
// This thread's current tag: a raw TagScope's tag while one is open, else the tag of (module, phase). A thread-local
// read unless a scope changed since the last call.
TagId current_tag();

// What the bytes are for. Parameters: a module's own parameters and buffers (nn tags them with the module's path at
// its first forward, Note [Parameter ownership] in nn/module.cpp).
enum class Phase : uint8_t { Parameters, Forward, Backward, Optimizer, Data, Workspace, Other };
inline constexpr int kNumPhases = 7;
// "parameters", "forward", "backward", "optimizer", "data", "workspace", "other"
const char* phase_name(Phase phase);

// A module path interned once ("" included): a stable handle, cheap to copy and to enter. nullptr means "".
struct InternedModule;
using ModuleHandle = const InternedModule*;
ModuleHandle intern_module(const std::string& path);  // thread-safe; the same handle for the same path
const std::string& module_path(ModuleHandle module);  // "" for nullptr

ModuleHandle current_module();  // this thread's module (nullptr: none)
TagId module_tag(ModuleHandle module, Phase phase);  // the tag "PATH/PHASE" (kUntagged for "" and Other)
Phase current_phase();          // this thread's phase (Other by default)

// "MODULE/PHASE" -> {module, phase}: the phase is the text after the last '/' when it is a phase name; otherwise the
// whole name is the module and the phase is "other". "" -> {"", "other"}.
std::pair<std::string, std::string> split_tag(const std::string& name);

// Sets this thread's module for the scope; a phase of Other becomes Forward. Restores both on exit.
class ModuleScope {
 public:
  explicit ModuleScope(ModuleHandle module);
  explicit ModuleScope(const std::string& path) : ModuleScope(intern_module(path)) {}
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  ModuleHandle previous_module_;
  Phase previous_phase_;
};

// Sets this thread's phase for the scope, keeping the module; restores it on exit.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
};

// Sets this thread's current tag outright for the scope (module and phase are ignored until it exits); restores the
// previous state on exit.
class TagScope {
 public:
  explicit TagScope(TagId tag);
  explicit TagScope(const std::string& name) : TagScope(intern_tag(name)) {}
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  TagId previous_;
  bool previous_active_;
};

}  // namespace ember::memory
