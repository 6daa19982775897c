// The attention facet of CpuBackend: head permutes (every dtype pair, KV-cache offset, round
// trips, untouched cache rows), the masked softmax (rows sum to 1, masked entries exactly 0,
// stability, in place) and its backward against a finite difference of the forward, and the
// argument errors; flash attention (facet 1.1): its backward against a finite difference of its
// forward on every ISA variant this CPU runs, the variants' agreement, the same bits on one thread
// and on two, supports(), and the bf16 tile products (flash_products) against the FP32 ones.
#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "backend_test_util.h"
#include "cpu_features.h"
#include "cpu_tile_matmul.h"
#include "isa_variants.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr DType kFloats[] = {DType::fp32, DType::bf16, DType::fp16};

// Element index of x [N, T, P, H, D] and of y [P, N, H, T', D] for (n, t, p, h, d).
struct Layout {
  sdk::HeadLayout l;
  std::int64_t x_at(std::int64_t n, std::int64_t t, std::int64_t p, std::int64_t h,
                    std::int64_t d) const {
    return (((n * l.tokens + t) * l.parts + p) * l.heads + h) * l.head_dim + d;
  }
  std::int64_t y_at(std::int64_t n, std::int64_t t, std::int64_t p, std::int64_t h,
                    std::int64_t d) const {
    return (((p * l.batch + n) * l.heads + h) * l.capacity() + l.head_offset + t) * l.head_dim + d;
  }
  Shape x_shape() const { return {l.batch, l.tokens, l.parts * l.heads * l.head_dim}; }
  Shape y_shape() const { return {l.parts * l.batch * l.heads, l.capacity(), l.head_dim}; }
};

Layout cache_layout() {
  sdk::HeadLayout l;
  l.batch = 2;
  l.tokens = 3;
  l.parts = 3;
  l.heads = 2;
  l.head_dim = 5;
  l.head_tokens = 7;
  l.head_offset = 2;
  return {l};
}

std::string pair_name(DType a, DType b) {
  return std::string(sdk::dtype_name(a)) + " -> " + std::string(sdk::dtype_name(b));
}

TEST(backend_cpu_attention, SplitHeadsWritesTheWindowAndLeavesCacheRowsAlone) {
  CpuBackend be(2);
  const Layout lay = cache_layout();
  const auto& l = lay.l;
  for (DType xt : kFloats)
    for (DType yt : kFloats) {
      const auto values = random_values(static_cast<std::size_t>(lay.x_shape().numel()), 1, -3, 3);
      DeviceTensor x(be, xt, lay.x_shape(), values);
      const float sentinel = 42.0f;
      DeviceTensor y(be, yt, lay.y_shape(),
                     std::vector<float>(static_cast<std::size_t>(lay.y_shape().numel()), sentinel));
      sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, l, y);
      const auto got = y.get();
      std::vector<bool> written(got.size(), false);
      for (std::int64_t n = 0; n < l.batch; ++n)
        for (std::int64_t t = 0; t < l.tokens; ++t)
          for (std::int64_t p = 0; p < l.parts; ++p)
            for (std::int64_t h = 0; h < l.heads; ++h)
              for (std::int64_t d = 0; d < l.head_dim; ++d) {
                const auto yi = static_cast<std::size_t>(lay.y_at(n, t, p, h, d));
                // One rounding: the x value as stored, rounded once into y's dtype.
                const float want = stored_value(
                    stored_value(values[static_cast<std::size_t>(lay.x_at(n, t, p, h, d))], xt),
                    yt);
                ASSERT_EQ(got[yi], want) << pair_name(xt, yt) << " n" << n << " t" << t << " p" << p
                                         << " h" << h << " d" << d;
                written[yi] = true;
              }
      for (std::size_t i = 0; i < got.size(); ++i)
        if (!written[i]) {
          ASSERT_EQ(got[i], sentinel) << pair_name(xt, yt) << " cache row element " << i;
        }
    }
}

