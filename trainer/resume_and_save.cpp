// Checkpoints of a run: resuming (rank 0 reads, start() hands out), model.init_from, writing them,
// and the note a signal-stopped run leaves.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/safetensors.h"
#include "layers/build.h"
#include "trainer/trainer.h"

namespace dptrain::trainer {

// Rank 0: loads `which` ("auto" or a path) into the parameters, optimizer state and position_.
void Trainer::resume(const std::string& which) {
  const std::optional<Checkpoint> found = checkpoints_.find(which, [&](const Checkpoint& c) {
    DPTRAIN_CHECK(c.position.epoch_samples_done < train_set_->size(), c.path, ": its position (sample ",
                  c.position.epoch_samples_done, " of epoch ", c.position.epochs_completed + 1,
                  ") lies beyond the ", train_set_->size(),
                  " training samples configured now; resume with the data.dir and data.max_train_samples "
                  "it was written with");
    // Outside deterministic mode (whose micro-batches may leave a rank none), every rank needs a sample
    // in each step: a resume on more ranks may find fewer samples left in the epoch than ranks.
    const int64_t left = train_set_->size() - c.position.epoch_samples_done;
    DPTRAIN_CHECK(deterministic_ || config_.data.drop_last || c.position.epoch_samples_done == 0 ||
                      left >= world_.size(),
                  c.path, ": its position leaves ", left, " sample(s) of epoch ",
                  c.position.epochs_completed + 1, ", fewer than the ", world_.size(),
                  " ranks of this run, each of which needs one; resume on at most ", left,
                  " rank(s) to finish the epoch, or from a checkpoint written at an epoch's end");
    check_deterministic_resume(c);
    check_classes(c);
    check_sampling(c);
    // A sharded optimizer's state is read whole here and handed out in start().
    if (optimizer_->sharded()) whole_optimizer_state_ = optimizer_->whole_state_buffers();
    const std::vector<NamedTensor> state =
        optimizer_->sharded() ? optimizer_->named_state(whole_optimizer_state_) : optimizer_->state();
    // A gradient sync's state is optional either way: the strategy may change at a resume.
    restore(c, model_state(), &state, distributed::gradient_sync_state_names());
    gradient_sync_->resume_state(
        [&](const std::string& name) { return c.file.find(std::string(kOptimizerPrefix) + name); }, c.path);
  });
  if (!found) {
    std::printf("dptrain: --resume auto: no checkpoint in %s; starting fresh\n",
                config_.checkpoint.dir.c_str());
    return;
  }
  const Checkpoint& c = *found;
  position_ = c.position;
  optimizer_->set_steps_taken(c.position.optimizer_steps);
  resumed_ = true;
  const std::string written = c.meta("world_size") + " rank(s) x batch " + c.meta("batch_size");
  const std::string now =
      std::to_string(world_.size()) + " rank(s) x batch " + std::to_string(config_.data.batch_size);
  std::printf("dptrain: resuming from %s: step %lld, epoch %lld at sample %lld of %lld (written on %s%s)\n",
              c.path.c_str(), static_cast<long long>(c.position.global_step),
              static_cast<long long>(c.position.epochs_completed + 1),
              static_cast<long long>(c.position.epoch_samples_done),
              static_cast<long long>(train_set_->size()), written.c_str(),
              written == now ? "" : (", now " + now + ": same samples, lr rescaled").c_str());
}

// model.init_from: weights only, from a checkpoint (validated) or a plain safetensors file.
void Trainer::init_from(const std::string& path) {
  safetensors::File file = safetensors::load(path);
  if (file.metadata.contains("dptrain_checkpoint_version")) {
    restore(validate_checkpoint(std::move(file), path), model_state(), nullptr);
  } else {
    layers::load_parameters(*model_, file, path);
  }
}

// Every rank calls it: the gradient sync's state may need a collective.
void Trainer::save_checkpoint() {
  // A checkpoint never holds steps whose updates a deferred gradient check skipped.
  gradient_sync_->check_deferred();
  std::vector<NamedTensor> training_state = optimizer_state_whole();
  for (NamedTensor& t : gradient_sync_->checkpoint_state()) training_state.push_back(std::move(t));
  const Json sampler = {{"seed", config_.seed},
                        {"shuffle", config_.data.shuffle},
                        {"drop_last", config_.data.drop_last},
                        {"dataset_size", train_set_->size()},
                        {"epoch", position_.epochs_completed},
                        {"first_sample", position_.epoch_samples_done}};
  const Json rng = {
      {"seed", config_.seed},
      {"dropout", deterministic_ ? "reseeded each micro-batch from (seed, global_step, micro-batch)"
                                 : "reseeded each pass from (seed, rank, global_step, pass)"},
      {"initialisation", "from (seed, parameter name)"}};
  const std::string note =
      checkpoints_.save({.parameters = model_state(),
                         .optimizer_state = training_state,
                         .position = position_,
                         .metadata = {{"producer", "dptrain"},
                                      {"world_size", std::to_string(world_.size())},
                                      {"batch_size", std::to_string(config_.data.batch_size)},
                                      {"backward_passes_per_step",
                                       std::to_string(config_.distributed.backward_passes_per_step)},
                                      {"deterministic", deterministic_metadata().dump()},
                                      {"optimizer", config_.optimizer.type},
                                      {"lr", std::to_string(lr_)},
                                      {"sampler", sampler.dump()},
                                      {"classes", Json(train_set_->class_names()).dump()},
                                      {"rng", rng.dump()},
                                      {"config", to_json(config_).dump()}}});
  if (!note.empty()) progress_.note(note);
}

std::vector<NamedTensor> Trainer::optimizer_state_whole() {
  if (!optimizer_->sharded()) return optimizer_->state();
  std::vector<Tensor> whole = optimizer_->whole_state_buffers();
  for (const Tensor& buffer : whole)
    gradient_sync_->optimizer_shard()->allgather(*state_comm_, buffer.data_ptr(),
                                                 "all-gather of the optimizer state for a checkpoint");
  return optimizer_->named_state(whole);
}

// Rank 0 records the stop beside the checkpoints (stop_note_path): under mpirun, a SIGTERM to
// mpirun itself makes mpirun exit 1 whatever the ranks return, and a wrapper can still tell.
void Trainer::write_stop_note(const std::string& why) const {
  if (!world_.is_root()) return;
  const std::string checkpoint = config_.checkpoint.dir + "/" + checkpoint_file_name(position_.global_step);
  // With checkpoint.on_error "warn", the stop's checkpoint may have failed (the warning above says
  // why): --resume auto then continues from the newest one that was written.
  const bool written = !checkpoints_.last_write_failed() && std::filesystem::exists(checkpoint);
  const std::vector<std::string> on_disk = list_checkpoints(config_.checkpoint.dir);
  const std::string resumes_from = written ? checkpoint : on_disk.empty() ? "" : on_disk.front();
  const Json note = {{"stopped_by", why},
                     {"global_step", position_.global_step},
                     {"checkpoint", resumes_from.empty() ? Json() : Json(resumes_from)},
                     {"checkpoint_written", written},
                     {"exit_status", kExitStoppedWithCheckpoint},
                     {"resume", "run the same command with --resume auto"}};
  const std::string text = note.dump() + "\n";
  try {
    write_file_durably(stop_note_path(config_), std::vector<char>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dptrain: warning: %s\n", e.what());
  }
  std::fflush(stdout);
  const std::string what_was_written =
      written ? "checkpoint " + checkpoint + " written"
              : "NO checkpoint of this step is in " + config_.checkpoint.dir + "; " +
                    (resumes_from.empty() ? "no checkpoint to resume from"
                                          : "--resume auto continues from " + resumes_from);
  // Open MPI's mpirun turns a SIGTERM or SIGINT sent to it into SIGTERM for the ranks, and exits 1.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
  std::fprintf(stderr,
               "dptrain: stopped by %s after step %lld, %s; exiting with status %d%s "
               "(resume with --resume auto)\n",
               why.c_str(), static_cast<long long>(position_.global_step), what_was_written.c_str(),
               kExitStoppedWithCheckpoint,
               under_mpirun && why.rfind("SIGUSR1", 0) != 0
                   ? " (mpirun itself exits 1 when the signal was sent to it; stopped.json records the stop)"
                   : "");
}

// Labels are positions in the class list: another list would silently relabel the data.
void Trainer::check_classes(const Checkpoint& c) const {
  const auto entry = c.file.metadata.find("classes");
  if (entry == c.file.metadata.end()) return;  // written before class lists were recorded
  const Json then = Json::parse(entry->second, nullptr, false);
  const Json now = train_set_->class_names();
  if (then == now) return;
  std::size_t first_difference = 0;
  while (then.is_array() && first_difference < std::min(then.size(), now.size()) &&
         then[first_difference] == now[first_difference])
    ++first_difference;
  const auto name_at = [&](const Json& names) {
    return names.is_array() && first_difference < names.size() ? names[first_difference].dump() : "none";
  };
  DPTRAIN_FAIL(c.path, ": written with the classes of another data set: ", then.is_array() ? then.size() : 0,
               " classes then, ", now.size(), " in data.dir ", config_.data.dir, " now; class ",
               first_difference, " was ", name_at(then), ", is ", name_at(now),
               ". Labels would change meaning: resume with the same class folders, or start afresh "
               "(model.init_from keeps the weights)");
}

// Mid-epoch, the rest of the epoch is the rest of the permutation that the checkpoint's run drew:
// another seed, shuffle or training-set size draws another, and the epoch would then visit some
// samples twice and others never.
void Trainer::check_sampling(const Checkpoint& c) const {
  if (c.position.epoch_samples_done == 0) return;
  const auto entry = c.file.metadata.find("sampler");
  if (entry == c.file.metadata.end()) return;
  const Json then = Json::parse(entry->second, nullptr, false);
  if (!then.is_object()) return;
  std::string changed;
  const auto compare = [&](const char* recorded, const Json& now, const std::string& key) {
    const Json was = then.value(recorded, Json());
    if (was.is_null() || was == now) return;
    changed += (changed.empty() ? "" : ", ") + key + " " + was.dump() + " then, " + now.dump() + " now";
  };
  compare("shuffle", config_.data.shuffle, "data.shuffle");
  if (config_.data.shuffle) compare("seed", config_.seed, "seed");
  compare("dataset_size", train_set_->size(), "training samples (data.dir, data.max_train_samples)");
  DPTRAIN_CHECK(changed.empty(), c.path, ": written mid-epoch (sample ", c.position.epoch_samples_done,
                " of epoch ", c.position.epochs_completed + 1, ") by a run that sampled otherwise: ", changed,
                ". The rest of the epoch would visit other samples, some twice and some never: resume with "
                "the values of then, or from a checkpoint written at an epoch's end");
}

Json Trainer::deterministic_metadata() const {
  if (!deterministic_) return false;
  return {{"micro_batch", config_.distributed.deterministic_micro_batch}, {"global_batch", global_batch()}};
}

// Bit-for-bit continuation needs the same micro-batches: the same global batch and micro-batch size.
void Trainer::check_deterministic_resume(const Checkpoint& c) const {
  if (!deterministic_) return;
  const auto entry = c.file.metadata.find("deterministic");
  const Json then = entry == c.file.metadata.end() ? Json(false) : Json::parse(entry->second, nullptr, false);
  const auto number = [&](const char* key) -> int64_t {
    return then.is_object() && then.contains(key) && then[key].is_number_integer() ? then[key].get<int64_t>()
                                                                                   : -1;
  };
  if (!then.is_object()) {
    std::printf(
        "dptrain: %s was not written in distributed.deterministic mode; training continues "
        "deterministically from it\n",
        c.path.c_str());
    return;
  }
  const int64_t batch = number("global_batch"), micro = number("micro_batch");
  const int64_t micro_now = config_.distributed.deterministic_micro_batch;
  if (batch == global_batch() && micro == micro_now) return;
  DPTRAIN_CHECK(batch > 0 && micro > 0, c.path, ": its distributed.deterministic record ", then.dump(),
                " lacks the global batch or micro-batch it was written with, so a bit-for-bit continuation "
                "cannot be checked; set distributed.deterministic to false to resume from it");
  const int64_t per_rank = world_.size() * config_.distributed.backward_passes_per_step;
  const std::string fix =
      batch % per_rank == 0
          ? "set data.batch_size = " + std::to_string(batch / per_rank)
          : "use ranks x data.batch_size x backward_passes_per_step = " + std::to_string(batch);
  DPTRAIN_FAIL(c.path, ": written in distributed.deterministic mode with a global batch of ", batch,
               " in micro-batches of ", micro, "; this run has ", global_batch(), " (", world_.size(),
               " rank(s) x data.batch_size ", config_.data.batch_size, " x ",
               config_.distributed.backward_passes_per_step, " backward pass(es)) in micro-batches of ",
               micro_now, ". To continue bit for bit, ", fix,
               " and distributed.deterministic_micro_batch = ", micro,
               "; or set distributed.deterministic to false");
}

}  // namespace dptrain::trainer
