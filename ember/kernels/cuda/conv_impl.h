// The geometry of one CUDA convolution and the two paths behind the entry points in conv.cpp: im2col + GEMM
// (conv_im2col.cu, always built) and cuDNN (conv_cudnn.cpp, EMBER_WITH_CUDNN). Invariant: a path gets checked tensors
// (contiguous outputs), runs with `device` current on `stream`, and writes every element of its output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/tensor.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {

// x [n, c, h, w], weight [o, cg, kh, kw], out (or grad_out) [n, o, oh, ow]; kg = cg * kh * kw is the reduction length
// of one group's product, plane = oh * ow. A plain aggregate, passed by value to kernels.
struct ConvShape {
  int64_t n, c, h, w, o, cg, kh, kw, oh, ow, groups, og, kg, plane;
  int64_t sh, sw, ph, pw, dh, dw;
};

inline ConvShape conv_shape(const Shape& x, const Shape& weight, const Shape& out, const Conv2dParams& p) {
  ConvShape s{};
  s.n = x[0];
  s.c = x[1];
  s.h = x[2];
  s.w = x[3];
  s.o = weight[0];
  s.cg = weight[1];
  s.kh = weight[2];
  s.kw = weight[3];
  s.oh = out[2];
  s.ow = out[3];
  s.groups = p.groups;
  s.og = s.o / p.groups;
  s.kg = s.cg * s.kh * s.kw;
  s.plane = s.oh * s.ow;
  s.sh = p.stride[0];
  s.sw = p.stride[1];
  s.ph = p.padding[0];
  s.pw = p.padding[1];
  s.dh = p.dilation[0];
  s.dw = p.dilation[1];
  return s;
}

// out [n, o, oh, ow] (contiguous) = bias[o] broadcast, or 0 where bias is undefined: the first term of every output
// sum on both paths, which then accumulate onto it (Note [Bias first] in conv_im2col.cu).
void fill_conv_bias(const Tensor& bias, const Tensor& out, int device, cudaStream_t stream);

// ---- im2col + GEMM (conv_im2col.cu) -------------------------------------------------------------------------------
void conv2d_im2col(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s, const Tensor& out,
                   int device, cudaStream_t stream);
// grad_x from grad_out and weight; grad_w from grad_out and x (sums over images). grad_out may have any strides.
void conv2d_input_grad_im2col(const Tensor& grad_out, const Tensor& weight, const ConvShape& s, const Tensor& grad_x,
                              int device, cudaStream_t stream);
void conv2d_weight_grad_im2col(const Tensor& grad_out, const Tensor& x, const ConvShape& s, const Tensor& grad_w,
                               int device, cudaStream_t stream);

#if defined(EMBER_WITH_CUDNN)
// ---- cuDNN (conv_cudnn.cpp) ---------------------------------------------------------------------------------------
// Each returns false, having written nothing, when cuDNN cannot take the convolution (a size beyond its 32-bit
// descriptors, or no algorithm within the workspace limit and precision rules); the caller then runs im2col.
bool conv2d_cudnn(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s, const Tensor& out,
                  int device, cudaStream_t stream);
bool conv2d_input_grad_cudnn(const Tensor& grad_out, const Tensor& weight, const ConvShape& s, const Tensor& grad_x,
                             int device, cudaStream_t stream);
bool conv2d_weight_grad_cudnn(const Tensor& grad_out, const Tensor& x, const ConvShape& s, const Tensor& grad_w,
                              int device, cudaStream_t stream);
#endif

}  // namespace ember::kernels::cuda
