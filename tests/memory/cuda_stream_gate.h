// Test helper for stream semantics on a GPU (CUDA builds only): hold a stream busy with a host function until a
// flag is set, and a guard that releases, drains and destroys it even when a test bails out early.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace cuda_test {

// Host function for cudaLaunchHostFunc: spins until *flag (a std::atomic<bool>) is true, or 60 s passed — a bound
// so that a runtime running host functions synchronously (a tool under which the test would deadlock) makes the test
// fail on its expectations instead of hanging.
inline void CUDART_CB wait_for_flag(void* flag) {
  auto* go = static_cast<std::atomic<bool>*>(flag);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!go->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
}

// Lets a stream held by wait_for_flag run again, drains and destroys it, so a failing test never leaves it blocked.
struct StreamGate {
  std::atomic<bool>& go;
  cudaStream_t stream;
  ~StreamGate() {
    go.store(true);
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
};

}  // namespace cuda_test