TEST(backend_cpu_attention, SplitThenMergeRoundTrips) {
  CpuBackend be(2);
  for (std::int64_t offset : {0, 2}) {
    Layout lay = cache_layout();
    lay.l.head_offset = offset;
    for (DType xt : kFloats)
      for (DType yt : kFloats) {
        const auto values = random_values(static_cast<std::size_t>(lay.x_shape().numel()), 2);
        DeviceTensor x(be, xt, lay.x_shape(), values);
        DeviceTensor y(be, yt, lay.y_shape());
        DeviceTensor back(be, xt, lay.x_shape());
        sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, lay.l, y);
        sdk::facet<sdk::AttentionFacet>(be)->merge_heads(y, lay.l, back);
        const auto before = x.get(), after = back.get();
        for (std::size_t i = 0; i < before.size(); ++i) {
          // Exact when y holds every x value (same dtype or fp32), else x rounded through y.
          const float want = stored_value(stored_value(before[i], yt), xt);
          ASSERT_EQ(after[i], want)
              << pair_name(xt, yt) << " offset " << offset << " element " << i;
          if (xt == yt || yt == DType::fp32) {
            ASSERT_EQ(after[i], before[i]);
          }
        }
      }
  }
}

TEST(backend_cpu_attention, MergeHeadsOfALargeLayoutMatchesTheIndexFormula) {
  // Above the single-thread threshold, so the permute runs on the OpenMP team.
  CpuBackend be(2);
  sdk::HeadLayout l;
  l.batch = 4;
  l.tokens = 64;
  l.heads = 4;
  l.head_dim = 32;
  const Layout lay{l};
  const auto values = random_values(static_cast<std::size_t>(lay.y_shape().numel()), 3);
  DeviceTensor y(be, DType::fp32, lay.y_shape(), values);
  DeviceTensor x(be, DType::bf16, lay.x_shape());
  sdk::facet<sdk::AttentionFacet>(be)->merge_heads(y, l, x);
  const auto got = x.get();
  for (std::int64_t n = 0; n < l.batch; ++n)
    for (std::int64_t t = 0; t < l.tokens; ++t)
      for (std::int64_t h = 0; h < l.heads; ++h)
        for (std::int64_t d = 0; d < l.head_dim; ++d)
          ASSERT_EQ(
              got[static_cast<std::size_t>(lay.x_at(n, t, 0, h, d))],
              stored_value(values[static_cast<std::size_t>(lay.y_at(n, t, 0, h, d))], DType::bf16));
}

void expect_backend_error(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no BackendError (expected one mentioning '" << needle << "')";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(backend_cpu_attention, PermuteArgumentErrors) {
  CpuBackend be(1);
  const Layout lay = cache_layout();
  DeviceTensor x(be, DType::fp32, lay.x_shape());
  DeviceTensor y(be, DType::bf16, lay.y_shape());
  DeviceTensor short_y(be, DType::bf16, Shape{lay.y_shape().numel() - 1});
  DeviceTensor ints(be, DType::int32, lay.x_shape());
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, lay.l, short_y); },
                       "backend_cpu.split_heads: y");
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->merge_heads(short_y, lay.l, x); },
                       "backend_cpu.merge_heads: y");
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(ints, lay.l, y); },
                       "int32");
  sdk::HeadLayout past = lay.l;
  past.head_offset = 5;  // 5 + 3 tokens > 7
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, past, y); },
                       "head_offset");
  sdk::HeadLayout small = lay.l;
  small.head_tokens = 2;  // below tokens
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, small, y); },
                       "head_tokens");
  sdk::HeadLayout no_heads = lay.l;
  no_heads.heads = 0;
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(x, no_heads, y); },
                       "layout");
  // A permute cannot run in place.
  sdk::HeadLayout flat;
  flat.tokens = 4;
  flat.head_dim = 3;
  DeviceTensor same(be, DType::fp32, Shape{12});
  expect_backend_error([&] { sdk::facet<sdk::AttentionFacet>(be)->split_heads(same, flat, same); },
                       "overlap");
}

// Double-precision softmax of one row of `scale * s` over its first `visible` entries.
std::vector<double> reference_softmax(const float* s, std::int64_t cols, std::int64_t visible,
                                      double scale) {
  std::vector<double> p(static_cast<std::size_t>(cols), 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < visible; ++j) mx = std::max(mx, scale * s[j]);
  double sum = 0.0;
  for (std::int64_t j = 0; j < visible; ++j) sum += std::exp(scale * s[j] - mx);
  for (std::int64_t j = 0; j < visible; ++j)
    p[static_cast<std::size_t>(j)] = std::exp(scale * s[j] - mx) / sum;
  return p;
}

