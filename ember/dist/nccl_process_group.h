// The NCCL backend of ProcessGroup (CUDA tensors): one communicator per group on this rank's GPU, its own CUDA stream,
// bootstrapped by broadcasting the ncclUniqueId over a bootstrap group (MPI, or one process alone: Note [NCCL without
// MPI] in process_group.cpp). Compiled only in a CUDA build that found NCCL
// (EMBER_WITH_NCCL; the implementation is cuda_nccl_process_group.cpp). Invariant: collectives run on the group's
// stream after the work already queued on the default stream, and Work::wait() orders later default-stream work after
// them.
#pragma once

#include <memory>
#include <string>

#include "ember/dist/process_group.h"

namespace ember::dist::detail {

// A group over the ranks of `bootstrap` on cuda:(local_rank % device count). Collective over `bootstrap`.
std::shared_ptr<ProcessGroup> make_nccl_process_group(ProcessGroup& bootstrap, int local_rank);

// NCCL's version ("2.27.7"); "" in a build without NCCL; "unavailable (<reason>)" when libnccl cannot be opened (Note
// [Libraries opened on first use] in base/dynamic_library.h). Opens the library; never throws.
std::string nccl_version();

}  // namespace ember::dist::detail
