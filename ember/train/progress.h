// Training progress: one record per logged step (step/total, loss, throughput, the device allocator's bytes) and a
// printer that writes it as plain lines, or — on a terminal — as one line rewritten in place with a progress bar.
// Invariant: the printer never leaves a rewritten line open when anything else is printed through it (note() and
// finish() end it first), so progress, messages and the final report never share a line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ember::train {

struct Progress {
  int64_t step = 0;           // optimizer steps done (counting from the start of training, resumed steps included)
  int64_t total_steps = 0;    // the step the run ends at
  int64_t epoch = 0;          // 1-based epoch of the step (0 where the run has no epochs)
  double loss = 0.0;          // mean training loss of the steps since the previous record
  double samples_per_s = 0.0; // training samples per second since the previous record
  int64_t allocated_bytes = 0;  // the device allocator now
  int64_t reserved_bytes = 0;
  double seconds = 0.0;       // training time so far (evaluation excluded)
};

// "step 120/938  epoch 1  loss 0.4321  812.3 samples/s  allocated 12.30 MiB  reserved 40.00 MiB" (epoch only when
// > 0); with bar_width > 0 a bar "[#####-----] " of that many cells comes first.
std::string format_progress(const Progress& p, int bar_width = 0);

class ProgressPrinter {
 public:
  // rewrite: a terminal — each record replaces the previous one ('\r', a bar); otherwise one line per record.
  ProgressPrinter(std::FILE* out, bool rewrite) : out_(out), rewrite_(rewrite) {}
  void print(const Progress& p);
  void note(const std::string& text);  // a line of its own (multi-line text is fine)
  void finish();                       // ends a rewritten line, if one is open
  std::FILE* stream() const { return out_; }

 private:
  std::FILE* out_;
  bool rewrite_;
  bool open_ = false;   // a rewritten line is on screen without its newline
  size_t last_width_ = 0;
};

}  // namespace ember::train
