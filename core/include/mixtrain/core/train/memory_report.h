// MemoryReport: what a training run holds in its backend's memory at its peak, item by item — the
// figure `mixtrain train` reports as peak memory (the backend allocator's high-water mark,
// memory_stats().peak_bytes), predicted by `mixtrain check` (Trainer::memory_report).
//
// Contract
// - held: what the model, the optimizer and the step keep from construction on, each item the
//   bytes of the tensors themselves; the items sum to held_bytes, the backend's count before the
//   first step less its scratch (the last item, "op buffers and the rest", is that remainder:
//   workspaces, saved statistics, data-parallel buckets).
// - rehearsed: the paths run, in order, and rehearsed_seconds the wall time of each (the same
//   length); empty when no step was rehearsed, and then step_bytes,
//   the scratch and transient_bytes are 0, the growth lists empty, and peak_bytes the count so
//   far (a lower bound of the run's).
// - step_bytes: allocated during the rehearsed step paths and still held (casts, layout
//   conversions, a pass's own buffers). scratch_bytes: the backend's own scratch
//   (sdk/backend_scratch.h) after them; nullopt when the backend does not report it apart, and
//   then it is in step_bytes. transient_bytes: freed again before the rehearsal ended.
//   held + step + scratch + transient = peak_bytes, exactly.
// - scratch_growth, step_growth: where the scratch and the step's buffers grew (a node's forward
//   or backward, or a path), in the order they grew, with the node's compute format; the scratch
//   is empty without the scratch facet (step_growth then holds it).
// - emulated: the GEMM input formats the backend reports as emulated (capabilities()).
// - device_memory, device_name: capabilities().memory_bytes and device_name (the host's memory on
//   a CPU backend, whose tensors are in the process's resident set).
// - host_memory_at_start, host_peak_rss: with a rehearsal, what the process could hold when it
//   began (its resident set plus the host's available memory) and the process's resident
//   high-water mark when it ended (the data, the libraries' scratch and, on a CPU backend, the
//   backend's memory); 0 without a rehearsal or where the kernel does not say.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

struct MemoryItem {
  std::string what;  // "fp32 master weights"
  std::size_t bytes = 0;
  std::string note;  // "" or a short qualification: "128 rows", "62.07 MiB in fp32"
};

// The names of the rehearsed paths (MemoryReport::rehearsed), as the step reports them
// (train/step.h, run_each_step_path) and `check` reads them back.
namespace rehearsed_path {
inline constexpr std::string_view kEvaluation = "evaluation batch";
inline constexpr std::string_view kForwardBackward = "forward and backward";
inline constexpr std::string_view kUnderflow = "underflow measurement";
inline constexpr std::string_view kGradientCheck = "gradient check";
inline constexpr std::string_view kReplay = "skipped-step replay";
inline constexpr std::string_view kUpdate = "update";
}  // namespace rehearsed_path

struct MemoryGrowth {
  std::string where;                 // "bn1 backward", "evaluation batch"
  std::optional<sdk::DType> format;  // the node's compute format; nullopt for a path
  std::size_t bytes = 0;
};

struct MemoryReport {
  std::string backend;  // capabilities().kind
  std::vector<MemoryItem> held;
  std::size_t held_bytes = 0;
  std::size_t step_bytes = 0;
  std::optional<std::size_t> scratch_bytes;
  std::vector<MemoryGrowth> scratch_growth;
  std::vector<MemoryGrowth> step_growth;
  std::size_t transient_bytes = 0;
  std::size_t peak_bytes = 0;
  std::vector<std::string> rehearsed;
  std::vector<double> rehearsed_seconds;
  std::vector<sdk::DTypeSupport> emulated;
  // The rehearsed step's first non-finite tensor when it lies in the forward (the input batch, a
  // node's output, the loss), which no loss scale fixes: "forward proj.output"; empty otherwise.
  std::string nonfinite_forward;
  std::size_t device_memory = 0;
  std::string device_name;
  std::size_t host_memory_at_start = 0;
  std::size_t host_peak_rss = 0;
};

// "# memory ..." comment lines for `mixtrain check`: the items, the step's buffers, the scratch
// with where it grew and which emulated format it serves, and the predicted peak in MiB and bytes
// (without a rehearsed step: the items and what they come to before the first step).
std::string render_memory_report(const MemoryReport& report);

// Above these shares a run is likely to fail for memory: a device allocator refuses what
// fragmentation leaves unusable, and the host's other processes and page cache claim theirs (a
// process killed for memory writes no checkpoint).
inline constexpr double kDeviceMemoryWarnShare = 0.9;
inline constexpr double kHostMemoryWarnShare = 0.8;

// What `check` warns about a rehearsed peak: the process's resident peak above
// kHostMemoryWarnShare of host_memory_at_start, else the backend's peak above
// kDeviceMemoryWarnShare of device_memory; each names the figures and the fix. Empty when neither
// holds or nothing was rehearsed.
std::vector<std::string> memory_headroom_warnings(const MemoryReport& report);

// The warning of a process whose resident peak `peak_rss` is above kHostMemoryWarnShare of the
// `could_hold` bytes it had (its own resident set and the host's available memory) when it began
// what `during` names ("by the end of the rehearsal"); nullopt below that share or when could_hold
// is 0.
std::optional<std::string> host_memory_warning(std::size_t peak_rss, std::size_t could_hold,
                                               const std::string& during);

// "# time: ..." for `check`: what the rehearsed paths of a plain step took (forward and backward,
// once per micro-batch of `accumulate`, gradient check, update) and `steps` of them at that rate;
// empty when they took under a second, where the first step's one-time setup (the kernels' plans)
// would be most of the figure.
std::string step_time_line(const MemoryReport& report, std::int64_t steps,
                           std::int64_t accumulate = 1);

}  // namespace mixtrain::core
