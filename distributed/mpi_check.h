// DPTRAIN_MPI_CHECK: every MPI call's return code becomes a dptrain::Error naming the call,
// file:line and rank. Internal to distributed/'s .cpp files (it brings <mpi.h>).
#pragma once

#include <mpi.h>

namespace dptrain::distributed {

void check_mpi(int code, const char* call, const char* file, int line);

}  // namespace dptrain::distributed

#define DPTRAIN_MPI_CHECK(call) ::dptrain::distributed::check_mpi((call), #call, __FILE__, __LINE__)