TEST(backend_cpu_attention, SoftmaxRowsSumToOneAndMaskedEntriesAreExactlyZero) {
  CpuBackend be(2);
  struct Case {
    std::int64_t batch, rows, cols;
    bool causal;
  };
  for (const Case c : {Case{3, 5, 9, true}, Case{2, 7, 7, true}, Case{3, 5, 9, false},
                       Case{64, 32, 48, true}}) {  // the last one runs on the OpenMP team
    const sdk::SoftmaxShape shape{c.batch, c.rows, c.cols, c.causal};
    const Shape s{c.batch, c.rows, c.cols};
    const auto scores = random_values(static_cast<std::size_t>(s.numel()), 4, -10.0f, 10.0f);
    DeviceTensor in(be, DType::fp32, s, scores);
    DeviceTensor out(be, DType::fp32, s);
    sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(in, shape, 0.3f, out);
    const auto p = out.get();
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t i = 0; i < c.rows; ++i) {
        const std::int64_t visible = c.causal ? i + (c.cols - c.rows) + 1 : c.cols;
        const std::size_t row = static_cast<std::size_t>((b * c.rows + i) * c.cols);
        const auto want = reference_softmax(scores.data() + row, c.cols, visible, 0.3);
        double sum = 0.0;
        for (std::int64_t j = 0; j < c.cols; ++j) {
          const float got = p[row + static_cast<std::size_t>(j)];
          if (j >= visible) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got), 0u) << "masked entry is +0 exactly";
            continue;
          }
          ASSERT_NEAR(got, want[static_cast<std::size_t>(j)],
                      1e-6 * want[static_cast<std::size_t>(j)] + 1e-12);
          sum += got;
        }
        EXPECT_NEAR(sum, 1.0, 1e-6) << "batch " << b << " row " << i;
      }
  }
}

TEST(backend_cpu_attention, SoftmaxIsStableAndRunsInPlace) {
  CpuBackend be(1);
  const sdk::SoftmaxShape shape{2, 3, 6, true};
  const Shape s{2, 3, 6};
  auto scores = random_values(static_cast<std::size_t>(s.numel()), 5, -1.0f, 1.0f);
  for (auto& v : scores) v = v * 1e4f + 3e4f;  // exp(3e4) overflows without max subtraction
  DeviceTensor in(be, DType::fp32, s, scores);
  DeviceTensor apart(be, DType::fp32, s);
  sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(in, shape, 1.0f, apart);
  for (float v : apart.get()) ASSERT_TRUE(std::isfinite(v));
  sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(in, shape, 1.0f,
                                                       in);  // probs aliases scores
  const auto a = apart.get(), b = in.get();
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // The first row of a 3x6 causal block sees 4 keys.
  EXPECT_EQ(a[4], 0.0f);
  EXPECT_EQ(a[5], 0.0f);
}

TEST(backend_cpu_attention, SoftmaxBackwardEqualsAFiniteDifferenceOfTheForward) {
  CpuBackend be(1);
  const float scale = 0.5f;
  for (bool causal : {true, false}) {
    const sdk::SoftmaxShape shape{2, 3, 5, causal};
    const Shape s{2, 3, 5};
    const auto n = static_cast<std::size_t>(s.numel());
    const auto scores = random_values(n, 6, -2.0f, 2.0f);
    const auto weights = random_values(n, 7);  // L = Σ w ∘ softmax(scale · scores)
    DeviceTensor x(be, DType::fp32, s, scores);
    DeviceTensor p(be, DType::fp32, s);
    DeviceTensor w(be, DType::fp32, s, weights);
    DeviceTensor grad(be, DType::fp32, s);
    sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(x, shape, scale, p);
    sdk::facet<sdk::AttentionFacet>(be)->softmax_backward(p, w, shape, scale, grad);
    const auto g = grad.get();
    auto loss = [&](const std::vector<float>& at) {
      DeviceTensor xi(be, DType::fp32, s, at);
      DeviceTensor pi(be, DType::fp32, s);
      sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(xi, shape, scale, pi);
      double l = 0.0;
      const auto probs = pi.get();
      for (std::size_t i = 0; i < n; ++i) l += static_cast<double>(weights[i]) * probs[i];
      return l;
    };
    const float h = 1e-2f;
    for (std::size_t i = 0; i < n; ++i) {
      auto up = scores, down = scores;
      up[i] += h;
      down[i] -= h;
      const double fd = (loss(up) - loss(down)) / (static_cast<double>(up[i]) - down[i]);
      EXPECT_NEAR(g[i], fd, 2e-4) << (causal ? "causal" : "full") << " element " << i;
    }
    // Masked entries: exactly 0. dscores may alias dprobs (same bits as apart).
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = causal ? i + 3 : 5; j < 5; ++j)
          EXPECT_EQ(g[static_cast<std::size_t>((b * 3 + i) * 5 + j)], 0.0f);
    sdk::facet<sdk::AttentionFacet>(be)->softmax_backward(p, w, shape, scale, w);
    const auto in_place = w.get();
    EXPECT_EQ(std::memcmp(in_place.data(), g.data(), n * sizeof(float)), 0);
  }
}

