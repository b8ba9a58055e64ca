// The NCCL functions ember calls (dist/cuda_nccl_process_group.cpp, train/cuda_system_info.cpp), forwarded to libnccl
// opened on first use (Note [Libraries opened on first use] in base/dynamic_library.h). Compiled with hidden
// visibility, only in a build that found NCCL (files named cuda_nccl*). Invariant: one forwarder per function called,
// with the header's own declaration (a mismatch does not compile).
#include <nccl.h>

#include <string>

#include "ember/base/dynamic_library.h"

#ifndef EMBER_NCCL_DIR
#define EMBER_NCCL_DIR ""
#endif

namespace {

ember::DynamicLibrary& nccl_library() {
  static ember::DynamicLibrary* lib =
      new ember::DynamicLibrary("NCCL", "libnccl.so." + std::to_string(NCCL_MAJOR), {EMBER_NCCL_DIR});
  return *lib;
}

}  // namespace

extern "C" {

EMBER_FORWARD(nccl_library, ncclResult_t, ncclGetVersion, (int* version), (version))
EMBER_FORWARD(nccl_library, const char*, ncclGetErrorString, (ncclResult_t result), (result))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank),
              (comm, nranks, id, rank))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclAllReduce,
              (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
               cudaStream_t stream),
              (send, recv, count, type, op, comm, stream))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclReduceScatter,
              (const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
               cudaStream_t stream),
              (send, recv, recv_count, type, op, comm, stream))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclAllGather,
              (const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
               cudaStream_t stream),
              (send, recv, send_count, type, comm, stream))
EMBER_FORWARD(nccl_library, ncclResult_t, ncclBroadcast,
              (const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
               cudaStream_t stream),
              (send, recv, count, type, root, comm, stream))

}  // extern "C"
