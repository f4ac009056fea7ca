// BatchLoader: reads, augments and normalises a rank's batches on worker threads, a few batches ahead
// of the step that needs them, so that memory is bounded by the batches in flight whatever the data
// set's size, and decoding overlaps compute (PyTorch's DataLoader workers, in threads).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "data/augment.h"
#include "data/dataset.h"

namespace dptrain::data {

// Where the batch slots' inputs live. On a GPU: page-locked memory that the device copies from in
// place while the step before still runs (Backend::allocate_host), so the batch is written once, by
// the worker that reads it. Functions left empty: plain memory, read by the time take() returns.
struct SlotMemory {
  std::function<void*(std::size_t bytes)> allocate;  // 64-byte aligned
  std::function<void(void*)> release;
  // Returns once nothing reads a batch taken earlier: called before its slot is filled again.
  std::function<void()> wait_for_readers;
};

struct LoaderOptions {
  int workers = 0;   // threads; 0 reads on the calling thread when take() asks
  int prefetch = 2;  // batches read ahead of the one the step holds (with workers)
  // Images only: x -> (x - mean[c]) / std[c] per channel c (one value: every channel).
  std::vector<float> mean{0.0f}, std{1.0f};
  Augmentation augmentation{};  // the training split's; evaluation passes none
  uint64_t seed = 0;
  // A BadSample is replaced by the next good sample (index + 1, + 2, ... wrapping) and counted,
  // instead of stopping the run.
  bool skip_bad_samples = false;
  SlotMemory slot_memory{};
};

// One batch on the host, valid until the next take() or start().
struct BatchView {
  int64_t samples = 0;
  std::span<const float> inputs;    // samples x sample_numel, normalised
  std::span<const int32_t> labels;  // samples
  std::span<const float> targets;   // samples x target_width; empty for classes
};

struct BadSampleCount {
  int64_t samples = 0;
  std::string first;  // the first one's message
};

class BatchLoader {
 public:
  BatchLoader(const Dataset& dataset, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The batches to read, in the order take() returns them; the spans must stay valid until the next
  // start(). `epoch` keys the augmentation. What was read ahead for an earlier start is dropped.
  void start(int64_t epoch, std::vector<std::span<const int64_t>> batches);
  // The next batch of the list: waits for it if the workers have not finished it. A worker's error
  // is rethrown here, on the caller's thread.
  BatchView take();
  // Bad samples replaced since the last call (skip_bad_samples).
  BadSampleCount take_bad_samples();

  int workers() const { return static_cast<int>(threads_.size()); }
  const Dataset& dataset() const { return dataset_; }

 private:
  struct ReleaseInputs {
    const SlotMemory* memory;  // null: new[] (value-initialised by unique_ptr)
    void operator()(float* inputs) const;
  };
  struct Slot {
    int64_t batch = -1;   // position in the list, -1: free
    int64_t pending = 0;  // chunks not yet read
    std::exception_ptr error;
    std::unique_ptr<float[], ReleaseInputs> inputs;  // capacity floats, of which the batch's samples'
    std::size_t inputs_capacity = 0;
    std::vector<float> targets;
    std::vector<int32_t> labels;
  };
  struct Chunk {
    std::size_t slot;
    int64_t begin, end;  // samples of the slot's batch
  };

  Slot& prepare(int64_t batch);  // the slot batch % slots, sized for it
  void enqueue(int64_t batch);   // prepare, then its chunks to the workers; needs mutex_ held
  void read_chunk(Slot& slot, std::span<const int64_t> indices, int64_t begin, int64_t end,
                  std::vector<float>& scratch);
  void read_sample(int64_t index, float* input, int32_t* label, float* target, std::vector<float>& scratch);
  void work();
  void wait_for_readers() const;

  const Dataset& dataset_;
  const LoaderOptions options_;
  const bool normalise_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable work_ready_, chunk_done_;
  std::deque<Chunk> queue_;
  int64_t active_chunks_ = 0;  // being read by a worker
  bool stopping_ = false;
  std::vector<Slot> slots_;
  int64_t epoch_ = 0;
  std::vector<std::span<const int64_t>> batches_;
  int64_t next_take_ = 0;
  std::vector<float> scratch_;  // the calling thread's, without workers
  std::mutex bad_mutex_;
  BadSampleCount bad_;
};

// The number of workers "auto" picks: none for data in memory, one for mapped files, and for images
// to decode one per CPU of the rank's share (`cpus_of_this_rank`: the host's cores shared among its
// ranks, within the process's affinity mask), at most 4. A rank that feeds a GPU gets at least
// one: its thread's time goes to queueing the step's kernels, and gathering a batch there left the
// GPU waiting (the MNIST CNN at batch 1024 spent 1.4 ms of a 2.9 ms step in `data`).
int default_workers(ReadCost cost, int cpus_of_this_rank, bool feeds_gpu = false);

}  // namespace dptrain::data
