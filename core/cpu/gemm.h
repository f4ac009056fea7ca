// The float matrix product behind the convolutions' im2col paths: Y (= or +=) A B, row-major.
#pragma once

#include <cstdint>

namespace dptrain::cpu {

// An operand [rows, cols] at data[r * stride + c], or, transposed, stored [cols, rows] at
// data[c * stride + r]. `streamed` marks a left operand that comes from memory rather than cache (an
// output gradient, read once per block of columns): read in place with rows more than a page apart
// and over 1 MiB in all, its rows are then fetched a row block ahead, in products of fewer than 64
// rows (larger ones go row block by row block, reading each row block once per panel of columns).
struct Operand {
  const float* data;
  int64_t stride;
  bool transposed = false;
  bool streamed = false;
};

// The blocks of k: each element of Y sums its products in blocks of this many, each block one chain of
// multiply-adds (fused where the vector ISA has them) in k order from zero, and the blocks' sums are
// added to Y in order (the first stored unless accumulating). That chain does not depend on the
// thread count.
constexpr int64_t kGemmDepthBlock = 192;

// Y[m, n] = A[m, k] B[k, n] (or += with accumulate), Y's rows at stride ldy.
void gemm(int64_t m, int64_t n, int64_t k, Operand a, Operand b, float* y, int64_t ldy, bool accumulate);

// A transposed A packed once for several products with it: gemm packs a transposed A on every call
// (W^T in every chunk of a convolution's backward: 2.4 MB a chunk for ResNet-50's 3x3 layers of 256
// channels).
struct PackedLeft {
  Operand operand;
  const float* packed = nullptr;
  int64_t m = 0, k = 0;  // its shape, which gemm_packed checks
};
// Floats that the packing of an A [m, k] takes.
int64_t packed_left_floats(int64_t m, int64_t k);
// Packs a (transposed) into `packed`, packed_left_floats(m, k) of them, which must outlive the result.
PackedLeft pack_transposed_left(int64_t m, int64_t k, Operand a, float* packed);
// gemm with A packed beforehand (for the same m and k): the same bits.
void gemm_packed(int64_t m, int64_t n, int64_t k, PackedLeft a, Operand b, float* y, int64_t ldy,
                 bool accumulate);

// A B [k, n] copied once into the column blocks that gemm copies it into on every call, for several
// products by it: U in every band of a Winograd convolution was copied again band after band.
struct PackedRight {
  const float* packed = nullptr;
  int64_t k = 0, n = 0;  // its shape, which gemm_packed_right checks
};
// Floats that the packing of a B [k, n] takes.
int64_t packed_right_floats(int64_t k, int64_t n);
// Packs b into `packed`, packed_right_floats(k, n) of them, which must outlive the result.
PackedRight pack_right(int64_t k, int64_t n, Operand b, float* packed);
// gemm with B packed beforehand (for the same k and n): the same bits.
void gemm_packed_right(int64_t m, int64_t n, int64_t k, Operand a, PackedRight b, float* y, int64_t ldy,
                       bool accumulate);

}  // namespace dptrain::cpu
