// A register-blocked float GEMM for the convolutions' im2col products: forward, input gradient and
// weight gradient. Why not Eigen's: on the shapes of ResNet layers (m of 64-2048, k of 64-4608, n of
// 192-3136 columns) Eigen 3.4's kernel ran at 125-147 GFLOP/s on one Zen 5 core whose 1024^3 Eigen
// GEMM reaches 180-190, and at 46-140 on the weight gradients' shapes; this one at 125-200 (215 since
// the prefetch below), then with B read in place, which no build does since 2026-12-06.
//
// The micro-kernel keeps a tile of Y, kRows rows by kPackets packets of columns, in registers
// (24 accumulators with AVX-512) over a block of k: each step loads kPackets packets of a row of B
// and multiplies them by kRows broadcast elements of A. A column block of B ([kDepth, kPackets
// packets], 36 KiB) stays in L1 while every row block of A passes over it, and the column block of
// Y stays in L2 across the blocks of k; that is for products of fewer than 64 rows: the others go row
// block by row block over panels of B's copies in L2 (multiply_by_rows). A stored as it lies is read in
// place, kRows rows side by side; a transposed A is packed once per call (or once for several, gemm_packed)
// so that each row block's elements sit together (its rows would be a stride apart at every step). A
// transposed B (the weight gradient's columns^T) is transposed into the block's buffer in kLanes x kLanes
// blocks in registers. (Both copied element by element, a weight gradient of 256 x 64 over 3136 pixels ran at
// 112 GFLOP/s; this way, 156.) A B that several products share is copied into its column blocks once,
// for all of them (pack_right).
#include "core/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/cpu/packet.h"
#include "core/error.h"

namespace dptrain::cpu {
namespace {

using namespace simd;

// 8 x 3 accumulators + 3 packets of B + a broadcast fit AVX-512's 32 vector registers; AVX2 has 16,
// so it gets half the rows.
constexpr int kRows = kVectorRegisters >= 32 ? 8 : 4;
constexpr int kPackets = 3;
constexpr int64_t kDepth = kGemmDepthBlock;
constexpr int64_t kLineFloats = 64 / sizeof(float);
// A streamed left operand up to half of L2 stays there between blocks of columns.
int64_t cached_left_floats() {
  return l2_floats() / 2;
}
constexpr int64_t kPageBytes = 4096;

// Buffers of the calling thread that outlive the call (simd::thread_scratch), one per slot.
enum Scratch { kPackedLeft, kPaddedColumns };

// The row blocks of A that the tiles cannot read in place are packed: all of a transposed A, and of A
// as it lies only a last block of fewer than kRows rows. Block b (rows from b * kRows) is at
// packed + (b - first_packed_block) * k * kRows, its element (r, kk) at [kk * kRows + r], rows past m
// zero.
int64_t first_packed_block(int64_t m, Operand a) {
  return a.transposed ? 0 : m / kRows;
}
void pack_left(int64_t m, int64_t k, Operand a, float* packed) {
  const int64_t blocks = (m + kRows - 1) / kRows, first_block = first_packed_block(m, a);
#pragma omp parallel for schedule(static) if (m * k > 65536)
  for (int64_t block = first_block; block < blocks; ++block) {
    float* to = packed + (block - first_block) * k * kRows;
    const int64_t rows = std::min<int64_t>(kRows, m - block * kRows);
    // A whole block of a transposed A is kRows contiguous floats per kk: one copy of a constant size,
    // which the compiler makes a vector move (element by element, with the bounds checks, this
    // packing took 1.1% of a ResNet-50 step on one Zen 3 core).
    if (a.transposed && rows == kRows) {
      for (int64_t kk = 0; kk < k; ++kk)
        std::copy_n(a.data + kk * a.stride + block * kRows, kRows, to + kk * kRows);
      continue;
    }
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t i = block * kRows + r;
        to[kk * kRows + r] = r >= rows      ? 0.0f
                             : a.transposed ? a.data[kk * a.stride + i]
                                            : a.data[i * a.stride + kk];
      }
  }
}

// Fetches the lines of row[0, length) into cache, the row's last float too: a row need not start on a
// line. Write and Keep are __builtin_prefetch's hints.
template <int Write, int Keep>
void prefetch_row(const float* row, int64_t length) {
  for (int64_t c = 0; c < length; c += kLineFloats) __builtin_prefetch(row + c, Write, Keep);
  __builtin_prefetch(row + length - 1, Write, Keep);
}

// Y's tile [rows, cols] (= or += with add) sums over kk < depth of A(r, kk) * b[kk * ldb + c], A's
// kRows rows packed (A(r, kk) at a[kk * kRows + r]) or in place (at a[r * lda + kk]). b must be
// readable for Packets * kLanes columns.
template <int Packets, bool Packed>
void tile(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy,
          int64_t rows, int64_t cols, bool add) {
  // The tile of Y is fetched (for writing) while its products run, whether they are added into it or
  // overwrite it: a store to a line that is not in cache reads the line first. Short products
  // otherwise end waiting on memory: the input gradient of a 1x1 convolution 256->64 over 56x56 (a
  // depth of 64), added into the shortcut's, whose rows lie a plane apart (more streams than the
  // hardware prefetcher follows), took 12.3 ms at batch 16 on one core, 7.7 this way; written, not
  // added, ResNet-50's products of depth 64-147 over 784-12544 columns took 11-17% less time on one
  // Zen 3 core.
  for (int64_t r = 0; r < rows; ++r) prefetch_row</*Write=*/1, /*Keep=*/3>(y + r * ldy, cols);
  Packet sums[kRows][Packets];
  for (auto& row : sums)
    for (Packet& s : row) s = zero();
  for (int64_t kk = 0; kk < depth; ++kk) {
    Packet row_of_b[Packets];
    // In registers: GCC otherwise folds each load into the multiply-adds as a memory operand, loading
    // B kRows times per step. With AVX2's 16 registers (12 accumulators) it did, and the loads, not
    // the multiply-adds, set the pace: 41 GFLOP/s for 1024^3 on a Zen 3 core, 58 this way.
    for (int p = 0; p < Packets; ++p) {
      row_of_b[p] = load(b + kk * ldb + p * kLanes);
      __asm__("" : "+v"(row_of_b[p]));
    }
    for (int r = 0; r < kRows; ++r) {
      const Packet element = pset1<Packet>(Packed ? a[kk * kRows + r] : a[r * lda + kk]);
      for (int p = 0; p < Packets; ++p) sums[r][p] = pmadd(element, row_of_b[p], sums[r][p]);
    }
  }
  if (rows == kRows && cols == Packets * kLanes) {
    for (int r = 0; r < kRows; ++r)
      for (int p = 0; p < Packets; ++p) {
        float* to = y + r * ldy + p * kLanes;
        pstoreu(to, add ? padd(load(to), sums[r][p]) : sums[r][p]);
      }
    return;
  }
  alignas(64) float staged[kRows][Packets * kLanes];
  for (int r = 0; r < kRows; ++r)
    for (int p = 0; p < Packets; ++p) pstoreu(staged[r] + p * kLanes, sums[r][p]);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * ldy + c] = add ? y[r * ldy + c] + staged[r][c] : staged[r][c];
}

