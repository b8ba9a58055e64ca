// Device parsing and printing.
// Invariant: parsing accepts exactly what str() prints (plus the bare "cuda" for cuda:0).
#include "ember/core/device.h"

#include <cctype>

#include "ember/base/error.h"

namespace ember {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    *this = cpu();
    return;
  }
  if (spec == "meta") {
    *this = meta();
    return;
  }
  if (spec == "cuda") {
    *this = cuda(0);
    return;
  }
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 10) {
    int idx = 0;
    for (size_t i = 5; i < spec.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(spec[i]))) idx = -1;
      if (idx >= 0) idx = idx * 10 + (spec[i] - '0');
    }
    if (idx >= 0) {
      *this = cuda(idx);
      return;
    }
  }
  EMBER_THROW(ConfigError, "invalid device '", spec, "' (expected cpu, cuda, cuda:N or meta)");
}

namespace {
thread_local Device t_default_device = Device::cpu();
}  // namespace

Device default_device() { return t_default_device; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(t_default_device) { t_default_device = device; }

DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::Meta: return "meta";
  }
  return "invalid";
}

std::string Device::str() const {
  if (type == DeviceType::CUDA) return "cuda:" + std::to_string(index);
  return device_type_name(type);
}

}  // namespace ember
