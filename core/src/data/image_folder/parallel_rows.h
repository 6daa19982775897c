// parallel_rows(): a loop over [0, count) spread over up to `threads` threads, for the image
// folder's per-file work (header checks at load, decoding per batch), which is independent per
// row. Rows are dealt out in blocks so that each thread's files are neighbours on disk.
//
// Contract: body(i) runs once for each i, on some thread (the caller's included). When bodies
// throw, every thread still stops, and the exception of the lowest row is rethrown, so which
// error a user sees does not depend on the scheduling.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace mixtrain::core {

template <class Body>
void parallel_rows(std::int64_t count, unsigned threads, const Body& body) {
  if (count <= 0) return;
  const auto workers = static_cast<std::int64_t>(std::clamp<std::int64_t>(threads, 1, count));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  std::vector<std::int64_t> failed_at(static_cast<std::size_t>(workers), count);
  const auto run = [&](std::int64_t w) {
    const std::int64_t begin = count * w / workers, end = count * (w + 1) / workers;
    for (std::int64_t i = begin; i < end; ++i) {
      try {
        body(i);
      } catch (...) {
        errors[static_cast<std::size_t>(w)] = std::current_exception();
        failed_at[static_cast<std::size_t>(w)] = i;
        return;  // later rows of this block could only fail at a higher row
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (std::int64_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
    run(0);
  }  // joined
  const auto first = std::min_element(failed_at.begin(), failed_at.end()) - failed_at.begin();
  if (errors[static_cast<std::size_t>(first)])
    std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
}

}  // namespace mixtrain::core
