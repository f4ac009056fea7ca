// --version: the git describe that cmake/version.cmake writes at every build, and the build's settings.
#include "trainer/version.h"

#include "core/backend.h"
#include "distributed/world.h"
#include "dptrain_version.h"

namespace dptrain::trainer {

std::string version_text() {
#if defined(DPTRAIN_WITH_CUDA)
  const std::string cuda = "CUDA backend built";
#else
  const std::string cuda = "no CUDA backend";
#endif
  return std::string("dptrain ") + DPTRAIN_GIT_DESCRIBE + ": " + DPTRAIN_BUILD_TYPE +
         " build, CPU kernels for " + cpu_vector_isa() + ", " + cuda + ", " +
         distributed::mpi_library_built_against();
}

}  // namespace dptrain::trainer
