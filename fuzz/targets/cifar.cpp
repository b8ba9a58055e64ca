// Fuzz target: the CIFAR-10 batch reader (data::parse_cifar10_batch). Invariant checked: bytes are rejected with an
// ember::Error, or give N = size / 3073 records whose labels (0..9) and pixels re-encode to the same bytes.
#include <string>
#include <string_view>

#include "ember/base/error.h"
#include "ember/data/cifar.h"
#include "fuzz/fuzz_util.h"

using namespace ember;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  data::Cifar10Data d;
  try {
    d = data::parse_cifar10_batch(bytes);
  } catch (const Error&) {
    return 0;
  }
  const int64_t n = d.size();
  FUZZ_CHECK(n > 0 && static_cast<size_t>(n * data::kCifar10RecordBytes) == size, "record count from the size");
  FUZZ_CHECK(d.images.sizes() == (Shape{n, 3, data::kCifar10Side, data::kCifar10Side}), "image shape");
  std::string again;
  const int64_t* labels = d.labels.data<int64_t>();
  const uint8_t* images = d.images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    FUZZ_CHECK(labels[i] >= 0 && labels[i] <= 9, "label is a class");
    again += static_cast<char>(labels[i]);
    again.append(reinterpret_cast<const char*>(images + i * data::kCifar10ImageBytes), data::kCifar10ImageBytes);
  }
  FUZZ_CHECK(again == bytes, "records re-encode to the input");
  return 0;
}
