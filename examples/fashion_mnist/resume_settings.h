// What shapes a fashion_mnist run, as the settings its checkpoints record
// (train/run_settings.h), and how a resume takes the saved values of the
// options its command line leaves out.
//
// Fixed (a resume must match them; the world size is added by the library):
// model, sync_bn, batch_size (per rank), train_samples, test_samples (the
// best checkpoint is the one with the best test accuracy), optimizer (with
// momentum and weight decay), zero, lr_schedule (with every setting of the
// schedule, its length in steps included), data (the --data directory as
// given), data_digest (of the training and test tensors loaded from it:
// other files under the same directory are other data), seed.
// Changeable: lr, epochs, clip_grad_norm, log_every, checkpoint_every, threads
// (keep_last is the checkpoint directory's).
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/train/run_settings.h"
#include "options.h"

namespace fashion_mnist {

lockstep::train::RunSettings run_settings(const Options& o, int64_t train_samples,
                                          int64_t test_samples, const std::string& data_digest,
                                          const lockstep::optim::LRScheduler* scheduler);

// For each option not in o.given, the value `saved` records (a resumed run
// goes on as it was unless told otherwise; examples/common/saved_settings.h).
void take_saved_settings(Options& o, const lockstep::train::RunSettings& saved);

// Where a resume's --epochs, which may change, changes the length of a
// schedule that spans the run (cosine, multistep, warmup-cosine, onecycle),
// or its --lr the peak rate of onecycle: a sentence for each, saying so and
// what to do, for the refusal of the changed lr_schedule; otherwise empty.
std::string schedule_change_notes(const lockstep::train::RunSettings& saved,
                                  const lockstep::train::RunSettings& now);

}  // namespace fashion_mnist
