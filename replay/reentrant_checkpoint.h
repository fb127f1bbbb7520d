// hpac/replay/reentrant_checkpoint.h
//
// The reentrant full checkpoint behind CheckpointOptions::use_reentrant (see
// replay/checkpoint.h for the contract): an autograd Function whose forward
// runs fn under no-grad and whose backward re-runs fn in a recompute region and
// differentiates it with respect to the inputs and options.parameters.
// Internal to replay/: callers use hpac::checkpoint().
#pragma once

#include "replay/checkpoint.h"

namespace hpac {

// Throws c10::Error if options.policy is set (this path recomputes everything).
std::vector<at::Tensor> reentrantCheckpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                            const CheckpointOptions& options);

}  // namespace hpac
