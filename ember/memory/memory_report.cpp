// Memory attribution: the allocator's per-tag bytes grouped by (module, phase), as data, JSON and a table whose rows
// are modules (a tree by dotted path) and whose columns are phases. Invariant: every figure comes from one
// tag_stats() call, taken under the allocator's lock with its statistics, so the totals equal those exactly.
#include "ember/memory/memory_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ember/memory/cpu_allocator.h"

namespace ember::memory {

namespace {

struct Owner {
  TagBytes bytes;
  TagId first_tag = kUntagged;  // the smallest tag id: tags are interned in the order owners first allocate
};

struct Snapshot {
  std::vector<Owner> owners;
  AllocatorStats totals;
};

Snapshot take(const CachingAllocator& allocator) {
  Snapshot out;
  const std::vector<TagStat> tags = allocator.tag_stats(&out.totals);
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const TagStat& t : tags) {
    auto [module, phase] = split_tag(tag_name(t.tag));
    auto [it, fresh] = index.emplace(std::make_pair(module, phase), out.owners.size());
    if (fresh) {
      Owner o;
      o.bytes.module = std::move(module);
      o.bytes.phase = std::move(phase);
      o.first_tag = t.tag;
      out.owners.push_back(std::move(o));
    }
    Owner& o = out.owners[it->second];
    o.bytes.current_bytes += t.current;
    o.bytes.peak_bytes += t.peak;
    o.bytes.at_peak_bytes += t.at_peak;
    o.bytes.num_allocs += t.num_allocs;
    o.first_tag = std::min(o.first_tag, t.tag);
  }
  return out;
}

int phase_index(const std::string& phase) {
  for (int p = 0; p < kNumPhases; ++p)
    if (phase == phase_name(static_cast<Phase>(p))) return p;
  return static_cast<int>(Phase::Other);
}

// One row of the table: a module path, its own bytes by phase, and its children in first-allocation order.
struct Row {
  std::string label;
  int depth = 0;
  int64_t bytes[kNumPhases] = {};
  TagId key = ~TagId{0};  // the smallest first tag of a module in the subtree
  std::map<std::string, size_t> child_index;
  std::vector<size_t> children;
};

constexpr int kCell = 11;

std::string cell(int64_t v, bool dash_zero) {
  std::string s = (v == 0 && dash_zero) ? std::string("-") : format_bytes(v);
  return std::string(static_cast<size_t>(std::max<int>(0, kCell - static_cast<int>(s.size()))), ' ') + s;
}

// The block "allocated now" (at_peak == false) or "at peak".
void write_block(std::ostringstream& os, const Snapshot& snap, bool at_peak) {
  // A module's place among its siblings: its first tag in any phase (the forward's, usually), so rows follow the
  // order in which modules first allocated — the forward's order — whatever the phase of the bytes shown.
  std::map<std::string, TagId> first_of_module;
  for (const Owner& o : snap.owners) {
    auto [it, fresh] = first_of_module.emplace(o.bytes.module, o.first_tag);
    if (!fresh) it->second = std::min(it->second, o.first_tag);
  }
  std::vector<Row> rows(1);  // rows[0]: the invisible root
  size_t no_module = SIZE_MAX;
  int64_t phase_total[kNumPhases] = {};
  for (const Owner& o : snap.owners) {
    const int64_t v = at_peak ? o.bytes.at_peak_bytes : o.bytes.current_bytes;
    if (v == 0) continue;
    const TagId key = first_of_module[o.bytes.module];
    const int p = phase_index(o.bytes.phase);
    phase_total[p] += v;
    size_t at = 0;
    if (o.bytes.module.empty()) {
      if (no_module == SIZE_MAX) {
        no_module = rows.size();
        rows.emplace_back();
        rows.back().label = "(no module)";
      }
      at = no_module;
    } else {
      size_t start = 0;
      int depth = 0;
      while (true) {  // walk / create the path's rows, segment by segment
        const size_t dot = o.bytes.module.find('.', start);
        const std::string segment = o.bytes.module.substr(start, dot == std::string::npos ? std::string::npos
                                                                                          : dot - start);
        rows[at].key = std::min(rows[at].key, key);
        auto it = rows[at].child_index.find(segment);
        if (it == rows[at].child_index.end()) {
          const size_t id = rows.size();
          rows[at].child_index.emplace(segment, id);
          rows[at].children.push_back(id);
          rows.emplace_back();
          rows.back().label = segment;
          rows.back().depth = depth;
          at = id;
        } else {
          at = it->second;
        }
        if (dot == std::string::npos) break;
        start = dot + 1;
        ++depth;
      }
    }
    rows[at].bytes[p] += v;
    rows[at].key = std::min(rows[at].key, key);
  }

  std::vector<size_t> order;
  auto visit = [&](auto&& self, size_t r) -> void {
    std::vector<size_t> kids = rows[r].children;
    std::stable_sort(kids.begin(), kids.end(), [&](size_t a, size_t b) { return rows[a].key < rows[b].key; });
    for (size_t k : kids) {
      order.push_back(k);
      self(self, k);
    }
  };
  visit(visit, 0);
  if (no_module != SIZE_MAX) order.push_back(no_module);

  size_t width = 24;
  for (size_t r : order) width = std::max(width, 2 * static_cast<size_t>(rows[r].depth) + rows[r].label.size());
  auto name_cell = [&](const std::string& label, int depth) {
    std::string s(2 * static_cast<size_t>(depth), ' ');
    s += label;
    s.resize(width, ' ');
    return "  " + s;
  };

  const int64_t total = at_peak ? snap.totals.peak_allocated_bytes : snap.totals.allocated_bytes;
  os << "  " << (at_peak ? "at peak" : "allocated now") << " (" << format_bytes(total) << ")\n";
  os << name_cell("module", 0);
  for (int p = 0; p < kNumPhases; ++p) {
    const std::string h = phase_name(static_cast<Phase>(p));
    os << " " << std::string(static_cast<size_t>(kCell) - h.size(), ' ') << h;
  }
  os << " " << std::string(static_cast<size_t>(kCell) - 5, ' ') << "total\n";
  const std::string rule = "  " + std::string(width + static_cast<size_t>((kCell + 1) * (kNumPhases + 1)), '-') + "\n";
  os << rule;
  for (size_t r : order) {
    const Row& row = rows[r];
    int64_t sum = 0;
    os << name_cell(row.label, row.depth);
    for (int p = 0; p < kNumPhases; ++p) {
      os << " " << cell(row.bytes[p], true);
      sum += row.bytes[p];
    }
    os << " " << cell(sum, true) << "\n";
  }
  if (order.empty()) os << name_cell("(nothing allocated)", 0) << "\n";
  os << rule;
  os << name_cell("TOTAL", 0);
  for (int p = 0; p < kNumPhases; ++p) os << " " << cell(phase_total[p], false);
  os << " " << cell(total, false) << "\n";
}

}  // namespace

