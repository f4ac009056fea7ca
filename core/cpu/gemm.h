// The float matrix product behind the convolutions' im2col paths: Y (= or +=) A B, row-major.
#pragma once

#include <cstdint>

namespace dptrain::cpu {

// An operand [rows, cols] at data[r * stride + c], or, transposed, stored [cols, rows] at
// data[c * stride + r].
struct Operand {
  const float* data;
  int64_t stride;
  bool transposed = false;
};

// The blocks of k: each element of Y sums its products in blocks of this many, each block one chain of
// multiply-adds (fused where the vector ISA has them) in k order from zero, and the blocks' sums are
// added to Y in order (the first stored unless accumulating). That chain does not depend on the
// thread count.
constexpr int64_t kGemmDepthBlock = 192;

// Y[m, n] = A[m, k] B[k, n] (or += with accumulate), Y's rows at stride ldy.
void gemm(int64_t m, int64_t n, int64_t k, Operand a, Operand b, float* y, int64_t ldy, bool accumulate);

}  // namespace dptrain::cpu