TEST(backend_cpu_attention, SoftmaxArgumentErrors) {
  CpuBackend be(1);
  const Shape s{2, 3, 4};
  DeviceTensor x(be, DType::fp32, s);
  DeviceTensor y(be, DType::fp32, s);
  DeviceTensor half(be, DType::bf16, s);
  DeviceTensor small(be, DType::fp32, Shape{2, 3, 3});
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(x, {2, 4, 3, true}, 1.0f, x);
      },
      "rows = 4 > cols = 3");
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(half, {2, 3, 4, true}, 1.0f, y);
      },
      "backend_cpu.softmax_forward: scores");
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(x, {2, 3, 4, true}, 1.0f, small);
      },
      "probs");
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_backward(x, y, {2, 3, 4, true}, 1.0f, half);
      },
      "dscores");
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_backward(x, y, {2, 3, 4, true}, 1.0f, x);
      },
      "overlaps probs");
  // A view one element into x is neither x nor disjoint from it.
  TensorView front = x.view();
  front.shape = Shape{2, 3, 3};
  TensorView shifted = front;
  shifted.data = x.view().as<float>() + 1;
  expect_backend_error(
      [&] {
        sdk::facet<sdk::AttentionFacet>(be)->softmax_forward(front, {2, 3, 3, false}, 1.0f,
                                                             shifted);
      },
      "partly overlap");
}

TEST(backend_cpu_attention, SupportsAnswersTheHeaderDtypes) {
  CpuBackend be(1);
  sdk::AttentionFacet& f = *sdk::facet<sdk::AttentionFacet>(be);
  for (DType a : kFloats)
    for (DType b : kFloats) {
      EXPECT_TRUE(f.supports(sdk::AttentionOp::split_heads, std::vector<DType>{a, b}));
      EXPECT_TRUE(f.supports(sdk::AttentionOp::merge_heads, std::vector<DType>{a, b}));
    }
  EXPECT_FALSE(
      f.supports(sdk::AttentionOp::split_heads, std::vector<DType>{DType::int32, DType::fp32}));
  EXPECT_TRUE(f.supports(sdk::AttentionOp::softmax_forward, std::vector<DType>{DType::fp32}));
  EXPECT_FALSE(f.supports(sdk::AttentionOp::softmax_forward, std::vector<DType>{DType::bf16}));
  EXPECT_FALSE(
      f.supports(sdk::AttentionOp::softmax_backward, std::vector<DType>{DType::fp32, DType::fp32}));
  EXPECT_GE(f.version(), (sdk::FacetVersion{1, 1}));
  for (DType a : kFloats) {
    EXPECT_TRUE(f.supports(sdk::AttentionOp::flash_forward, std::vector<DType>{a}));
    for (DType b : kFloats)
      EXPECT_TRUE(f.supports(sdk::AttentionOp::flash_backward, std::vector<DType>{a, b}));
  }
  EXPECT_FALSE(f.supports(sdk::AttentionOp::flash_forward, std::vector<DType>{DType::fp8_e4m3}));
}

