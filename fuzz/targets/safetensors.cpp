// Fuzz target: the safetensors reader (nn::deserialize_safetensors and deserialize_safetensors_metadata).
// Invariant checked: bytes are rejected with an ember::Error or parse to tensors that re-serialise to a file which
// parses back to equal tensors (names, dtypes, shapes, bytes) and equal metadata.
#include <cstring>
#include <string>
#include <string_view>

#include "ember/base/error.h"
#include "ember/nn/safetensors.h"
#include "fuzz/fuzz_util.h"

using namespace ember;

namespace {

void check_equal(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  FUZZ_CHECK(a.size() == b.size(), "tensor count");
  for (size_t i = 0; i < a.size(); ++i) {
    FUZZ_CHECK(a[i].first == b[i].first, "tensor name");
    const Tensor& x = a[i].second;
    const Tensor& y = b[i].second;
    FUZZ_CHECK(x.dtype() == y.dtype(), "dtype");
    FUZZ_CHECK(x.sizes() == y.sizes(), "shape");
    FUZZ_CHECK(x.nbytes() == y.nbytes(), "byte count");
    if (x.nbytes() > 0)
      FUZZ_CHECK(std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) == 0, "tensor bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  nn::NamedTensors tensors;
  try {
    tensors = nn::deserialize_safetensors(bytes, Device::cpu());
  } catch (const Error&) {
    try {
      (void)nn::deserialize_safetensors_metadata(bytes);  // the header alone may still be valid
    } catch (const Error&) {
    }
    return 0;
  }
  // Accepted: the metadata reader must accept it too, and the round trip must be exact.
  const nn::SafetensorsMetadata metadata = nn::deserialize_safetensors_metadata(bytes);
  for (const auto& [name, t] : tensors)
    if (name.empty()) return 0;  // readable (as in the reference implementation) but the writer refuses empty names
  const std::string again = nn::serialize_safetensors(tensors, metadata);
  check_equal(tensors, nn::deserialize_safetensors(again, Device::cpu()));
  FUZZ_CHECK(nn::deserialize_safetensors_metadata(again) == metadata, "metadata");
  FUZZ_CHECK(nn::serialize_safetensors(nn::deserialize_safetensors(again, Device::cpu()), metadata) == again,
             "a written file re-serialises to the same bytes");
  return 0;
}
