// The memory timeline page: walks a trace's alloc/free events, finds the peak and the owners alive there, and writes
// one self-contained HTML page (inline SVG, CSS and a little JS; readable without JS). Invariant: every string from
// the trace or the options is HTML-escaped, and the page size is bounded whatever the trace length (Note [Timeline
// downsampling]).
#include "ember/memory/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/tags.h"

namespace ember::memory {

namespace {

// Note [Timeline bytes]: an allocation counts its block_size (bytes taken after rounding), or its requested size
// when the trace has no block sizes (files from other tools). The walk follows replay_trace's rules: an id allocated
// again while live drops the older allocation first (the trace lost its free), and frees of unknown ids are ignored.
// Sums are checked for int64 overflow, so a hostile file raises FormatError instead of drawing nonsense.
//
// Note [Bytes before the trace]: a trace that starts on an allocator already holding memory, or whose ring dropped
// its oldest events, misses allocations that are still live: the walk undercounts. Each event records the allocator's
// `allocated` bytes after it; where that exceeds the walked live total, the difference is counted as bytes allocated
// before the trace (the page draws it as the bottom band "(before the trace)"), so the total after each event is
// max(walked, recorded). Files without recorded bytes (allocated 0) are the walk alone.

constexpr const char* kUntaggedOwner = "(untagged)";

struct LiveAlloc {
  int64_t bytes = 0;
  uint32_t owner = 0;
  size_t index = 0;  // the alloc event
};

// Owner indices by tag (tag_name takes a lock, so each tag is looked up once).
class Owners {
 public:
  uint32_t of(TagId tag) {
    auto it = by_tag_.find(tag);
    if (it != by_tag_.end()) return it->second;
    const std::string name = tag == kUntagged ? std::string(kUntaggedOwner) : tag_name(tag);
    uint32_t idx = 0;
    auto named = by_name_.find(name);
    if (named != by_name_.end()) {
      idx = named->second;
    } else {
      idx = static_cast<uint32_t>(names_.size());
      names_.push_back(name);
      by_name_.emplace(name, idx);
    }
    by_tag_.emplace(tag, idx);
    return idx;
  }
  const std::string& name(uint32_t idx) const { return names_[idx]; }
  size_t size() const { return names_.size(); }

 private:
  std::unordered_map<TagId, uint32_t> by_tag_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<std::string> names_;
};

int64_t bytes_of(const TraceEvent& e) { return e.block_size > 0 ? e.block_size : e.size; }

// The live allocations, replayed event by event (Note [Timeline bytes]). `on_change(owner, delta)` sees every change.
class LiveSet {
 public:
  explicit LiveSet(Owners& owners) : owners_(owners) {}

  template <class OnChange>
  void apply(const std::vector<TraceEvent>& events, size_t i, OnChange&& on_change) {
    const TraceEvent& e = events[i];
    if (e.action == TraceAction::Alloc) {
      if (auto old = live_.find(e.id); old != live_.end()) remove(old, on_change);
      const LiveAlloc a{bytes_of(e), owners_.of(e.tag), i};
      EMBER_CHECK(!__builtin_add_overflow(total_, a.bytes, &total_), FormatError, "memory timeline: event ", i,
                  ": live bytes exceed 2^63");
      live_.emplace(e.id, a);
      on_change(a.owner, a.bytes);
    } else if (e.action == TraceAction::Free) {
      if (auto it = live_.find(e.id); it != live_.end()) remove(it, on_change);
    } else if (e.action == TraceAction::Retag) {  // the bytes stay live and change owner
      if (auto it = live_.find(e.id); it != live_.end()) {
        const uint32_t owner = owners_.of(e.tag);
        on_change(it->second.owner, -it->second.bytes);
        it->second.owner = owner;
        on_change(owner, it->second.bytes);
      }
    }
  }
  void apply(const std::vector<TraceEvent>& events, size_t i) {
    apply(events, i, [](uint32_t, int64_t) {});
  }

  int64_t total() const { return total_; }
  const std::unordered_map<uint64_t, LiveAlloc>& live() const { return live_; }

 private:
  template <class It, class OnChange>
  void remove(It it, OnChange&& on_change) {
    total_ -= it->second.bytes;
    on_change(it->second.owner, -it->second.bytes);
    live_.erase(it);
  }

