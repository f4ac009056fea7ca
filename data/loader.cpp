// BatchLoader: a ring of prefetch + 1 batch slots; taking batch k hands the slot of batch k - 1 to
// batch k + prefetch. Each batch is cut into one chunk per worker, and every sample lands at its own
// place in the slot, so the bytes of a batch do not depend on which thread read what.
#include "data/loader.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace dptrain::data {
namespace {

// Replacements tried for one bad sample before the run stops: a data set this broken needs fixing.
constexpr int kMaxReplacements = 16;

}  // namespace

int default_workers(ReadCost cost, int cpus_of_this_rank, bool feeds_gpu) {
  switch (cost) {
    case ReadCost::kMemory:
      return feeds_gpu ? 1 : 0;
    case ReadCost::kFile:
      return 1;
    case ReadCost::kDecode:
      break;
  }
  // Workers beyond the rank's CPUs would take turns with its compute threads, which spin at barriers.
  return std::clamp(cpus_of_this_rank, 1, 4);
}

BatchLoader::BatchLoader(const Dataset& dataset, LoaderOptions options)
    : dataset_(dataset), options_(std::move(options)), normalise_(dataset.is_image()) {
  const Shape& shape = dataset.sample_shape();
  const std::size_t channels = shape.size() == 3 ? static_cast<std::size_t>(shape[0]) : 1;
  for (const std::vector<float>* values : {&options_.mean, &options_.std})
    DPTRAIN_CHECK(values->size() == 1 || values->size() == channels,
                  "config keys data.mean and data.std take one value, or one per channel (", channels,
                  " here); got ", values->size());
  for (const float s : options_.std) DPTRAIN_CHECK(s > 0.0f, "config key data.std must be positive, got ", s);
  DPTRAIN_CHECK(options_.workers >= 0 && options_.prefetch >= 1, "BatchLoader: workers ", options_.workers,
                " and prefetch ", options_.prefetch, " need workers >= 0 and prefetch >= 1");
  if (options_.augmentation.any())
    DPTRAIN_CHECK(shape.size() == 3, "config keys data.augment.* need [C, H, W] samples, these are ",
                  shape_str(shape));
  const SlotMemory& memory = options_.slot_memory;
  DPTRAIN_CHECK(static_cast<bool>(memory.allocate) == static_cast<bool>(memory.release),
                "BatchLoader: SlotMemory needs both allocate and release, or neither");
  slots_.resize(options_.workers > 0 ? static_cast<std::size_t>(options_.prefetch) + 1 : 1);
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void BatchLoader::start(int64_t epoch, std::vector<std::span<const int64_t>> batches) {
  wait_for_readers();
  std::unique_lock lock(mutex_);
  queue_.clear();
  // Chunks a worker already holds still write into their slots: wait for them before reusing any.
  chunk_done_.wait(lock, [&] { return active_chunks_ == 0; });
  for (Slot& slot : slots_) {
    slot.batch = -1;
    slot.pending = 0;
    slot.error = nullptr;
  }
  epoch_ = epoch;
  batches_ = std::move(batches);
  next_take_ = 0;
  if (threads_.empty()) return;
  const int64_t ahead =
      std::min<int64_t>(static_cast<int64_t>(slots_.size()), static_cast<int64_t>(batches_.size()));
  for (int64_t batch = 0; batch < ahead; ++batch) enqueue(batch);
  work_ready_.notify_all();
}

BatchLoader::Slot& BatchLoader::prepare(int64_t batch) {
  Slot& slot = slots_[static_cast<std::size_t>(batch) % slots_.size()];
  const int64_t samples = static_cast<int64_t>(batches_[static_cast<std::size_t>(batch)].size());
  slot.batch = batch;
  slot.error = nullptr;
  const std::size_t inputs = static_cast<std::size_t>(samples * dataset_.sample_numel());
  if (inputs > slot.inputs_capacity) {
    slot.inputs.reset();
    slot.inputs_capacity = 0;
    const SlotMemory& memory = options_.slot_memory;
    slot.inputs =
        memory.allocate
            ? std::unique_ptr<float[], ReleaseInputs>(
                  static_cast<float*>(memory.allocate(inputs * sizeof(float))), ReleaseInputs{&memory})
            : std::unique_ptr<float[], ReleaseInputs>(new float[inputs], ReleaseInputs{});
    slot.inputs_capacity = inputs;
  }
  slot.labels.resize(static_cast<std::size_t>(samples));
  slot.targets.resize(static_cast<std::size_t>(samples * dataset_.target_width()));
  return slot;
}

void BatchLoader::enqueue(int64_t batch) {
  Slot& slot = prepare(batch);
  const std::size_t index = static_cast<std::size_t>(batch) % slots_.size();
  const int64_t samples = static_cast<int64_t>(slot.labels.size());
  const int64_t workers = std::max<int64_t>(1, static_cast<int64_t>(threads_.size()));
  const int64_t per_chunk = std::max<int64_t>(1, (samples + workers - 1) / workers);
  slot.pending = 0;
  for (int64_t begin = 0; begin < samples; begin += per_chunk) {
    queue_.push_back({index, begin, std::min(samples, begin + per_chunk)});
    ++slot.pending;
  }
}

BatchView BatchLoader::take() {
  DPTRAIN_CHECK(next_take_ < static_cast<int64_t>(batches_.size()), "BatchLoader: batch ", next_take_,
                " taken, but start() gave ", batches_.size());
  const int64_t batch = next_take_++;
  // The slot of the batch before is filled again below (the next batch ahead, or this one inline).
  if (batch >= 1) wait_for_readers();
  const std::span<const int64_t> indices = batches_[static_cast<std::size_t>(batch)];
  Slot* slot = &slots_[static_cast<std::size_t>(batch) % slots_.size()];
  if (threads_.empty()) {
    read_chunk(prepare(batch), indices, 0, static_cast<int64_t>(indices.size()), scratch_);
  } else {
    std::unique_lock lock(mutex_);
    // The caller is done with the batch before this one: its slot starts on the next batch ahead.
    const int64_t ahead = batch - 1 + static_cast<int64_t>(slots_.size());
    if (batch >= 1 && ahead < static_cast<int64_t>(batches_.size())) {
      enqueue(ahead);
      work_ready_.notify_all();
    }
    chunk_done_.wait(lock, [&] { return slot->pending == 0; });
    if (slot->error) std::rethrow_exception(slot->error);
  }
  const int64_t samples = static_cast<int64_t>(indices.size());
  return {.samples = samples,
          .inputs = {slot->inputs.get(), static_cast<std::size_t>(samples * dataset_.sample_numel())},
          .labels = slot->labels,
          .targets = slot->targets};
}

void BatchLoader::ReleaseInputs::operator()(float* inputs) const {
  if (memory == nullptr) {
    delete[] inputs;
  } else {
    memory->release(inputs);
  }
}

void BatchLoader::wait_for_readers() const {
  if (options_.slot_memory.wait_for_readers) options_.slot_memory.wait_for_readers();
}

BadSampleCount BatchLoader::take_bad_samples() {
  std::lock_guard lock(bad_mutex_);
  return std::exchange(bad_, {});
}

void BatchLoader::work() {
  std::vector<float> scratch;
  for (;;) {
    Chunk chunk{};
    std::span<const int64_t> indices;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      chunk = queue_.front();
      queue_.pop_front();
      ++active_chunks_;
      indices = batches_[static_cast<std::size_t>(slots_[chunk.slot].batch)];
    }
    std::exception_ptr error;
    try {
      read_chunk(slots_[chunk.slot], indices, chunk.begin, chunk.end, scratch);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      --active_chunks_;
      Slot& slot = slots_[chunk.slot];
      if (error && !slot.error) slot.error = error;
      --slot.pending;
    }
    chunk_done_.notify_all();
  }
}

