// The renderings of a RunComparison (terminal text, markdown, JSON, the compare.svg chart) and
// write_comparison(), which writes them into a folder.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/core/runs/svg_chart.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "runs/comparison_internal.h"
#include "runs/component_history_json.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Losses: five decimals while that keeps about four significant digits, else scientific.
std::string num(const std::optional<double>& v, const char* f = nullptr) {
  if (!v) return "-";
  if (std::isnan(*v)) return "nan";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  if (f != nullptr) return fmt(f, *v);
  const double a = std::fabs(*v);
  return fmt(a == 0.0 || (a >= 1e-2 && a < 1e5) ? "%.5f" : "%.4e", *v);
}

std::string with_step(const std::string& value, const std::optional<std::int64_t>& step) {
  return step ? value + " @" + std::to_string(*step) : value;
}

// Loss scales are usually powers of two: 2^24 says more than 1.67772e+07.
std::string scale_value(double v) {
  int e = 0;
  if (std::isfinite(v) && std::frexp(v, &e) == 0.5 && (e - 1 > 16 || e - 1 < -4))
    return "2^" + std::to_string(e - 1);
  return fmt("%.6g", v);
}

std::string scale_range(const RunComparisonRow& r) {
  if (!r.loss_scale_min) return "-";
  if (*r.loss_scale_min == *r.loss_scale_max) return scale_value(*r.loss_scale_min);
  return scale_value(*r.loss_scale_min) + ".." + scale_value(*r.loss_scale_max);
}

std::string with_ratio(const std::string& value, const std::optional<double>& ratio,
                       bool baseline) {
  if (baseline || !ratio) return value;
  return value + " (" + fmt("%.2f", *ratio) + "x)";
}

bool shares_logged_steps(const RunData& a, const RunData& b) {
  const auto la = finite_losses(a), lb = finite_losses(b);
  return std::any_of(la.begin(), la.end(), [&](const auto& kv) { return lb.count(kv.first) != 0; });
}

// Table cells shared by the terminal and markdown renderings, so both always agree.
std::vector<std::vector<std::string>> table_cells(const RunComparison& c) {
  std::vector<std::vector<std::string>> t;
  t.push_back({"run", "final loss", "best loss", "eval acc", "eval loss",
               "max gap, " + std::to_string(c.smoothing_window_steps()) + "-step mean loss",
               "skipped", "loss scale", "samples/s", "peak MiB"});
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    const bool base = i == 0;
    std::string acc = num(r.eval_accuracy, "%.4f");
    if (!base && r.eval_accuracy_delta_points)
      acc += " (" + fmt("%+.2f", *r.eval_accuracy_delta_points) + " pts)";
    std::string gap;
    if (base)
      gap = "(baseline)";
    else if (!r.max_rel_loss_gap)
      gap = shares_logged_steps(c.runs[0], c.runs[i]) ? "too short to smooth" : "no common steps";
    else
      gap = with_step(fmt("%.2f%%", *r.max_rel_loss_gap * 100.0), r.max_rel_loss_gap_step);
    std::string eval_loss = num(r.eval_loss);
    if (!base && r.eval_loss_rel_delta)
      eval_loss += " (" + fmt("%+.2f%%", *r.eval_loss_rel_delta * 100.0) + ")";
    std::string speed = with_ratio(num(r.samples_per_s, "%.0f"), r.samples_per_s_ratio, base);
    // An emulated format's speed is the emulation's, not the format's on hardware that has it.
    if (r.samples_per_s && r.samples_per_s_emulated) speed += " emulated";
    t.push_back({r.label, num(r.final_loss), with_step(num(r.best_loss), r.best_loss_step), acc,
                 eval_loss, gap, std::to_string(r.skipped_steps), scale_range(r), speed,
                 with_ratio(num(r.peak_memory_mib, "%.1f"), r.peak_memory_ratio, base)});
  }
  return t;
}

