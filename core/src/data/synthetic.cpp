// Seeded synthetic classification data ("clusters", "teacher", "images").
#include "data/byte_images.h"
#include "mixtrain/core/data/dataset.h"

#include "mixtrain/sdk/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

// Bit-identical output needs every a*b+c rounded twice, on every compiler and target.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace mixtrain::core {
namespace {

// Separate streams so that, for one seed, the class structure does not depend on `rows` and
// the first rows stay the same when more are asked for.
constexpr std::uint64_t kStructureStream = 1;
constexpr std::uint64_t kPointStream = 2;
constexpr std::uint64_t kLabelNoiseStream = 3;
constexpr std::uint64_t kCalibrationStream = 4;
constexpr std::int64_t kTeacherCalibrationRows = 2048;

[[noreturn]] void bad_spec(const std::string& field, const std::string& what,
                           std::string hint = {}) {
  if (hint.empty()) hint = "fix this field of the synthetic [data] settings";
  throw sdk::DataError("synthetic data: '" + field + "' " + what, hint);
}

constexpr std::int64_t kMaxValues = std::int64_t{1} << 34;  // 64 GiB of float32
constexpr std::int64_t kStrokesPerChannel = 3;

void validate_images(const SyntheticSpec& spec) {
  for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"channels", spec.channels},
                                    {"height", spec.height},
                                    {"width", spec.width}})
    if (value < 1 || value > 65536)
      bad_spec(name, "must be in [1, 65536], found " + std::to_string(value));
  if (spec.height < 4 || spec.width < 4)
    bad_spec(spec.height < 4 ? "height" : "width",
             "must be >= 4 for images, found " + std::to_string(std::min(spec.height, spec.width)),
             "a stroke template needs a few pixels; use e.g. height = width = 16");
  if (spec.channels > kMaxValues / spec.height / spec.width)
    bad_spec("channels", "x height x width is too large to hold in memory",
             "ask for smaller images");
  const std::int64_t side = std::min(spec.height, spec.width);
  if (spec.max_shift < 0 || 2 * spec.max_shift >= side)
    bad_spec("max_shift",
             "must be in [0, " + std::to_string((side - 1) / 2) + "] for " +
                 std::to_string(spec.height) + " x " + std::to_string(spec.width) +
                 " images, found " + std::to_string(spec.max_shift),
             "a shift must leave most of the template inside the image");
}

std::int64_t image_features(const SyntheticSpec& spec) {
  return spec.channels * spec.height * spec.width;
}

void validate(const SyntheticSpec& spec) {
  if (spec.kind != "clusters" && spec.kind != "teacher" && spec.kind != "images")
    bad_spec("kind", "is \"" + spec.kind + "\", expected \"clusters\", \"teacher\" or \"images\"",
             "set data.kind = \"clusters\" (Gaussian blobs), \"teacher\" (random-MLP labels) "
             "or \"images\" (shifted stroke templates)");
  if (spec.rows <= 0) bad_spec("rows", "must be >= 1, found " + std::to_string(spec.rows));
  if (spec.kind == "images") validate_images(spec);
  if (spec.byte_pixels && spec.kind != "images")
    bad_spec("pixels", "= \"uint8\" needs kind = \"images\", found \"" + spec.kind + "\"",
             "remove data.pixels, or set data.synthetic.kind = \"images\"");
  if (spec.byte_pixels && spec.feature_scale != 1.0)
    bad_spec("feature_scale",
             "must be 1 for byte pixels, found " + std::to_string(spec.feature_scale),
             "remove data.synthetic.feature_scale, or data.pixels = \"uint8\"");
  const std::int64_t features = spec.kind == "images" ? image_features(spec) : spec.features;
  if (features <= 0) bad_spec("features", "must be >= 1, found " + std::to_string(features));
  if (spec.classes < 2)
    bad_spec("classes", "must be >= 2, found " + std::to_string(spec.classes),
             "a classifier needs at least two classes");
  if (features > kMaxValues / spec.rows)
    bad_spec("rows",
             "x features = " + std::to_string(spec.rows) + " x " + std::to_string(features) +
                 " is too large to hold in memory",
             "ask for fewer rows or features");
  if (!(spec.feature_scale > 0.0) || !std::isfinite(spec.feature_scale))
    bad_spec("feature_scale",
             "must be a finite number > 0, found " + std::to_string(spec.feature_scale));
  if (!(spec.noise >= 0.0) || !std::isfinite(spec.noise))
    bad_spec("noise", "must be a finite number >= 0, found " + std::to_string(spec.noise));
  if (!(spec.separation >= 0.0) || !std::isfinite(spec.separation))
    bad_spec("separation",
             "must be a finite number >= 0, found " + std::to_string(spec.separation));
  if (spec.teacher_hidden <= 0 || spec.teacher_hidden > (std::int64_t{1} << 20))
    bad_spec("teacher_hidden",
             "must be in [1, 2^20], found " + std::to_string(spec.teacher_hidden));
  // The generator's own tables: a centre per class, or the teacher's two weight matrices.
  if (spec.kind != "teacher" && features > kMaxValues / spec.classes)
    bad_spec("num_classes",
             "x features = " + std::to_string(spec.classes) + " x " + std::to_string(features) +
                 " class centres or templates are too large to hold in memory",
             "ask for fewer classes or features");
  if (spec.kind == "teacher" && (spec.features > kMaxValues / spec.teacher_hidden ||
                                 spec.classes > kMaxValues / spec.teacher_hidden))
    bad_spec("teacher_hidden", "x (features + classes) is too large to hold in memory",
             "ask for a smaller teacher_hidden, fewer features or fewer classes");
  if (!(spec.label_noise >= 0.0 && spec.label_noise <= 1.0))
    bad_spec("label_noise", "must be in [0, 1], found " + std::to_string(spec.label_noise),
             "it is the probability that a label is replaced by a random class");
}