void BatchLoader::read_chunk(Slot& slot, std::span<const int64_t> indices, int64_t begin, int64_t end,
                             std::vector<float>& scratch) {
  const int64_t numel = dataset_.sample_numel(), width = dataset_.target_width();
  scratch.resize(static_cast<std::size_t>(numel));
  for (int64_t i = begin; i < end; ++i)
    read_sample(indices[static_cast<std::size_t>(i)], slot.inputs.get() + i * numel, slot.labels.data() + i,
                width > 0 ? slot.targets.data() + i * width : nullptr, scratch);
}

void BatchLoader::read_sample(int64_t index, float* input, int32_t* label, float* target,
                              std::vector<float>& scratch) {
  DPTRAIN_CHECK(index >= 0 && index < dataset_.size(), "BatchLoader: sample index ", index, " outside [0, ",
                dataset_.size(), ")");
  const bool augment = options_.augmentation.any();
  float* read_into = augment ? scratch.data() : input;
  int64_t source = index;
  for (int attempt = 1;; ++attempt) {
    try {
      *label = dataset_.read(source, read_into, target);
      break;
    } catch (const BadSample& bad) {
      if (!options_.skip_bad_samples) throw;
      {
        std::lock_guard lock(bad_mutex_);
        if (bad_.samples++ == 0) bad_.first = bad.what();
      }
      DPTRAIN_CHECK(attempt < kMaxReplacements, "data.on_bad_sample \"skip\": ", kMaxReplacements,
                    " bad samples in a row from index ", index, ", the last: ", bad.what());
      source = (source + 1) % dataset_.size();
    }
  }
  if (augment)
    augment_sample(options_.augmentation, dataset_.sample_shape(),
                   augmentation_key(options_.seed, epoch_, source), scratch.data(), input);
  if (!normalise_) return;
  const std::size_t channels = std::max(options_.mean.size(), options_.std.size());
  const int64_t plane = dataset_.sample_numel() / static_cast<int64_t>(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    const float mean = options_.mean[options_.mean.size() == 1 ? 0 : c],
                std = options_.std[options_.std.size() == 1 ? 0 : c];
    float* x = input + static_cast<int64_t>(c) * plane;
    for (int64_t i = 0; i < plane; ++i) x[i] = (x[i] - mean) / std;
  }
}

}  // namespace dptrain::data
