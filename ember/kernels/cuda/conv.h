// Which implementation the CUDA conv2d / conv2d_backward kernels use: cuDNN (where built in) or the im2col + GEMM
// path, and the column budget of the latter. Invariant: plain C++ (no CUDA headers), so tests and tools can switch
// paths; every setting is process-wide and takes effect on the next call.
#pragma once

#include <cstdint>

namespace ember::cuda {

enum class ConvStrategy : int8_t { Cudnn, Im2col };

// "cudnn" or "im2col".
const char* conv_strategy_name(ConvStrategy s);
// Whether this build contains the cuDNN path.
bool conv_cudnn_built_in();
// The path in use: EMBER_CONV=cudnn|im2col sets the initial value (read on first use; ConfigError for any other
// value, or for cudnn in a build without cuDNN); without it, cuDNN where built in, else im2col. Where cuDNN finds no
// algorithm for a convolution (no heuristic fits the workspace limit, or a size beyond its 32-bit descriptors), that
// convolution runs on the im2col path.
ConvStrategy conv_strategy();
// Sets the path for the process; ConfigError for Cudnn in a build without cuDNN.
void set_conv_strategy(ConvStrategy s);

// The im2col path converts images in batches whose scratch (columns and packed operands) stays within this many
// bytes, at least one image per batch (default 64 MiB). Returns the previous value; bytes must be positive (tests set
// a tiny budget to run one image per batch).
int64_t set_im2col_chunk_bytes(int64_t bytes);
int64_t im2col_chunk_bytes();

}  // namespace ember::cuda
