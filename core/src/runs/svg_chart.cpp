#include "mixtrain/core/runs/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

namespace mixtrain::core {

namespace {

constexpr double kWidth = 900.0;
constexpr double kPlotLeft = 84.0;
constexpr double kPlotRight = 876.0;
constexpr double kLegendRow = 20.0;
constexpr double kLegendCharWidth = 7.0;  // DejaVu Sans at 12 px, on average
constexpr const char* kFont = "DejaVu Sans, Arial, Helvetica, sans-serif";

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// Tick spacing of 1, 2 or 5 times a power of ten giving about `target` intervals over `span`.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / mag;
  return (m < 1.5 ? 1.0 : m < 3.5 ? 2.0 : m < 7.5 ? 5.0 : 10.0) * mag;
}

struct Tick {
  double value;  // in data units
  std::string label;
  std::string exponent;  // non-empty: label is drawn as label^exponent
};

// A data → pixel mapping for one axis; log axes map log(value).
struct Axis {
  AxisScale scale = AxisScale::linear;
  double lo = 0.0, hi = 1.0;  // in transformed units (log10 / log2 of the value for log axes)
  std::vector<Tick> ticks;

  double transform(double v) const {
    if (scale == AxisScale::log10)
      return v > 0 ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
    if (scale == AxisScale::log2)
      return v > 0 ? std::log2(v) : std::numeric_limits<double>::quiet_NaN();
    return v;
  }
  // Pixel position between p0 (at lo) and p1 (at hi); NaN when the value cannot be drawn.
  double map(double v, double p0, double p1) const {
    const double t = transform(v);
    if (!std::isfinite(t)) return std::numeric_limits<double>::quiet_NaN();
    return p0 + (t - lo) / (hi - lo) * (p1 - p0);
  }
};

// One style per axis, so labels read as a column: fixed decimals, or scientific with the same
// mantissa digits when every tick is tiny (a loss difference of 1e-4) or huge.
std::string linear_label(double v, double step, double max_abs) {
  if (std::fabs(v) < step * 1e-9) v = 0.0;  // no "-0"
  if (max_abs >= 1e6 || max_abs < 1e-2) {
    if (v == 0.0) return "0";
    const int digits = std::max(0, static_cast<int>(std::floor(std::log10(max_abs) + 1e-9) -
                                                    std::floor(std::log10(step) + 1e-9)));
    return fmt("%.*e", digits, v);
  }
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt("%.*f", decimals, v);
}

Axis linear_axis(double mn, double mx, int target) {
  Axis a;
  // A range within a few ulps of its values (two losses 1 ulp apart) would take a step too small
  // to move a tick (v + step == v): it is drawn as one value, padded.
  const double magnitude = std::max(std::fabs(mn), std::fabs(mx));
  if (!(mx - mn > 64 * std::numeric_limits<double>::epsilon() * magnitude)) {
    mx = std::max(mn, mx);
    mn = mx;
  }
  if (!(mx > mn)) {
    const double pad = std::fabs(mn) > 0 ? std::fabs(mn) * 0.1 : 1.0;
    mn -= pad;
    mx += pad;
  }
  const double step = nice_step(mx - mn, target);
  a.lo = std::floor(mn / step + 1e-9) * step;
  a.hi = std::ceil(mx / step - 1e-9) * step;
  const double max_abs = std::max(std::fabs(a.lo), std::fabs(a.hi));
  // Counted, not stepped to hi: a sum that never reaches hi must not add ticks forever.
  const auto count = static_cast<int>(std::min(std::round((a.hi - a.lo) / step), 1000.0));
  for (int i = 0; i <= count; ++i) {
    const double v = a.lo + i * step;
    a.ticks.push_back({v, linear_label(v, step, max_abs), {}});
  }
  return a;
}

Axis log_axis(AxisScale scale, double mn, double mx) {
  Axis a;
  a.scale = scale;
  const double base = scale == AxisScale::log2 ? 2.0 : 10.0;
  const double tmn = a.transform(mn), tmx = a.transform(mx);
  // Padded, not snapped to whole powers: a loss scale sits exactly on a power of two, and a
  // curve on the frame's edge is invisible.
  const double pad = tmx > tmn ? std::max(0.05 * (tmx - tmn), 0.3) : 1.0;
  a.lo = tmn - pad;
  a.hi = tmx + pad;
  if (std::floor(a.hi) < std::ceil(a.lo) + 1) {  // fewer than two labelled powers: widen to them
    a.lo = std::min(a.lo, std::floor(tmn));
    a.hi = std::max(a.hi, std::floor(tmn) + 1);
  }
  // Tick every 1, 2, 4, 8... powers for log2 (so 2^16 gets a label), 1, 2, 3... decades for log10.
  int every = std::max(1, static_cast<int>(std::ceil((a.hi - a.lo) / 7.0)));
  if (scale == AxisScale::log2)
    while ((every & (every - 1)) != 0) ++every;
  const double first = std::ceil(a.lo / every) * every, last = std::floor(a.hi);
  // Exponents that read better as plain numbers stay plain (1, 8, 1024, 0.01).
  const bool plain =
      scale == AxisScale::log2 ? (first >= -4 && last <= 13) : (first >= -4 && last <= 5);
  for (double e = first; e <= last + 1e-9; e += every) {
    const double v = std::pow(base, e);
    if (plain)
      a.ticks.push_back({v, fmt("%g", v), {}});
    else
      a.ticks.push_back({v, scale == AxisScale::log2 ? "2" : "10", fmt("%d", static_cast<int>(e))});
  }
  return a;
}

Axis y_axis(AxisScale scale, const ChartPanel& panel) {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn;
  double pos_mn = mn, pos_mx = -mn;
  auto take = [&](double y) {
    if (!std::isfinite(y)) return;
    mn = std::min(mn, y);
    mx = std::max(mx, y);
    if (y > 0) {
      pos_mn = std::min(pos_mn, y);
      pos_mx = std::max(pos_mx, y);
    }
  };
  for (const auto& s : panel.series) {
    for (const auto& p : s.points) take(p.y);
    for (const auto& p : s.marks) take(p.y);
  }
  if (!std::isfinite(mn)) return linear_axis(0.0, 1.0, 5);  // nothing drawable
  const bool has_positive = std::isfinite(pos_mn);
  if (scale == AxisScale::automatic)
    scale =
        has_positive && mn > 0 && pos_mx / pos_mn > 100.0 ? AxisScale::log10 : AxisScale::linear;
  if (scale == AxisScale::linear) return linear_axis(mn, mx, 5);
  if (!has_positive) return linear_axis(mn, mx, 5);  // a log axis of nothing positive: fall back
  return log_axis(scale, pos_mn, pos_mx);
}

void text(std::string& out, double x, double y, const std::string& body, const char* anchor,
          const char* extra = "") {
  out += fmt(R"(<text x="%.1f" y="%.1f" text-anchor="%s"%s>)", x, y, anchor, extra);
  out += body;
  out += "</text>\n";
}

std::string tick_label(const Tick& t) {
  if (t.exponent.empty()) return xml_escape(t.label);
  return xml_escape(t.label) + R"(<tspan dy="-5" font-size="9">)" + xml_escape(t.exponent) +
         "</tspan>";
}

// One path's "d": a non-drawable point ends the current subpath. A subpath of one point (a run
// of one logged step, a finite value between NaNs) is a zero-length segment, which the round
// line caps draw as a dot; a lone moveto would draw nothing. (A series with dots has its own.)
std::string path_data(const ChartSeries& s, const Axis& x, const Axis& y, double top,
                      double bottom) {
  std::string d;
  int open = 0;  // points in the current subpath
  double last_x = 0.0, last_y = 0.0;
  auto close = [&] {
    if (open == 1 && !s.dots) d += fmt("L%.2f %.2f", last_x, last_y);
    open = 0;
  };
  for (const auto& p : s.points) {
    const double px = x.map(p.x, kPlotLeft, kPlotRight), py = y.map(p.y, bottom, top);
    if (!std::isfinite(px) || !std::isfinite(py)) {
      close();
      continue;
    }
    if (open == 0)
      d += fmt("M%.2f %.2f", px, py);
    else if (s.staircase)
      d += fmt("H%.2fV%.2f", px, py);
    else
      d += fmt("L%.2f %.2f", px, py);
    ++open;
    last_x = px;
    last_y = py;
  }
  close();
  return d;
}

std::string marks_data(const ChartSeries& s, const Axis& x, const Axis& y, double top,
                       double bottom) {
  constexpr double r = 4.0;
  std::string d;
  for (const auto& p : s.marks) {
    const double px = x.map(p.x, kPlotLeft, kPlotRight);
    if (!std::isfinite(px)) continue;
    double py = y.map(p.y, bottom, top);
    // A non-finite loss still marks its step: at the top edge, where "off the chart" belongs.
    if (!std::isfinite(py)) py = std::isfinite(p.y) && p.y <= 0 ? bottom - r : top + r;
    d += fmt("M%.2f %.2fL%.2f %.2fM%.2f %.2fL%.2f %.2f", px - r, py - r, px + r, py + r, px - r,
             py + r, px + r, py - r);
  }
  return d;
}

// Filled circles, each two arcs, at every drawable point.
std::string dots_data(const ChartSeries& s, const Axis& x, const Axis& y, double top,
                      double bottom) {
  const double r = std::max(2.5, s.width * 0.9);
  std::string d;
  for (const auto& p : s.points) {
    const double px = x.map(p.x, kPlotLeft, kPlotRight), py = y.map(p.y, bottom, top);
    if (!std::isfinite(px) || !std::isfinite(py)) continue;
    d += fmt("M%.2f %.2fa%.1f %.1f 0 1 0 %.1f 0a%.1f %.1f 0 1 0 %.1f 0", px - r, py, r, r, 2 * r, r,
             r, -2 * r);
  }
  return d;
}

}  // namespace

