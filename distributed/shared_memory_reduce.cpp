// A POSIX shared-memory segment per reduction buffer, its counters, and the in-place reductions.
#include "distributed/shared_memory_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "distributed/mpi_check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dptrain::distributed {

// One slot per rank, written by that rank only; a cache line each, so that a rank polling its peers
// does not steal the line its own rank writes.
struct alignas(64) SlotData {
  uint32_t arrived;  // sequence number of the last collective this rank entered
  uint32_t reduced;  // ... whose chunk this rank has reduced into every buffer
  uint32_t kind, type, op;
  // Whether the chunk this rank reduced in that collective holds an Inf or NaN (floats only). Written
  // between `arrived` and `reduced`, so that a peer reads it after it sees `reduced`, before this
  // rank can enter the next collective and write it again.
  uint32_t not_finite;
  uint64_t offset, count;  // bytes from the start of the rank's buffer; elements
};

namespace {

constexpr std::size_t kPage = 4096;
constexpr int kAllreduce = 1, kReduceScatter = 2, kAllgather = 3;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

SlotData& slot(char* base, int rank) {
  return reinterpret_cast<SlotData*>(base)[rank];
}

// Sequence numbers wrap around: `value` has reached `target` unless it is less than 2^31 behind.
bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// A store the peers see, and a wake-up for one of them asleep on the word. The futex is the shared
// (not private) kind: the word lives in a mapping several processes share.
void publish(uint32_t& word, uint32_t value) {
  std::atomic_ref<uint32_t>(word).store(value, std::memory_order_release);
  syscall(SYS_futex, &word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Until a peer's `word` reaches `target`: a few microseconds of spinning (a peer that is already there
// answers within them), then sleep on the futex, so that a communication thread waiting for a peer
// still in backward gives the core back to this rank's own backward. The timeout only rechecks (a
// lost wake-up costs 20 ms, never a hang); stalls are the watchdog's business.
void wait_until(uint32_t& word, uint32_t target) {
  std::atomic_ref<uint32_t> value(word);
  for (int spin = 0; spin < 200; ++spin) {
    if (reached(value.load(std::memory_order_acquire), target)) return;
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
  for (;;) {
    const uint32_t seen = value.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    timespec timeout{0, 20'000'000};
    syscall(SYS_futex, &word, FUTEX_WAIT, seen, &timeout, nullptr, 0);
  }
}

const char* type_name(uint32_t type) {
  static const char* const names[] = {"f32", "f64", "i32", "i64", "u64", "u16", "u8", "f16", "bf16"};
  return type < std::size(names) ? names[type] : "?";
}

std::string describe(const SlotData& s) {
  char text[160];
  std::snprintf(text, sizeof text, "%s of %llu %s at byte %llu (op %u)",
                s.kind == kAllreduce       ? "an allreduce"
                : s.kind == kReduceScatter ? "a reduce-scatter"
                                           : "an all-gather",
                static_cast<unsigned long long>(s.count), type_name(s.type),
                static_cast<unsigned long long>(s.offset), s.op);
  return text;
}

// Elements [begin, end) of every buffer summed in rank order (and averaged), written to every buffer
// or to `only`'s; whether any result is Inf or NaN. Blocks of one cache line keep the sums in
// registers between the reads and writes, and the test of the results costs no pass of its own: Inf
// and NaN are the floats whose exponent bits are all ones, an integer test ORed into one flag per
// lane (with one flag for the whole block, the reduction of 4-64 MiB ran 2.1-2.2x slower).
template <typename T>
bool sum_floats(T* const* buffers, int count, std::size_t begin, std::size_t end, bool average, int only) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits kExponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000u : 0x7ff0000000000000u);
  constexpr std::size_t kBlock = 64 / sizeof(T);
  const T divisor = static_cast<T>(count);
  Bits lane_not_finite[kBlock] = {};
  const auto finish = [&](T* sums, std::size_t at, std::size_t n) {
    if (average)
      for (std::size_t k = 0; k < n; ++k) sums[k] /= divisor;
    for (std::size_t k = 0; k < n; ++k)
      lane_not_finite[k] |= (std::bit_cast<Bits>(sums[k]) & kExponent) == kExponent ? Bits{1} : Bits{0};
    for (int q = 0; q < count; ++q)
      if (only < 0 || q == only)
        for (std::size_t k = 0; k < n; ++k) buffers[q][at + k] = sums[k];
  };
  std::size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    T sums[kBlock];
    for (std::size_t k = 0; k < kBlock; ++k) sums[k] = buffers[0][i + k];
    for (int q = 1; q < count; ++q)
      for (std::size_t k = 0; k < kBlock; ++k) sums[k] += buffers[q][i + k];
    finish(sums, i, kBlock);
  }
  for (; i < end; ++i) {
    T sum = buffers[0][i];
    for (int q = 1; q < count; ++q) sum += buffers[q][i];
    finish(&sum, i, 1);
  }
  Bits any = 0;
  for (Bits flag : lane_not_finite) any |= flag;
  return any != 0;
}

// The same for halves: a running sum in half precision (rounded after each addend, as MPI's
// pairwise user op), staged through a block on the stack.
void sum_halves(uint16_t* const* buffers, int count, std::size_t begin, std::size_t end, HalfFormat format,
                int only) {
  constexpr std::size_t kBlock = 1024;
  uint16_t sums[kBlock];
  for (std::size_t at = begin; at < end; at += kBlock) {
    const std::size_t n = std::min(kBlock, end - at);
    std::memcpy(sums, buffers[0] + at, n * sizeof(uint16_t));
    for (int q = 1; q < count; ++q) add_halves(buffers[q] + at, sums, static_cast<int64_t>(n), format);
    for (int q = 0; q < count; ++q)
      if (only < 0 || q == only) std::memcpy(buffers[q] + at, sums, n * sizeof(uint16_t));
  }
}

}  // namespace