  Owners& owners_;
  std::unordered_map<uint64_t, LiveAlloc> live_;
  int64_t total_ = 0;
};

// Allocated bytes after every event (Note [Bytes before the trace]), and the first event where they are highest.
struct Totals {
  std::vector<int64_t> after;   // walked live bytes + before
  std::vector<int64_t> before;  // bytes live from before the trace's window (recorded allocated - walked, >= 0)
  bool any_before = false;
  int64_t peak_index = -1;
  int64_t peak = 0;
};

Totals walk_totals(const std::vector<TraceEvent>& events, Owners& owners) {
  Totals t;
  t.after.resize(events.size());
  t.before.resize(events.size());
  LiveSet live(owners);
  bool any_alloc = false;
  for (size_t i = 0; i < events.size(); ++i) {
    live.apply(events, i);
    t.before[i] = std::max<int64_t>(0, events[i].allocated - live.total());  // both >= 0: no overflow
    t.after[i] = live.total() + t.before[i];                                  // == max(walked, recorded)
    t.any_before = t.any_before || t.before[i] > 0;
    if (events[i].action == TraceAction::Alloc && (!any_alloc || t.after[i] > t.peak)) {
      any_alloc = true;
      t.peak = t.after[i];
      t.peak_index = static_cast<int64_t>(i);
    }
  }
  return t;
}

// The live allocations just after event `peak_index`, largest first (ties: allocated earlier first).
struct PeakAlloc {
  uint64_t id = 0;
  LiveAlloc a;
};
std::vector<PeakAlloc> alive_at(const std::vector<TraceEvent>& events, int64_t peak_index, Owners& owners) {
  LiveSet live(owners);
  for (int64_t i = 0; i <= peak_index; ++i) live.apply(events, static_cast<size_t>(i));
  std::vector<PeakAlloc> out;
  out.reserve(live.live().size());
  for (const auto& [id, a] : live.live()) out.push_back({id, a});
  std::sort(out.begin(), out.end(), [](const PeakAlloc& x, const PeakAlloc& y) {
    return x.a.bytes != y.a.bytes ? x.a.bytes > y.a.bytes : x.a.index < y.a.index;
  });
  return out;
}

std::vector<OwnerBytes> owners_of(const std::vector<PeakAlloc>& alive, const Owners& owners) {
  std::vector<OwnerBytes> out;
  std::unordered_map<uint32_t, size_t> slot;
  for (const PeakAlloc& p : alive) {
    auto [it, fresh] = slot.emplace(p.a.owner, out.size());
    if (fresh) out.push_back(OwnerBytes{owners.name(p.a.owner), 0, 0});
    out[it->second].bytes += p.a.bytes;  // <= the peak total, which did not overflow
    out[it->second].allocations += 1;
  }
  std::sort(out.begin(), out.end(), [](const OwnerBytes& x, const OwnerBytes& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.owner < y.owner;
  });
  return out;
}

// ---- formatting ----------------------------------------------------------------------------------------------------

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// "512 MiB", "1.5 GiB", "700 B": at most two decimals, trailing zeros dropped.
std::string short_bytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && std::fabs(v) >= 1024.0) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s + " " + units[u];
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A time in nanoseconds in the unit that suits `span`.
std::string format_time(double ns, double span) {
  char buf[64];
  if (span >= 1e9) std::snprintf(buf, sizeof buf, "%.6g s", ns / 1e9);
  else if (span >= 1e6) std::snprintf(buf, sizeof buf, "%.6g ms", ns / 1e6);
  else if (span >= 1e3) std::snprintf(buf, sizeof buf, "%.6g us", ns / 1e3);
  else std::snprintf(buf, sizeof buf, "%.6g ns", ns);
  return buf;
}

// A byte step for about `ticks` gridlines up to `top`: 1, 2 or 5 x 10^k of a binary unit.
double byte_step(double top, int ticks) {
  for (double unit = 1.0; unit < 1e19; unit *= 1024.0)
    for (double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0})
      if (top / (m * unit) <= ticks) return m * unit;
  return top;
}

// A decimal step (1, 2 or 5 x 10^k) for about `ticks` gridlines over `span`.
double decimal_step(double span, int ticks) {
  const double raw = span / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10.0 * p;
}