// Terminal columns: UTF-8 continuation bytes take no width (run names may be non-ASCII).
std::size_t display_width(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(
      s.begin(), s.end(), [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
}

std::string gap_note(const RunComparison& c) {
  return "max gap: the largest |L - L_baseline| / |L_baseline| over the steps both runs logged, "
         "and "
         "its step; L is the training loss averaged over the trailing " +
         std::to_string(c.smoothing_window_steps()) + " steps (" +
         std::to_string(kLossSmoothingIntervals) +
         " of the baseline's logging intervals; from the first full window on), not a single "
         "batch's. A run logged at another interval is compared on the steps both logged, each "
         "averaged over " +
         std::to_string(kLossSmoothingIntervals) + " of their common intervals";
}

// One line per run whose throughput was measured on emulated GEMM formats.
std::vector<std::string> emulation_notes(const RunComparison& c) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < c.runs.size(); ++i) {
    if (!c.rows[i].samples_per_s_emulated) continue;
    std::string what;
    for (const auto& d : c.runs[i].emulated_gemm_inputs())
      what += (what.empty() ? "" : "; ") + d + " GEMMs " + c.runs[i].gemm_inputs.at(d).how;
    out.push_back(c.runs[i].name + ": " + what);
  }
  return out;
}

json opt_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}
json opt_json(const std::optional<std::int64_t>& v) {
  return v ? json(*v) : json(nullptr);
}

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::string RunData::Escalation::text() const {
  const std::string at = " at step " + std::to_string(step);
  if (kind == "stuck") return node + " blamed" + at + " but already " + from;
  return node + " " + from + " -> " + to + at + (kind == "demote" ? " (de-escalated)" : "");
}

namespace {

// "<run>: proj fp16 -> fp32 at step 3; fc1 ..." for every run that escalated.
std::vector<std::string> escalation_lines(const RunComparison& c) {
  std::vector<std::string> out;
  for (const auto& run : c.runs) {
    if (run.escalations.empty()) continue;
    std::string line = "escalation in " + run.name + ": ";
    for (std::size_t i = 0; i < run.escalations.size(); ++i)
      line += (i ? "; " : "") + run.escalations[i].text();
    out.push_back(line);
  }
  return out;
}

json escalation_json(const RunData& d) {
  json out = json::array();
  for (const auto& e : d.escalations)
    out.push_back(
        {{"step", e.step}, {"kind", e.kind}, {"node", e.node}, {"from", e.from}, {"to", e.to}});
  return out;
}

}  // namespace

std::string comparison_text(const RunComparison& c) {
  const auto cells = table_cells(c);
  std::vector<std::size_t> width(cells.front().size(), 0);
  for (const auto& row : cells)
    for (std::size_t k = 0; k < row.size(); ++k)
      width[k] = std::max(width[k], display_width(row[k]));
  std::string out = "parity against the baseline " + c.rows.front().label + " (" +
                    std::to_string(c.rows.size()) + (c.rows.size() == 1 ? " run" : " runs") + ")\n";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    std::string line;
    for (std::size_t k = 0; k < cells[i].size(); ++k) {
      const auto& s = cells[i][k];
      const std::string pad(width[k] - display_width(s), ' ');
      // Text left, numbers right: the eye compares digits column by column.
      line += k == 0 ? s + pad : "  " + pad + s;
    }
    out += line + "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (auto w : width) total += w + 2;
      out += std::string(total - 2, '-') + "\n";
    }
  }
  for (const auto& w : comparison_warnings(c)) out += "warning: " + w + "\n";
  out += gap_note(c) + "\n";
  for (const auto& line : escalation_lines(c)) out += line + "\n";
  const auto emulated = emulation_notes(c);
  if (!emulated.empty()) {
    out +=
        "emulated: these runs' samples/s measure an emulation, not the format on hardware that "
        "runs it:\n";
    for (const auto& e : emulated) out += "  " + e + "\n";
  }
  return out;
}

