// The float matrix product behind the convolutions' im2col paths: Y (= or +=) A B, row-major.
#pragma once

#include <cstdint>

namespace dptrain::cpu {

// The left operand: [m, k] at data[i * stride + kk], or, transposed, stored [k, m] at
// data[kk * stride + i].
struct LeftOperand {
  const float* data;
  int64_t stride;
  bool transposed = false;
};

// The blocks of k: each element of Y sums its products in blocks of this many, each block one chain of
// multiply-adds (fused where the vector ISA has them) in k order from zero, and the blocks' sums are
// added to Y in order (the first stored unless accumulating). That chain does not depend on the
// thread count.
constexpr int64_t kGemmDepthBlock = 192;

// Y[m, n] = A[m, k] B[k, n] (or += with accumulate), B's rows at stride ldb, Y's at stride ldy.
void gemm(int64_t m, int64_t n, int64_t k, LeftOperand a, const float* b, int64_t ldb, float* y, int64_t ldy,
          bool accumulate);

}  // namespace dptrain::cpu