std::string series_color(size_t k) {
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                                  "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#8cd17d"};
  if (k < std::size(palette)) return palette[k];
  char buf[48];
  std::snprintf(buf, sizeof buf, "hsl(%d,55%%,55%%)", static_cast<int>(std::fmod(k * 137.508, 360.0)));
  return buf;
}
constexpr const char* kOtherColor = "#bab0ac";
constexpr const char* kBeforeColor = "#e0e0e0";
constexpr const char* kBeforeName = "(before the trace)";

}  // namespace

const char* timeline_group_name(TimelineGroup group) {
  switch (group) {
    case TimelineGroup::Owner: return "owner";
    case TimelineGroup::Phase: return "phase";
    case TimelineGroup::Module: return "module";
  }
  return "phase";
}

TimelineGroup parse_timeline_group(const std::string& name) {
  for (TimelineGroup g : {TimelineGroup::Owner, TimelineGroup::Phase, TimelineGroup::Module})
    if (name == timeline_group_name(g)) return g;
  EMBER_THROW(ValueError, "timeline: unknown grouping '", name, "' (expected owner, phase or module)");
}

TimelinePeak timeline_peak(const std::vector<TraceEvent>& events) {
  Owners owners;
  const Totals t = walk_totals(events, owners);
  TimelinePeak p;
  if (t.peak_index < 0) return p;
  p.event_index = t.peak_index;
  p.allocated = t.peak;
  p.live_allocations = static_cast<int64_t>(alive_at(events, t.peak_index, owners).size());
  return p;
}

std::vector<OwnerBytes> timeline_owners_at_peak(const std::vector<TraceEvent>& events) {
  Owners owners;
  const Totals t = walk_totals(events, owners);
  if (t.peak_index < 0) return {};
  std::vector<OwnerBytes> out = owners_of(alive_at(events, t.peak_index, owners), owners);
  // Bytes the recorded `allocated` counts but no traced allocation explains (Note [Bytes before the trace]): one
  // owner, as the page's bottom band, so the owners add up to the peak.
  const int64_t before = t.before[static_cast<size_t>(t.peak_index)];
  if (before > 0) {
    out.push_back(OwnerBytes{kBeforeName, before, 0});
    std::stable_sort(out.begin(), out.end(), [](const OwnerBytes& x, const OwnerBytes& y) { return x.bytes > y.bytes; });
  }
  return out;
}

// ---- the page ------------------------------------------------------------------------------------------------------
// Note [Timeline downsampling]: the events are cut into at most kMaxPoints buckets of consecutive events; each bucket
// is drawn at the event where allocated bytes are highest in it (its first such event), with the owners' bytes at
// that event, so every bucket's maximum is kept and the stack stays consistent with the total. The peak is the first
// highest event of the whole trace, so it is its bucket's representative and always drawn. Reserved bytes take the
// highest value recorded in each bucket. Bands are drawn as areas from the baseline to each cumulative top, largest
// first, so each band costs one polygon of kMaxPoints points.

namespace {

constexpr size_t kMaxPoints = 2000;
constexpr size_t kMaxOomMarkers = 500;
constexpr double kWidth = 1100, kHeight = 440, kLeft = 84, kRight = 24, kTop = 28, kBottom = 44;

}  // namespace

