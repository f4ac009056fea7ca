// DPTRAIN_HOST_DEVICE marks inline functions that CUDA kernels share with the CPU (update rules,
// random streams), so each formula exists once; plain C++ sees nothing.
#pragma once

#if defined(__CUDACC__)
#define DPTRAIN_HOST_DEVICE __host__ __device__
#else
#define DPTRAIN_HOST_DEVICE
#endif