void fill_normal(std::span<float> out, DataRng& rng, double scale) {
  for (float& v : out) v = static_cast<float>(scale * rng.normal());
}

void make_clusters(const SyntheticSpec& spec, Dataset& data) {
  const auto d = static_cast<std::size_t>(spec.features);
  const auto k = static_cast<std::size_t>(spec.classes);
  std::vector<double> centres(k * d);
  DataRng structure(spec.seed, kStructureStream);
  for (std::size_t c = 0; c < k; ++c) {
    double norm2 = 0.0;
    for (std::size_t j = 0; j < d; ++j) {
      const double g = structure.normal();
      centres[c * d + j] = g;
      norm2 += g * g;
    }
    // A random direction at a fixed radius keeps the difficulty independent of `features`.
    const double scale = norm2 > 0.0 ? spec.separation / std::sqrt(norm2) : 0.0;
    for (std::size_t j = 0; j < d; ++j) centres[c * d + j] *= scale;
  }
  DataRng points(spec.seed, kPointStream);
  for (std::size_t i = 0; i < static_cast<std::size_t>(spec.rows); ++i) {
    const auto label = static_cast<std::size_t>(points.below(k));
    data.y[i] = static_cast<std::int32_t>(label);
    for (std::size_t j = 0; j < d; ++j)
      data.x[i * d + j] = static_cast<float>(centres[label * d + j] + spec.noise * points.normal());
  }
}

// Rows go through the teacher kBlockRows at a time, transposed so that the innermost loop runs
// across rows: kBlockRows independent sums, which the compiler keeps in vector registers, where
// one row at a time was one long chain of dependent additions. Each row still adds its terms
// in the same order (b, then j = 0, 1, ...), every product and sum rounded on its own, so the
// labels are bit for bit those of the row-at-a-time loop (Synthetic.GoldenFingerprints). The
// wide MLP's 16,384 rows of 1,024 features took 1.2 s to draw instead of 2.1 s (AMD EPYC, AVX2,
// GCC 12 -O3); every `mixtrain check` and `train` of those configs draws them. Of that, w[j]
// read once per j and the __restrict pointers (weights and rows never overlap) are the step
// from 1.5-1.6 s to 1.2 s.
constexpr std::size_t kBlockRows = 8;

struct Teacher {
  std::size_t in, hidden, out;
  std::vector<double> w1, b1, w2, b2;  // [hidden, in], [hidden], [out, hidden], [out]

  // x is [rows, in] (rows <= kBlockRows), z is [rows, out]. xt and h are scratch:
  // xt [in, kBlockRows], h [hidden, kBlockRows].
  void logits(const float* x, std::size_t rows, std::vector<double>& xt, std::vector<double>& h,
              double* z) const {
    std::fill(xt.begin(), xt.end(), 0.0);  // rows past `rows` compute on zeros, never read
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < in; ++j)
        xt[j * kBlockRows + r] = static_cast<double>(x[r * in + j]);
    double acc[kBlockRows];
    const double* __restrict xs = xt.data();
    for (std::size_t u = 0; u < hidden; ++u) {
      const double* __restrict w = w1.data() + u * in;
      for (std::size_t r = 0; r < kBlockRows; ++r) acc[r] = b1[u];
      for (std::size_t j = 0; j < in; ++j) {
        const double wj = w[j];
        const double* __restrict xj = xs + j * kBlockRows;
        for (std::size_t r = 0; r < kBlockRows; ++r) acc[r] += wj * xj[r];
      }
      for (std::size_t r = 0; r < kBlockRows; ++r)
        h[u * kBlockRows + r] = acc[r] > 0.0 ? acc[r] : 0.0;
    }
    for (std::size_t c = 0; c < out; ++c) {
      const double* w = w2.data() + c * hidden;
      for (std::size_t r = 0; r < kBlockRows; ++r) acc[r] = b2[c];
      for (std::size_t u = 0; u < hidden; ++u) {
        const double* hu = h.data() + u * kBlockRows;
        for (std::size_t r = 0; r < kBlockRows; ++r) acc[r] += w[u] * hu[r];
      }
      for (std::size_t r = 0; r < rows; ++r) z[r * out + c] = acc[r];
    }
  }
};

