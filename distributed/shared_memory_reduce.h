// SharedMemorySegment: reductions without copies among ranks that share a host. Every rank's buffer
// lives in one POSIX shared-memory segment that all of them map, so the rank that owns a chunk of a
// collective reads that chunk from every rank's buffer and writes the result straight back into
// every rank's buffer. Each rank reads a bucket once and writes it once; Open MPI's shared-memory
// transport copies each message twice (or once through the kernel, CMA) and reduces it in a third
// pass, on the same core as the backward pass it is meant to overlap.
//
// Protocol, per collective, in the order every rank issues them (all ranks call the same collectives
// in the same order, as with MPI): a rank publishes what it reduces (offset, count, type, op) and
// raises its `arrived` counter; once every rank has arrived, it checks that they all reduce the same
// thing, reduces its chunk, raises `reduced`, and returns once every rank has reduced. Waiting spins
// briefly, then sleeps on a futex, so a rank whose peer is still in backward gives the core back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace dptrain::distributed {

class SharedMemorySegment {
 public:
  // Collective over MPI_COMM_WORLD, whose `size` ranks must share this host: a segment holding
  // `bytes` per rank. Null, and `why_not` says why (the same decision on every rank), when one of
  // them could not create or map it (a small /dev/shm, say).
  static std::shared_ptr<SharedMemorySegment> create(std::size_t bytes, int rank, int size,
                                                     std::string* why_not);
  ~SharedMemorySegment();
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  void* mine() const { return region(rank_); }  // this rank's `bytes` (zeroed), 64-byte aligned
  std::size_t bytes() const { return bytes_; }
  bool contains(const void* data, std::size_t bytes) const;

  // In place over `count` elements at `data` (inside mine(), at the same offset on every rank): the
  // sum, or average, over the ranks, the same bits on every rank. Floats are added in rank order
  // (for two ranks a + b, as MPI_Allreduce); halves sum in half precision, one rounding per addend.
  // With `finite` (floats only), also whether every element of the result is finite: each rank tests
  // its chunk while the sums are in registers, and reads the peers' answers from their slots.
  void allreduce(void* data, std::size_t count, DataType type, ReduceOp op, const std::string& what,
                 bool* finite = nullptr);
  // `data` is size() chunks of `chunk` elements; chunk rank() becomes that chunk's sum (or average)
  // here, and no other chunk of any rank changes (Communicator::start_reduce_scatter leaves them
  // undefined).
  void reduce_scatter(void* data, std::size_t chunk, DataType type, ReduceOp op, const std::string& what);
  // `data` is size() chunks of `chunk` elements of any type; every rank's chunk q becomes rank q's, each
  // rank copying the peers' chunks straight from their buffers into its own (one copy each; MPI's
  // shared-memory transport makes two).
  void allgather(void* data, std::size_t chunk, DataType type, const std::string& what);
  // Collectives this segment has run (tests check that a buffer took this path). Counted on the
  // communication thread, read from any.
  uint64_t collectives() const { return collectives_.load(std::memory_order_relaxed); }

  // Whether the shared-memory path reduces `type` with `op`; others go through MPI.
  static bool supports(DataType type, ReduceOp op);

 private:
  SharedMemorySegment(char* base, std::size_t mapped, std::size_t stride, std::size_t bytes, int rank,
                      int size);
  char* region(int rank) const { return base_ + header_ + static_cast<std::size_t>(rank) * stride_; }
  // Every rank's buffer at `offset` bytes into its region, as T*, in rank order.
  template <typename T>
  std::vector<T*> buffers_at(std::size_t offset) const {
    std::vector<T*> out;
    for (int q = 0; q < size_; ++q) out.push_back(reinterpret_cast<T*>(region(q) + offset));
    return out;
  }
  // Where `count` elements of `type` at `data` sit in this rank's region (bytes); throws, naming
  // `collective`, unless they lie inside it and this path reduces `type` with `op`.
  std::size_t offset_of(const void* data, std::size_t count, DataType type, ReduceOp op,
                        const char* collective) const;
  // The element range [begin, end) of this rank's buffers that `rank` reduces, for every rank;
  // whether a result is Inf or NaN (floats; false for halves, which are not tested).
  bool reduce_range(std::size_t offset, std::size_t begin, std::size_t end, DataType type, ReduceOp op,
                    bool write_everywhere) const;
  // Publishes this collective, waits for every rank, checks they agree; the sequence number.
  uint32_t arrive(std::size_t offset, std::size_t count, DataType type, ReduceOp op, int kind,
                  const std::string& what);
  void depart(uint32_t sequence);

  char* base_;
  std::size_t mapped_, header_, stride_, bytes_;
  int rank_, size_;
  uint32_t sequence_ = 0;
  std::atomic<uint64_t> collectives_{0};
};

}  // namespace dptrain::distributed