std::string diagnostics_text(const RunComparison& c) {
  std::string out;
  char buf[256];
  for (const auto& run : c.runs) {
    if (run.fp8_slots.empty() && run.max_gradient_underflow.empty() && run.escalations.empty())
      continue;
    out += run.label() + ":\n";
    for (const auto& e : run.escalations) out += "  escalation: " + e.text() + "\n";
    for (const auto& [slot, d] : run.fp8_slots) {
      std::snprintf(buf, sizeof buf,
                    "  fp8 %-24s %-9s scale %-12.6g saturated <= %.4f%%  underflow <= %.4f%%\n",
                    slot.c_str(), d.dtype.c_str(), d.last_scale, 100.0 * d.max_saturated_share,
                    100.0 * d.max_underflow_share);
      out += buf;
    }
    // The worst few tensors are what a reader acts on. One that would read "0.0%" tells nothing
    // to act on and crowds out the others: left out, and said once when none is left.
    constexpr double kShown = 0.0005;  // 0.05%: a smaller share prints as 0.0%
    std::vector<std::pair<double, std::string>> worst;
    for (const auto& [t, v] : run.max_gradient_underflow)
      if (v >= kShown) worst.emplace_back(v, t);
    std::sort(worst.rbegin(), worst.rend());
    for (std::size_t i = 0; i < worst.size() && i < 5; ++i) {
      std::snprintf(buf, sizeof buf,
                    "  gradient underflow %-28s up to %.1f%% of non-zero values flushed\n",
                    worst[i].second.c_str(), 100.0 * worst[i].first);
      out += buf;
    }
    if (worst.empty() && !run.max_gradient_underflow.empty())
      out +=
          "  gradient underflow: every gradient measured flushed under 0.05% of its non-zero "
          "values\n";
  }
  return out;
}

namespace {
// Run names and config values are user text: neither HTML nor markdown syntax may leak from them.
std::string md_escape(const std::string& text) {
  std::string e;
  for (char ch : valid_utf8(text)) {
    if (ch == '\n' || ch == '\r')
      e += ' ';  // a line break would end the table row
    else if (ch == '<')
      e += "&lt;";
    else if (ch == '>')
      e += "&gt;";
    else if (ch == '&')
      e += "&amp;";
    else if (ch == '|' || ch == '*' || ch == '_' || ch == '`' || ch == '\\' || ch == '[' ||
             ch == ']' || ch == '~')  // brackets: a link or an image needs them
      e += std::string("\\") + ch;
    else
      e += ch;
  }
  return e;
}
}  // namespace

std::string comparison_markdown(const RunComparison& c) {
  auto cells = table_cells(c);
  std::string out =
      "# Parity against the baseline\n\nThe first row is the baseline; every other row is compared "
      "with it.\n\n";
  for (const auto& w : comparison_warnings(c)) out += "> **Warning:** " + md_escape(w) + "\n\n";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    out += "|";
    for (auto& s : cells[i]) out += " " + md_escape(s) + " |";
    out += "\n";
    if (i == 0) {
      out += "|:---|";
      for (std::size_t k = 1; k < cells[i].size(); ++k) out += "---:|";
      out += "\n";
    }
  }
  out += "\n" + md_escape(gap_note(c)) + ". Chart: `compare.svg`.\n";
  const auto escalated = escalation_lines(c);
  if (!escalated.empty()) {
    out += "\nPrecision escalation ([precision.escalate]):\n\n";
    for (const auto& line : escalated) out += "- " + md_escape(line) + "\n";
  }
  const auto emulated = emulation_notes(c);
  if (!emulated.empty()) {
    out +=
        "\n*emulated*: these runs' samples/s measure an emulation, not the format on hardware that "
        "runs it:\n\n";
    for (const auto& e : emulated) out += "- " + md_escape(e) + "\n";
  }
  return out;
}

namespace {
json fp8_json(const RunData& d) {
  json out = json::object();
  for (const auto& [slot, v] : d.fp8_slots)
    out[slot] = {{"dtype", v.dtype},
                 {"max_saturated_share", v.max_saturated_share},
                 {"max_underflow_share", v.max_underflow_share},
                 {"last_scale", v.last_scale}};
  return out;
}

json gemm_json(const RunData& d) {
  json out = json::object();
  for (const auto& [dtype, g] : d.gemm_inputs) out[dtype] = {{"native", g.native}, {"how", g.how}};
  return out;
}

json setup_json(const RunComparisonRow& r) {
  if (!r.setup_differences) return nullptr;
  json out = json::array();
  for (const auto& d : *r.setup_differences)
    out.push_back({{"key", d.key}, {"baseline", d.baseline}, {"run", d.run}});
  return out;
}
}  // namespace