// One causal attention of qkv [N, T, 3, H, D] on `be`: out, lse, and dqkv for dout.
struct FlashRun {
  std::vector<float> out, lse, dqkv;
};
FlashRun run_flash(CpuBackend& be, const sdk::HeadLayout& l, DType dt,
                   const std::vector<float>& qkv_values, const std::vector<float>& dout_values,
                   float scale) {
  const std::int64_t width = l.heads * l.head_dim;
  DeviceTensor qkv(be, dt, Shape{l.batch, l.tokens, 3 * width}, qkv_values);
  DeviceTensor dout(be, dt, Shape{l.batch, l.tokens, width}, dout_values);
  DeviceTensor out(be, dt, Shape{l.batch, l.tokens, width});
  DeviceTensor lse(be, DType::fp32, Shape{l.batch, l.heads, l.tokens});
  DeviceTensor dqkv(be, dt, Shape{l.batch, l.tokens, 3 * width});
  sdk::AttentionFacet& f = *sdk::facet<sdk::AttentionFacet>(be);
  f.flash_forward(qkv, l, scale, out, lse);
  f.flash_backward(qkv, out, dout, lse, l, scale, dqkv);
  return {out.get(), lse.get(), dqkv.get()};
}

// Several sequences and heads, T = 200 past one tile of kFlashBlock (128): qkv and dout drawn from
// `seed`.
struct FlashInputs {
  sdk::HeadLayout l{2, 200, 3, 16, 3, 0, 0};
  std::vector<float> qkv, dout;
};
FlashInputs flash_inputs(unsigned seed) {
  FlashInputs in;
  const std::int64_t tokens = in.l.batch * in.l.tokens, width = in.l.heads * in.l.head_dim;
  in.qkv = random_values(static_cast<std::size_t>(tokens * 3 * width), seed);
  in.dout = random_values(static_cast<std::size_t>(tokens * width), seed + 1);
  return in;
}

// max |got − want| over max |want|: one figure for a whole tensor, which per-element ratios near
// zero would blow up.
double max_relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// The flash backward on one thread against a central difference of L = Σ w ∘ out, T = 140: two
// tiles of kFlashBlock (128), the second partial, so the online softmax rescales and the backward
// visits tiles below the diagonal.
void flash_matches_a_finite_difference() {
  CpuBackend be(1);
  static_assert(kFlashBlock < 140 && 140 < 2 * kFlashBlock);
  const sdk::HeadLayout l{1, 140, 1, 3, 3, 0, 0};
  const std::int64_t width = l.heads * l.head_dim;
  const auto qkv = random_values(static_cast<std::size_t>(l.tokens * 3 * width), 81, -2.f, 2.f);
  const auto w = random_values(static_cast<std::size_t>(l.tokens * width), 82);
  const float scale = 0.7f;
  const FlashRun run = run_flash(be, l, DType::fp32, qkv, w, scale);
  auto loss = [&](const std::vector<float>& at) {
    DeviceTensor x(be, DType::fp32, Shape{l.batch, l.tokens, 3 * width}, at);
    DeviceTensor out(be, DType::fp32, Shape{l.batch, l.tokens, width});
    DeviceTensor lse(be, DType::fp32, Shape{l.batch, l.heads, l.tokens});
    sdk::facet<sdk::AttentionFacet>(be)->flash_forward(x, l, scale, out, lse);
    double sum = 0.0;
    const auto o = out.get();
    for (std::size_t i = 0; i < o.size(); ++i) sum += static_cast<double>(w[i]) * o[i];
    return sum;
  };
  double max_err = 0.0, max_fd = 0.0;
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    auto up = qkv, down = qkv;
    up[i] += 1e-2f;
    down[i] -= 1e-2f;
    const double fd = (loss(up) - loss(down)) / (static_cast<double>(up[i]) - down[i]);
    max_err = std::max(max_err, std::abs(fd - run.dqkv[i]));
    max_fd = std::max(max_fd, std::abs(fd));
  }
  EXPECT_GT(max_fd, 0.1);  // the check compares real gradients, not zeros
  EXPECT_LE(max_err, 2e-3 * max_fd) << "largest |fd - dqkv|";
}

TEST(backend_cpu_attention, FlashBackwardEqualsAFiniteDifferenceOfTheForward) {
  // On every ISA variant of the element kernels this CPU runs.
  for (const Isa isa : runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const IsaScope as_isa(isa);
    flash_matches_a_finite_difference();
  }
}

