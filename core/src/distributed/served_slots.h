// ServedSlots: a sharded optimizer's whole slots, gathered as rank 0's checkpoint format reads
// them, so that rank 0 holds one bucket of one slot on the host at a time instead of the whole
// state (docs/architecture.md, "Data parallel"). Internal to the core.
//
// Contract
// - Every rank constructs one for a save, at the same point (collective: the slot table). Rank 0
//   stages the slots (staged(): named, shaped and ordered as gather_optimizer_state returns them,
//   fp32), hands them to the format and calls end() when the write is over, also when it failed;
//   the other ranks call serve() instead, which returns when rank 0 ends.
// - A read of a slot on rank 0 tells the other ranks which (a host all-reduce), and every rank
//   then all-gathers that slot's bucket, unless it is the bucket gathered last: a format that
//   reads in order (the native one, twice: checksums, then bytes) gathers each bucket of each slot
//   once a pass; one that reads no slot (safetensors) gathers nothing. The bytes a read returns
//   are held (StagedTensor::held) and valid until the next read.
// - end() is idempotent. It communicates, so it may throw the communicator's error: a
//   destructor's guard catches (train/trainer_state.h, SaveReadsEnd). A rank other than 0 that
//   calls end() or staged(), or rank 0 that calls serve(), is a logic_error.
// - Errors: sdk::CommunicationError from the communicator; what a gather throws on rank 0 comes
//   out of the read, and the format then leaves no file.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/staged_state.h"
#include "distributed/data_parallel.h"
#include "mixtrain/sdk/optimizer.h"

namespace mixtrain::core {

class ServedSlots : public std::enable_shared_from_this<ServedSlots> {
 public:
  ServedSlots(DataParallel& dp, const sdk::Optimizer& optimizer);

  std::vector<StagedTensor> staged();
  void end();
  void serve();

 private:
  // One of a host all-reduce (max) in which rank 0 says which slot tensor it reads next (its
  // index), or kEnd, and the others say kListening.
  double exchange(double mine);
  // Tensor k's bucket of its slot gathered (collective), onto the host on rank 0.
  void gather(std::size_t k);
  std::span<const std::byte> read(std::size_t k);

  static constexpr double kEnd = -1.0, kListening = -2.0;
  DataParallel& dp_;
  const sdk::Optimizer& optimizer_;
  std::vector<std::string> slots_;
  std::size_t params_ = 0;
  std::size_t gathered_slot_ = static_cast<std::size_t>(-1);
  std::size_t gathered_bucket_ = static_cast<std::size_t>(-1);
  std::vector<float> host_;  // rank 0: the last gathered bucket, fp32 [padded]
  bool ended_ = false;
};

}  // namespace mixtrain::core