std::string valid_utf8(std::string_view text) {
  // nlohmann's serializer validates UTF-8 strictly and, asked to, replaces what is not.
  const std::string quoted = nlohmann::json(std::string(text))
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(quoted).get<std::string>();
}

std::string xml_escape(std::string_view text) {
  const std::string s = valid_utf8(text);
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n')
          out += '?';
        else
          out += ch;
    }
  }
  return out;
}

namespace {

// The x range is shared so steps line up between panels.
Axis shared_x_axis(const std::vector<ChartPanel>& panels) {
  double xmn = std::numeric_limits<double>::infinity(), xmx = -xmn;
  for (const auto& panel : panels)
    for (const auto& s : panel.series) {
      for (const auto& p : s.points)
        if (std::isfinite(p.x)) xmn = std::min(xmn, p.x), xmx = std::max(xmx, p.x);
      for (const auto& p : s.marks)
        if (std::isfinite(p.x)) xmn = std::min(xmn, p.x), xmx = std::max(xmx, p.x);
    }
  if (!std::isfinite(xmn)) xmn = 0.0, xmx = 1.0;
  return linear_axis(xmn, xmx, 8);
}

// Legend entries by row, each row as wide as the plot allows.
std::vector<std::vector<std::size_t>> legend_rows(const std::vector<ChartLegendEntry>& legend) {
  std::vector<std::vector<std::size_t>> rows(1);
  double row_x = kPlotLeft;
  for (std::size_t i = 0; i < legend.size(); ++i) {
    const double w = 30.0 + kLegendCharWidth * static_cast<double>(legend[i].text.size()) + 22.0;
    if (row_x + w > kPlotRight && !rows.back().empty()) {
      rows.emplace_back();
      row_x = kPlotLeft;
    }
    rows.back().push_back(i);
    row_x += w;
  }

  return rows;
}

// A panel's grid lines, tick marks and tick labels.
void write_grid_and_ticks(std::string& out, const Axis& x, const Axis& y, double top,
                          double bottom) {
  out += "<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (const auto& t : y.ticks) {
    const double py = y.map(t.value, bottom, top);
    out +=
        fmt(R"(<line x1="%.1f" y1="%.2f" x2="%.1f" y2="%.2f"/>)", kPlotLeft, py, kPlotRight, py) +
        "\n";
  }
  for (const auto& t : x.ticks) {
    const double px = x.map(t.value, kPlotLeft, kPlotRight);
    out += fmt(R"(<line x1="%.2f" y1="%.1f" x2="%.2f" y2="%.1f"/>)", px, top, px, bottom) + "\n";
  }
  out += "</g>\n";