bool SharedMemorySegment::supports(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kF32:
    case DataType::kF64:
      return op == ReduceOp::kSum || op == ReduceOp::kAverage;
    case DataType::kF16:
    case DataType::kBf16:
      return op == ReduceOp::kSum;
    default:
      return false;  // integer flags and counts: few bytes, MPI is as good
  }
}

std::shared_ptr<SharedMemorySegment> SharedMemorySegment::create(std::size_t bytes, int rank, int size,
                                                                 std::string* why_not) {
  const std::size_t header = round_up(sizeof(SlotData) * static_cast<std::size_t>(size), kPage);
  const std::size_t stride = round_up(std::max<std::size_t>(bytes, 1), kPage);
  const std::size_t mapped = header + stride * static_cast<std::size_t>(size);
  // Rank 0 creates the segment and names it; the others open it by that name; everyone maps it; then
  // the name goes, so that nothing outlives the job, however it ends.
  char name[64] = {};
  std::string failure;
  int fd = -1;
  if (rank == 0) {
    static int made = 0;
    std::snprintf(name, sizeof name, "/dptrain-%d-%d", static_cast<int>(getpid()), made++);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      failure = std::string("shm_open(\"") + name + "\") failed: " + std::strerror(errno);
    } else if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      failure = std::string("ftruncate of the shared segment failed: ") + std::strerror(errno);
    }
    if (fd < 0) name[0] = '\0';  // nothing for the others to open
  }
  const bool created = rank == 0 && fd >= 0;
  DPTRAIN_MPI_CHECK(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD));
  if (rank != 0) {
    fd = name[0] == '\0' ? -1 : shm_open(name, O_RDWR, 0);
    if (fd < 0) failure = std::string("shm_open(\"") + name + "\") failed: " + std::strerror(errno);
  }
  if (failure.empty()) {
    // Each rank reserves its own buffer (rank 0 the counters too): tmpfs takes the pages from the
    // reserving process's NUMA node, where that rank's backward writes them. Reserving up front also
    // turns a segment larger than /dev/shm's free space into this message rather than a SIGBUS on
    // first touch.
    const std::size_t first = rank == 0 ? 0 : header + stride * static_cast<std::size_t>(rank);
    const std::size_t length = (rank == 0 ? header : 0) + stride;
    if (const int error = posix_fallocate(fd, static_cast<off_t>(first), static_cast<off_t>(length));
        error != 0)
      failure = "no room for " + std::to_string(mapped >> 20) + " MiB in /dev/shm (" + std::strerror(error) +
                "; in a container, raise --shm-size)";
  }
  void* base = MAP_FAILED;
  if (failure.empty()) {
    base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
      failure = std::string("mmap of the shared segment failed: ") + std::strerror(errno);
  }
  if (fd >= 0) close(fd);  // the mapping keeps the segment
  int first_failed = failure.empty() ? size : rank;
  DPTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (rank == 0 && created) shm_unlink(name);  // after every rank has opened it (the allreduce above)
  if (first_failed == size)
    return std::shared_ptr<SharedMemorySegment>(
        new SharedMemorySegment(static_cast<char*>(base), mapped, stride, bytes, rank, size));
  if (base != MAP_FAILED) munmap(base, mapped);
  // Every rank reports the first failing rank's reason.
  char reason[256] = {};
  if (rank == first_failed) std::snprintf(reason, sizeof reason, "rank %d: %s", rank, failure.c_str());
  DPTRAIN_MPI_CHECK(MPI_Bcast(reason, sizeof reason, MPI_CHAR, first_failed, MPI_COMM_WORLD));
  *why_not = reason;
  return nullptr;
}

