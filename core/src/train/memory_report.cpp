// render_memory_report: the memory report as `mixtrain check` prints it; see memory_report.h.
#include "mixtrain/core/train/memory_report.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "console/short_list.h"
#include "graph/allocation_error.h"

namespace mixtrain::core {

namespace {

// "#   <what, padded> <bytes, right-aligned>  <note>"
std::string item_line(const std::string& what, std::size_t bytes, const std::string& note) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "#   %-40s %12s", what.c_str(), memory_text(bytes).c_str());
  std::string line = buf;
  if (!note.empty()) line += "  " + note;
  return line + "\n";
}

// "bn1 backward 48.0 MiB, conv1 forward 16.0 MiB and 3 more": the largest first.
std::string growth_text(std::vector<MemoryGrowth> growth) {
  constexpr std::size_t kShown = 4;
  std::stable_sort(growth.begin(), growth.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  std::vector<std::string> places;
  for (const auto& g : growth)
    places.push_back(g.where +
                     (g.format ? " (" + std::string(sdk::dtype_name(*g.format)) + ")" : "") + " " +
                     memory_text(g.bytes));
  const std::string out = short_list(places, kShown);
  return out.empty() ? out : "grew at " + out;
}

// One line per emulated format the scratch grew for: how the backend emulates it and how much of
// the scratch grew at nodes computing in it.
std::string emulation_lines(const MemoryReport& r) {
  std::map<sdk::DType, std::size_t> by_format;
  for (const auto& g : r.scratch_growth)
    if (g.format) by_format[*g.format] += g.bytes;
  std::string out;
  for (const auto& d : r.emulated) {
    const auto it = by_format.find(d.dtype);
    if (it == by_format.end()) continue;
    const std::string name(sdk::dtype_name(d.dtype));
    std::string how = d.how;
    if (how.rfind("emulated: ", 0) == 0) how.erase(0, 10);
    out += "# " + name + " is emulated on this " + r.backend + " backend (GEMM: " + how +
           "): " + memory_text(it->second) + " of the scratch grew at " + name +
           " nodes, the fp32 copies it decodes into\n";
  }
  return out;
}

constexpr const char* kMemoryFix =
    "lower data.batch_size (keeping the effective batch with run.accumulate = N micro-batches), "
    "the model's size or its inputs' (an image folder's data.image_folder.size)";

// "77%"; "<1%" for a share that would print as 0% (a small model on a large host).
std::string share_text(std::size_t part, std::size_t whole) {
  const double percent = 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  if (part > 0 && percent < 0.5) return "<1%";
  return std::to_string(static_cast<int>(percent + 0.5)) + "%";
}

}  // namespace

std::string render_memory_report(const MemoryReport& r) {
  std::string out = "# memory: what `train` reports as peak memory (the " + r.backend +
                    " backend's allocator; the process's resident set adds the data, the code, "
                    "the libraries' own scratch and, while a checkpoint is written, a buffer of "
                    "its largest tensor)\n";
  for (const auto& item : r.held) out += item_line(item.what, item.bytes, item.note);
  if (r.rehearsed.empty()) {
    if (r.scratch_bytes.value_or(0) > 0) out += item_line("backend scratch", *r.scratch_bytes, "");
    return out + item_line("before the first step", r.peak_bytes,
                           "no step rehearsed: the step's buffers, the backend's scratch and so "
                           "the peak are not known");
  }
  if (r.scratch_bytes) {
    out += item_line("step buffers", r.step_bytes, growth_text(r.step_growth));
    out += item_line("backend scratch", *r.scratch_bytes, growth_text(r.scratch_growth));
  } else {
    out +=
        item_line("step buffers and backend scratch", r.step_bytes,
                  "(the backend does not report its scratch apart) " + growth_text(r.step_growth));
  }
  if (r.transient_bytes > 0) out += item_line("freed again within the step", r.transient_bytes, "");
  std::string paths;
  for (const auto& p : r.rehearsed) paths += (paths.empty() ? "" : ", ") + p;
  out +=
      item_line("predicted peak", r.peak_bytes,
                "(" + std::to_string(r.peak_bytes) + " bytes), rehearsed: " + paths +
                    (r.device_memory > 0 ? "; " + share_text(r.peak_bytes, r.device_memory) +
                                               " of the backend's " + memory_text(r.device_memory)
                                         : std::string()));
  if (r.host_peak_rss > 0 && r.host_memory_at_start > 0)
    out += item_line("the process's resident peak", r.host_peak_rss,
                     share_text(r.host_peak_rss, r.host_memory_at_start) + " of the " +
                         memory_text(r.host_memory_at_start) +
                         " it could hold when the rehearsal began (its own and the host's "
                         "available memory)");
  return out + emulation_lines(r);
}

