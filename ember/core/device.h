// Where a tensor's bytes live: cpu, cuda:N, or meta (shape and dtype only, no bytes — for planning and estimation).
// Invariant: index is 0 for cpu and meta, so Device equality is plain field equality.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace ember {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1, Meta = 2 };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // meaningful for CUDA; 0 otherwise

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cuda", "cuda:1", "meta"; throws ConfigError otherwise.
  explicit Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}

  static constexpr Device cpu() { return Device(DeviceType::CPU); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  static constexpr Device meta() { return Device(DeviceType::Meta); }

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  std::string str() const;
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
};

const char* device_type_name(DeviceType t);
inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// The device of tensors made without naming one (TensorOptions{}, TensorOptions(dtype)): cpu, unless a
// DefaultDeviceGuard on this thread sets another — torch's `with torch.device(...)`. Building a model under
// DefaultDeviceGuard(Device::meta()) gives parameters with no bytes and no initialisation work (the estimator's
// models: Note [Models built on meta] in train/bench_train.cpp).
Device default_device();
class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace ember
