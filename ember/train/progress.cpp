// Progress records and their printer (progress.h).
// Invariant: a rewritten line is padded to the width of the one it replaces, so no stale characters remain.
#include "ember/train/progress.h"

#include <algorithm>

#include "ember/memory/allocator.h"

namespace ember::train {

std::string format_progress(const Progress& p, int bar_width) {
  std::string out;
  if (bar_width > 0) {
    const double frac =
        p.total_steps > 0 ? std::clamp(static_cast<double>(p.step) / static_cast<double>(p.total_steps), 0.0, 1.0)
                          : 0.0;
    const int filled = std::clamp(static_cast<int>(frac * bar_width + 0.5), 0, bar_width);
    out += '[';
    out.append(static_cast<size_t>(filled), '#');
    out.append(static_cast<size_t>(bar_width - filled), '-');
    out += "] ";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld", static_cast<long long>(p.step),
                static_cast<long long>(p.total_steps));
  out += buf;
  if (p.epoch > 0) {
    std::snprintf(buf, sizeof buf, "  epoch %lld", static_cast<long long>(p.epoch));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "  loss %.4f  %.1f samples/s  allocated %s  reserved %s", p.loss, p.samples_per_s,
                memory::format_bytes(p.allocated_bytes).c_str(), memory::format_bytes(p.reserved_bytes).c_str());
  out += buf;
  return out;
}

void ProgressPrinter::print(const Progress& p) {
  if (!rewrite_) {
    std::fprintf(out_, "%s\n", format_progress(p).c_str());
    std::fflush(out_);
    return;
  }
  std::string line = format_progress(p, 24);
  const size_t width = line.size();
  if (width < last_width_) line += std::string(last_width_ - width, ' ');
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  last_width_ = width;
  open_ = true;
}

void ProgressPrinter::note(const std::string& text) {
  finish();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (!open_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  open_ = false;
  last_width_ = 0;
}

}  // namespace ember::train
