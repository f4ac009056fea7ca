// Eigen views over raw row-major float buffers, shared by the CPU kernels.
#pragma once

#include <Eigen/Core>

namespace dptrain::cpu {

using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<MatrixRM, Eigen::Aligned64>;
using ConstMatMap = Eigen::Map<const MatrixRM, Eigen::Aligned64>;

// Views of buffers that need not be 64-byte aligned (one sample inside a tensor).
using UnalignedMatMap = Eigen::Map<MatrixRM>;
using ConstUnalignedMatMap = Eigen::Map<const MatrixRM>;

inline MatMap mat(float* p, Eigen::Index rows, Eigen::Index cols) {
  return MatMap(p, rows, cols);
}
inline ConstMatMap mat(const float* p, Eigen::Index rows, Eigen::Index cols) {
  return ConstMatMap(p, rows, cols);
}

inline UnalignedMatMap unaligned_mat(float* p, Eigen::Index rows, Eigen::Index cols) {
  return UnalignedMatMap(p, rows, cols);
}
inline ConstUnalignedMatMap unaligned_mat(const float* p, Eigen::Index rows, Eigen::Index cols) {
  return ConstUnalignedMatMap(p, rows, cols);
}

}  // namespace dptrain::cpu