using TileKernel = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                            int64_t, bool);
constexpr TileKernel kPackedTile[kPackets + 1] = {nullptr, tile<1, true>, tile<2, true>, tile<3, true>};
constexpr TileKernel kInPlaceTile[kPackets + 1] = {nullptr, tile<1, false>, tile<2, false>, tile<3, false>};

// A column block of the product: columns [j, j + cols) of Y and B, kept as `packets` packets of B's
// copy.
struct ColumnBlock {
  int64_t j, cols, packets;
};

// n columns in blocks of kPackets packets; where that would leave a last block of one packet (8
// accumulators, too few to hide the multiply-add's latency), the last two have two each.
class ColumnBlocks {
 public:
  explicit ColumnBlocks(int64_t n)
      : n_(n),
        total_packets_((n + kLanes - 1) / kLanes),
        count_((total_packets_ + kPackets - 1) / kPackets),
        split_last_two_(total_packets_ % kPackets == 1 && count_ >= 2) {}
  int64_t count() const { return count_; }
  ColumnBlock operator[](int64_t block) const {
    int64_t first_packet = block * kPackets,
            packets = std::min<int64_t>(kPackets, total_packets_ - first_packet);
    if (split_last_two_ && block >= count_ - 2) {
      first_packet = (count_ - 2) * kPackets + (block - (count_ - 2)) * 2;
      packets = 2;
    }
    const int64_t j = first_packet * kLanes;
    return {j, std::min(packets * kLanes, n_ - j), packets};
  }

 private:
  int64_t n_, total_packets_, count_;
  bool split_last_two_;
};

