// Builders for the convolution and pooling parameter structs, shared by the forward and backward kernel tests.
#pragma once

#include "ember/kernels/stubs.h"

namespace ember::testing {

inline Conv2dParams conv_params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                int64_t groups) {
  Conv2dParams p;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.dilation[0] = dh;
  p.dilation[1] = dw;
  p.groups = groups;
  return p;
}

inline Pool2dParams pool_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                bool count_include_pad = true) {
  Pool2dParams p;
  p.kernel[0] = kh;
  p.kernel[1] = kw;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.count_include_pad = count_include_pad;
  return p;
}

}  // namespace ember::testing
