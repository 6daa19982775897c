// SVG line charts written by hand: panels stacked vertically over one shared x range, a legend
// below them. Used by `mixtrain compare` (compare.svg); nothing here knows about training runs.
//
// Contract
// - render_svg_chart() returns one standalone SVG document (xmlns, viewBox, width 900) that any
//   browser or rsvg-convert renders without external resources. All text is XML-escaped.
// - Each series becomes exactly one <path class="<panel.series_class>"> per panel (a gap in the
//   data — a non-finite y, or y <= 0 on a log axis — starts a new subpath, never a new element);
//   its marks, if any, become one <path class="<panel.mark_class>">; with `dots`, its drawable
//   points also become one filled <path class="<panel.series_class>-dots"> (so a series of a
//   single point still shows); without dots, a subpath of one point is a zero-length segment,
//   which the round line caps draw as a dot.
// - Axis ranges cover every finite point (a range within a few ulps is drawn as one value); a log
// axis is used when asked for, or with
//   AxisScale::automatic when the positive data spans more than two decades (the y label then
//   ends in " (log scale)").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mixtrain::core {

enum class AxisScale { linear, log10, log2, automatic };

struct ChartPoint {
  double x = 0.0, y = 0.0;
};

struct ChartSeries {
  std::string color;               // any SVG colour, e.g. "#1f77b4"
  std::vector<ChartPoint> points;  // in x order
  bool staircase = false;          // hold y until the next point (a piecewise-constant value)
  std::vector<ChartPoint> marks;   // drawn as crosses; a non-finite y is drawn at the top edge
  double width = 1.6;
  double opacity = 1.0;
  bool dots = false;  // a dot at every point: for sparse series such as evaluations
};

struct ChartPanel {
  std::string title, y_label;
  AxisScale y_scale = AxisScale::linear;
  double height = 240.0;  // of the plot area, in px
  std::string series_class = "series", mark_class = "marks";
  std::vector<ChartSeries> series;
};

struct ChartLegendEntry {
  std::string text, color;
  double width = 3.0, opacity = 1.0;  // of the swatch, to match its series
};

std::string render_svg_chart(const std::string& title, const std::string& x_label,
                             const std::vector<ChartPanel>& panels,
                             const std::vector<ChartLegendEntry>& legend);

// `text` escaped for XML character data and attributes: markup characters as entities, control
// characters other than tab and newline as '?', and bytes that are not valid UTF-8 (a run folder's
// name may hold any) as U+FFFD, so the document stays well-formed.
std::string xml_escape(std::string_view text);

// `text` with every byte sequence that is not valid UTF-8 replaced by U+FFFD.
std::string valid_utf8(std::string_view text);

}  // namespace mixtrain::core
