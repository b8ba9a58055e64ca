// Shared pieces of the fuzz targets: the libFuzzer entry point's signature and the finding check.
// Invariant: a target returns normally for every input that a parser accepts or rejects with an ember::Error; a
// FUZZ_CHECK that fails, any other exception, a crash or a sanitizer report is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// A round-trip property that must hold for every input a parser accepted: prints and aborts (libFuzzer saves the
// input as a crash; the replay test fails).
#define FUZZ_CHECK(cond, what)                                                                         \
  do {                                                                                                 \
    if (!(cond)) {                                                                                     \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)
