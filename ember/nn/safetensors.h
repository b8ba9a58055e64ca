// safetensors (https://github.com/huggingface/safetensors): the checkpoint format of state dicts. A file is an 8-byte
// little-endian header length N, N bytes of JSON header, then the tensors' bytes (row-major, little-endian).
// Invariant: whatever the loaders return passed every check of the format (Note [safetensors validation]).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "ember/core/device.h"
#include "ember/nn/module.h"

namespace ember::nn {

using SafetensorsMetadata = std::map<std::string, std::string>;

// The bytes of a safetensors file holding `tensors` (any device, any layout: copied to the CPU as contiguous
// row-major data) in the given order, with `metadata` as the header's "__metadata__" (omitted when empty).
// ValueError on duplicate or empty names, the reserved name "__metadata__", undefined or meta tensors.
std::string serialize_safetensors(const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

// Writes serialize_safetensors(...) to `path` atomically: a temporary file in the same directory is written,
// fsync'ed and renamed over `path`, so a reader never sees a half-written checkpoint. Error on I/O failure.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

// Parses safetensors bytes / a file into tensors on `device`, in the order of their data in the buffer (the order
// they were saved in). FormatError with the reason on any malformed input; ValueError when the file cannot be read.
NamedTensors deserialize_safetensors(std::string_view bytes, Device device = Device::cpu());
NamedTensors load_safetensors(const std::string& path, Device device = Device::cpu());

// The "__metadata__" map of a file (empty when it has none); reads and validates only the header.
SafetensorsMetadata read_safetensors_metadata(const std::string& path);
SafetensorsMetadata deserialize_safetensors_metadata(std::string_view bytes);

// The safetensors dtype name ("F32", "BF16", "BOOL", ...) of an ember dtype, and back (FormatError when ember has
// no such dtype).
const char* safetensors_dtype_name(DType dtype);
DType parse_safetensors_dtype(const std::string& name);

}  // namespace ember::nn
