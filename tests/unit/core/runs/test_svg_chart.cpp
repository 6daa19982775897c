// compare.svg: a well-formed standalone SVG with one curve per run per panel and escaped text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "compare_test_support.h"
#include "mixtrain/core/runs/comparison.h"
#include "mixtrain/core/runs/svg_chart.h"

namespace mixtrain::testing_compare {
namespace {

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// A small well-formedness check: every tag closes in order, no raw '<' or stray '&' in text,
// quoted attribute values. Returns "" when fine, else what went wrong.
std::string check_xml(const std::string& s) {
  std::vector<std::string> open;
  std::size_t i = 0, roots = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      auto semi = s.find(';', i);
      const auto ent = s.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;")
        return "bad entity at " + std::to_string(i) + ": " + ent;
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') {
      ++i;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      i = s.find("?>", i) + 2;
      continue;
    }
    // Scan to the tag's end, skipping quoted attribute values (which may hold '>').
    std::size_t j = i + 1;
    char quote = 0;
    for (; j < s.size(); ++j) {
      if (quote) {
        if (s[j] == quote)
          quote = 0;
        else if (s[j] == '<')
          return "raw '<' in an attribute at " + std::to_string(j);
      } else if (s[j] == '"' || s[j] == '\'') {
        quote = s[j];
      } else if (s[j] == '<') {
        return "raw '<' inside a tag at " + std::to_string(j);
      } else if (s[j] == '>') {
        break;
      }
    }
    if (j >= s.size()) return "unterminated tag at " + std::to_string(i);
    std::string tag = s.substr(i + 1, j - i - 1);
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      const auto name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (tag.back() != '/') {
      const auto name = tag.substr(0, tag.find_first_of(" \n\t"));
      if (open.empty()) ++roots;
      open.push_back(name);
    } else if (open.empty()) {
      return "self-closed tag outside the root";
    }
    i = j + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

class Chart : public RunFolders {};

TEST_F(Chart, CompareSvgIsOneWellFormedStandaloneDocument) {
  auto c = core::compare_runs({baseline(), fp16_run(), interrupted_run()});
  const auto svg = core::comparison_svg(c);
  EXPECT_EQ(check_xml(svg), "");
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_NE(svg.find(R"(xmlns="http://www.w3.org/2000/svg")"), std::string::npos);
  EXPECT_NE(svg.find("viewBox=\"0 0 900 "), std::string::npos);
  EXPECT_EQ(count(svg, R"(class="loss-curve")"), 3u);
  EXPECT_EQ(count(svg, R"(class="scale-curve")"), 3u);
  EXPECT_EQ(count(svg, R"(class="diff-curve")"), 3u);
  EXPECT_EQ(count(svg, R"(class="eval-curve")"), 3u);
  // Each run evaluated at least once; a dot per evaluation shows even a single one.
  EXPECT_EQ(count(svg, R"(class="eval-curve-dots")"), 3u);
  EXPECT_NE(svg.find("eval accuracy"), std::string::npos);
  EXPECT_NE(svg.find("difference from the baseline"), std::string::npos);
  // fp16 and the interrupted run each skipped one step; the baseline none.
  EXPECT_EQ(count(svg, R"(class="skip-marks")"), 2u);
  for (const char* label :
       {"base (fp32/none) [baseline]", "fp16 (fp16-mixed/dynamic)", "cut (bf16-mixed/static)"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
}

// The y pixel coordinates of every point of the n-th path of class `cls` (M/L commands only).
std::vector<double> path_ys(const std::string& svg, const std::string& cls, std::size_t n) {
  std::size_t p = 0;
  for (std::size_t i = 0; i <= n; ++i) p = svg.find("class=\"" + cls + "\"", p + 1);
  const auto d = svg.find(" d=\"", p) + 4;
  const std::string data = svg.substr(d, svg.find('"', d) - d);
  std::vector<double> ys;
  for (std::size_t k = 0; k < data.size(); ++k)
    if (data[k] == 'M' || data[k] == 'L') {
      double x = 0, y = 0;
      std::sscanf(data.c_str() + k + 1, "%lf %lf", &x, &y);
      ys.push_back(y);
    }
  return ys;
}

TEST_F(Chart, TheDifferencePanelPlotsSmoothedLossMinusTheBaselines) {
  std::vector<double> flat(12, 1.0), shifted(12, 1.1), drifting;
  for (int i = 0; i < 12; ++i) drifting.push_back(1.0 + 0.01 * i);
  const auto svg = core::comparison_svg(
      core::compare_runs({curve_run("base", 1, 1, flat), curve_run("shifted", 1, 1, shifted),
                          curve_run("drift", 1, 1, drifting)}));
  EXPECT_EQ(check_xml(svg), "");
  EXPECT_NE(svg.find("5-step trailing mean"), std::string::npos);
  const auto base = path_ys(svg, "diff-curve", 0), up = path_ys(svg, "diff-curve", 1),
             drift = path_ys(svg, "diff-curve", 2);
  ASSERT_EQ(base.size(), 8u);  // steps 5..12: the full windows
  ASSERT_EQ(up.size(), 8u);
  // The baseline is the zero line; a constant offset is a parallel line above it (smaller y);
  // a drift climbs away from it.
  for (double y : base) EXPECT_DOUBLE_EQ(y, base[0]);
  for (double y : up) EXPECT_NEAR(y, up[0], 0.01);
  EXPECT_LT(up[0], base[0]);
  EXPECT_LT(drift.back(), drift.front());
  // No run evaluated: no empty eval panel.
  EXPECT_EQ(count(svg, "eval-curve"), 0u);
}

TEST_F(Chart, OneRunAloneHasNoDifferencePanel) {
  const auto svg = core::comparison_svg(core::compare_runs({baseline()}));
  EXPECT_EQ(count(svg, "diff-curve"), 0u);
  EXPECT_EQ(count(svg, R"(class="eval-curve")"), 1u);
}

TEST_F(Chart, RunNamesAreEscapedForXml) {
  baseline();
  fp16_run("a<b>&\"c'");
  const auto svg = core::comparison_svg(core::compare_runs({root_ / "base", root_ / "a<b>&\"c'"}));
  EXPECT_EQ(check_xml(svg), "");
  EXPECT_NE(svg.find("a&lt;b&gt;&amp;&quot;c&apos;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b>"), std::string::npos);
}

TEST_F(Chart, TheCheckerItselfCatchesBrokenDocuments) {
  EXPECT_NE(check_xml("<svg><g></svg>"), "");
  EXPECT_NE(check_xml("<svg>a & b</svg>"), "");
  EXPECT_NE(check_xml("<svg/><svg/>"), "");
  EXPECT_EQ(check_xml("<svg><g a=\"x>y\"/></svg>"), "");
}

core::ChartPanel panel_of(std::vector<core::ChartPoint> pts, core::AxisScale scale) {
  core::ChartPanel p;
  p.title = "t";
  p.y_label = "y";
  p.y_scale = scale;
  p.series.push_back({"#000", std::move(pts), false, {}, 1.0});
  return p;
}

std::string first_d(const std::string& svg) {
  auto p = svg.find("class=\"series\"");
  auto d = svg.find(" d=\"", p) + 4;
  return svg.substr(d, svg.find('"', d) - d);
}

TEST(SvgChart, ANonFinitePointStartsANewSubpathInTheSameElement) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto svg = core::render_svg_chart(
      "t", "step", {panel_of({{0, 1}, {1, 2}, {2, nan}, {3, 2}, {4, 1}}, core::AxisScale::linear)},
      {});
  EXPECT_EQ(count(svg, "class=\"series\""), 1u);
  const auto d = first_d(svg);
  EXPECT_EQ(count(d, "M"), 2u) << d;
  EXPECT_EQ(count(d, "L"), 2u) << d;
}

// A subpath of one point (one logged step, a finite value between NaNs) is a zero-length segment,
// which the round caps draw; a lone moveto draws nothing.
TEST(SvgChart, ALonePointOfALineIsAZeroLengthSegment) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto d = first_d(core::render_svg_chart(
      "t", "step",
      {panel_of({{0, 1}, {1, nan}, {2, 2}, {3, nan}, {4, 1}, {5, 3}}, core::AxisScale::linear)},
      {}));
  EXPECT_EQ(count(d, "M"), 3u) << d;
  EXPECT_EQ(count(d, "L"), 3u) << d;  // one per lone point, one between the last two
  // The lone point's segment starts and ends where it moved to.
  const auto m = d.find('M'), l = d.find('L');
  ASSERT_NE(l, std::string::npos);
  EXPECT_EQ(d.substr(m + 1, l - m - 1), d.substr(l + 1, d.find('M', l) - l - 1)) << d;
  d = first_d(
      core::render_svg_chart("t", "step", {panel_of({{3, 0.5}}, core::AxisScale::linear)}, {}));
  EXPECT_EQ(count(d, "L"), 1u) << d;
}

// Values a few ulps apart (two runs' equal losses) give finitely many ticks.
TEST(SvgChart, AFlatRangeOfUlpsHasFinitelyManyTicks) {
  const auto svg = core::render_svg_chart(
      "t", "step", {panel_of({{0, 1.0}, {1, std::nextafter(1.0, 2.0)}}, core::AxisScale::linear)},
      {});
  EXPECT_LT(count(svg, "<text"), 40u);
  EXPECT_EQ(check_xml(svg), "");
}

TEST(SvgChart, DotsDrawEvenASinglePoint) {
  auto p = panel_of({{5.0, 0.5}}, core::AxisScale::linear);
  p.series[0].dots = true;
  const auto svg = core::render_svg_chart("t", "x", {p}, {});
  EXPECT_EQ(first_d(svg).find('L'), std::string::npos) << "one point: no line to draw";
  ASSERT_EQ(count(svg, "class=\"series-dots\""), 1u);
  const auto at = svg.find("class=\"series-dots\"");
  const auto d = svg.find(" d=\"", at) + 4;
  EXPECT_EQ(count(svg.substr(d, svg.find('"', d) - d), "a"), 2u) << "a circle of two arcs";
  p.series[0].dots = false;
  EXPECT_EQ(count(core::render_svg_chart("t", "x", {p}, {}), "series-dots"), 0u);
}

TEST(SvgChart, TinyLinearTicksShareOneScientificStyle) {
  // A loss difference of a few 1e-4: ticks every 5e-5 from -2e-4 to 1e-4.
  const auto svg = core::render_svg_chart(
      "t", "x", {panel_of({{0, -2e-4}, {1, 1e-4}}, core::AxisScale::linear)}, {});
  for (const char* label :
       {">-2.0e-04</text>", ">-1.5e-04</text>", ">5.0e-05</text>", ">1.0e-04</text>", ">0</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(svg.find(">0.0000"), std::string::npos);
  // Ordinary ranges keep fixed decimals.
  const auto plain = core::render_svg_chart(
      "t", "x", {panel_of({{0, 0.5}, {1, 1.0}}, core::AxisScale::linear)}, {});
  EXPECT_NE(plain.find(">0.5</text>"), std::string::npos);
}

TEST(SvgChart, AutomaticLossAxisGoesLogarithmicBeyondTwoDecades) {
  auto wide = core::render_svg_chart(
      "t", "step", {panel_of({{0, 5.0}, {1, 0.5}, {2, 0.004}}, core::AxisScale::automatic)}, {});
  EXPECT_NE(wide.find(">y (log scale)<"), std::string::npos);
  // Decade ticks inside the data's range (0.004 .. 5, padded a little): 0.01, 0.1, 1.
  for (const char* tick : {">0.01<", ">0.1<", ">1<"})
    EXPECT_NE(wide.find(tick), std::string::npos) << tick;
  EXPECT_EQ(wide.find(">100<"), std::string::npos);
  auto narrow = core::render_svg_chart(
      "t", "step", {panel_of({{0, 5.0}, {1, 0.5}, {2, 0.06}}, core::AxisScale::automatic)}, {});
  EXPECT_EQ(narrow.find("(log scale)"), std::string::npos);
}

TEST(SvgChart, Log2AxisLabelsPowersOfTwo) {
  auto plain = core::render_svg_chart("t", "step",
                                      {panel_of({{0, 1024}, {1, 64}}, core::AxisScale::log2)}, {});
  for (const char* tick : {">64<", ">1024<"})
    EXPECT_NE(plain.find(tick), std::string::npos) << tick;
  // Large scales are written 2^k: a base "2" and a raised exponent.
  auto big = core::render_svg_chart(
      "t", "step", {panel_of({{0, 65536}, {1, 16777216}}, core::AxisScale::log2)}, {});
  EXPECT_NE(big.find(R"(2<tspan dy="-5" font-size="9">24</tspan>)"), std::string::npos);
  EXPECT_EQ(check_xml(big), "");
}

TEST(SvgChart, XmlEscapeCoversTheFiveSpecialCharacters) {
  EXPECT_EQ(core::xml_escape("<a href=\"x\">Tom & Jerry's</a>"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; Jerry&apos;s&lt;/a&gt;");
}

}  // namespace
}  // namespace mixtrain::testing_compare
