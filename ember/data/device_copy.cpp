// DeviceCopier for builds without CUDA: there is no device to copy to, so construction refuses with DeviceError.
// Invariant: the CUDA implementation (cuda_device_copy.cpp) replaces this file in CUDA builds.
#ifndef EMBER_WITH_CUDA

#include "ember/data/device_copy.h"

#include "ember/base/error.h"

namespace ember::data {

struct DeviceCopier::Impl {};
class DeviceCopier::Ticket {};

DeviceCopier::DeviceCopier(Device device) : device_(device) {
  EMBER_THROW(DeviceError, "DataLoader: cannot deliver batches to ", device.str(),
              ": ember was built without CUDA");
}
DeviceCopier::~DeviceCopier() = default;
std::shared_ptr<DeviceCopier::Ticket> DeviceCopier::start(std::vector<Tensor*>) { return nullptr; }
void DeviceCopier::hand_over(const std::shared_ptr<Ticket>&) {}
bool DeviceCopier::done(const std::shared_ptr<Ticket>&) const { return true; }

}  // namespace ember::data

#endif