void write_timeline_html(const std::vector<TraceEvent>& events, std::ostream& out, const TimelineOptions& options) {
  EMBER_CHECK(options.max_series >= 1 && options.max_series <= 1000, ValueError,
              "write_timeline_html: max_series must be in [1, 1000], got ", options.max_series);
  EMBER_CHECK(options.group_depth >= 1, ValueError, "write_timeline_html: group_depth must be >= 1, got ",
              options.group_depth);
  EMBER_CHECK(options.max_peak_rows >= 0, ValueError, "write_timeline_html: max_peak_rows must be >= 0, got ",
              options.max_peak_rows);
  Owners owners;
  const Totals totals = walk_totals(events, owners);
  EMBER_CHECK(totals.peak_index >= 0, ValueError, "write_timeline_html: the trace holds no alloc event (",
              events.size(), " events)");
  const size_t n = events.size();
  const size_t peak_index = static_cast<size_t>(totals.peak_index);
  const std::vector<PeakAlloc> alive = alive_at(events, totals.peak_index, owners);
  // The bands group the owners (TimelineOptions::group); peak_owners are the groups' bytes at the peak.
  auto group_of = [&](const std::string& owner) -> std::string {
    if (options.group == TimelineGroup::Owner || owner == kUntaggedOwner) return owner;
    auto [module, phase] = split_tag(owner);
    if (options.group == TimelineGroup::Phase) return phase;
    int64_t dots = 0;  // keep the first group_depth dotted names
    for (size_t i = 0; i < module.size(); ++i) {
      if (module[i] == '.' && ++dots == options.group_depth) {
        module.resize(i);
        break;
      }
    }
    return module.empty() ? std::string("(no module)") : module;
  };
  std::vector<OwnerBytes> peak_owners;
  {
    std::unordered_map<std::string, size_t> slot;
    for (const OwnerBytes& o : owners_of(alive, owners)) {
      const std::string g = group_of(o.owner);
      auto [it, fresh] = slot.emplace(g, peak_owners.size());
      if (fresh) peak_owners.push_back(OwnerBytes{g, 0, 0});
      peak_owners[it->second].bytes += o.bytes;
      peak_owners[it->second].allocations += o.allocations;
    }
    std::sort(peak_owners.begin(), peak_owners.end(), [](const OwnerBytes& x, const OwnerBytes& y) {
      return x.bytes != y.bytes ? x.bytes > y.bytes : x.owner < y.owner;
    });
    if (options.group == TimelineGroup::Phase && peak_owners.size() <= static_cast<size_t>(options.max_series)) {
      // Phases stack in the order a step builds them: parameters at the bottom, then optimizer state, data,
      // forward, backward, workspace, other (and untagged bytes last).
      auto rank = [](const std::string& phase) {
        for (int p = 0; p < kNumPhases; ++p)
          if (phase == phase_name(static_cast<Phase>(p))) {
            static constexpr int order[kNumPhases] = {0, 3, 4, 1, 2, 5, 6};  // by Phase: parameters, forward, ...
            return order[p];
          }
        return kNumPhases;
      };
      std::stable_sort(peak_owners.begin(), peak_owners.end(),
                       [&](const OwnerBytes& x, const OwnerBytes& y) { return rank(x.owner) < rank(y.owner); });
    }
  }

  // Series: the largest groups at the peak, then "other owners" when any other group ever holds memory.
  const size_t named = std::min(peak_owners.size(), static_cast<size_t>(options.max_series));
  std::vector<uint32_t> series_of;  // owner index -> series
  std::vector<std::string> series_name;
  for (size_t k = 0; k < named; ++k) series_name.push_back(peak_owners[k].owner);
  auto series_for = [&](uint32_t owner) -> uint32_t {
    while (series_of.size() <= owner) {
      const std::string name = group_of(owners.name(static_cast<uint32_t>(series_of.size())));
      auto it = std::find(series_name.begin(), series_name.begin() + static_cast<std::ptrdiff_t>(named), name);
      series_of.push_back(static_cast<uint32_t>(it - series_name.begin()));  // == named for "other owners"
    }
    return series_of[owner];
  };
  const size_t num_series = named + 1;  // the last is "other owners" (drawn only when it holds bytes)

  // Buckets and their representatives (Note [Timeline downsampling]).
  const size_t buckets = std::min(n, kMaxPoints);
  std::vector<size_t> rep(buckets);
  std::vector<int64_t> bucket_reserved(buckets, 0);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    size_t best = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (totals.after[i] > totals.after[best]) best = i;
      bucket_reserved[b] = std::max(bucket_reserved[b], events[i].reserved);
    }
    rep[b] = best;
  }
  std::vector<std::vector<int64_t>> stack(buckets, std::vector<int64_t>(num_series, 0));
  {
    std::vector<int64_t> current(num_series, 0);
    LiveSet live(owners);
    size_t b = 0;
    for (size_t i = 0; i < n && b < buckets; ++i) {
      live.apply(events, i, [&](uint32_t owner, int64_t delta) { current[series_for(owner)] += delta; });
      while (b < buckets && rep[b] == i) stack[b++] = current;
    }
  }
  const bool has_other = std::any_of(stack.begin(), stack.end(), [&](const std::vector<int64_t>& s) {
    return s[named] != 0;
  });

  // Scales. x is the event index, or the event time when asked for and the trace has increasing times. Times are
  // taken relative to the first event in int64 (a double cannot tell 2^60 from 2^60 + 1); a zero span, or a step
  // that is not positive, falls back to the event index.
  bool has_times = std::any_of(events.begin(), events.end(), [](const TraceEvent& e) { return e.time_ns != 0; });
  for (size_t i = 1; has_times && i < n; ++i) has_times = events[i].time_ns >= events[i - 1].time_ns;
  int64_t span_ns = 0;
  if (has_times && __builtin_sub_overflow(events.back().time_ns, events.front().time_ns, &span_ns)) has_times = false;
  const int64_t t0 = has_times ? events.front().time_ns : 0;
  auto rel_time = [&](size_t i) { return static_cast<double>(events[i].time_ns - t0); };  // within [0, span_ns]
  const double time_step = span_ns > 0 ? decimal_step(static_cast<double>(span_ns), 8) : 0.0;
  const bool use_time = options.time_axis && has_times && span_ns > 0 && time_step > 0.0 && std::isfinite(time_step);
  auto xval = [&](size_t i) { return use_time ? rel_time(i) : static_cast<double>(i); };
  const double x0 = 0.0;
  const double x1 = use_time ? static_cast<double>(span_ns) : std::max(static_cast<double>(n - 1), 1.0);
  int64_t max_reserved = 0;
  for (const TraceEvent& e : events) max_reserved = std::max(max_reserved, e.reserved);
  const double ymax_raw = std::max<double>({static_cast<double>(totals.peak), static_cast<double>(max_reserved), 1.0});
  const double ystep = byte_step(ymax_raw, 6);
  const double ymax = std::ceil(ymax_raw / ystep) * ystep;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + ph - y / ymax * ph; };
  const double base = kTop + ph;

  // Counts for the summary.
  int64_t allocs = 0, frees = 0, annotations = 0;
  std::vector<size_t> ooms;
  for (size_t i = 0; i < n; ++i) {
    switch (events[i].action) {
      case TraceAction::Alloc: ++allocs; break;
      case TraceAction::Free: ++frees; break;
      case TraceAction::Oom: ooms.push_back(i); break;
      case TraceAction::Annotate: ++annotations; break;
      default: break;
    }
  }
  const double span = static_cast<double>(span_ns);
  auto when = [&](size_t i) {
    std::string s = "event #" + std::to_string(i);
    if (has_times) s += " (" + format_time(rel_time(i), span) + ")";
    return s;
  };
  const std::string title = html_escape(options.title);

  // ---- head
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << title << "</title>\n"
      << "<style>\n"
         "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fff}\n"
         "h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 8px}\n"
         ".summary{display:flex;flex-wrap:wrap;gap:6px 28px;margin:0 0 12px}.summary div b{font-weight:600}\n"
         "svg{display:block;border:1px solid #ddd;background:#fff}\n"
         ".axis line,.grid line{stroke:#ccc}.axis text{font-size:11px;fill:#555}\n"
         ".legend{list-style:none;padding:0;margin:10px 0;display:flex;flex-wrap:wrap;gap:4px 18px}\n"
         ".legend li{display:flex;align-items:center;gap:6px}.sw{display:inline-block;width:14px;height:14px;"
         "border:1px solid #0003}\n"
         ".sw.line{height:0;border:0;border-top:2px solid #222}.sw.oom{height:14px;width:0;border:0;"
         "border-left:2px dashed #d62728}\n"
         "table{border-collapse:collapse;font-size:13px}th,td{padding:3px 10px;border-bottom:1px solid #eee;"
         "text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
         "#tip{position:fixed;pointer-events:none;background:#222d;color:#fff;padding:6px 8px;border-radius:4px;"
         "font-size:12px;display:none;white-space:pre}\n"
         "</style>\n</head>\n<body>\n<h1>"
      << title << "</h1>\n";

  out << "<div class=\"summary\">"
      << "<div>events <b>" << n << "</b></div><div>allocations <b>" << allocs << "</b></div><div>frees <b>" << frees
      << "</b></div><div>OOMs <b>" << ooms.size() << "</b></div>"
      << "<div>peak allocated <b>" << short_bytes(static_cast<double>(totals.peak)) << "</b> (" << totals.peak
      << " B) at " << when(peak_index) << "</div>"
      << "<div>peak reserved (recorded) <b>" << short_bytes(static_cast<double>(max_reserved)) << "</b></div>"
      << "<div>alive at the peak <b>" << alive.size() << "</b> allocations of <b>" << owners_of(alive, owners).size()
      << "</b> owners</div><div>bands by <b>" << timeline_group_name(options.group) << "</b></div></div>\n";
  if (totals.any_before) {
    out << "<p class=\"before-note\">" << short_bytes(static_cast<double>(totals.before[peak_index]))
        << " of the peak were allocated before the trace's first event (or in events the trace dropped): the "
           "allocator's recorded bytes exceed what the trace's own events account for. They are drawn as the bottom "
           "band &ldquo;(before the trace)&rdquo; and are not in the table of allocations below.</p>\n";
  }

  // ---- chart
  out << "<svg id=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight << "\" role=\"img\" aria-label=\"" << title << "\">\n";
  out << "<g class=\"grid axis\">\n";
  for (double y = 0; y <= ymax + ystep / 2; y += ystep) {
    out << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + pw << "\" y1=\"" << fixed1(py(y)) << "\" y2=\""
        << fixed1(py(y)) << "\"/><text x=\"" << kLeft - 6 << "\" y=\"" << fixed1(py(y) + 4)
        << "\" text-anchor=\"end\">" << short_bytes(y) << "</text>\n";
  }
  const double xstep = use_time ? time_step : std::max(1.0, decimal_step(x1 - x0, 8));
  for (int k = 0; k <= 100; ++k) {  // about 8 ticks; the count bounds the loop whatever the step
    const double dx = k * xstep;
    if (x0 + dx > x1 + xstep * 1e-9) break;
    const double x = x0 + dx;
    const std::string label = use_time ? format_time(dx, span) : std::to_string(static_cast<int64_t>(x));
    out << "<line x1=\"" << fixed1(px(x)) << "\" x2=\"" << fixed1(px(x)) << "\" y1=\"" << base << "\" y2=\""
        << base + 5 << "\"/><text x=\"" << fixed1(px(x)) << "\" y=\"" << base + 18 << "\" text-anchor=\"middle\">"
        << label << "</text>\n";
  }
  out << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 6 << "\" text-anchor=\"middle\">"
      << (use_time ? "time since the first event" : "event index") << "</text>\n";
  out << "</g>\n";

  // Bands: cumulative areas, drawn from the largest top down (Note [Timeline downsampling]).
  std::vector<int64_t> cum(buckets, 0);
  for (size_t b = 0; b < buckets; ++b) cum[b] = totals.before[rep[b]];  // the bottom band (Note [Bytes before ...])
  const std::vector<int64_t> before_tops = cum;
  std::vector<std::vector<int64_t>> tops(num_series);
  for (size_t k = 0; k < num_series; ++k) {
    for (size_t b = 0; b < buckets; ++b) cum[b] += stack[b][k];
    tops[k] = cum;
  }
  out << "<g class=\"bands\">\n";
  for (size_t kk = num_series; kk-- > 0;) {
    if (kk == named && !has_other) continue;
    const bool other = kk == named;
    const std::string name = other ? "other owners" : series_name[kk];
    const int64_t at_peak = other ? 0 : peak_owners[kk].bytes;
    out << "<polygon class=\"band\" data-series=\"" << kk << "\" fill=\"" << (other ? kOtherColor : series_color(kk))
        << "\" points=\"" << fixed1(px(xval(rep[0]))) << ',' << base;
    for (size_t b = 0; b < buckets; ++b)
      out << ' ' << fixed1(px(xval(rep[b]))) << ',' << fixed1(py(static_cast<double>(tops[kk][b])));
    out << ' ' << fixed1(px(xval(rep[buckets - 1]))) << ',' << base << "\"><title>" << html_escape(name);
    if (!other) out << ": " << short_bytes(static_cast<double>(at_peak)) << " at the peak";
    out << "</title></polygon>\n";
  }
  if (totals.any_before) {
    out << "<polygon class=\"band before\" fill=\"" << kBeforeColor << "\" points=\"" << fixed1(px(xval(rep[0])))
        << ',' << base;
    for (size_t b = 0; b < buckets; ++b)
      out << ' ' << fixed1(px(xval(rep[b]))) << ',' << fixed1(py(static_cast<double>(before_tops[b])));
    out << ' ' << fixed1(px(xval(rep[buckets - 1]))) << ',' << base << "\"><title>" << kBeforeName << ": "
        << short_bytes(static_cast<double>(totals.before[peak_index])) << " at the peak</title></polygon>\n";
  }
  out << "</g>\n";

  if (max_reserved > 0) {
    out << "<polyline class=\"reserved\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.5\" points=\"";
    for (size_t b = 0; b < buckets; ++b)
      out << (b ? " " : "") << fixed1(px(xval(rep[b]))) << ',' << fixed1(py(static_cast<double>(bucket_reserved[b])));
    out << "\"><title>reserved bytes (recorded)</title></polyline>\n";
  }

  // OOM markers: one per pixel column, at most kMaxOomMarkers.
  {
    out << "<g class=\"ooms\">\n";
    int64_t last_px = -1;
    size_t drawn = 0;
    for (size_t i : ooms) {
      const double x = px(xval(i));
      if (static_cast<int64_t>(x) == last_px || drawn >= kMaxOomMarkers) continue;
      last_px = static_cast<int64_t>(x);
      ++drawn;
      out << "<g class=\"oom-marker\"><line x1=\"" << fixed1(x) << "\" x2=\"" << fixed1(x) << "\" y1=\"" << kTop
          << "\" y2=\"" << base << "\" stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/><text x=\""
          << fixed1(x + 3) << "\" y=\"" << kTop + 22 << "\" fill=\"#d62728\" font-size=\"11\">OOM</text><title>OOM: "
          << short_bytes(static_cast<double>(events[i].size)) << " requested at " << when(i) << ", allocated "
          << short_bytes(static_cast<double>(events[i].allocated)) << ", reserved "
          << short_bytes(static_cast<double>(events[i].reserved)) << "</title></g>\n";
    }
    out << "</g>\n";
  }

  // The peak marker.
  {
    const double x = px(xval(peak_index));
    const bool right_half = x > kLeft + pw / 2;
    out << "<g id=\"peak-marker\" class=\"peak-marker\"><line x1=\"" << fixed1(x) << "\" x2=\"" << fixed1(x)
        << "\" y1=\"" << kTop - 8 << "\" y2=\"" << base << "\" stroke=\"#000\" stroke-width=\"1.5\"/><text x=\""
        << fixed1(right_half ? x - 4 : x + 4) << "\" y=\"" << kTop - 12 << "\" text-anchor=\""
        << (right_half ? "end" : "start") << "\" font-size=\"12\" font-weight=\"600\">peak "
        << short_bytes(static_cast<double>(totals.peak)) << " at " << when(peak_index) << "</text></g>\n";
  }
  out << "<line id=\"hover\" x1=\"0\" x2=\"0\" y1=\"" << kTop << "\" y2=\"" << base
      << "\" stroke=\"#888\" visibility=\"hidden\"/>\n</svg>\n<div id=\"tip\"></div>\n";

  // ---- legend
  out << "<ul class=\"legend\">\n";
  for (size_t k = 0; k < named; ++k) {
    out << "<li class=\"owner\"><span class=\"sw\" style=\"background:" << series_color(k) << "\"></span>"
        << html_escape(series_name[k]) << " &mdash; " << short_bytes(static_cast<double>(peak_owners[k].bytes))
        << " at the peak</li>\n";
  }
  if (has_other) {
    int64_t rest = 0;
    for (size_t k = named; k < peak_owners.size(); ++k) rest += peak_owners[k].bytes;
    std::vector<std::string> other_groups;  // the groups summed into the band, not their owner tags
    for (uint32_t o = 0; o < owners.size(); ++o)
      if (series_for(o) == named) other_groups.push_back(group_of(owners.name(o)));
    std::sort(other_groups.begin(), other_groups.end());
    other_groups.erase(std::unique(other_groups.begin(), other_groups.end()), other_groups.end());
    out << "<li class=\"owner\"><span class=\"sw\" style=\"background:" << kOtherColor << "\"></span>other owners ("
        << other_groups.size() << ") &mdash; " << short_bytes(static_cast<double>(rest)) << " at the peak</li>\n";
  }
  if (totals.any_before) {
    out << "<li class=\"owner\"><span class=\"sw\" style=\"background:" << kBeforeColor << "\"></span>"
        << kBeforeName << " &mdash; " << short_bytes(static_cast<double>(totals.before[peak_index]))
        << " at the peak</li>\n";
  }
  if (max_reserved > 0) out << "<li><span class=\"sw line\"></span>reserved (recorded)</li>\n";
  if (!ooms.empty()) out << "<li><span class=\"sw oom\"></span>out of memory (" << ooms.size() << ")</li>\n";
  out << "</ul>\n";

  // ---- allocations alive at the peak
  const size_t rows = std::min(alive.size(), static_cast<size_t>(options.max_peak_rows));
  out << "<h2>Allocations alive at the peak (" << alive.size() << ", largest first)</h2>\n"
      << "<table id=\"alive-at-peak\">\n<thead><tr><th>#</th><th>id</th><th>size</th><th>bytes</th>"
         "<th>requested</th><th>owner</th><th>allocated at</th><th>stream</th></tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < rows; ++r) {
    const PeakAlloc& p = alive[r];
    const TraceEvent& e = events[p.a.index];
    out << "<tr class=\"alive\" data-id=\"" << p.id << "\" data-bytes=\"" << p.a.bytes << "\"><td class=\"num\">"
        << r + 1 << "</td><td class=\"num\">" << p.id << "</td><td class=\"num\">"
        << short_bytes(static_cast<double>(p.a.bytes)) << "</td><td class=\"num\">" << p.a.bytes
        << "</td><td class=\"num\">" << e.size << "</td><td>" << html_escape(owners.name(p.a.owner)) << "</td><td>"
        << when(p.a.index) << "</td><td class=\"num\">" << e.stream << "</td></tr>\n";
  }
  out << "</tbody>\n</table>\n";
  if (rows < alive.size()) out << "<p>" << alive.size() - rows << " smaller allocations not listed.</p>\n";

  // ---- hover read-out (the page is complete without it)
  out << "<script>\nconst D={x:[";
  for (size_t b = 0; b < buckets; ++b) out << (b ? "," : "") << fixed1(px(xval(rep[b])));
  out << "],i:[";
  for (size_t b = 0; b < buckets; ++b) out << (b ? "," : "") << rep[b];
  out << "],a:[";
  for (size_t b = 0; b < buckets; ++b) out << (b ? "," : "") << totals.after[rep[b]];
  out << "],r:[";
  for (size_t b = 0; b < buckets; ++b) out << (b ? "," : "") << bucket_reserved[b];
  out << "]};\n"
         "(function(){const svg=document.getElementById('chart'),tip=document.getElementById('tip'),"
         "hv=document.getElementById('hover');\n"
         "function fb(v){const u=['B','KiB','MiB','GiB','TiB','PiB'];let k=0;"
         "while(Math.abs(v)>=1024&&k<5){v/=1024;k++;}"
         "return (+v.toFixed(2))+' '+u[k];}\n"
         "svg.addEventListener('mousemove',function(ev){const p=svg.createSVGPoint();p.x=ev.clientX;p.y=ev.clientY;"
         "const q=p.matrixTransform(svg.getScreenCTM().inverse());let lo=0,hi=D.x.length-1;"
         "while(lo<hi){const m=(lo+hi)>>1;if(D.x[m]<q.x)lo=m+1;else hi=m;}"
         "if(lo>0&&q.x-D.x[lo-1]<D.x[lo]-q.x)lo--;hv.setAttribute('x1',D.x[lo]);hv.setAttribute('x2',D.x[lo]);"
         "hv.setAttribute('visibility','visible');tip.style.display='block';tip.style.left=(ev.clientX+14)+'px';"
         "tip.style.top=(ev.clientY+14)+'px';tip.textContent='event #'+D.i[lo]+'\\nallocated '+fb(D.a[lo])+"
         "(D.r[lo]>0?'\\nreserved '+fb(D.r[lo]):'');});\n"
         "svg.addEventListener('mouseleave',function(){tip.style.display='none';"
         "hv.setAttribute('visibility','hidden');});})();\n"
         "</script>\n</body>\n</html>\n";
}

}  // namespace ember::memory