TEST(backend_cpu_attention, FlashAgreesOnEveryIsaVariant) {
  // The variants differ only in how wide the exponentials run and whether their polynomial is
  // fused (FMA), by an ulp or two of an exponential: within 16 fp32 ulps of the largest value
  // (2^-20; 1 ulp measured), and in 16-bit storage within one ulp of the output's largest value
  // (a rounding that falls the other way: 2^-7 for bf16, 2^-10 for fp16).
  CpuBackend be(2);
  const FlashInputs in = flash_inputs(85);
  for (DType dt : kFloats) {
    const FlashRun widest = run_flash(be, in.l, dt, in.qkv, in.dout, 0.25f);
    const double tol = dt == DType::fp32 ? 0x1p-20 : dt == DType::bf16 ? 0x1p-7 : 0x1p-10;
    for (const Isa isa : runnable_isas()) {
      const IsaScope as_isa(isa);
      const FlashRun run = run_flash(be, in.l, dt, in.qkv, in.dout, 0.25f);
      const std::string what = isa_name(isa) + ", " + std::string(sdk::dtype_name(dt));
      EXPECT_LE(max_relative_difference(run.out, widest.out), tol) << "out, " << what;
      EXPECT_LE(max_relative_difference(run.lse, widest.lse), 0x1p-20) << "lse, " << what;
      EXPECT_LE(max_relative_difference(run.dqkv, widest.dqkv), tol) << "dqkv, " << what;
    }
  }
}

TEST(backend_cpu_attention, FlashIsTheSameBitsOnTheFmaVariants) {
  // The online softmax's max and sum run in fixed lanes (cpu_lane_reductions.h), so the variants
  // whose exponentials are alike (x86-64-v4 and v3 both fuse the polynomial) agree bit for bit,
  // at 16 and at 8 floats a vector: out, lse and the gradients.
  const auto isas = runnable_isas();
  if (std::find(isas.begin(), isas.end(), Isa::v4) == isas.end())
    GTEST_SKIP() << "this CPU runs no x86-64-v4 variant to compare with v3";
  CpuBackend be(2);
  const FlashInputs in = flash_inputs(87);
  for (DType dt : kFloats) {
    FlashRun v4, v3;
    {
      const IsaScope as_isa(Isa::v4);
      v4 = run_flash(be, in.l, dt, in.qkv, in.dout, 0.25f);
    }
    {
      const IsaScope as_isa(Isa::v3);
      v3 = run_flash(be, in.l, dt, in.qkv, in.dout, 0.25f);
    }
    const std::string what(sdk::dtype_name(dt));
    EXPECT_EQ(v4.out, v3.out) << what;
    EXPECT_EQ(v4.lse, v3.lse) << what;
    EXPECT_EQ(v4.dqkv, v3.dqkv) << what;
  }
}

TEST(backend_cpu_attention, FlashBf16ProductsAreTheSameBitsWithAmxTilesAsWithOneDnn) {
  // Where the process may run AMX tile instructions and the head dimension is a multiple of 32,
  // bf16 products whose right operand is packed once run AMX's own (cpu_amx_tile_product.h);
  // refused, they are oneDNN's. The same bits either way: out, lse and every gradient, at GPT-2's
  // head dimension of 64 with T past two tiles (a partial last tile: k of 44 in p·v and ds·k), and
  // at 16, where both runs take oneDNN's.
  if (!amx_tiles_usable() || !Bf16TileMatmul::available())
    GTEST_SKIP() << "this process runs no AMX tile instructions: there is one path only";
  CpuBackend be(2);
  be.set_flash_products(FlashProductsChoice::bf16);
  FlashInputs wide = flash_inputs(95);
  wide.l = sdk::HeadLayout{1, 300, 2, 64, 3, 0, 0};
  wide.qkv = random_values(static_cast<std::size_t>(300 * 3 * 2 * 64), 95);
  wide.dout = random_values(static_cast<std::size_t>(300 * 2 * 64), 96);
  for (const FlashInputs& in : {flash_inputs(93), wide}) {
    const FlashRun amx = run_flash(be, in.l, DType::bf16, in.qkv, in.dout, 0.125f);
    FlashRun onednn;
    {
      const AmxTilesRefused refused;
      onednn = run_flash(be, in.l, DType::bf16, in.qkv, in.dout, 0.125f);
    }
    const std::string what = "head_dim " + std::to_string(in.l.head_dim);
    EXPECT_EQ(amx.out, onednn.out) << what;
    EXPECT_EQ(amx.lse, onednn.lse) << what;
    EXPECT_EQ(amx.dqkv, onednn.dqkv) << what;
  }
}

