// Start-up checks that every rank runs the same config, and starts from the same data and
// position (docs/architecture.md, "Data parallel"):
// ranks that disagree would issue different collectives and hang, or silently average gradients
// of different models.
//
// Contract: check_config_agreement(comm, resolved) is collective. Rank 0's resolved config (the
// text resolved_toml() writes, which holds every effective value) is broadcast; each rank compares
// it with its own, and when any differs, every rank throws ConfigDisagreement with the same
// message: the lowest differing rank, the first differing key ("run.seed", an array-of-tables
// entry as "model.layers[0].out") and both values. A difference outside any key (a reordered
// table) names the line instead. Effective values only: comments and blank lines (the header
// naming the file the config came from) never count, so one config reached by two paths, or a
// byte-identical copy, agrees.
#pragma once

#include <string>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

// Thrown on every rank at once (so each can exit normally, unlike an error on one rank alone).
class ConfigDisagreement : public sdk::UserError {
 public:
  using sdk::UserError::UserError;
};

void check_config_agreement(sdk::Communicator& comm, const std::string& resolved);

// Collective, once the data is loaded and any checkpoint resumed: `start` says where this rank
// starts (its data's row counts and a checksum of each split, the resumed step and sampler
// position). Rank 0's is broadcast, and when any rank's differs every rank throws
// ConfigDisagreement naming the lowest such rank and both texts: ranks that read different
// checkpoints (a stale copy off shared storage) or different data files would otherwise issue
// different collectives and wait out the timeout, or train on different data.
void check_start_agreement(sdk::Communicator& comm, const std::string& start);

// The first difference between two resolved configs, as "key: `a` against `b`"; "" when their
// effective values are equal.
std::string first_config_difference(const std::string& a, const std::string& b);

}  // namespace mixtrain::core
