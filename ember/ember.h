// ember: one include for users — tensors, devices, dtypes, the op set and the allocator statistics.
// Invariant: includes only public headers; nothing here pulls in Eigen or CUDA headers.
#pragma once

#include "ember/base/error.h"
#include "ember/core/device.h"
#include "ember/core/dtype.h"
#include "ember/core/generator.h"
#include "ember/core/tensor.h"
#include "ember/autograd/functions.h"
#include "ember/kernels/ops.h"
#include "ember/memory/allocator.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/host_allocator.h"
