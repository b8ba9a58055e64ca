// `ember mem`: reads an allocator trace (JSON Lines or ember's Chrome JSON, docs/memory-trace.md) and summarises it,
// replays it under one or several allocator configurations, or draws it as an HTML timeline (docs/cli.md).
// Invariant: every failure — a bad flag, a missing or malformed file, a bad size or config — is thrown as an
// ember::Error (one line, "ember: ..." and exit status 1); with --json the last line printed is one JSON object.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "ember/memory/timeline.h"
#include "ember/memory/trace.h"
#include "tools/commands.h"

namespace ember::tools {

namespace {

using nlohmann::ordered_json;

// Numbers are kept as text and read in the callbacks, so that a bad value fails like every other error.
struct MemArgs {
  std::string trace;
  bool json = false;
  // summary
  std::string top = "10";
  // replay / compare
  std::vector<std::string> confs;  // compare: one per configuration
  std::string replay_conf;         // replay: one configuration
  bool replay_conf_given = false;
  std::string capacity;
  // html
  std::string output;
  std::string title;
  std::string max_series = "12";
  std::string group = "phase";
  std::string depth = "3";
  std::string rows = "200";
  bool time_axis = false;
};

// A whole number in [lo, hi] given to option `name`.
int64_t parse_count(const std::string& text, const char* name, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  EMBER_CHECK(ec == std::errc() && p == text.data() + text.size() && v >= lo && v <= hi, ValueError, name,
              ": expected a whole number from ", lo, " to ", hi, ", got \"", text, "\"");
  return v;
}

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// Arguments CLI11 could not place (the subcommands allow extras so that they fail here, as one ember error).
// `cmd` is `mem` or one of its subcommands; a subcommand also checks what was given to `mem` before it.
void reject_extras(const CLI::App* cmd) {
  const bool is_mem = cmd->get_name() == "mem";
  if (!is_mem) reject_extras(cmd->get_parent());
  const std::vector<std::string> extra = cmd->remaining();
  if (extra.empty()) return;
  const std::string name = is_mem ? "mem" : "mem " + cmd->get_name();
  const bool flag = !extra.front().empty() && extra.front().front() == '-';
  EMBER_THROW(ValueError, name, ": ", flag ? "unknown option" : "unexpected argument", " \"", extra.front(),
              "\" (see ember ", name, " --help)");
}

memory::TraceFile load(const CLI::App* cmd, const MemArgs& a) {
  reject_extras(cmd);
  EMBER_CHECK(!a.trace.empty(), ValueError, "mem ", cmd->get_name(),
              ": missing TRACE (a .json Chrome trace written by ember, or a .jsonl trace)");
  return memory::load_trace_file(a.trace);
}

int64_t capacity_of(const MemArgs& a) {
  if (a.capacity.empty()) return memory::kNoLimit;
  const int64_t c = memory::parse_bytes(a.capacity, "--capacity");
  EMBER_CHECK(c > 0, ValueError, "--capacity must be positive, got \"", a.capacity, "\"");
  return c;
}

ordered_json replay_json(const memory::ReplayResult& r, const std::string& source) {
  ordered_json j;
  j["config"] = r.config;
  j["config_source"] = source;
  j["peak_allocated_bytes"] = r.peak_allocated;
  j["peak_reserved_bytes"] = r.peak_reserved;
  j["peak_requested_bytes"] = r.peak_requested;
  j["fragmentation"] = r.fragmentation;
  j["num_ooms"] = r.num_ooms;
  j["first_oom_index"] = r.first_oom_index;
  j["num_device_allocs"] = r.num_device_allocs;
  j["num_allocs"] = r.num_allocs;
  j["largest_free_block_at_peak"] = r.largest_free_block_at_peak;
  j["allowed"] = r.allowed == memory::kNoLimit ? ordered_json(nullptr) : ordered_json(r.allowed);
  return j;
}

std::string conf_label(const std::string& conf) { return conf.empty() ? "(defaults)" : conf; }

// A --conf string means what it means in EMBER_ALLOC_CONF: it is read over ember's defaults (expandable segments on).
// A recorded configuration is read as written (AllocatorConfig::str() spells out every difference from PyTorch's).
memory::AllocatorConfig user_conf(const std::string& text) {
  return memory::parse_alloc_config(text, memory::ember_default_config());
}

// Requests that failed while recording (oom events) are not replayed: the replay cannot say whether another setting
// would have served them, only how the requests that succeeded behave. Said after the replay's numbers.
void note_recorded_ooms(const memory::TraceFile& f) {
  int64_t ooms = 0;
  for (const memory::TraceEvent& e : f.events) ooms += e.action == memory::TraceAction::Oom;
  if (ooms > 0)
    std::printf("  note: the recording ran out of memory %lld time(s); failed requests are not replayed, so the OOMs "
                "above count only requests that succeeded when recorded\n",
                static_cast<long long>(ooms));
}

std::string allowed_label(int64_t allowed) {
  return allowed == memory::kNoLimit ? std::string() : " (allowed " + memory::format_bytes(allowed) + ")";
}

// ---- summary -------------------------------------------------------------------------------------------------------

void run_summary(const CLI::App* cmd, const MemArgs& a) {
  reject_extras(cmd);
  const int64_t top_n = parse_count(a.top, "--top", 1, 100000);
  const memory::TraceFile f = load(cmd, a);
  int64_t allocs = 0, frees = 0, ooms = 0, annotations = 0, peak_allocated = 0, peak_reserved = 0;
  for (const memory::TraceEvent& e : f.events) {
    allocs += e.action == memory::TraceAction::Alloc;
    frees += e.action == memory::TraceAction::Free;
    ooms += e.action == memory::TraceAction::Oom;
    annotations += e.action == memory::TraceAction::Annotate;
    peak_allocated = std::max(peak_allocated, e.allocated);
    peak_reserved = std::max(peak_reserved, e.reserved);
  }
  const bool recorded = peak_allocated > 0 || peak_reserved > 0;
  const memory::TimelinePeak peak = memory::timeline_peak(f.events);
  std::vector<memory::OwnerBytes> owners = memory::timeline_owners_at_peak(f.events);
  const size_t num_owners = owners.size();
  if (owners.size() > static_cast<size_t>(top_n)) owners.resize(static_cast<size_t>(top_n));

  if (a.json) {
    ordered_json j;
    j["trace"] = a.trace;
    j["format"] = f.format;
    j["allocator"] = f.has_options ? ordered_json(f.options.allocator) : ordered_json(nullptr);
    j["alloc_conf"] = f.has_options ? ordered_json(f.options.alloc_conf) : ordered_json(nullptr);
    j["events"] = f.events.size();
    j["allocs"] = allocs;
    j["frees"] = frees;
    j["ooms"] = ooms;
    j["annotations"] = annotations;
    // A trace from another tool may carry no allocator totals (every event's allocated and reserved are 0): null,
    // not a peak of 0.
    j["peak_allocated_bytes"] = recorded ? ordered_json(peak_allocated) : ordered_json(nullptr);
    j["peak_reserved_bytes"] = recorded ? ordered_json(peak_reserved) : ordered_json(nullptr);
    j["peak_event_index"] = peak.event_index;
    j["peak_live_bytes"] = peak.allocated;
    j["live_allocations_at_peak"] = peak.live_allocations;
    j["num_owners_at_peak"] = num_owners;
    ordered_json top = ordered_json::array();
    for (const memory::OwnerBytes& o : owners)
      top.push_back({{"owner", o.owner}, {"bytes", o.bytes}, {"allocations", o.allocations}});
    j["top_owners"] = std::move(top);
    std::printf("%s\n", dump(j).c_str());
    return;
  }
  std::printf("trace %s (%s", a.trace.c_str(), f.format == "chrome" ? "Chrome JSON" : "JSON Lines");
  if (f.has_options)
    std::printf(", allocator \"%s\", config %s", f.options.allocator.c_str(), conf_label(f.options.alloc_conf).c_str());
  std::printf("): %zu events\n", f.events.size());
  std::printf("  allocations %lld, frees %lld, OOMs %lld, annotations %lld\n", static_cast<long long>(allocs),
              static_cast<long long>(frees), static_cast<long long>(ooms), static_cast<long long>(annotations));
  if (recorded)
    std::printf("  recorded peaks: allocated %s, reserved %s\n", memory::format_bytes(peak_allocated).c_str(),
                memory::format_bytes(peak_reserved).c_str());
  else
    std::printf("  recorded peaks: none (the events carry no allocated/reserved totals)\n");
  if (peak.event_index < 0) {
    std::printf("  no allocations\n");
    return;
  }
  std::printf("  peak of the live allocations: %s at event #%lld (%lld allocations)\n",
              memory::format_bytes(peak.allocated).c_str(), static_cast<long long>(peak.event_index),
              static_cast<long long>(peak.live_allocations));
  std::printf("  top owners at the peak:\n");
  for (const memory::OwnerBytes& o : owners)
    std::printf("    %12s  %6.1f%%  %5lld allocs  %s\n", memory::format_bytes(o.bytes).c_str(),
                peak.allocated > 0 ? 100.0 * static_cast<double>(o.bytes) / static_cast<double>(peak.allocated) : 0.0,
                static_cast<long long>(o.allocations), o.owner.c_str());
  if (num_owners > owners.size()) std::printf("    ... and %zu more owners\n", num_owners - owners.size());
}

// ---- replay / compare ----------------------------------------------------------------------------------------------

void run_replay(const CLI::App* cmd, const MemArgs& a) {
  reject_extras(cmd);
  const memory::TraceFile f = load(cmd, a);
  std::string conf, source = "defaults";
  if (a.replay_conf_given) {
    conf = a.replay_conf;
    source = "--conf";
  } else if (f.has_options) {
    conf = f.options.alloc_conf;
    source = "recorded";
  }
  const int64_t capacity = capacity_of(a);
  const memory::AllocatorConfig config = source == "--conf" ? user_conf(conf) : memory::parse_alloc_config(conf);
  const memory::ReplayResult r = memory::replay_trace(f.events, config, capacity);
  if (a.json) {
    ordered_json j;
    j["trace"] = a.trace;
    j["capacity"] = capacity == memory::kNoLimit ? ordered_json(nullptr) : ordered_json(capacity);
    const ordered_json result = replay_json(r, source);
    for (const auto& [key, value] : result.items()) j[key] = value;
    std::printf("%s\n", dump(j).c_str());
    return;
  }
  std::printf("replay of %s (%zu events) under %s [%s]%s%s%s\n", a.trace.c_str(), f.events.size(),
              config.explicit_str().c_str(), source.c_str(), capacity == memory::kNoLimit ? "" : " on a device of ",
              capacity == memory::kNoLimit ? "" : memory::format_bytes(capacity).c_str(),
              allowed_label(r.allowed).c_str());
  std::printf("  peak allocated %s, peak reserved %s, fragmentation %.1f%%\n",
              memory::format_bytes(r.peak_allocated).c_str(), memory::format_bytes(r.peak_reserved).c_str(),
              100.0 * r.fragmentation);
  std::printf("  %lld allocations, %lld device allocations, %lld OOMs", static_cast<long long>(r.num_allocs),
              static_cast<long long>(r.num_device_allocs), static_cast<long long>(r.num_ooms));
  if (r.first_oom_index >= 0) std::printf(" (first at event #%lld)", static_cast<long long>(r.first_oom_index));
  std::printf("\n");
  note_recorded_ooms(f);
}

void run_compare(const CLI::App* cmd, const MemArgs& a) {
  reject_extras(cmd);
  EMBER_CHECK(a.confs.size() >= 2, ValueError, "mem compare: give two or more configurations, --conf A --conf B ... "
              "(got ", a.confs.size(), "; ember mem replay replays one)");
  const memory::TraceFile f = load(cmd, a);
  const int64_t capacity = capacity_of(a);
  std::vector<memory::AllocatorConfig> configs;  // all parsed before any replay: a bad one fails at once
  for (const std::string& c : a.confs) configs.push_back(user_conf(c));
  std::vector<memory::ReplayResult> results;
  for (const memory::AllocatorConfig& c : configs) results.push_back(memory::replay_trace(f.events, c, capacity));

  if (a.json) {
    ordered_json j;
    j["trace"] = a.trace;
    j["capacity"] = capacity == memory::kNoLimit ? ordered_json(nullptr) : ordered_json(capacity);
    ordered_json rs = ordered_json::array();
    for (const memory::ReplayResult& r : results) rs.push_back(replay_json(r, "--conf"));
    j["results"] = std::move(rs);
    std::printf("%s\n", dump(j).c_str());
    return;
  }
  size_t best = 0;
  for (size_t i = 1; i < results.size(); ++i)
    if (results[i].num_ooms < results[best].num_ooms ||
        (results[i].num_ooms == results[best].num_ooms && results[i].peak_reserved < results[best].peak_reserved))
      best = i;
  size_t width = 6;
  for (const memory::AllocatorConfig& c : configs) width = std::max(width, c.explicit_str().size());
  std::printf("replays of %s (%zu events)%s%s; * = fewest OOMs, then least reserved\n", a.trace.c_str(),
              f.events.size(), capacity == memory::kNoLimit ? "" : " on a device of ",
              capacity == memory::kNoLimit ? "" : memory::format_bytes(capacity).c_str());
  std::printf("  %-*s  %14s  %14s  %8s  %6s  %13s  %10s\n", static_cast<int>(width), "config", "peak allocated",
              "peak reserved", "frag", "OOMs", "device allocs", "allowed");
  for (size_t i = 0; i < results.size(); ++i) {
    const memory::ReplayResult& r = results[i];
    std::printf("%c %-*s  %14s  %14s  %7.1f%%  %6lld  %13lld  %10s\n", i == best ? '*' : ' ', static_cast<int>(width),
                configs[i].explicit_str().c_str(), memory::format_bytes(r.peak_allocated).c_str(),
                memory::format_bytes(r.peak_reserved).c_str(), 100.0 * r.fragmentation,
                static_cast<long long>(r.num_ooms), static_cast<long long>(r.num_device_allocs),
                r.allowed == memory::kNoLimit ? "-" : memory::format_bytes(r.allowed).c_str());
  }
  note_recorded_ooms(f);
}

// ---- html ----------------------------------------------------------------------------------------------------------

void run_html(const CLI::App* cmd, const MemArgs& a) {
  reject_extras(cmd);
  EMBER_CHECK(!a.output.empty(), ValueError, "mem html: missing -o OUT.html");
  const memory::TraceFile f = load(cmd, a);
  memory::TimelineOptions o;
  o.title = a.title.empty() ? "ember memory timeline: " + a.trace : a.title;
  o.max_series = parse_count(a.max_series, "--max-series", 1, 1000);
  o.group = memory::parse_timeline_group(a.group);
  o.group_depth = parse_count(a.depth, "--depth", 1, 1000);
  o.max_peak_rows = parse_count(a.rows, "--rows", 0, 1000000);
  o.time_axis = a.time_axis;
  std::ostringstream page;
  memory::write_timeline_html(f.events, page, o);
  const std::string text = page.str();
  {
    std::ofstream out(a.output, std::ios::binary | std::ios::trunc);
    EMBER_CHECK(out.is_open(), ValueError, "mem html: cannot write ", a.output);
    out << text;
    out.flush();
    EMBER_CHECK(out.good(), ValueError, "mem html: write error on ", a.output);
  }
  const memory::TimelinePeak peak = memory::timeline_peak(f.events);
  if (a.json) {
    ordered_json j;
    j["trace"] = a.trace;
    j["output"] = a.output;
    j["bytes"] = text.size();
    j["events"] = f.events.size();
    j["peak_event_index"] = peak.event_index;
    j["peak_live_bytes"] = peak.allocated;
    std::printf("%s\n", dump(j).c_str());
    return;
  }
  std::printf("wrote %s (%s): %zu events, peak %s at event #%lld\n", a.output.c_str(),
              memory::format_bytes(static_cast<int64_t>(text.size())).c_str(), f.events.size(),
              memory::format_bytes(peak.allocated).c_str(), static_cast<long long>(peak.event_index));
}

// Runs `body`, turning anything that is not already an ember::Error into one (main() prints those on one line).
template <class Body>
void guarded(const char* what, Body&& body) {
  try {
    body();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    EMBER_THROW(ValueError, "mem ", what, ": ", e.what());
  }
}

}  // namespace

void add_mem_command(CLI::App& app) {
  auto args = std::make_shared<MemArgs>();
  CLI::App* mem = app.add_subcommand(
      "mem", "inspect an allocator trace (.json Chrome trace written by ember, or .jsonl): summary, replay under "
             "other EMBER_ALLOC_CONF settings, compare configurations, HTML timeline");
  mem->allow_extras();
  auto add_trace = [&](CLI::App* cmd) {
    cmd->add_option("trace", args->trace, "trace file: ember's Chrome JSON (.json) or JSON Lines (.jsonl)");
    cmd->add_flag("--json", args->json, "print one JSON object (the last line)");
    cmd->allow_extras();
  };

  CLI::App* summary = mem->add_subcommand("summary", "counts, recorded peaks, and the owners at the peak");
  add_trace(summary);
  summary->add_option("--top", args->top, "owners listed (default 10)");
  summary->callback([args, summary] { guarded("summary", [&] { run_summary(summary, *args); }); });

  CLI::App* replay = mem->add_subcommand("replay", "replay the trace through a fresh allocator");
  add_trace(replay);
  CLI::Option* replay_conf =
      replay->add_option("--conf", args->replay_conf,
                         "an EMBER_ALLOC_CONF string, read as the variable is (over ember's defaults; default: the "
                         "trace's recorded configuration, else the defaults; ember mem compare takes several)");
  replay->add_option("--capacity", args->capacity, "simulated device size, e.g. 6GiB (default: unbounded)");
  replay->callback([args, replay, replay_conf] {
    args->replay_conf_given = replay_conf->count() > 0;
    guarded("replay", [&] { run_replay(replay, *args); });
  });

  CLI::App* compare = mem->add_subcommand("compare", "replay the trace under several configurations, side by side");
  add_trace(compare);
  compare->add_option("--conf", args->confs,
                      "an EMBER_ALLOC_CONF string, read as the variable is (over ember's defaults); repeat for each "
                      "configuration (two or more)")
      ->allow_extra_args(false);
  compare->add_option("--capacity", args->capacity, "simulated device size, e.g. 6GiB (default: unbounded)");
  compare->callback([args, compare] { guarded("compare", [&] { run_compare(compare, *args); }); });

  CLI::App* html = mem->add_subcommand("html", "write a self-contained HTML timeline of the trace");
  add_trace(html);
  html->add_option("-o,--output", args->output, "the page to write (OUT.html)");
  html->add_option("--title", args->title, "page title");
  html->add_option("--max-series", args->max_series, "groups with their own band (default 12)");
  html->add_option("--group-by", args->group, "bands by owner (module/phase tag), phase (default) or module");
  html->add_option("--depth", args->depth, "--group-by module: dotted names kept (default 3)");
  html->add_option("--rows", args->rows, "allocations listed at the peak (default 200)");
  html->add_flag("--time", args->time_axis, "x axis: the events' times (default: the event index)");
  html->callback([args, html] { guarded("html", [&] { run_html(html, *args); }); });

  mem->callback([mem] {
    if (mem->get_subcommands().empty()) {
      const std::vector<std::string> extra = mem->remaining();
      if (extra.empty())
        EMBER_THROW(ValueError, "mem: missing subcommand (summary, replay, compare or html)");
      EMBER_THROW(ValueError, "mem: unknown subcommand \"", extra.front(),
                  "\" (expected summary, replay, compare or html)");
    }
    reject_extras(mem);
  });
}

}  // namespace ember::tools