std::string comparison_json(const RunComparison& c) {
  json runs = json::array();
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    const auto& d = c.runs[i];
    runs.push_back(
        {{"name", r.name},
         {"label", r.label},
         {"dir", d.dir.string()},
         {"baseline", i == 0},
         {"has_summary", d.has_summary},
         {"policy", d.policy},
         {"resolved_policy", d.resolved_policy.empty() ? json(nullptr) : json(d.resolved_policy)},
         {"scaler", d.scaler},
         {"optimizer", d.optimizer},
         {"segments",
          d.segments.size() > 1 ? component_history_to_json(d.segments) : json(nullptr)},
         {"backend", d.backend},
         {"steps", d.steps_run},
         {"final_loss", opt_json(r.final_loss)},
         {"best_loss", opt_json(r.best_loss)},
         {"best_loss_step", opt_json(r.best_loss_step)},
         {"eval_accuracy", opt_json(r.eval_accuracy)},
         {"eval_accuracy_delta_points", opt_json(r.eval_accuracy_delta_points)},
         {"eval_loss", opt_json(r.eval_loss)},
         {"eval_loss_rel_delta", opt_json(r.eval_loss_rel_delta)},
         {"max_rel_loss_gap", opt_json(r.max_rel_loss_gap)},
         {"max_rel_loss_gap_step", opt_json(r.max_rel_loss_gap_step)},
         {"common_steps", r.common_steps},
         {"smoothed_steps", r.smoothed_steps},
         {"max_rel_loss_gap_window_steps", r.gap_window_steps},
         {"skipped_steps", r.skipped_steps},
         {"loss_scale_min", opt_json(r.loss_scale_min)},
         {"loss_scale_max", opt_json(r.loss_scale_max)},
         {"samples_per_s", opt_json(r.samples_per_s)},
         {"samples_per_s_ratio", opt_json(r.samples_per_s_ratio)},
         {"samples_per_s_emulated", r.samples_per_s_emulated},
         {"gemm_inputs", gemm_json(d)},
         {"setup_differences", setup_json(r)},
         {"peak_memory_mib", opt_json(r.peak_memory_mib)},
         {"peak_memory_ratio", opt_json(r.peak_memory_ratio)},
         {"fp8_slots", fp8_json(d)},
         {"max_gradient_underflow", d.max_gradient_underflow},
         {"escalations", escalation_json(d)}});
  }
  // Non-finite numbers have no JSON spelling; nlohmann writes them as null.
  return json{{"baseline", c.rows.front().name},
              {"loss_gap",
               {{"curve", "training loss, trailing mean"},
                {"window_steps", c.smoothing_window_steps()}}},
              {"warnings", comparison_warnings(c)},
              {"runs", runs}}
             .dump(2, ' ', false, json::error_handler_t::replace) +  // folder names: any bytes
         "\n";
}

std::string comparison_svg(const RunComparison& c) {
  const std::string window = std::to_string(c.smoothing_window_steps());
  ChartPanel loss{"training loss", "loss", AxisScale::automatic, 260.0, "loss-curve",
                  "skip-marks",    {}};
  ChartPanel diff{"difference from the baseline: smoothed loss minus the baseline's (" + window +
                      "-step trailing mean)",
                  "loss - baseline",
                  AxisScale::linear,
                  160.0,
                  "diff-curve",
                  "diff-marks",
                  {}};
  ChartPanel acc{"eval accuracy", "accuracy", AxisScale::linear, 160.0, "eval-curve",
                 "eval-marks",    {}};
  ChartPanel scale{"loss scale (log2 axis)",
                   "loss scale",
                   AxisScale::log2,
                   140.0,
                   "scale-curve",
                   "scale-marks",
                   {}};
  std::vector<ChartLegendEntry> legend;
  bool any_skipped = false, any_eval = false;
  for (std::size_t i = 0; i < c.runs.size(); ++i) {
    const auto& run = c.runs[i];
    const std::string color = kPalette[i % std::size(kPalette)];
    // The baseline is a wide translucent band under the other curves, so a run that matches it
    // exactly still shows both.
    const double width = i == 0 ? 5.0 : 1.6, opacity = i == 0 ? 0.45 : 1.0;
    ChartSeries ls{color, {}, false, {}, width, opacity}, ss{color, {}, true, {}, width, opacity};
    for (const auto& r : run.steps) {
      ls.points.push_back({static_cast<double>(r.step), r.loss});
      if (r.skipped) ls.marks.push_back({static_cast<double>(r.step), r.loss}), any_skipped = true;
      ss.points.push_back({static_cast<double>(r.step), r.loss_scale});
      // The scaler's decision takes effect right after the step: draw the drop at that step.
      if (r.next_loss_scale != r.loss_scale)
        ss.points.push_back({static_cast<double>(r.step), r.next_loss_scale});
    }
    // Only the steps both logged have a difference; the baseline's own is its zero line.
    ChartSeries ds{color, {}, false, {}, width, opacity};
    for (const auto& [step, losses] : smoothed_common_losses(c.runs.front(), run).at)
      ds.points.push_back({static_cast<double>(step), losses.first - losses.second});
    ChartSeries as{color, {}, false, {}, width, opacity};
    as.dots = true;
    for (const auto& r : run.evals) as.points.push_back({static_cast<double>(r.step), r.accuracy});
    any_eval = any_eval || !run.evals.empty();
    loss.series.push_back(std::move(ls));
    diff.series.push_back(std::move(ds));
    acc.series.push_back(std::move(as));
    scale.series.push_back(std::move(ss));
    legend.push_back({run.label() + (i == 0 ? " [baseline]" : ""), color, width, opacity});
  }
  if (any_skipped) loss.title += "  (x = skipped step)";
  std::vector<ChartPanel> panels;
  panels.push_back(std::move(loss));
  if (c.runs.size() > 1) panels.push_back(std::move(diff));
  if (any_eval) panels.push_back(std::move(acc));
  panels.push_back(std::move(scale));
  return render_svg_chart(
      "mixtrain compare: " + std::to_string(c.runs.size()) + " runs against " + c.runs.front().name,
      "step", panels, legend);
}