SharedMemorySegment::SharedMemorySegment(char* base, std::size_t mapped, std::size_t stride,
                                         std::size_t bytes, int rank, int size)
    : base_(base),
      mapped_(mapped),
      header_(mapped - stride * static_cast<std::size_t>(size)),
      stride_(stride),
      bytes_(bytes),
      rank_(rank),
      size_(size) {}

SharedMemorySegment::~SharedMemorySegment() {
  munmap(base_, mapped_);
}

bool SharedMemorySegment::contains(const void* data, std::size_t bytes) const {
  const char* p = static_cast<const char*>(data);
  const char* begin = region(rank_);
  return p >= begin && p + bytes <= begin + bytes_;
}

uint32_t SharedMemorySegment::arrive(std::size_t offset, std::size_t count, DataType type, ReduceOp op,
                                     int kind, const std::string& what) {
  const uint32_t sequence = ++sequence_;
  SlotData& me = slot(base_, rank_);
  me.kind = static_cast<uint32_t>(kind);
  me.type = static_cast<uint32_t>(type);
  me.op = static_cast<uint32_t>(op);
  me.offset = offset;
  me.count = count;
  publish(me.arrived, sequence);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_until(slot(base_, q).arrived, sequence);
  // A peer cannot overwrite its slot before this rank has reduced (depart), so the slots are stable.
  for (int q = 0; q < size_; ++q) {
    const SlotData& peer = slot(base_, q);
    if (peer.kind != me.kind || peer.type != me.type || peer.op != me.op || peer.offset != me.offset ||
        peer.count != me.count)
      DPTRAIN_FAIL("ranks disagree on ", what, " (shared-memory collective ", sequence, "): rank ", rank_,
                   " runs ", describe(me), ", rank ", q, " runs ", describe(peer),
                   "; every rank must issue the same collectives in the same order");
  }
  return sequence;
}

void SharedMemorySegment::depart(uint32_t sequence) {
  publish(slot(base_, rank_).reduced, sequence);
  // No rank touches its buffer again (nor another's) before every rank is done with it.
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_until(slot(base_, q).reduced, sequence);
  collectives_.fetch_add(1, std::memory_order_relaxed);
}

