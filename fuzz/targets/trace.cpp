// Fuzz target: the allocator trace readers (memory::read_trace_jsonl and parse_trace_text, which also takes ember's
// Chrome JSON with embedded events). The first byte picks the reader (bit 0: parse_trace_text); the rest is the
// file. Invariant checked: text is rejected with an ember::Error, or its events written back as JSON Lines and as a
// Chrome trace (with the file's options) read back to the same events and options.
#include <sstream>
#include <string>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/trace.h"
#include "fuzz/fuzz_util.h"

using namespace ember;
using memory::TraceEvent;

namespace {

void check_same(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b) {
  FUZZ_CHECK(a.size() == b.size(), "event count");
  for (size_t i = 0; i < a.size(); ++i) {
    const TraceEvent& x = a[i];
    const TraceEvent& y = b[i];
    FUZZ_CHECK(x.action == y.action && x.id == y.id && x.size == y.size && x.block_size == y.block_size &&
                   x.addr == y.addr && x.stream == y.stream && x.tag == y.tag && x.time_ns == y.time_ns &&
                   x.allocated == y.allocated && x.reserved == y.reserved,
               "event fields");
    if (x.action == memory::TraceAction::Annotate) FUZZ_CHECK(x.note == y.note, "annotation text");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool whole_file = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  memory::TraceFile file;
  try {
    if (whole_file) {
      file = memory::parse_trace_text(text, "fuzz input");
    } else {
      std::istringstream in(text);
      file.events = memory::read_trace_jsonl(in);
    }
  } catch (const Error&) {
    return 0;
  }
  std::ostringstream jsonl;
  memory::write_trace_jsonl(file.events, jsonl);
  std::istringstream jsonl_in(jsonl.str());
  check_same(file.events, memory::read_trace_jsonl(jsonl_in));

  std::ostringstream chrome;
  memory::write_chrome_trace(file.events, chrome, file.options);
  const memory::TraceFile back = memory::parse_trace_text(chrome.str(), "fuzz round trip");
  FUZZ_CHECK(back.format == "chrome", "a written Chrome trace reads as one");
  check_same(file.events, back.events);
  FUZZ_CHECK(back.options.alloc_conf == file.options.alloc_conf && back.options.allocator == file.options.allocator,
             "options");
  return 0;
}
