// Tag interning (mutex-protected table) and the thread-local current tag.
// Invariant: names_[id] is the name of tag id; index 0 is the empty name (kUntagged).
#include "ember/memory/tags.h"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace ember::memory {

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
thread_local TagId t_current = kUntagged;
}  // namespace

TagId intern_tag(const std::string& name) {
  TagTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.ids.find(name);
  if (it != t.ids.end()) return it->second;
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

TagId current_tag() { return t_current; }

TagScope::TagScope(TagId tag) : previous_(t_current) { t_current = tag; }
TagScope::~TagScope() { t_current = previous_; }

}  // namespace ember::memory