bool SharedMemorySegment::reduce_range(std::size_t offset, std::size_t begin, std::size_t end, DataType type,
                                       ReduceOp op, bool write_everywhere) const {
  if (begin >= end) return false;
  const int only = write_everywhere ? -1 : rank_;
  const bool average = op == ReduceOp::kAverage;
  switch (type) {
    case DataType::kF32:
      return sum_floats(buffers_at<float>(offset).data(), size_, begin, end, average, only);
    case DataType::kF64:
      return sum_floats(buffers_at<double>(offset).data(), size_, begin, end, average, only);
    case DataType::kF16:
    case DataType::kBf16:
      sum_halves(buffers_at<uint16_t>(offset).data(), size_, begin, end,
                 type == DataType::kF16 ? HalfFormat::kFp16 : HalfFormat::kBf16, only);
      return false;  // not tested: an encoding's halves are checked once decoded
    default:
      DPTRAIN_FAIL("shared-memory reduction of an unsupported type");
  }
}

std::size_t SharedMemorySegment::offset_of(const void* data, std::size_t count, DataType type, ReduceOp op,
                                           const char* collective) const {
  DPTRAIN_CHECK(supports(type, op) && contains(data, count * element_size(type)),
                std::string("shared-memory ") + collective +
                    " of a buffer outside the segment or of an unsupported type");
  return static_cast<std::size_t>(static_cast<const char*>(data) - region(rank_));
}

void SharedMemorySegment::allreduce(void* data, std::size_t count, DataType type, ReduceOp op,
                                    const std::string& what, bool* finite) {
  const std::size_t offset = offset_of(data, count, type, op, "allreduce");
  const uint32_t sequence = arrive(offset, count, type, op, kAllreduce, what);
  // Chunks of whole cache lines, so that no two ranks write into one line.
  const std::size_t per_line = 64 / element_size(type), ranks = static_cast<std::size_t>(size_);
  const std::size_t chunk = round_up((count + ranks - 1) / ranks, per_line);
  const std::size_t begin = std::min(count, chunk * static_cast<std::size_t>(rank_));
  slot(base_, rank_).not_finite =
      reduce_range(offset, begin, std::min(count, begin + chunk), type, op, /*write_everywhere=*/true);
  depart(sequence);
  if (finite == nullptr) return;
  DPTRAIN_CHECK(type == DataType::kF32 || type == DataType::kF64,
                "shared-memory allreduce: only floats are tested for Inf and NaN");
  *finite = true;
  for (int q = 0; q < size_; ++q) *finite = *finite && slot(base_, q).not_finite == 0;
}

void SharedMemorySegment::reduce_scatter(void* data, std::size_t chunk, DataType type, ReduceOp op,
                                         const std::string& what) {
  const std::size_t count = chunk * static_cast<std::size_t>(size_);
  const std::size_t offset = offset_of(data, count, type, op, "reduce-scatter");
  const uint32_t sequence = arrive(offset, count, type, op, kReduceScatter, what);
  const std::size_t begin = chunk * static_cast<std::size_t>(rank_);
  reduce_range(offset, begin, begin + chunk, type, op, /*write_everywhere=*/false);
  depart(sequence);
}

void SharedMemorySegment::allgather(void* data, std::size_t chunk, DataType type, const std::string& what) {
  const std::size_t chunk_bytes = chunk * element_size(type);
  DPTRAIN_CHECK(contains(data, chunk_bytes * static_cast<std::size_t>(size_)),
                "shared-memory all-gather of a buffer outside the segment (", what, ")");
  const std::size_t offset = static_cast<std::size_t>(static_cast<const char*>(data) - region(rank_));
  // Every rank has written its own chunk before it arrives, and reads the others' only: no chunk is
  // written and read at once. depart() keeps each owner from changing its chunk until all have read it.
  const uint32_t sequence =
      arrive(offset, chunk * static_cast<std::size_t>(size_), type, ReduceOp::kSum, kAllgather, what);
  for (int q = 0; q < size_; ++q) {
    const std::size_t at = offset + static_cast<std::size_t>(q) * chunk_bytes;
    if (q != rank_) std::memcpy(region(rank_) + at, region(q) + at, chunk_bytes);
  }
  depart(sequence);
}

}  // namespace dptrain::distributed
