#include "distributed/local_reducer.h"

#include "mixtrain/sdk/error.h"
#include "train/host_tensor.h"

namespace mixtrain::core {

Reducer::~Reducer() = default;

std::vector<sdk::HostTensor> whole_optimizer_state(sdk::DeviceBackend& backend,
                                                   const sdk::Optimizer& optimizer) {
  std::vector<sdk::HostTensor> out;
  for (const auto& t : optimizer.state_tensors()) out.push_back(to_host(backend, t.name, t.view));
  return out;
}

std::vector<StagedTensor> staged_optimizer_state(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                                 const sdk::Optimizer& optimizer) {
  std::vector<StagedTensor> out;
  for (const auto& t : optimizer.state_tensors()) out.push_back(staged_view(backend, t.name, t.view));
  return out;
}

void load_whole_optimizer_state(const sdk::Optimizer& optimizer, const WholeTensorFinder& find,
                                const WholeTensorLoader& load, const std::string& where) {
  for (const auto& t : optimizer.state_tensors()) {
    const sdk::HostTensor* h = find(t.name);
    if (h == nullptr)
      throw sdk::CheckpointError(
          where + ": no optimizer state '" + t.name + "'",
          "the file holds no state of this optimizer: resume with the optimizer that wrote it, or, "
          "if it was the same, its checkpoint format did not keep the state; to start from its "
          "weights alone, give it as checkpoint.init_from");
    load(*h, t.view);
  }
}

LocalReducer::LocalReducer(std::shared_ptr<sdk::DeviceBackend> backend)
    : backend_(std::move(backend)) {}

std::vector<StagedTensor> LocalReducer::optimizer_state(const sdk::Optimizer& optimizer) {
  return staged_optimizer_state(backend_, optimizer);
}

void LocalReducer::load_optimizer_state(const sdk::Optimizer& optimizer,
                                        const WholeTensorFinder& find,
                                        const WholeTensorLoader& load, const std::string& where) {
  load_whole_optimizer_state(optimizer, find, load, where);
}

}  // namespace mixtrain::core