MemoryAttribution memory_attribution(const CachingAllocator& allocator) {
  Snapshot snap = take(allocator);
  MemoryAttribution out;
  out.allocator = allocator.name();
  out.current_bytes = snap.totals.allocated_bytes;
  out.peak_bytes = snap.totals.peak_allocated_bytes;
  out.owners.reserve(snap.owners.size());
  for (Owner& o : snap.owners) out.owners.push_back(std::move(o.bytes));
  std::stable_sort(out.owners.begin(), out.owners.end(), [](const TagBytes& a, const TagBytes& b) {
    if (a.at_peak_bytes != b.at_peak_bytes) return a.at_peak_bytes > b.at_peak_bytes;
    if (a.current_bytes != b.current_bytes) return a.current_bytes > b.current_bytes;
    return a.module != b.module ? a.module < b.module : a.phase < b.phase;
  });
  return out;
}

std::string MemoryAttribution::to_json() const {
  nlohmann::ordered_json owners_json = nlohmann::ordered_json::array();
  for (const TagBytes& o : owners) {
    owners_json.push_back({{"module", o.module},
                           {"phase", o.phase},
                           {"current_bytes", o.current_bytes},
                           {"peak_bytes", o.peak_bytes},
                           {"at_peak_bytes", o.at_peak_bytes},
                           {"num_allocs", o.num_allocs}});
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::object();  // keys in the documented order
  j["allocator"] = allocator;
  j["current_bytes"] = current_bytes;
  j["peak_bytes"] = peak_bytes;
  j["owners"] = std::move(owners_json);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string memory_report(const CachingAllocator& allocator) {
  const Snapshot snap = take(allocator);
  std::ostringstream os;
  const std::string rule(82, '=');
  os << rule << "\n";
  os << "  ember memory report: " << allocator.name() << " — " << format_bytes(snap.totals.allocated_bytes)
     << " allocated now, " << format_bytes(snap.totals.peak_allocated_bytes)
     << " at peak (block bytes by module and phase)\n";
  os << rule << "\n";
  write_block(os, snap, /*at_peak=*/false);
  os << rule << "\n";
  write_block(os, snap, /*at_peak=*/true);
  os << rule << "\n";
  return os.str();
}

std::string memory_report() { return memory_report(cpu_allocator()); }

}  // namespace ember::memory