// Copies rows [k0, k0 + depth) of B's column block into `slice`, [depth, block.packets * kLanes], zero
// past its columns. Every column block of B is copied so, and every row block of A then reuses the copy.
// Read in place, the block's kDepth rows lie a row of B apart, so that its lines fall into a few sets
// of the L1 cache and evict each other (a stride of 768 floats puts its 576 lines in 12 of the 64 sets
// of a 48 KiB 12-way L1): the row blocks of A then reread B from L2. With AVX2, on a Zen 3 core (32
// KB L1), 1024^3 ran at 22 GFLOP/s in place, 41 copied; with AVX-512 on the Intel Xeon kind (48 KiB
// L1), ResNet-50's shapes (m 64-1024, k 64-1152, n 196-12544) ran 9-18% faster copied, 1024^3 25%. A
// transposed B is transposed into the copy, and the copy keeps the kernel's loads inside B at a ragged
// last block.
void copy_block_of_b(Operand b, ColumnBlock block, int64_t k0, int64_t depth, float* slice) {
  const int64_t stride = block.packets * kLanes;
  for (int64_t kk = 0; kk < depth; ++kk)
    std::fill(slice + kk * stride + block.cols, slice + (kk + 1) * stride, 0.0f);
  // Stored transposed, column c of B is row j + c of the storage.
  if (b.transposed)
    return transpose</*Add=*/false>(block.cols, depth,
                                    Rows{[&](int64_t c) { return b.data + (block.j + c) * b.stride + k0; }},
                                    [&](int64_t kk) { return slice + kk * stride; });
  for (int64_t kk = 0; kk < depth; ++kk)
    std::copy_n(b.data + (k0 + kk) * b.stride + block.j, block.cols, slice + kk * stride);
}

// Column block `block` of a B packed whole (pack_right): its copy for all of k, as copy_block_of_b would
// make it, at packed + block * k * kPackets * kLanes; rows from k0 on start k0 * packets * kLanes in.
int64_t packed_block_floats(int64_t k) {
  return k * kPackets * kLanes;
}

// B as given, which the product copies block by block, or packed beforehand (pack_right).
struct Right {
  Operand operand;
  const float* packed = nullptr;
};

// Products with at least this many rows go row block by row block (multiply_by_rows) ...
constexpr int64_t kRowwiseMinRows = 64;
// ... over panels of column blocks whose copies of B take up to half of L2: 1 MiB on the Intel Xeon
// kind, where panels of 512 and 256 KiB ran within 3% of it either way (1024^3 2% slower, ResNet-50's
// shapes 1-3% faster, one core); the 1 MiB that it was before would fill the whole L2 of a Zen 4 or 5
// core and leave A's rows and Y's tiles none.
int64_t panel_floats() {
  return l2_floats() / 2;
}

// The product a row block of A at a time: each thread copies a panel of its column blocks of B, every
// block of k of them (up to half of L2, where they stay), then runs each row block of A across the whole
// panel, block of k by block of k, so that the tiles go on along Y's rows where the ones before left
// off. Taken a column block at a time (multiply), each block's tiles wrote every row of Y three lines
// at a time, a row of Y apart (with a plane of 3,136 floats per row, hundreds of pages in turn for
// every 48 columns, which neither the hardware prefetchers nor the TLB follow), and A, too large for
// L2 at ResNet-50's later layers, was read again from memory for every column block. On one Intel
// Xeon core, batch 16, ms a call, forward and backward: 1x1 64->256 over 56x56 17.4 -> 13.3 and 31.6
// -> 30.7, 256->64 20.8 -> 18.6 and 39.0 -> 30.8, 512->2048 over 7x7 15.8 -> 12.7 and 30.8 -> 28.0,
// 2048->512 17.4 -> 14.3 and 33.3 -> 28.6, 1x1/2 512->1024 31.4 -> 27.7 and 64.2 -> 57.2; the product
// alone, 1024^3, 107 -> 143 GFLOP/s (64 x 3136 x 64 97 -> 94, while the convolution 64->64 over
// 56x56 went 6.3 -> 4.5 forward). Each element of Y sums the same blocks of k in the same order: the
// same bits.
void multiply_by_rows(int64_t m, int64_t n, int64_t k, Operand a, const float* packed, Right b, float* y,
                      int64_t ldy, bool accumulate) {
  const int64_t first_packed = first_packed_block(m, a);
  const ColumnBlocks blocks(n);
  const int64_t slice_floats = packed_block_floats(k);
  const int64_t panel_blocks = std::max<int64_t>(1, panel_floats() / slice_floats);
#pragma omp parallel
  {
    // Each thread takes a contiguous run of column blocks, as schedule(static) would give it.
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t begin = blocks.count() * thread / threads, end = blocks.count() * (thread + 1) / threads;
    for (int64_t first = begin; first < end; first += panel_blocks) {
      const int64_t last = std::min(end, first + panel_blocks);
      const float* slices = nullptr;
      if (b.packed) {
        slices = b.packed + first * slice_floats;
      } else {
        float* copies = thread_scratch<kPaddedColumns>((last - first) * slice_floats);
        for (int64_t block = first; block < last; ++block)
          copy_block_of_b(b.operand, blocks[block], 0, k, copies + (block - first) * slice_floats);
        slices = copies;
      }
      for (int64_t i = 0; i < m; i += kRows) {
        const int64_t rows = std::min<int64_t>(kRows, m - i);
        const bool in_place = i / kRows < first_packed;
        const float* rows_of_a =
            in_place ? a.data + i * a.stride : packed + (i / kRows - first_packed) * k * kRows;
        for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
          const int64_t depth = std::min(kDepth, k - k0);
          const float* a_k0 = rows_of_a + (in_place ? k0 : k0 * kRows);
          for (int64_t block = first; block < last; ++block) {
            const ColumnBlock c = blocks[block];
            (in_place ? kInPlaceTile : kPackedTile)[c.packets](
                depth, a_k0, a.stride, slices + (block - first) * slice_floats + k0 * c.packets * kLanes,
                c.packets * kLanes, y + i * ldy + c.j, ldy, rows, c.cols, accumulate || k0 > 0);
          }
        }
      }
    }
  }
}

