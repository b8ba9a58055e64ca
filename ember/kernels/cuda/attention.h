// Which implementation the CUDA attention_qkv / attention_qkv_backward kernels use: the tiled path (per-head products
// through gemm() and a row kernel over [rows, T] score tiles, every dtype and head size) or flash attention (one
// launch over every head, scores never stored; f16/bf16 with head size 32 or 64 on sm_80 and later, Note [Flash
// attention] in attention_flash.cu). Invariant: plain C++ (no CUDA headers), so tests and tools can switch paths; the
// setting is process-wide and takes effect on the next call.
#pragma once

#include <cstdint>

#include "ember/core/dtype.h"

namespace ember::cuda {

enum class AttentionStrategy : int8_t { Tiled, Flash };

// "tiled" or "flash".
const char* attention_strategy_name(AttentionStrategy s);
// The strategy a name spells (case-insensitive "tiled" or "flash"); ConfigError for anything else, naming `what`.
AttentionStrategy parse_attention_strategy(const char* name, const char* what);
// The path in use: EMBER_ATTENTION=tiled|flash sets the initial value (read on first use; ConfigError for any other
// value); without it, flash. Under Flash, a call the flash kernels do not cover (dtype, head size, alignment, an
// older GPU) runs on the tiled path. A backward runs the path its forward ran as long as the strategy is not changed
// in between (the tiled path rounds the scores to 16 bits before lse, the flash path does not, so mixing them gives
// weights that sum to 1 only within that rounding).
AttentionStrategy attention_strategy();
void set_attention_strategy(AttentionStrategy s);

// Calls (forward or backward) that ran the flash kernels since the process started: lets tests and benchmarks see
// which path ran.
int64_t flash_attention_calls();

// Sizes of a flash attention call: batch, sequence, width (3 C per qkv row), heads.
struct FlashShape {
  int64_t B, T, C, H;
};

// Whether the flash kernels cover qkv of this dtype and head size (C / n_head); the call also needs 16-byte aligned
// qkv and grad_out and a device of sm_80 or later.
bool flash_attention_supported(DType dtype, int64_t head_dim);

}  // namespace ember::cuda
