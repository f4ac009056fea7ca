// Progress reporting on rank 0: a live bar on a terminal, plain periodic lines in logs and batch jobs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dptrain::trainer {

// training.progress: "auto" picks kBar on a terminal and kLines otherwise (see resolve_progress_mode).
enum class ProgressMode { kAuto, kBar, kLines, kOff };

// kBar or kLines (kOff stays kOff) for this process. kAuto gives kLines when stdout is not a terminal,
// under a batch system (Slurm, PBS, LSF, Flux) and under an MPI launcher whose own stdout is not a
// terminal: mpirun hands its ranks a pseudo-terminal even when its output goes to a file.
ProgressMode resolve_progress_mode(ProgressMode configured);

// Where the run stands in time when a step is shown: seconds since the run started and since this
// epoch's first step, and the steps the run has left after this one (training.max_steps counted).
struct ProgressClock {
  double run_seconds = 0, epoch_seconds = 0;
  int64_t steps_left = 0;
};

// A duration as a clock shows it: "0:07", "12:34", "1:02:03".
std::string clock_text(double seconds);

// The steps a run has left after `done` of this epoch's `steps`, with `epochs_after` epochs of
// `steps_per_epoch` to come; training.max_steps (`max_steps` > 0), already `global_step` in, may
// stop it sooner.
int64_t run_steps_left(int64_t steps, int64_t done, int64_t epochs_after, int64_t steps_per_epoch,
                       int64_t max_steps, int64_t global_step);

class Progress {
 public:
  // `enabled`: this rank reports (rank 0); the others print nothing.
  Progress(bool enabled, ProgressMode mode, int64_t log_every_steps);
  void begin_epoch(int64_t epoch, int64_t epochs, int64_t steps);
  // Whether update() after `step` would show something: the bar's next frame is due (every 100 ms,
  // and at the epoch's last step) or a log line is. The trainer reads the metrics only then.
  bool due(int64_t step) const;
  // Running means over the epoch so far, of this rank's batches; accuracy < 0 means "not a
  // classifier" and is not shown; gradient_norm, the last step's before clipping, only where >= 0
  // (optimizer.max_grad_norm). Then the time since the run started, and the steps left at this
  // epoch's pace so far (evaluations not counted).
  void update(int64_t step, double loss, double accuracy, double samples_per_sec, double gradient_norm,
              const ProgressClock& clock);
  void end_epoch();
  // A line of its own (e.g. "checkpoint written"), below the bar rather than through it; printed in
  // every mode but on ranks that do not report.
  void note(const std::string& line);

 private:
  bool enabled_;
  ProgressMode mode_;  // kBar, kLines or kOff once resolved
  int64_t log_every_steps_;
  int64_t epoch_ = 0, epochs_ = 0, steps_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace dptrain::trainer
