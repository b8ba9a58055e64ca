// Ownership tags for allocations (DESIGN.md §6): a tag is an interned string such as "model.layers.3.attn/forward".
// Upper layers set the current tag for a scope (TagScope); every allocation made on that thread inside the scope
// carries it into the allocator's blocks, statistics and trace. Invariant: tag 0 is "untagged"; ids are stable for
// the life of the process.
#pragma once

#include <cstdint>
#include <string>

namespace ember::memory {

using TagId = uint32_t;
inline constexpr TagId kUntagged = 0;

TagId intern_tag(const std::string& name);  // thread-safe
std::string tag_name(TagId id);             // "" for kUntagged
TagId current_tag();                        // this thread's current tag

// Sets this thread's current tag for the scope; restores the previous one on exit.
class TagScope {
 public:
  explicit TagScope(TagId tag);
  explicit TagScope(const std::string& name) : TagScope(intern_tag(name)) {}
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  TagId previous_;
};

}  // namespace ember::memory
