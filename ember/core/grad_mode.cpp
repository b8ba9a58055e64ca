// Thread-local grad and inference mode flags (grad_mode.h).
#include "ember/core/grad_mode.h"

namespace ember {
namespace {
thread_local bool t_grad_enabled = true;
thread_local bool t_inference = false;
}  // namespace

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

InferenceMode::InferenceMode(bool enabled) : prev_inference_(t_inference), prev_grad_(t_grad_enabled) {
  t_inference = enabled;
  t_grad_enabled = !enabled;  // as c10::InferenceMode: InferenceMode(false) inside inference mode records again
}
InferenceMode::~InferenceMode() {
  t_inference = prev_inference_;
  t_grad_enabled = prev_grad_;
}
bool InferenceMode::is_enabled() { return t_inference; }

}  // namespace ember
