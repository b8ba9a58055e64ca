// The dispatch table: one stub per op holding a function pointer per device type (DESIGN.md §3).
// Kernels register themselves with EMBER_REGISTER_KERNEL in their own .cpp/.cu; callers only see the stub.
// Note [Stub initialisation]: DispatchStub has a constexpr constructor, so every stub is constant-initialised before
// any registration (a dynamic initialiser in another file) runs; registration order between files does not matter.
#pragma once

#include "ember/base/error.h"
#include "ember/core/device.h"

namespace ember {

template <class Fn>
class DispatchStub {
 public:
  constexpr explicit DispatchStub(const char* name) : name_(name), table_{} {}

  void set(DeviceType type, Fn fn) { table_[static_cast<int>(type)] = fn; }
  bool has(DeviceType type) const { return table_[static_cast<int>(type)] != nullptr; }
  // The meta entry of a dry run that stands in for CUDA (Note [Dry-run targets] in meta_scope.h): it replays the CUDA
  // kernel's workspace on meta. Registered from host code that every build compiles, so a machine without CUDA can
  // estimate for a GPU; null where the CUDA kernel takes no workspace or its replay is not written (docs/cli.md).
  void set_cuda_replay(Fn fn) { table_[kNumDeviceTypes] = fn; }
  Fn cuda_replay() const { return table_[kNumDeviceTypes]; }
  Fn get(DeviceType type) const {
    Fn fn = table_[static_cast<int>(type)];
    EMBER_CHECK(fn != nullptr, DeviceError, name_, ": no kernel registered for device type ", device_type_name(type),
                type == DeviceType::CUDA ? " (ember built without CUDA, or the CUDA kernel is not written yet)" : "");
    return fn;
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
  Fn table_[kNumDeviceTypes + 1];  // one per device type, then the CUDA replay
};

}  // namespace ember

// In a header: EMBER_DECLARE_STUB(add, AddFn);  in one .cpp: EMBER_DEFINE_STUB(add, AddFn);
#define EMBER_DECLARE_STUB(name, FnType) extern ::ember::DispatchStub<FnType> name##_stub
#define EMBER_DEFINE_STUB(name, FnType) constinit ::ember::DispatchStub<FnType> name##_stub(#name)

#define EMBER_CONCAT_IMPL(a, b) a##b
#define EMBER_CONCAT(a, b) EMBER_CONCAT_IMPL(a, b)
// In a kernel file, at namespace scope: EMBER_REGISTER_KERNEL(add, ::ember::DeviceType::CPU, cpu::add_kernel);
#define EMBER_REGISTER_KERNEL(name, device_type, fn)                                           \
  static const bool EMBER_CONCAT(ember_registered_##name##_, __LINE__) = [] {                  \
    name##_stub.set(device_type, fn);                                                          \
    return true;                                                                               \
  }()
// In a replay file (kernels/meta/): EMBER_REGISTER_CUDA_REPLAY(bmm, bmm_cuda_replay);
#define EMBER_REGISTER_CUDA_REPLAY(name, fn)                                                   \
  static const bool EMBER_CONCAT(ember_cuda_replay_##name##_, __LINE__) = [] {                 \
    name##_stub.set_cuda_replay(fn);                                                           \
    return true;                                                                               \
  }()