void make_teacher(const SyntheticSpec& spec, Dataset& data) {
  Teacher t{static_cast<std::size_t>(spec.features),
            static_cast<std::size_t>(spec.teacher_hidden),
            static_cast<std::size_t>(spec.classes),
            {},
            {},
            {},
            {}};
  DataRng structure(spec.seed, kStructureStream);
  auto draw = [&](std::vector<double>& v, std::size_t n, double scale) {
    v.resize(n);
    for (double& e : v) e = scale * structure.normal();
  };
  draw(t.w1, t.hidden * t.in, 1.0 / std::sqrt(static_cast<double>(t.in)));
  draw(t.b1, t.hidden, 0.1);
  draw(t.w2, t.out * t.hidden, 1.0 / std::sqrt(static_cast<double>(t.hidden)));
  t.b2.assign(t.out, 0.0);

  std::vector<double> xt(t.in * kBlockRows), h(t.hidden * kBlockRows), z(kBlockRows * t.out);
  // Centre each logit over a fixed calibration sample: a raw random teacher lets a few classes
  // win almost everywhere, and the sample is independent of `rows` so labels stay stable.
  {
    DataRng calibration(spec.seed, kCalibrationStream);
    std::vector<float> x(kBlockRows * t.in);
    std::vector<double> mean(t.out, 0.0);
    static_assert(kTeacherCalibrationRows % kBlockRows == 0);
    for (std::int64_t i = 0; i < kTeacherCalibrationRows; i += kBlockRows) {
      fill_normal(x, calibration, 1.0);  // kBlockRows rows, drawn in row order
      t.logits(x.data(), kBlockRows, xt, h, z.data());
      for (std::size_t r = 0; r < kBlockRows; ++r)
        for (std::size_t c = 0; c < t.out; ++c) mean[c] += z[r * t.out + c];
    }
    for (std::size_t c = 0; c < t.out; ++c)
      t.b2[c] = -mean[c] / static_cast<double>(kTeacherCalibrationRows);
  }

  DataRng points(spec.seed, kPointStream);
  fill_normal(data.x, points, 1.0);
  const auto rows = static_cast<std::size_t>(spec.rows);
  for (std::size_t i = 0; i < rows; i += kBlockRows) {
    const std::size_t block = std::min(kBlockRows, rows - i);
    t.logits(data.x.data() + i * t.in, block, xt, h, z.data());
    for (std::size_t r = 0; r < block; ++r) {
      const double* zr = z.data() + r * t.out;
      data.y[i + r] = static_cast<std::int32_t>(std::max_element(zr, zr + t.out) - zr);
    }
  }
}

// Class templates: per class and channel, kStrokesPerChannel bars two pixels thick in one of
// four orientations (horizontal, vertical, the two diagonals), a length of a quarter to a half
// of the image and an intensity in [0.75, 1), centred in the middle half of the image; overlaps
// keep the brighter.
std::vector<float> image_templates(const SyntheticSpec& spec) {
  const std::int64_t C = spec.channels, H = spec.height, W = spec.width;
  const auto plane = static_cast<std::size_t>(H * W);
  std::vector<float> templates(static_cast<std::size_t>(spec.classes) * plane *
                               static_cast<std::size_t>(C));
  DataRng structure(spec.seed, kStructureStream);
  const std::int64_t side = std::min(H, W);
  const std::int64_t shortest = std::max<std::int64_t>(2, side / 4);
  const std::int64_t longest = std::max(shortest, side / 2);
  static constexpr std::int64_t kStep[4][2] = {{0, 1}, {1, 0}, {1, 1}, {1, -1}};  // (dy, dx)
  for (std::int64_t c = 0; c < spec.classes; ++c)
    for (std::int64_t ch = 0; ch < C; ++ch) {
      float* t = templates.data() + static_cast<std::size_t>(c * C + ch) * plane;
      for (std::int64_t k = 0; k < kStrokesPerChannel; ++k) {
        const auto orientation = structure.below(4);
        const auto length = shortest + static_cast<std::int64_t>(structure.below(
                                           static_cast<std::uint64_t>(longest - shortest + 1)));
        const auto cy = H / 4 + static_cast<std::int64_t>(
                                    structure.below(static_cast<std::uint64_t>(H - H / 2)));
        const auto cx = W / 4 + static_cast<std::int64_t>(
                                    structure.below(static_cast<std::uint64_t>(W - W / 2)));
        const auto value = static_cast<float>(0.75 + 0.25 * structure.uniform());
        const std::int64_t dy = kStep[orientation][0], dx = kStep[orientation][1];
        // Two pixels thick: the bar and its neighbour across it (below a horizontal bar, right
        // of the others).
        const std::int64_t ty = orientation == 0 ? 1 : 0, tx = orientation == 0 ? 0 : 1;
        for (std::int64_t s = -length / 2; s < length - length / 2; ++s)
          for (std::int64_t k = 0; k < 2; ++k) {
            const std::int64_t y = cy + s * dy + k * ty, x = cx + s * dx + k * tx;
            if (y < 0 || y >= H || x < 0 || x >= W) continue;
            float& pixel = t[static_cast<std::size_t>(y * W + x)];
            pixel = std::max(pixel, value);
          }
      }
    }
  return templates;
}

