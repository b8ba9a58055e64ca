// main() for every ember test binary: prints the test seed, turns on allocation poisoning (every new buffer is
// filled with NaN bytes, so an output element a kernel forgets to write fails its test), then runs GoogleTest.
#include <gtest/gtest.h>

#include "tests/harness/op_harness.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ember::memory::set_poison_allocations(true);
  ember::testing::test_seed();
  return RUN_ALL_TESTS();
}
