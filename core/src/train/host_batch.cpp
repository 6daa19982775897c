// HostMemory (train/host_batch.h): the backend's upload memory, or ordinary memory after a refusal.
#include "train/host_batch.h"

#include <string>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::unique_ptr<sdk::HostBuffer> HostMemory::allocate(std::size_t bytes) const {
  if (facet_ == nullptr || refused_.load()) return nullptr;
  try {
    return facet_->allocate_host(bytes);
  } catch (const sdk::BackendError& e) {
    // Only the upload's staging copy is lost; the batches are the same bytes in ordinary memory.
    if (!refused_.exchange(true))
      log_.warn(std::string("data.pin_memory: ") + e.what() +
                "; batches stay in ordinary memory (the upload copies them once more)" +
                (e.hint().empty() ? "" : " (" + e.hint() + ")"));
    return nullptr;
  }
}

}  // namespace mixtrain::core
