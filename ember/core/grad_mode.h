// Grad mode and inference mode: thread-local switches that decide whether differentiable ops record graph nodes.
// They live in core (like c10's GradMode) because tensor factories mark tensors made in inference mode, and view
// and copy methods consult them; the autograd layer does the recording.
#pragma once

namespace ember {

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables gradient recording in its scope (torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: sets grad mode to `enabled` in its scope (torch::AutoGradMode).
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~AutoGradMode() { GradMode::set_enabled(prev_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool prev_;
};

// RAII: inference mode (c10::InferenceMode). Grad mode is off, and every tensor allocated in the scope is an
// *inference tensor*: it can never be saved for backward, never require grad, and cannot be modified in place
// outside inference mode (these would silently give wrong gradients: the tensor carries no version history).
// Views keep their base's kind. InferenceMode(false) turns both off again (grad mode on) for its scope. Nested guards
// restore the previous state.
class InferenceMode {
 public:
  explicit InferenceMode(bool enabled = true);
  ~InferenceMode();
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;
  static bool is_enabled();

 private:
  bool prev_inference_, prev_grad_;
};

}  // namespace ember