std::vector<fs::path> write_comparison(const RunComparison& c, const fs::path& out_dir) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec))
    throw sdk::UserError(out_dir.string() + ": exists and is not a folder",
                         "pass --out a folder (it is created when missing)");
  // The folder itself may be new, its parent not: a typo in a parent is not made into folders.
  const fs::path named = out_dir.has_filename() ? out_dir : out_dir.parent_path();
  const fs::path parent = named.parent_path().empty() ? fs::path(".") : named.parent_path();
  if (!fs::is_directory(out_dir, ec) && !fs::is_directory(parent, ec))
    throw sdk::UserError(
        "the folder of " + out_dir.string() + ", " + parent.string() +
            (fs::exists(parent, ec) ? ", is not a folder" : ", does not exist"),
        "create it first (mkdir -p " + parent.string() + "), or choose another --out");
  fs::create_directory(out_dir, ec);
  if (ec)
    throw sdk::UserError("cannot create " + out_dir.string() + ": " + ec.message(),
                         "pass --out a folder you can write to");
  const std::string contents[] = {comparison_json(c), comparison_markdown(c), comparison_svg(c)};
  std::vector<fs::path> written, staged;
  for (const char* name : kCompareOutputNames) {
    const auto p = out_dir / name;
    if (fs::exists(p, ec) && !fs::is_regular_file(p, ec))
      throw sdk::UserError(p.string() + ": exists and is not a file; refusing to replace it",
                           "pass --out another folder");
    written.push_back(p);
    staged.push_back(out_dir / ("." + std::string(name) + ".staged"));
  }
  // All three whole on disk under staging names first (each committed: flushed and closed, so a
  // full disk fails here, whichever file it hits), then renamed into place, which takes no space:
  // a failure leaves the previous comparison's three files as they were, never a torn one or a
  // mix of two comparisons. Committing each file to its target in turn left the first two new
  // when the third's flush failed. A staging file left by a killed compare is replaced by the next.
  struct RemoveStaged {
    const std::vector<fs::path>& paths;
    ~RemoveStaged() {
      std::error_code ignored;
      for (const auto& p : paths) fs::remove(p, ignored);
    }
  } remove_staged{staged};
  for (std::size_t i = 0; i < staged.size(); ++i) {
    sdk::AtomicFileWriter w(staged[i], /*durable=*/false, "comparison");
    w.write(contents[i].data(), contents[i].size());
    w.commit();
  }
  for (std::size_t i = 0; i < staged.size(); ++i) {
    fs::rename(staged[i], written[i], ec);
    if (ec)
      throw sdk::UserError(
          "cannot move " + staged[i].string() + " to " + written[i].string() + ": " + ec.message(),
          "check the folder's permissions, then compare again");
  }
  return written;
}

}  // namespace mixtrain::core
