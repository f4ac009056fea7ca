// Checkpoint files: one safetensors file per checkpoint holding the model weights under their
// PyTorch names, the optimizer state under "optimizer.", and the training position in __metadata__;
// durable writes (temp file, fsync, rename, fsync of the directory), validation, listing, pruning.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"

namespace dptrain::trainer {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kOptimizerPrefix = "optimizer.";

// Where training stands after an optimizer step: enough to continue exactly.
struct TrainingPosition {
  int64_t epochs_completed = 0;
  int64_t epoch_samples_done = 0;  // of epoch (epochs_completed + 1)'s permutation, all ranks together
  int64_t global_step = 0;
  int64_t samples_seen = 0;     // since the start of training, all ranks together
  int64_t optimizer_steps = 0;  // Adam's bias-correction count
};

struct CheckpointData {
  std::vector<NamedTensor> parameters;       // stored under their own names
  std::vector<NamedTensor> optimizer_state;  // stored under kOptimizerPrefix + name
  TrainingPosition position;
  // Descriptive entries (world size, batch, sampler, RNG, resolved config, ...), stored as given.
  std::map<std::string, std::string> metadata;
};

struct Checkpoint {
  std::string path;
  TrainingPosition position;
  safetensors::File file;  // every tensor and the metadata as stored

  const std::string& meta(const std::string& key) const;  // throws naming the file when absent
};

// "ckpt-00001234.safetensors": names sort by step.
std::string checkpoint_file_name(int64_t global_step);

// The file image: tensors, metadata with the position, the format version and the crc32 of the data.
std::vector<char> encode_checkpoint(const CheckpointData& data);

// Writes `bytes` to `path` so that a crash at any instant leaves either the old state or the whole
// new file: a temp file beside it, fsync, rename over `path`, fsync of the directory. `midway` (if
// set) runs when half the bytes are written: the fault-injection point of the interrupted-write test.
void write_file_durably(const std::string& path, const std::vector<char>& bytes,
                        const std::function<void()>& midway = {});

// Reads and validates a checkpoint: safetensors structure, format version, data checksum and the
// position entries. Every defect throws dptrain::Error naming the file and what is wrong.
Checkpoint read_checkpoint(const std::string& path);
// The same checks on a file already parsed from `path`.
Checkpoint validate_checkpoint(safetensors::File file, const std::string& path);

// Copies the checkpoint's tensors into `parameters` and (unless null) `optimizer_state`, after
// checking that names and shapes match exactly: a checkpoint of another model or optimizer throws,
// naming the tensor. Model-only loading (--evaluate, model.init_from) passes null. State named in
// `optional_state` may be missing from the file (its target is then left as it is) and is ignored
// in the file when not asked for.
void restore(const Checkpoint& checkpoint, const std::vector<NamedTensor>& parameters,
             const std::vector<NamedTensor>* optimizer_state,
             const std::vector<std::string>& optional_state = {});

// The step in a checkpoint's file name ("ckpt-00001234.safetensors"); nullopt for any other name.
std::optional<int64_t> checkpoint_step_of(const std::string& file_name);

// Checkpoint files in `dir`, newest (highest step) first; temp files of interrupted writes are not
// listed. A missing directory has none.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Deletes a checkpoint file; throws naming it when it cannot.
void remove_checkpoint(const std::string& path);

// Renames checkpoint `path` to "set-aside-<stamp>-<its name>" beside it, out of the checkpoints'
// names (list_checkpoints no longer sees it); <stamp> is the UTC time given, so that a second
// rollback never overwrites what a first set aside. Throws naming the file when it cannot. Returns
// the new path.
std::string set_checkpoint_aside(const std::string& path, const std::string& stamp);
// Checkpoints set aside in `dir` (set_checkpoint_aside).
std::vector<std::string> list_set_aside(const std::string& dir);
// fsync of a directory: renames and removals in it survive a crash of the machine.
void sync_directory(const std::string& dir);

// Deletes all but the newest `keep` checkpoints (keep 0: none deleted) and leftover temp files.
void prune_checkpoints(const std::string& dir, int64_t keep);

// The newest checkpoint in `dir` that reads, validates and passes `accept`. Each one rejected on
// the way is reported through `report(path, reason)`. None: std::nullopt.
std::optional<Checkpoint> newest_valid_checkpoint(
    const std::string& dir, const std::function<void(const Checkpoint&)>& accept,
    const std::function<void(const std::string&, const std::string&)>& report);

}  // namespace dptrain::trainer
