// main() for every ember test binary: prints the test seed, then runs GoogleTest.
#include <gtest/gtest.h>

#include "tests/harness/op_harness.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ember::testing::test_seed();
  return RUN_ALL_TESTS();
}
