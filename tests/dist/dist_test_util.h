// Shared by the dist tests: the process group (MPI, initialised once per process; the tests skip on every rank when
// ember was built without MPI) and small helpers. Run under `mpirun -np N` or alone (world size 1).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "ember/dist/process_group.h"

namespace ember::testing {

inline std::shared_ptr<dist::ProcessGroup> dist_group() {
  if (!dist::is_available()) return nullptr;
  return dist::init();
}

}  // namespace ember::testing

// Declares `pg` (ProcessGroup&), or skips the test on every rank when there is no MPI backend.
#define EMBER_DIST_GROUP(pg)                                                       \
  auto pg##_ptr = ::ember::testing::dist_group();                                  \
  if (!pg##_ptr) GTEST_SKIP() << "ember was built without MPI (dist::is_available)"; \
  ::ember::dist::ProcessGroup& pg = *pg##_ptr
