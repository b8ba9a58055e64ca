// Host-side random draws for the data pipeline (shuffles, crops, flips), all from a Generator's Philox stream, and the
// per-sample seeds the DataLoader derives. Invariant: every draw reserves counters from the generator it is given, so
// the same (seed, offset) gives the same draws on every machine and thread.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/core/generator.h"

namespace ember::data {

// A uniform double in [0, 1) with 53 random bits (one Philox counter).
double uniform(Generator& gen);
// A uniform double in [low, high).
double uniform(Generator& gen, double low, double high);
// A uniform integer in [0, n) (ValueError for n <= 0); unbiased (rejection on the 64-bit draw).
int64_t randint(Generator& gen, int64_t n);
// A uniformly random permutation of 0..n-1 (Fisher-Yates over randint).
std::vector<int64_t> permutation(int64_t n, Generator& gen);

// The seed of sample `index` in `epoch` of a loader seeded with `seed`: a mix (splitmix64) of the three, so each
// sample's random transforms depend on nothing else — not on the worker that loads it, nor on the worker count.
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index);

}  // namespace ember::data
