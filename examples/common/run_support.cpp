#include "common/run_support.h"

#include <cmath>

#include "lockstep/distributed/launch_env.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/error.h"

namespace examples {

using namespace lockstep;

std::optional<train::TrainingRun> open_checkpoints(const CheckpointFlags& flags,
                                                   runtime::BestMode best,
                                                   collectives::ProcessGroup& group) {
  if (flags.dir.empty()) return std::nullopt;
  // Started again by lockstep-run --max-restarts: the run this job was
  // saving (LOCKSTEP_JOB_ID in its checkpoints) continues from its newest
  // good checkpoint. Until the job saved one, --resume and --restart decide
  // as they did for the first attempt: a directory of another run is still
  // refused, and never resumed in this run's place.
  const int restarts = distributed::read_restart_count();
  train::TrainingRun run = train::open_training_run(
      flags.dir, {.keep_last = flags.keep_last, .best = best},
      {.resume = flags.resume,
       .restart = flags.restart,
       .resume_hint = "add --resume",
       .restart_hint = "add --restart to move those files into a subdirectory (nothing is "
                       "deleted)",
       .job = distributed::read_job_id(),
       .keep_last_given = flags.keep_last_given},
      group);
  if (restarts > 0 && run.continues_job)
    print(group.rank(), "restart {} (LOCKSTEP_RESTART_COUNT): resuming the run in {}\n",
          restarts, flags.dir);
  else if (restarts > 0)
    print(group.rank(),
          "restart {} (LOCKSTEP_RESTART_COUNT): this job saved no checkpoint in {} yet: "
          "starting as the first attempt did\n",
          restarts, flags.dir);
  for (const auto& note : run.notes) print(group.rank(), "{}\n", note);
  return run;
}

std::vector<train::SettingChange> record_settings(train::TrainingRun& run, train::RunSettings now,
                                                  int rank) {
  const size_t noted = run.notes.size();
  auto changes = train::record_run_settings(run, std::move(now));
  for (const auto& c : changes)
    print(rank, "{} {} from the command line replaces the saved {}\n", c.name, c.now, c.saved);
  for (size_t i = noted; i < run.notes.size(); ++i) print(rank, "note: {}\n", run.notes[i]);
  return changes;
}

double clip_gradients(optim::Optimizer& opt, double max_norm) {
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizer*>(&opt))
    return zero->clip_grad_norm(max_norm);
  std::vector<runtime::Tensor> params;
  for (const auto& g : opt.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  return optim::clip_grad_norm(params, max_norm);
}

void check_loss_finite(double loss, int64_t step, int rank) {
  LOCKSTEP_CHECK(std::isfinite(loss),
                 "rank {}: the loss of step {} is {}: training has diverged; start again with a "
                 "lower --lr or with --clip-grad-norm (no checkpoint is written after a loss that "
                 "is not finite, so the newest one holds finite parameters; if a resume from it "
                 "diverges again at once, move it out of the directory to resume from the one "
                 "before)",
                 rank, step, loss);
}

uint64_t parameters_digest(const nn::Module& model) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : model.state_dict()) {
    const runtime::Tensor c = t.to(runtime::Device::cpu()).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.raw_data());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace examples
