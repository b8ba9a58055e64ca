// The MPI backend of ProcessGroup (CPU tensors) and the process-wide MPI state it rests on: MPI initialised once,
// the communicator ember uses (a duplicate of MPI_COMM_WORLD), and finalisation. Only mpi_process_group.cpp includes
// <mpi.h>; this header is compiled only with EMBER_WITH_MPI. Invariant: every MPI call ember makes holds one process
// lock (Note [MPI threading]).
#pragma once

#include <memory>

#include "ember/dist/process_group.h"

namespace ember::dist::detail {

// MPI_Init_thread(MPI_THREAD_SERIALIZED) unless MPI is initialised already (then the level it gave is checked).
// BackendError when MPI fails or cannot give the thread level.
void mpi_init_once();
bool mpi_is_initialized();  // by anyone, and not finalized
// MPI_Finalize when mpi_init_once initialised MPI (the program's own MPI_Init is left for it to finalize).
void mpi_finalize_if_owned();
int mpi_world_rank();
int mpi_world_size();
int mpi_local_rank();  // rank within MPI_COMM_TYPE_SHARED (the ranks on this host)

// A group over every rank (its own duplicate of MPI_COMM_WORLD). Requires mpi_init_once().
std::shared_ptr<ProcessGroup> make_mpi_process_group();

}  // namespace ember::dist::detail
