// What --version prints: the source's git describe and how this binary was built.
#pragma once

#include <string>

namespace dptrain::trainer {

// "dptrain <git describe>: <build type> build, CPU kernels for <ISA>, CUDA backend <built or not>,
// Open MPI <version>".
std::string version_text();

}  // namespace dptrain::trainer
