// CachingAllocator::memory_summary(): a readable table of the statistics, the fragmentation metrics and the
// segments, built only from the allocator's public snapshots. Invariant: printing takes no allocator lock twice
// in a way that could interleave with itself (each snapshot is taken once, under the allocator's own lock).
#include <cstdio>
#include <sstream>

#include "ember/memory/caching_allocator.h"

namespace ember::memory {

namespace {

std::string row(const char* name, const StatCounter (&c)[kNumStatPools], bool bytes) {
  auto f = [bytes](int64_t v) { return bytes ? format_bytes(v) : std::to_string(v); };
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %-26s | %12s | %12s | %12s | %12s |\n", name, f(c[kAggregatePool].current).c_str(),
                f(c[kAggregatePool].peak).c_str(), f(c[kAggregatePool].allocated).c_str(),
                f(c[kAggregatePool].freed).c_str());
  std::string out = buf;
  for (int p : {int(kLargePool), int(kSmallPool)}) {
    std::snprintf(buf, sizeof buf, "|   %-24s | %12s | %12s | %12s | %12s |\n",
                  p == kLargePool ? "from large pool" : "from small pool", f(c[p].current).c_str(),
                  f(c[p].peak).c_str(), f(c[p].allocated).c_str(), f(c[p].freed).c_str());
    out += buf;
  }
  return out;
}

}  // namespace

std::string CachingAllocator::memory_summary() const {
  const DeviceStats s = device_stats();
  const FragmentationMetrics fr = fragmentation();
  const std::vector<SegmentSnapshot> segs = snapshot();
  const AllocatorConfig cfg = config();
  const int64_t allow = allowed_memory();
  std::ostringstream os;
  const std::string rule(82, '=');
  os << rule << "\n";
  os << "  ember memory summary: " << name() << " on " << backing_->name() << "\n";
  os << "  allowed " << (allow == kNoLimit ? std::string("unbounded") : format_bytes(allow)) << "; config: "
     << (cfg.str().empty() ? std::string("defaults") : cfg.str());
  if (cfg.expandable_segments && !backing_->supports_expandable())
    os << " (this backing cannot map pages: fixed segments are used)";
  os << "\n";
  os << "  OOMs: " << s.num_ooms << "   alloc retries: " << s.num_alloc_retries
     << "   device allocs/frees: " << s.num_device_alloc << "/" << s.num_device_free
     << "   syncs: " << s.num_sync_all_streams << "\n";
  os << rule << "\n";
  os << "| metric                     |      current |         peak |    total in  |   total out  |\n";
  os << "|" << std::string(28, '-') << "|" << std::string(14, '-') << "|" << std::string(14, '-') << "|"
     << std::string(14, '-') << "|" << std::string(14, '-') << "|\n";
  os << row("allocated memory", s.allocated_bytes, true);
  os << row("active memory", s.active_bytes, true);
  os << row("requested memory", s.requested_bytes, true);
  os << row("reserved memory", s.reserved_bytes, true);
  os << row("non-releasable (split)", s.inactive_split_bytes, true);
  os << row("allocations", s.allocation, false);
  os << row("active allocations", s.active, false);
  os << row("segments", s.segment, false);
  os << row("non-releasable allocs", s.inactive_split, false);
  char buf[160];
  std::snprintf(buf, sizeof buf, "| %-26s | %12lld | %12lld |\n", "oversize allocations",
                static_cast<long long>(s.oversize_allocations.current), static_cast<long long>(s.oversize_allocations.peak));
  os << buf;
  std::snprintf(buf, sizeof buf, "| %-26s | %12lld | %12lld |\n", "oversize segments",
                static_cast<long long>(s.oversize_segments.current), static_cast<long long>(s.oversize_segments.peak));
  os << buf;
  os << rule << "\n";
  os << "  fragmentation\n";
  os << "    cache slack (reserved - allocated)       " << format_bytes(fr.cache_slack) << "\n";
  os << "    inactive split bytes (stranded in splits) " << format_bytes(fr.inactive_split_bytes) << "\n";
  os << "    rounding waste (allocated - requested)   " << format_bytes(fr.rounding_waste) << "\n";
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fr.peak_fragmentation);
  os << "    1 - peak active / peak reserved          " << buf << "\n";
  os << "    largest free block                       " << format_bytes(fr.largest_free_block) << "\n";
  os << rule << "\n";
  os << "  segments (" << segs.size() << ")\n";
  size_t shown = 0;
  for (const SegmentSnapshot& seg : segs) {
    if (++shown > 16) {
      os << "    ... " << (segs.size() - 16) << " more\n";
      break;
    }
    int64_t used = 0;
    for (const BlockSnapshot& b : seg.blocks)
      if (b.allocated) used += b.size;
    std::snprintf(buf, sizeof buf, "    0x%012llx %10s %s%s stream %llu: %zu block(s), %s in use\n",
                  static_cast<unsigned long long>(seg.addr), format_bytes(seg.size).c_str(),
                  seg.small_pool ? "small" : "large", seg.expandable ? " expandable" : "",
                  static_cast<unsigned long long>(seg.stream), seg.blocks.size(), format_bytes(used).c_str());
    os << buf;
  }
  os << rule << "\n";
  return os.str();
}

}  // namespace ember::memory