void make_images(const SyntheticSpec& spec, Dataset& data) {
  const std::vector<float> templates = image_templates(spec);
  const std::int64_t C = spec.channels, H = spec.height, W = spec.width;
  const auto plane = static_cast<std::size_t>(H * W);
  const auto width = static_cast<std::size_t>(C) * plane;
  const auto shifts = static_cast<std::uint64_t>(2 * spec.max_shift + 1);
  DataRng points(spec.seed, kPointStream);
  for (std::size_t i = 0; i < static_cast<std::size_t>(spec.rows); ++i) {
    const auto label =
        static_cast<std::size_t>(points.below(static_cast<std::uint64_t>(spec.classes)));
    data.y[i] = static_cast<std::int32_t>(label);
    const std::int64_t sy = static_cast<std::int64_t>(points.below(shifts)) - spec.max_shift;
    const std::int64_t sx = static_cast<std::int64_t>(points.below(shifts)) - spec.max_shift;
    const float* t = templates.data() + label * width;
    float* out = data.x.data() + i * width;
    for (std::int64_t ch = 0; ch < C; ++ch)
      for (std::int64_t y = 0; y < H; ++y)
        for (std::int64_t x = 0; x < W; ++x) {
          // The template moved by (sy, sx): pixel (y, x) shows template pixel (y − sy, x − sx).
          const std::int64_t ty = y - sy, tx = x - sx;
          const double base = (ty < 0 || ty >= H || tx < 0 || tx >= W)
                                  ? 0.0
                                  : static_cast<double>(t[static_cast<std::size_t>(ch) * plane +
                                                          static_cast<std::size_t>(ty * W + tx)]);
          out[static_cast<std::size_t>(ch) * plane + static_cast<std::size_t>(y * W + x)] =
              static_cast<float>(base + spec.noise * points.normal());
        }
  }
}

}  // namespace

Dataset make_synthetic(const SyntheticSpec& spec) {
  validate(spec);
  Dataset data;
  data.rows = spec.rows;
  data.features = spec.kind == "images" ? image_features(spec) : spec.features;
  data.classes = spec.classes;
  data.x.resize(static_cast<std::size_t>(spec.rows * data.features));
  data.y.resize(static_cast<std::size_t>(spec.rows));
  if (spec.kind == "images") {
    data.sample_shape = {spec.channels, spec.height, spec.width};
    make_images(spec, data);
  } else if (spec.kind == "clusters") {
    make_clusters(spec, data);
  } else {
    make_teacher(spec, data);
  }
  if (spec.label_noise > 0.0) {
    DataRng noise(spec.seed, kLabelNoiseStream);
    for (auto& label : data.y) {
      // Draw both numbers for every row so a row's fate does not depend on earlier rows.
      const double u = noise.uniform();
      const auto replacement =
          static_cast<std::int32_t>(noise.below(static_cast<std::uint64_t>(spec.classes)));
      if (u < spec.label_noise) label = replacement;
    }
  }
  if (spec.feature_scale != 1.0)
    for (float& v : data.x) v = static_cast<float>(v * spec.feature_scale);
  if (spec.byte_pixels) {
    // round(clamp(v, 0, 1)·255): exact in double, then the bytes decode as b / 255.
    std::vector<std::uint8_t> bytes(data.x.size());
    for (std::size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<std::uint8_t>(
          std::floor(std::clamp(static_cast<double>(data.x[i]), 0.0, 1.0) * 255.0 + 0.5));
    store_image_bytes(data, std::move(bytes), /*keep_bytes=*/true);
  }
  check_dataset(data, "synthetic data (" + spec.kind + ")");
  return data;
}

}  // namespace mixtrain::core