  out += "<g class=\"ticks\" stroke=\"#444\" stroke-width=\"1\">\n";
  for (const auto& t : y.ticks) {
    const double py = y.map(t.value, bottom, top);
    out += fmt(R"(<line x1="%.1f" y1="%.2f" x2="%.1f" y2="%.2f"/>)", kPlotLeft - 5, py, kPlotLeft,
               py) +
           "\n";
  }
  for (const auto& t : x.ticks) {
    const double px = x.map(t.value, kPlotLeft, kPlotRight);
    out += fmt(R"(<line x1="%.2f" y1="%.1f" x2="%.2f" y2="%.1f"/>)", px, bottom, px, bottom + 5) +
           "\n";
  }
  out += "</g>\n<g class=\"tick-labels\" fill=\"#333\">\n";
  for (const auto& t : y.ticks)
    text(out, kPlotLeft - 8, y.map(t.value, bottom, top) + 4, tick_label(t), "end");
  for (const auto& t : x.ticks)
    text(out, x.map(t.value, kPlotLeft, kPlotRight), bottom + 18, tick_label(t), "middle");
  out += "</g>\n";
}

// A panel's series, clipped to its plot area, their dots and marks.
void write_series(std::string& out, const ChartPanel& panel, std::size_t pi, const Axis& x,
                  const Axis& y, double top, double bottom) {
  const std::string clip = fmt("plot-area-%zu", pi);
  out += fmt(R"(<clipPath id="%s"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/></clipPath>)",
             clip.c_str(), kPlotLeft, top - 1, kPlotRight - kPlotLeft, bottom - top + 2) +
         "\n";
  out +=
      fmt(R"svg(<g clip-path="url(#%s)" fill="none" stroke-linejoin="round" stroke-linecap="round">)svg",
          clip.c_str()) +
      "\n";
  for (const auto& s : panel.series)
    out += fmt(R"(<path class="%s" stroke="%s" stroke-width="%.1f" stroke-opacity="%.2f" d=")",
               xml_escape(panel.series_class).c_str(), xml_escape(s.color).c_str(), s.width,
               s.opacity) +
           path_data(s, x, y, top, bottom) + "\"/>\n";
  out += "</g>\n";
  // Outside the clip: a dot on the frame (accuracy 1.0) stays whole.
  for (const auto& s : panel.series)
    if (s.dots)
      out += fmt(R"(<path class="%s-dots" fill="%s" fill-opacity="%.2f" stroke="none" d=")",
                 xml_escape(panel.series_class).c_str(), xml_escape(s.color).c_str(), s.opacity) +
             dots_data(s, x, y, top, bottom) + "\"/>\n";
  for (const auto& s : panel.series)
    if (!s.marks.empty())
      out += fmt(R"(<path class="%s" fill="none" stroke="%s" stroke-width="1.6" d=")",
                 xml_escape(panel.mark_class).c_str(), xml_escape(s.color).c_str()) +
             marks_data(s, x, y, top, bottom) + "\"/>\n";
}