std::optional<std::string> host_memory_warning(std::size_t peak_rss, std::size_t could_hold,
                                               const std::string& during) {
  if (could_hold == 0 ||
      static_cast<double>(peak_rss) <= kHostMemoryWarnShare * static_cast<double>(could_hold))
    return std::nullopt;
  return "host memory: this process peaked at " + memory_text(peak_rss) + " resident " + during +
         ", " + share_text(peak_rss, could_hold) + " of the " + memory_text(could_hold) +
         " it could hold (its own and the host's available memory): training is likely to be "
         "killed for memory, losing the steps since its last checkpoint; " +
         kMemoryFix + ", or free host memory";
}

std::string step_time_line(const MemoryReport& r, std::int64_t steps, std::int64_t accumulate) {
  // The rehearsal runs one micro-batch: the others take the same path over the same buffers.
  double step = 0.0;
  for (std::size_t i = 0; i < r.rehearsed.size() && i < r.rehearsed_seconds.size(); ++i)
    if (r.rehearsed[i] == rehearsed_path::kForwardBackward)
      step += r.rehearsed_seconds[i] * static_cast<double>(std::max<std::int64_t>(accumulate, 1));
    else if (r.rehearsed[i] == rehearsed_path::kGradientCheck ||
             r.rehearsed[i] == rehearsed_path::kUpdate)
      step += r.rehearsed_seconds[i];
  if (step < 1.0) return {};
  const double total = step * static_cast<double>(std::max<std::int64_t>(steps, 0));
  char run[48];
  if (total < 120.0)
    std::snprintf(run, sizeof run, "%.0f s", total);
  else if (total < 7200.0)
    std::snprintf(run, sizeof run, "%.0f min", total / 60.0);
  else
    std::snprintf(run, sizeof run, "%.1f h", total / 3600.0);
  char line[256];
  std::snprintf(line, sizeof line,
                "# time: the rehearsed step (forward and backward, gradient check, update) took "
                "%.1f s; %lld steps at that rate: about %s, evaluations and checkpoints aside\n",
                step, static_cast<long long>(steps), run);
  return line;
}

std::vector<std::string> memory_headroom_warnings(const MemoryReport& r) {
  std::vector<std::string> out;
  if (r.rehearsed.empty()) return out;
  if (auto host = host_memory_warning(r.host_peak_rss, r.host_memory_at_start,
                                      "by the end of the rehearsal")) {
    out.push_back(std::move(*host));
    return out;
  }
  if (r.device_memory > 0 && static_cast<double>(r.peak_bytes) >
                                 kDeviceMemoryWarnShare * static_cast<double>(r.device_memory))
    out.push_back("the predicted peak " + memory_text(r.peak_bytes) + " is " +
                  share_text(r.peak_bytes, r.device_memory) + " of the " + r.backend +
                  " backend's " + memory_text(r.device_memory) +
                  (r.device_name.empty() ? std::string() : " (" + r.device_name + ")") +
                  ": an allocation is likely to fail mid-run; " + kMemoryFix);
  return out;
}

}  // namespace mixtrain::core
