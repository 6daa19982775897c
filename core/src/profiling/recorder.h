// Recorder: the profiler's table of (scope, op) -> calls and seconds, which every facet call
// (through BoundFacets) and the backend's own ops add to. Internal to the core (profiling/).
//
// Contract
// - timed(op, f) runs f; while recording it synchronises the inner backend after f, so the time
//   is the op's device time, and adds it under the calling thread's ProfileScope.
// - An error the wait raises is never dropped: timed() raises it, and one found after a facet call
//   (end(), noexcept) is raised by the next timed() or raise_pending().
// - entries() lists the table, slowest first; node_entries() the same times by model node (the
//   ops run inside a node's ProfileScope), slowest first; recorded_seconds() the wall time spent
//   recording.
#pragma once

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "mixtrain/core/profiling/profiling_backend.h"
#include "profiling/profile_scope.h"

namespace mixtrain::core::profiling {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The table of (scope, op) times every facet call and the core ops add to.
class Recorder {
 public:
  explicit Recorder(sdk::DeviceBackend& inner) : in_(inner), since_(Clock::now()) {}

  template <class F>
  void timed(const char* op, F&& f) {
    raise_pending();
    begin();
    f();
    end(op);
    raise_pending();
  }
  // timed() in two halves, for a call timed from outside (a FacetCall): begin() before it, end()
  // after it returns. Both are noexcept (sdk/backend_call_observer.h), so an error the wait raises
  // is kept and raised by the next timed() or raise_pending(): a device check (a bad label or id)
  // that the wait reports once and clears would otherwise be lost.
  void begin() noexcept {
    if (recording_) started_ = Clock::now();
  }
  void end(std::string_view op) noexcept {
    if (!recording_) return;
    try {
      in_.synchronize();
      add(op, seconds_since(started_));
    } catch (...) {
      if (!pending_) pending_ = std::current_exception();
    }
  }
  // Raises the first error an end() kept, once.
  void raise_pending() {
    if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
  }

  std::vector<ProfileEntry> entries() const {
    std::vector<ProfileEntry> out;
    out.reserve(table_.size());
    for (const auto& [key, e] : table_) out.push_back(e);
    std::sort(out.begin(), out.end(),
              [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
    return out;
  }
  std::vector<ProfileNodeEntry> node_entries() const {
    std::vector<ProfileNodeEntry> out;
    out.reserve(nodes_.size());
    for (const auto& [key, e] : nodes_) out.push_back(e);
    std::sort(out.begin(), out.end(), [](const ProfileNodeEntry& a, const ProfileNodeEntry& b) {
      return a.entry.seconds > b.entry.seconds;
    });
    return out;
  }
  bool recording() const { return recording_; }
  double recorded_seconds() const { return recorded_ + (recording_ ? seconds_since(since_) : 0.0); }
  void set_recording(bool on) {
    if (on == recording_) return;
    if (recording_) recorded_ += seconds_since(since_);
    since_ = Clock::now();
    recording_ = on;
  }
  void reset() {
    table_.clear();
    nodes_.clear();
    recorded_ = 0.0;
    since_ = Clock::now();
  }

 private:
  void add(std::string_view op, double s) {
    const char* scope = ProfileScope::current();
    auto [it, fresh] = table_.try_emplace(std::make_pair(std::string(scope), std::string(op)));
    if (fresh) {
      it->second.scope = scope;
      it->second.op = std::string(op);
    }
    it->second.calls += 1;
    it->second.seconds += s;
    if (const char* node = ProfileScope::node(); node != nullptr) {
      auto [n, first] = nodes_.try_emplace({std::string(node), it->first.first, it->first.second});
      if (first) n->second = {node, {it->second.scope, it->second.op, 0, 0.0}};
      n->second.entry.calls += 1;
      n->second.entry.seconds += s;
    }
  }

  sdk::DeviceBackend& in_;
  Clock::time_point started_;
  std::map<std::pair<std::string, std::string>, ProfileEntry> table_;  // by (scope, op)
  std::map<std::tuple<std::string, std::string, std::string>, ProfileNodeEntry>
      nodes_;  // by (node, scope, op)
  bool recording_ = true;
  double recorded_ = 0.0;
  std::exception_ptr pending_;
  Clock::time_point since_;
};

}  // namespace mixtrain::core::profiling