TEST(backend_cpu_attention, FlashGivesTheSameBitsOnOneThreadAndOnTwo) {
  // Several sequences and heads, T past one tile: two threads share the (sequence, head) tasks
  // differently from one, and every sum still runs in the same order; with either tile product.
  for (const FlashProductsChoice products :
       {FlashProductsChoice::fp32, FlashProductsChoice::bf16}) {
    CpuBackend one(1), two(2);
    one.set_flash_products(products);
    two.set_flash_products(products);
    const FlashInputs in = flash_inputs(83);
    for (DType dt : kFloats) {
      const FlashRun a = run_flash(one, in.l, dt, in.qkv, in.dout, 0.25f);
      const FlashRun b = run_flash(two, in.l, dt, in.qkv, in.dout, 0.25f);
      const FlashRun c = run_flash(two, in.l, dt, in.qkv, in.dout, 0.25f);
      const std::string what = std::string(sdk::dtype_name(dt)) + ", " +
                               (products == FlashProductsChoice::bf16 ? "bf16" : "fp32") +
                               " products";
      EXPECT_EQ(a.out, b.out) << what;
      EXPECT_EQ(a.lse, b.lse) << what;
      EXPECT_EQ(a.dqkv, b.dqkv) << what;
      EXPECT_EQ(b.dqkv, c.dqkv) << what << ", second run";
    }
  }
}

TEST(backend_cpu_attention, FlashBf16TileProductsDifferOnlyByRoundingPAndTheScoreGradient) {
  // flash_products = bf16 on every CPU (auto takes it where bf16 GEMMs run natively). For bf16 qkv
  // the products read the same bf16 values and sum in FP32; P is rounded to bf16 before P·v and dS
  // before dS·k and dSᵀ·q, each half a bf16 ulp (2^-9) relative. So against the FP32 products:
  // - out: |Σ_j (bf16(P_ij) − P_ij)·v_j| <= 2^-9·max|v|, plus each side's own rounding of out
  //   (2^-9·max|out| each);
  // - dqkv: each side within its bound of the exact gradient as the conformance suite states it
  //   (FP32 products: one bf16 ulp of the largest value, 2^-7; bf16 products: that and the two
  //   intermediate roundings, 2^-7 more), plus FP32 sums of T + D terms, 4 chained, each side.
  // And they differ: the rounding happened. fp32 and fp16 qkv take the FP32 products whatever
  // the option says: the same bits.
  if (!Bf16TileMatmul::available())
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU: flash_products = bf16 runs FP32 "
                    "products (FlashProductsAutoTakesBf16WhereBf16GemmsAreNative checks that)";
  const FlashInputs in = flash_inputs(87);
  CpuBackend exact(2), rounded(2);
  exact.set_flash_products(FlashProductsChoice::fp32);
  rounded.set_flash_products(FlashProductsChoice::bf16);
  const FlashRun want = run_flash(exact, in.l, DType::bf16, in.qkv, in.dout, 0.25f);
  const FlashRun got = run_flash(rounded, in.l, DType::bf16, in.qkv, in.dout, 0.25f);
  const std::int64_t width = in.l.heads * in.l.head_dim;
  double max_v = 0.0, max_out = 0.0, max_diff = 0.0;
  for (std::size_t i = 0; i < in.qkv.size(); ++i)
    if (static_cast<std::int64_t>(i) % (3 * width) >= 2 * width)
      max_v = std::max(max_v, std::abs(static_cast<double>(stored_value(in.qkv[i], DType::bf16))));
  for (std::size_t i = 0; i < want.out.size(); ++i) {
    max_out = std::max(max_out, std::abs(static_cast<double>(want.out[i])));
    max_diff = std::max(max_diff, std::abs(static_cast<double>(got.out[i]) - want.out[i]));
  }
  const double sums = static_cast<double>(in.l.tokens + in.l.head_dim) * 0x1p-24;
  EXPECT_LE(max_diff, 0x1p-9 * max_v + 2 * 0x1p-9 * max_out + sums * max_v) << "out";
  EXPECT_NE(got.out, want.out) << "P was not rounded: the bf16 products did not run";
  EXPECT_LE(max_relative_difference(got.lse, want.lse), 0x1p-20) << "lse: both FP32 softmaxes";
  EXPECT_LE(max_relative_difference(got.dqkv, want.dqkv), 3 * 0x1p-7 + 8 * sums) << "dqkv";
  EXPECT_NE(got.dqkv, want.dqkv) << "dqkv";
  for (DType dt : {DType::fp32, DType::fp16}) {
    const FlashRun a = run_flash(exact, in.l, dt, in.qkv, in.dout, 0.25f);
    const FlashRun b = run_flash(rounded, in.l, dt, in.qkv, in.dout, 0.25f);
    EXPECT_EQ(a.out, b.out) << sdk::dtype_name(dt);
    EXPECT_EQ(a.dqkv, b.dqkv) << sdk::dtype_name(dt);
  }
}