// The block of B that the column block at j, k0 reads after this one, as rows of B's storage: the
// next block of k of the same columns, else the first of the next columns; none after the last.
struct NextBlock {
  const float* first = nullptr;
  int64_t rows = 0, row_length = 0;
};
NextBlock next_block_of_b(int64_t n, int64_t k, Operand b, int64_t j, int64_t cols, int64_t k0) {
  const bool next_k = k0 + kDepth < k;
  const int64_t next_j = next_k ? j : j + cols, next_k0 = next_k ? k0 + kDepth : 0;
  if (next_j >= n) return {};
  const int64_t depth = std::min(kDepth, k - next_k0),
                width = std::min<int64_t>(kPackets * kLanes, n - next_j);
  // Stored transposed, the block is its columns' rows of the storage, each depth long.
  if (b.transposed) return {b.data + next_j * b.stride + next_k0, width, depth};
  return {b.data + next_k0 * b.stride + next_j, depth, width};
}

// The product, A's row blocks from first_packed_block(m, a) on read from `packed` (pack_left's
// layout), the others in place.
void multiply(int64_t m, int64_t n, int64_t k, Operand a, const float* packed, Right b, float* y, int64_t ldy,
              bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill_n(y + i * ldy, n, 0.0f);
    return;
  }
  if (m >= kRowwiseMinRows) return multiply_by_rows(m, n, k, a, packed, b, y, ldy, accumulate);
  const int64_t row_blocks = (m + kRows - 1) / kRows, first_packed = first_packed_block(m, a);
  const ColumnBlocks blocks(n);
  // A streamed A read in place, too large to stay in L2 between blocks of columns, whose rows lie more
  // than a page apart, has the rows of the next row block fetched while a tile runs. A tile reads
  // kRows runs of kDepth floats, each in its own page, and the hardware prefetchers do not cross
  // pages: the weight gradient of a 1x1 convolution 64->256 over 56x56 at batch 16 (an output gradient
  // of [256, 3136] per sample) took 46 ms a call on one Intel Xeon core, 35 this way, 256->128 74 ->
  // 68. With rows of 784 floats (four to a page) the prefetchers keep up, and the fetches only cost:
  // ResNet-50's 256->1024 over 14x14 and 512->2048 over 7x7 ran 9-12% slower with them. (Those were
  // measured in this order, before products of kRowwiseMinRows rows or more went row by row, which
  // fetches nothing ahead: here only those with fewer rows, weight gradients of under 64 channels.)
  const bool prefetch_left = a.streamed && !a.transposed && a.stride * int64_t{sizeof(float)} > kPageBytes &&
                             m * k > cached_left_floats();
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks.count(); ++block) {
    const ColumnBlock column_block = blocks[block];
    const int64_t j = column_block.j, cols = column_block.cols, packets = column_block.packets;
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, k - k0);
      const int64_t slice_stride = packets * kLanes;
      const float* slice = nullptr;
      if (b.packed) {
        slice = b.packed + block * packed_block_floats(k) + k0 * slice_stride;
      } else {
        float* copy = thread_scratch<kPaddedColumns>(depth * slice_stride);
        copy_block_of_b(b.operand, column_block, k0, depth, copy);
        slice = copy;
      }
      const bool add = accumulate || k0 > 0;
      // The block of B that comes next (the next k, else the next columns) is fetched into L2 while
      // this one's row blocks run, a few of its rows after each tile: its rows lie a row of B apart,
      // which the hardware prefetcher does not follow, and with few row blocks of A (m of 64-128)
      // nothing hid the wait for them. ResNet-50's products with m of 64 over 3136-12544 columns took
      // 8-19% less time on one Zen 3 core, all its products 2%. A packed B lies in one run, which the
      // prefetchers follow.
      const NextBlock next = b.packed ? NextBlock{} : next_block_of_b(n, k, b.operand, j, cols, k0);
      const int64_t rows_per_tile = (next.rows + row_blocks - 1) / row_blocks;
      int64_t next_row = 0;
      for (int64_t i = 0; i < m; i += kRows) {
        for (const int64_t end = std::min(next.rows, next_row + rows_per_tile); next_row < end; ++next_row)
          prefetch_row</*Write=*/0, /*Keep=*/2>(next.first + next_row * b.operand.stride, next.row_length);
        const int64_t rows = std::min<int64_t>(kRows, m - i);
        const bool in_place = i / kRows < first_packed;
        if (prefetch_left && i + kRows < first_packed * kRows)
          for (int64_t r = i + kRows; r < i + 2 * kRows; ++r)
            prefetch_row</*Write=*/0, /*Keep=*/2>(a.data + r * a.stride + k0, depth);
        const float* rows_of_a = in_place ? a.data + i * a.stride + k0
                                          : packed + (i / kRows - first_packed) * k * kRows + k0 * kRows;
        (in_place ? kInPlaceTile : kPackedTile)[packets](depth, rows_of_a, a.stride, slice, slice_stride,
                                                         y + i * ldy + j, ldy, rows, cols, add);
      }
    }
  }
}

