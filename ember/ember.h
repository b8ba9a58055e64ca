// ember: one include for users — tensors, devices, dtypes, the differentiable op set, autograd and the allocator
// statistics.
// Invariant: includes only public headers; nothing here pulls in Eigen or CUDA headers.
#pragma once

#include "ember/base/error.h"
#include "ember/core/device.h"
#include "ember/core/dtype.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/core/tensor.h"
#include "ember/autograd/anomaly.h"
#include "ember/autograd/engine.h"
#include "ember/autograd/functions.h"
#include "ember/autograd/hooks.h"
#include "ember/autograd/saved_hooks.h"
#include "ember/kernels/ops.h"
#include "ember/memory/allocator.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/memory/cuda_device.h"
#include "ember/memory/host_allocator.h"