TEST(backend_cpu_attention, FlashProductsAutoTakesBf16WhereBf16GemmsAreNative) {
  // auto runs what the rule picks: the bf16 products for bf16 qkv where bf16 GEMMs run natively
  // (AMX-BF16, or AVX512-BF16 on an AMD CPU), the FP32 ones elsewhere and for other dtypes; bf16
  // forced where oneDNN has no bf16 matmul (AVX2) runs the FP32 ones too. Bits against the FP32
  // products and, where oneDNN has a bf16 matmul, against the forced bf16 ones; the notes say
  // which. And under bf16_gemm = emulated, auto keeps the FP32 ones on any CPU.
  const FlashInputs in = flash_inputs(89);
  CpuBackend automatic(1), bf16(1), fp32(1);
  bf16.set_flash_products(FlashProductsChoice::bf16);
  fp32.set_flash_products(FlashProductsChoice::fp32);
  const bool offered = Bf16TileMatmul::available();
  const bool native = offered && automatic.bf16_gemm_native();
  for (DType dt : kFloats) {
    const FlashRun got = run_flash(automatic, in.l, dt, in.qkv, in.dout, 0.25f);
    const FlashRun want =
        run_flash(native && dt == DType::bf16 ? bf16 : fp32, in.l, dt, in.qkv, in.dout, 0.25f);
    EXPECT_EQ(got.out, want.out) << sdk::dtype_name(dt) << ", native bf16 GEMMs " << native;
    EXPECT_EQ(got.dqkv, want.dqkv) << sdk::dtype_name(dt) << ", native bf16 GEMMs " << native;
  }
  CpuBackend emulated(1, Bf16GemmPath::emulated);
  EXPECT_EQ(run_flash(emulated, in.l, DType::bf16, in.qkv, in.dout, 0.25f).dqkv,
            run_flash(fp32, in.l, DType::bf16, in.qkv, in.dout, 0.25f).dqkv)
      << "bf16_gemm = emulated: auto takes the FP32 products";
  if (!offered) {
    const FlashRun a = run_flash(bf16, in.l, DType::bf16, in.qkv, in.dout, 0.25f);
    const FlashRun b = run_flash(fp32, in.l, DType::bf16, in.qkv, in.dout, 0.25f);
    EXPECT_EQ(a.out, b.out) << "bf16 forced without a oneDNN bf16 matmul";
    EXPECT_EQ(a.dqkv, b.dqkv) << "bf16 forced without a oneDNN bf16 matmul";
    EXPECT_NE(bf16.flash_products_note().find("no bf16 matmul on this CPU"), std::string::npos)
        << bf16.flash_products_note();
  } else {
    EXPECT_NE(bf16.flash_products_note().find("flash_products = bf16:"), std::string::npos)
        << bf16.flash_products_note();
  }
  EXPECT_EQ(
      automatic.flash_products_note().find("in bf16 with native bf16 GEMMs") != std::string::npos,
      native)
      << automatic.flash_products_note();
  EXPECT_NE(fp32.flash_products_note().find("flash_products = fp32"), std::string::npos);
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