// The row blocks of A that the tiles cannot read in place, packed into the calling thread's buffer.
const float* packed_blocks_of_left(int64_t m, int64_t n, int64_t k, Operand a) {
  if (m <= 0 || n <= 0 || k <= 0) return nullptr;
  const int64_t packed_blocks = (m + kRows - 1) / kRows - first_packed_block(m, a);
  float* packed = thread_scratch<kPackedLeft>(packed_blocks * kRows * k);
  pack_left(m, k, a, packed);
  return packed;
}

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, Operand a, Operand b, float* y, int64_t ldy, bool accumulate) {
  multiply(m, n, k, a, packed_blocks_of_left(m, n, k, a), Right{b}, y, ldy, accumulate);
}

int64_t packed_left_floats(int64_t m, int64_t k) {
  return (m + kRows - 1) / kRows * kRows * k;
}

PackedLeft pack_transposed_left(int64_t m, int64_t k, Operand a, float* packed) {
  DPTRAIN_CHECK(a.transposed,
                "pack_transposed_left: A is not transposed (read in place, it needs no packing)");
  pack_left(m, k, a, packed);
  return {a, packed, m, k};
}

void gemm_packed(int64_t m, int64_t n, int64_t k, PackedLeft a, Operand b, float* y, int64_t ldy,
                 bool accumulate) {
  DPTRAIN_CHECK(a.packed && a.m == m && a.k == k, "gemm_packed: A was packed as [", a.m, ", ", a.k,
                "], not [", m, ", ", k, "]");
  multiply(m, n, k, a.operand, a.packed, Right{b}, y, ldy, accumulate);
}

int64_t packed_right_floats(int64_t k, int64_t n) {
  return ColumnBlocks(n).count() * packed_block_floats(k);
}

PackedRight pack_right(int64_t k, int64_t n, Operand b, float* packed) {
  const ColumnBlocks blocks(n);
#pragma omp parallel for schedule(static) if (k * n > 65536)
  for (int64_t block = 0; block < blocks.count(); ++block)
    copy_block_of_b(b, blocks[block], 0, k, packed + block * packed_block_floats(k));
  return {packed, k, n};
}

void gemm_packed_right(int64_t m, int64_t n, int64_t k, Operand a, PackedRight b, float* y, int64_t ldy,
                       bool accumulate) {
  DPTRAIN_CHECK(b.packed && b.k == k && b.n == n, "gemm_packed_right: B was packed as [", b.k, ", ", b.n,
                "], not [", k, ", ", n, "]");
  multiply(m, n, k, a, packed_blocks_of_left(m, n, k, a), Right{{}, b.packed}, y, ldy, accumulate);
}

}  // namespace dptrain::cpu
