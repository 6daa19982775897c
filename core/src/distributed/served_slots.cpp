// A sharded optimizer's slots gathered as rank 0's format reads them; see served_slots.h.
#include "distributed/served_slots.h"

#include <cmath>
#include <span>
#include <stdexcept>

namespace mixtrain::core {

ServedSlots::ServedSlots(DataParallel& dp, const sdk::Optimizer& optimizer)
    : dp_(dp),
      optimizer_(optimizer),
      slots_(dp.optimizer_slots(optimizer)),
      params_(dp.parameter_count()) {}

std::vector<StagedTensor> ServedSlots::staged() {
  if (dp_.rank() != 0) throw std::logic_error("ServedSlots::staged: rank 0 reads the slots");
  std::vector<StagedTensor> out;
  out.reserve(slots_.size() * params_);
  // Slot-major, then parameters in model order: gather_optimizer_state's order, so the file is
  // the one a whole gather writes.
  for (std::size_t s = 0; s < slots_.size(); ++s)
    for (std::size_t i = 0; i < params_; ++i) {
      StagedTensor t;
      t.info = dp_.whole_slot(i, slots_[s]);
      t.read = [self = shared_from_this(), k = s * params_ + i](std::span<std::byte>) {
        return self->read(k);
      };
      t.held = true;
      out.push_back(std::move(t));
    }
  return out;
}

double ServedSlots::exchange(double mine) {
  double value[1] = {mine};
  dp_.communicator().all_reduce_host(value, sdk::ReduceOp::max);
  return value[0];
}

void ServedSlots::gather(std::size_t k) {
  const std::size_t slot = k / params_, bucket = dp_.bucket_of(k % params_);
  if (slot == gathered_slot_ && bucket == gathered_bucket_) return;
  // Forgotten first: a gather that throws leaves no half-gathered bucket taken for whole.
  gathered_slot_ = gathered_bucket_ = static_cast<std::size_t>(-1);
  dp_.gather_slot_bucket(optimizer_, slots_[slot], bucket, dp_.rank() == 0 ? &host_ : nullptr);
  gathered_slot_ = slot;
  gathered_bucket_ = bucket;
}

std::span<const std::byte> ServedSlots::read(std::size_t k) {
  if (ended_) throw std::logic_error("ServedSlots::read: the save's reads were ended");
  exchange(static_cast<double>(k));
  gather(k);
  const std::size_t param = k % params_;
  const auto& p = dp_.parameter(param);
  return std::as_bytes(
      std::span<const float>(host_).subspan(static_cast<std::size_t>(dp_.offset_of(param)),
                                            static_cast<std::size_t>(p.master.view().numel())));
}

void ServedSlots::end() {
  if (dp_.rank() != 0) throw std::logic_error("ServedSlots::end: rank 0 ends the reads");
  if (ended_) return;
  ended_ = true;
  exchange(kEnd);
}

void ServedSlots::serve() {
  if (dp_.rank() == 0)
    throw std::logic_error("ServedSlots::serve: rank 0 reads, it does not serve");
  for (;;) {
    const double asked = exchange(kListening);
    if (asked < 0.0) return;  // kEnd
    const auto k = static_cast<std::size_t>(asked);
    if (asked != std::floor(asked) || k >= slots_.size() * params_)
      throw std::logic_error("ServedSlots::serve: rank 0 asked for slot tensor " +
                             std::to_string(asked) + " of " +
                             std::to_string(slots_.size() * params_));
    gather(k);
  }
}

}  // namespace mixtrain::core
