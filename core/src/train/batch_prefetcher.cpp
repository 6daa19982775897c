// The loader thread of the training batches (contract in the header).
#include "train/batch_prefetcher.h"

#include <utility>

namespace mixtrain::core {

BatchPrefetcher::~BatchPrefetcher() {
  wait_quietly();
}

void BatchPrefetcher::wait_quietly() noexcept {
  if (!pending_.valid()) return;
  try {
    pending_.get();
  } catch (...) {  // a dropped job's failure: the caller's own preparation meets it again
  }
}

void BatchPrefetcher::start(PrefetchJob job, std::function<void(HostBatch&)> prepare) {
  if (pending_.valid()) {
    wait_quietly();
    ++dropped_;
  }
  job_ = std::move(job);
  // The thread writes spare_ alone until take() or the next start() has waited for it.
  pending_ =
      std::async(std::launch::async, [this, prepare = std::move(prepare)] { prepare(spare_); });
}

bool BatchPrefetcher::take(const PrefetchJob& job, HostBatch& into) {
  if (!pending_.valid()) return false;
  if (!(job == job_)) {
    wait_quietly();
    ++dropped_;
    return false;
  }
  pending_.get();  // rethrows the job's failure: it was this batch's
  std::swap(spare_, into);
  ++taken_;
  return true;
}

}  // namespace mixtrain::core
