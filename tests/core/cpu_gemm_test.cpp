// core/cpu/gemm: every tile shape and edge (rows, ragged columns, blocks of k, strides, transposed A
// and B, accumulation) against a naive product in double, and bit for bit against the documented order of
// the sums at 1, 2 and 3 threads; an A or a B packed once, or a streamed A, gives the same bits. The vector
// ISA that the kernels name (benchmarks print it) agrees with their vectors' width and runs on this CPU.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/gemm.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

struct Case {
  int64_t m, n, k;
  bool a_transposed, b_transposed, accumulate;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (a_transposed ? " A^T" : "") + (b_transposed ? " B^T" : "") + (accumulate ? " +=" : " =");
  }
};

// Operands with strides past their widths, so that a kernel reading or writing a row's neighbours
// shows; every float of Y outside [m, n] must come back as it was.
struct Operands {
  Operands(const Case& c, uint32_t seed)
      : lda((c.a_transposed ? c.m : c.k) + 3),
        ldb((c.b_transposed ? c.k : c.n) + 5),
        ldy(c.n + 7),
        a(static_cast<std::size_t>((c.a_transposed ? c.k : c.m) * lda + 1)),
        b(static_cast<std::size_t>((c.b_transposed ? c.n : c.k) * ldb + 1)),
        y(static_cast<std::size_t>(c.m * ldy + 1)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (auto* v : {&a, &b, &y})
      for (float& x : *v) x = uniform(rng);
  }
  float a_at(const Case& c, int64_t i, int64_t kk) const {
    return c.a_transposed ? a[kk * lda + i] : a[i * lda + kk];
  }
  float b_at(const Case& c, int64_t kk, int64_t j) const {
    return c.b_transposed ? b[j * ldb + kk] : b[kk * ldb + j];
  }
  int64_t lda, ldb, ldy;
  std::vector<float> a, b, y;
};

std::vector<float> run(const Case& c, const Operands& o, int threads) {
  std::vector<float> y = o.y;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  gemm(c.m, c.n, c.k, {o.a.data(), o.lda, c.a_transposed}, {o.b.data(), o.ldb, c.b_transposed}, y.data(),
       o.ldy, c.accumulate);
  omp_set_num_threads(before);
  return y;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // m around the row block (8 with AVX-512, 4 with AVX2), n around packets and blocks of 3 packets,
  // k around the block of kGemmDepthBlock
  for (int64_t m : {1, 3, 8, 13, 24})
    for (int64_t n : {1, 7, 16, 17, 47, 48, 49, 100})
      for (int64_t k :
           {int64_t{1}, int64_t{5}, kGemmDepthBlock, kGemmDepthBlock + 1, 2 * kGemmDepthBlock + 9})
        for (int transposes = 0; transposes < 4; ++transposes)
          out.push_back(
              {m, n, k, (transposes & 1) != 0, (transposes & 2) != 0, (m + n + k + transposes) % 3 == 0});
  // n around the split of a last block of one packet into two of two: 4, 7 and 13 packets
  for (int64_t n : {64, 112, 208}) out.push_back({9, n, 200, false, n == 112, false});
  // a 1x1 layer's sample in the conformance table: forward, input gradient, weight gradient
  out.push_back({130, 961, 65, false, false, false});
  out.push_back({65, 961, 130, true, false, true});
  out.push_back({130, 65, 961, false, true, true});
  // 64 rows or more, taken row block by row block: a transposed B added into, a packed A over two panels
  // of column blocks (a panel's copies of B are up to 1 MiB), and a packed A over three blocks of depth
  out.push_back({72, 200, 100, false, true, true});
  out.push_back({64, 2000, 150, true, false, false});
  out.push_back({65, 300, 2 * kGemmDepthBlock + 16, true, false, true});
  out.push_back({5, 9, 0, false, false, false});  // k = 0: Y = 0
  out.push_back({5, 9, 0, false, false, true});   // k = 0: Y unchanged
  return out;
}

TEST(CpuGemm, MatchesANaiveProductInDouble) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const Operands o(c, static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k));
    const std::vector<float> y = run(c, o, 1);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < o.ldy; ++j) {
        const float got = y[i * o.ldy + j], before = o.y[i * o.ldy + j];
        if (j >= c.n) {
          ASSERT_EQ(got, before) << "wrote past column n at (" << i << ", " << j << ")";
          continue;
        }
        double want = c.accumulate ? before : 0.0, scale = std::abs(want);
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double term = static_cast<double>(o.a_at(c, i, kk)) * o.b_at(c, kk, j);
          want += term;
          scale += std::abs(term);
        }
        ASSERT_NEAR(got, want, 1e-6 * scale + 1e-30) << "at (" << i << ", " << j << ")";
      }
    ASSERT_EQ(y.back(), o.y.back()) << "wrote past row m";
  }
}

