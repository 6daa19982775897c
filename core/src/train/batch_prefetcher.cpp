// The loader thread of the training batches (contract in the header).
#include "train/batch_prefetcher.h"

#include <utility>

namespace mixtrain::core {

BatchPrefetcher::~BatchPrefetcher() {
  wait_quietly();
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BatchPrefetcher::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || task_; });
    if (!task_) return;  // stopping, nothing queued
    auto task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    // The thread writes spare_ alone until wait() has seen done_.
    std::exception_ptr error;
    try {
      task(spare_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    changed_.notify_all();
  }
}

std::exception_ptr BatchPrefetcher::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_; });
  in_flight_ = false;
  return std::exchange(error_, nullptr);
}

void BatchPrefetcher::wait_quietly() noexcept {
  // A dropped job's failure: the caller's own preparation meets it again.
  if (in_flight_) (void)wait();
}

void BatchPrefetcher::start(PrefetchJob job, std::function<void(HostBatch&)> prepare) {
  if (in_flight_) {
    wait_quietly();
    ++dropped_;
  }
  // The thread first: if it cannot start, no job is left in flight for the destructor to await.
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  job_ = std::move(job);
  {
    const std::lock_guard lock(mutex_);
    task_ = std::move(prepare);
    done_ = false;
  }
  in_flight_ = true;
  changed_.notify_all();
}

bool BatchPrefetcher::take(const PrefetchJob& job, HostBatch& into) {
  if (!in_flight_) return false;
  if (!(job == job_)) {
    wait_quietly();
    ++dropped_;
    return false;
  }
  if (auto error = wait()) std::rethrow_exception(error);  // it was this batch's
  std::swap(spare_, into);
  ++taken_;
  return true;
}

}  // namespace mixtrain::core