// One panel below `cursor`; returns where the next begins.
double write_panel(std::string& out, const ChartPanel& panel, std::size_t pi, const Axis& x,
                   double cursor) {
  const Axis y = y_axis(panel.y_scale, panel);
  const double top = cursor + 26.0, bottom = top + panel.height;
  std::string y_label = panel.y_label;
  if (panel.y_scale == AxisScale::automatic && y.scale == AxisScale::log10)
    y_label += " (log scale)";
  text(out, kPlotLeft, top - 9, xml_escape(panel.title), "start",
       R"( font-size="13" font-weight="bold")");

  write_grid_and_ticks(out, x, y, top, bottom);

  const double label_y = (top + bottom) / 2;
  text(out, 20, label_y, xml_escape(y_label), "middle",
       fmt(R"svg( font-size="12" transform="rotate(-90 20 %.1f)")svg", label_y).c_str());

  write_series(out, panel, pi, x, y, top, bottom);
  out +=
      fmt(R"(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444" stroke-width="1"/>)",
          kPlotLeft, top, kPlotRight - kPlotLeft, bottom - top) +
      "\n";
  return bottom + 34.0;
}

void write_legend(std::string& out, const std::vector<ChartLegendEntry>& legend,
                  const std::vector<std::vector<std::size_t>>& rows, double ly) {
  out += "<g class=\"legend\" font-size=\"12\">\n";
  for (const auto& row : rows) {
    double lx = kPlotLeft;
    for (std::size_t i : row) {
      out +=
          fmt(R"(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f" stroke-opacity="%.2f"/>)",
              lx, ly - 4, lx + 24, ly - 4, xml_escape(legend[i].color).c_str(),
              std::max(legend[i].width, 3.0), legend[i].opacity) +
          "\n";
      text(out, lx + 30, ly, xml_escape(legend[i].text), "start");
      lx += 30.0 + kLegendCharWidth * static_cast<double>(legend[i].text.size()) + 22.0;
    }
    ly += kLegendRow;
  }
}

}  // namespace

std::string render_svg_chart(const std::string& title, const std::string& x_label,
                             const std::vector<ChartPanel>& panels,
                             const std::vector<ChartLegendEntry>& legend) {
  const Axis x = shared_x_axis(panels);

  // Legend rows are laid out first: their count decides the document height.
  const auto rows = legend_rows(legend);
  double height = 48.0;
  for (const auto& panel : panels) height += 26.0 + panel.height + 34.0;
  height += 16.0 + kLegendRow * static_cast<double>(rows.size()) + 8.0;

  std::string out;
  out += R"(<?xml version="1.0" encoding="UTF-8"?>)"
         "\n";
  out += fmt(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s" font-size="11">)",
      kWidth, height, kWidth, height, kFont);
  out += "\n<title>" + xml_escape(title) + "</title>\n";
  out +=
      fmt(R"(<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>)", kWidth, height) + "\n";
  text(out, kWidth / 2, 26, xml_escape(title), "middle", R"( font-size="15" font-weight="bold")");

  double cursor = 48.0;
  for (std::size_t pi = 0; pi < panels.size(); ++pi) {
    cursor = write_panel(out, panels[pi], pi, x, cursor);
  }
  text(out, (kPlotLeft + kPlotRight) / 2, cursor - 2, xml_escape(x_label), "middle",
       R"( font-size="12")");

  write_legend(out, legend, rows, cursor + 16.0);
  out += "</g>\n</svg>\n";
  return out;
}

}  // namespace mixtrain::core