// The order the header promises, written out: per block of k a chain of fused multiply-adds from zero,
// the blocks added to Y in order. Only where the vector ISA fuses them (as -march=native does on the
// machines this runs on); elsewhere the products round before they add.
TEST(CpuGemm, SumsInTheDocumentedOrderAtAnyThreadCount) {
#if !defined(__FMA__)
  GTEST_SKIP()
      << "the build's vector ISA has no fused multiply-add (build with DPTRAIN_NATIVE on an FMA machine)";
#endif
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const Operands o(c, static_cast<uint32_t>(c.m + c.n * 7 + c.k * 13));
    std::vector<float> want = o.y;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        float& y = want[i * o.ldy + j];
        if (!c.accumulate) y = 0.0f;
        for (int64_t k0 = 0; k0 < c.k; k0 += kGemmDepthBlock) {
          float block = 0.0f;
          for (int64_t kk = k0; kk < std::min(c.k, k0 + kGemmDepthBlock); ++kk)
            block = std::fma(o.a_at(c, i, kk), o.b_at(c, kk, j), block);
          y = (k0 == 0 && !c.accumulate) ? block : y + block;
        }
      }
    for (int threads : {1, 2, 3}) {
      const std::vector<float> got = run(c, o, threads);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * want.size()))
          << threads << " threads";
    }
  }
}

// A transposed A packed once and multiplied by two B's gives what gemm gives; so does a streamed A
// whose rows the GEMM fetches ahead (rows over a page apart, over 1 MiB in all): the same bits.
TEST(CpuGemm, PackedOnceAndStreamedGiveTheSameBits) {
  for (const Case& c : {Case{13, 49, kGemmDepthBlock + 1, true, false, false},
                        Case{24, 100, 5, true, true, true}, Case{300, 20, 4000, false, true, true}}) {
    SCOPED_TRACE(c.name());
    const Operands first(c, 11), second(c, 12);
    for (const Operands* o : {&first, &second}) {
      std::vector<float> want = run(c, *o, 1), got = o->y;
      if (c.a_transposed) {
        std::vector<float> packed(static_cast<std::size_t>(packed_left_floats(c.m, c.k)));
        const PackedLeft a = pack_transposed_left(c.m, c.k, {first.a.data(), first.lda, true}, packed.data());
        // the first operands' A with this B: gemm's own answer for it
        std::vector<float> mixed = o->y;
        gemm(c.m, c.n, c.k, {first.a.data(), first.lda, true}, {o->b.data(), o->ldb, c.b_transposed},
             mixed.data(), o->ldy, c.accumulate);
        gemm_packed(c.m, c.n, c.k, a, {o->b.data(), o->ldb, c.b_transposed}, got.data(), o->ldy,
                    c.accumulate);
        want = mixed;
      } else {
        gemm(c.m, c.n, c.k, {o->a.data(), o->lda, false, /*streamed=*/true},
             {o->b.data(), o->ldb, c.b_transposed}, got.data(), o->ldy, c.accumulate);
      }
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * want.size()));
    }
  }
}

// A B packed once (pack_right) and multiplied by two A's gives what gemm gives: products of fewer than
// 64 rows (column block by column block) and of more (row block by row block, here over two panels),
// a ragged last block split in two, blocks of k, a transposed B and a transposed A.
TEST(CpuGemm, RightPackedOnceGivesTheSameBits) {
  for (const Case& c :
       {Case{13, 49, kGemmDepthBlock + 1, false, false, false}, Case{24, 112, 5, true, true, true},
        Case{9, 208, 200, false, true, false}, Case{72, 200, 2 * kGemmDepthBlock + 9, false, false, true},
        Case{64, 2000, 150, true, false, false}, Case{130, 65, 961, false, true, true}}) {
    SCOPED_TRACE(c.name());
    const Operands first(c, 21), second(c, 22);
    std::vector<float> packed(static_cast<std::size_t>(packed_right_floats(c.k, c.n)));
    const PackedRight b = pack_right(c.k, c.n, {first.b.data(), first.ldb, c.b_transposed}, packed.data());
    for (const Operands* o : {&first, &second}) {
      // this A with the first operands' B: gemm's own answer for it
      std::vector<float> want = o->y, got = o->y;
      gemm(c.m, c.n, c.k, {o->a.data(), o->lda, c.a_transposed}, {first.b.data(), first.ldb, c.b_transposed},
           want.data(), o->ldy, c.accumulate);
      gemm_packed_right(c.m, c.n, c.k, {o->a.data(), o->lda, c.a_transposed}, b, got.data(), o->ldy,
                        c.accumulate);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * want.size()));
    }
  }
  std::vector<float> packed(static_cast<std::size_t>(packed_right_floats(4, 4))), a(16), y(16);
  const PackedRight b = pack_right(4, 4, {a.data(), 4}, packed.data());
  EXPECT_THROW(gemm_packed_right(4, 4, 3, {a.data(), 4}, b, y.data(), 4, false), Error);
}

// The floats a vector holds by each ISA's registers (512, 256, 128 bits; one without vectors), and the
// feature this CPU must have to run the build.
TEST(CpuVectorIsa, NamesTheKernelsWidthAndRunsHere) {
  const std::string isa = cpu_vector_isa();
  const int floats = isa == "AVX-512"                 ? 16
                     : isa == "AVX2" || isa == "AVX"  ? 8
                     : isa == "SSE2" || isa == "NEON" ? 4
                     : isa == "none"                  ? 1
                                                      : -1;
  EXPECT_EQ(cpu_vector_floats(), floats) << "ISA " << isa;
#if defined(__x86_64__)
  if (isa == "AVX-512") {
    EXPECT_TRUE(__builtin_cpu_supports("avx512f"));
  }
  if (isa == "AVX2") {
    EXPECT_TRUE(__builtin_cpu_supports("avx2"));
  }
  if (isa == "AVX") {
    EXPECT_TRUE(__builtin_cpu_supports("avx"));
  }
  EXPECT_NE(isa, "none") << "x86-64 has SSE2 at least";
#endif
}

}  // namespace
}  // namespace dptrain::cpu
