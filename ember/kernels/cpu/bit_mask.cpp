// CPU kernels of the bit-packed masks (ops_sparse.h): pack a bool mask into bytes, unpack, and zero the elements of
// a floating tensor whose bit is 0. Invariant: bit i of a packed mask is bit i % 8 of byte i / 8 (LSB first), and
// pack writes every byte of its output, padding bits as 0.
#include "ember/kernels/ops_sparse.h"

namespace ember::kernels::cpu {
namespace {

void pack_mask_kernel(const Tensor& mask, const Tensor& out) {
  const int64_t n = mask.numel();
  const bool* m = static_cast<const bool*>(mask.raw_data());
  uint8_t* o = static_cast<uint8_t*>(out.raw_data());
  const int64_t full = n / 8;
  for (int64_t b = 0; b < full; ++b) {
    const bool* s = m + b * 8;
    uint8_t byte = 0;
    for (int j = 0; j < 8; ++j) byte |= static_cast<uint8_t>(s[j] ? 1u << j : 0u);
    o[b] = byte;
  }
  if (n % 8 != 0) {
    uint8_t byte = 0;
    for (int64_t j = 0; j < n % 8; ++j) byte |= static_cast<uint8_t>(m[full * 8 + j] ? 1u << j : 0u);
    o[full] = byte;
  }
}

void unpack_mask_kernel(const Tensor& packed, const Tensor& out) {
  const int64_t n = out.numel();
  const uint8_t* p = static_cast<const uint8_t*>(packed.raw_data());
  bool* o = static_cast<bool*>(out.raw_data());
  for (int64_t i = 0; i < n; ++i) o[i] = (p[i >> 3] >> (i & 7)) & 1u;
}

template <class T>
void masked_zero_typed(const Tensor& t, const Tensor& packed) {
  const int64_t n = t.numel();
  const uint8_t* p = static_cast<const uint8_t*>(packed.raw_data());
  T* d = static_cast<T*>(t.raw_data());
  const int64_t full = n / 8;
  for (int64_t b = 0; b < full; ++b) {
    const uint8_t byte = p[b];
    if (byte == 0xFF) continue;  // all kept: the common case in a lightly pruned tensor
    T* s = d + b * 8;
    for (int j = 0; j < 8; ++j)
      if (!((byte >> j) & 1u)) s[j] = T(0);
  }
  for (int64_t i = full * 8; i < n; ++i)
    if (!((p[i >> 3] >> (i & 7)) & 1u)) d[i] = T(0);
}

void masked_zero_kernel(const Tensor& t, const Tensor& packed) {
  EMBER_DISPATCH_FLOAT(t.dtype(), "masked_zero_", [&] { masked_zero_typed<scalar_t>(t, packed); });
}

}  // namespace

EMBER_REGISTER_KERNEL(pack_mask, DeviceType::CPU, pack_mask_kernel);
EMBER_REGISTER_KERNEL(unpack_mask, DeviceType::CPU, unpack_mask_kernel);
EMBER_REGISTER_KERNEL(masked_zero, DeviceType::CPU, masked_zero_kernel);

}  // namespace ember::kernels::cpu
