// The attention facet: head permutes, the masked softmax, flash attention and its decode step
// against double-precision references, and flash's argument errors.
#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_attention() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, AttentionHeadPermutesEveryDtypePairWithACacheOffset) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  // x [N, T, P, H, D] = [2, 3, 3, 2, 8] into a cache y [P, N, H, 7, 8] at token offset 2: the
  // window gets x rounded once into y's dtype, every other row keeps its sentinel; merging the
  // window back gives y rounded once into x's dtype.
  sdk::HeadLayout l;
  l.batch = 2;
  l.tokens = 3;
  l.parts = 3;
  l.heads = 2;
  l.head_dim = 8;
  l.head_tokens = 7;
  l.head_offset = 2;
  const Shape xs{l.batch, l.tokens, l.parts * l.heads * l.head_dim};
  const Shape ys{l.parts * l.batch * l.heads, l.head_tokens, l.head_dim};
  const auto values = random_values(static_cast<std::size_t>(xs.numel()), 40, -3.f, 3.f);
  for (DType xt : kStorageFloats)
    for (DType yt : kStorageFloats) {
      const std::vector<DType> pair{xt, yt};
      if (!tested_attention->supports(sdk::AttentionOp::split_heads, pair) ||
          !tested_attention->supports(sdk::AttentionOp::merge_heads, pair))
        continue;
      const std::string what = dtypes_text({xt, yt});
      auto x = upload(values, xs, xt);
      auto y = upload(std::vector<float>(static_cast<std::size_t>(ys.numel()), 42.f), ys, yt);
      tested_attention->split_heads(x.tested->view(), l, y.tested->view());
      auto back = zeros(xs, xt);
      tested_attention->merge_heads(y.tested->view(), l, back.tested->view());
      std::vector<float> want_y(static_cast<std::size_t>(ys.numel()), 42.f);
      std::vector<float> want_back(values.size());
      for (std::int64_t n = 0; n < l.batch; ++n)
        for (std::int64_t t = 0; t < l.tokens; ++t)
          for (std::int64_t p = 0; p < l.parts; ++p)
            for (std::int64_t h = 0; h < l.heads; ++h)
              for (std::int64_t d = 0; d < l.head_dim; ++d) {
                const auto xi = static_cast<std::size_t>(
                    (((n * l.tokens + t) * l.parts + p) * l.heads + h) * l.head_dim + d);
                const auto yi = static_cast<std::size_t>(
                    (((p * l.batch + n) * l.heads + h) * l.head_tokens + l.head_offset + t) *
                        l.head_dim +
                    d);
                want_y[yi] = stored(stored(values[xi], xt), yt);
                want_back[xi] = stored(want_y[yi], xt);
              }
      EXPECT_EQ(tested_values(y), want_y) << "split_heads " << what;
      EXPECT_EQ(tested_values(back), want_back) << "merge_heads " << what;
    }
}

TEST_P(Conformance, AttentionSoftmaxForwardAndBackward) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  const std::vector<DType> fp32{DType::fp32};
  if (!tested_attention->supports(sdk::AttentionOp::softmax_forward, fp32) ||
      !tested_attention->supports(sdk::AttentionOp::softmax_backward, fp32))
    GTEST_SKIP() << "the attention facet does not support the fp32 softmax";
  const float scale = 0.35f;
  // Square causal (training), rows < cols causal (decoding over a cache, one and four new
  // tokens), rows < cols and square without a mask.
  for (const sdk::SoftmaxShape s :
       {sdk::SoftmaxShape{6, 17, 17, true}, sdk::SoftmaxShape{6, 1, 9, true},
        sdk::SoftmaxShape{6, 4, 9, true}, sdk::SoftmaxShape{6, 4, 9, false},
        sdk::SoftmaxShape{3, 33, 33, false}}) {
    const Shape shape{s.batch, s.rows, s.cols};
    const auto n = static_cast<std::size_t>(shape.numel());
    const auto scores = random_values(n, 41, -6.f, 6.f);
    const auto dprobs = random_values(n, 42);
    auto x = upload(scores, shape);
    auto p = zeros(shape);
    auto dp = upload(dprobs, shape);
    auto ds = zeros(shape);
    tested_attention->softmax_forward(x.tested->view(), s, scale, p.tested->view());
    tested_attention->softmax_backward(p.tested->view(), dp.tested->view(), s, scale,
                                       ds.tested->view());
    std::vector<float> want_p(n), want_ds(n);
    for (std::int64_t r = 0; r < s.batch * s.rows; ++r) {
      const std::int64_t i = r % s.rows;
      const std::int64_t visible = s.causal ? i + (s.cols - s.rows) + 1 : s.cols;
      const auto row = static_cast<std::size_t>(r * s.cols);
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0, dot = 0.0;
      for (std::int64_t j = 0; j < visible; ++j)
        mx = std::max(mx, double{scale} * scores[row + static_cast<std::size_t>(j)]);
      for (std::int64_t j = 0; j < visible; ++j)
        sum += std::exp(double{scale} * scores[row + static_cast<std::size_t>(j)] - mx);
      std::vector<double> prob(static_cast<std::size_t>(s.cols), 0.0);
      for (std::int64_t j = 0; j < visible; ++j) {
        const auto c = static_cast<std::size_t>(j);
        prob[c] = std::exp(double{scale} * scores[row + c] - mx) / sum;
        dot += prob[c] * dprobs[row + c];
      }
      for (std::int64_t j = 0; j < s.cols; ++j) {
        const auto c = static_cast<std::size_t>(j);
        want_p[row + c] = static_cast<float>(prob[c]);
        want_ds[row + c] = static_cast<float>(double{scale} * prob[c] * (dprobs[row + c] - dot));
      }
    }
    const std::string what = "batch " + std::to_string(s.batch) + " rows " +
                             std::to_string(s.rows) + " cols " + std::to_string(s.cols) +
                             (s.causal ? " causal" : " full");
    const auto got_p = tested_values(p), got_ds = tested_values(ds);
    EXPECT_LE(relative_difference(got_p, want_p), 1e-5) << "softmax_forward " << what;
    EXPECT_LE(relative_difference(got_ds, want_ds), 1e-4) << "softmax_backward " << what;
    for (std::size_t i = 0; i < n; ++i)
      if (want_p[i] == 0.0f) {  // masked (no visible probability underflows at these scores)
        EXPECT_EQ(got_p[i], 0.0f) << "masked probability, " << what << " element " << i;
        EXPECT_EQ(got_ds[i], 0.0f) << "masked gradient, " << what << " element " << i;
      }
  }
}

// A NaN score (an overflow upstream) makes its whole row NaN, as PyTorch's softmax does, at a
// one-thread and a threaded size: never NaN at one key and 0 at the others, which would let a
// finite context through. The other rows stay finite, and a +inf score's row is NaN too.
TEST_P(Conformance, AttentionSoftmaxRowWithANaNScoreIsNaN) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  const std::vector<DType> fp32{DType::fp32};
  if (!tested_attention->supports(sdk::AttentionOp::softmax_forward, fp32))
    GTEST_SKIP() << "the attention facet does not support the fp32 softmax";
  for (const sdk::SoftmaxShape s :
       {sdk::SoftmaxShape{2, 8, 8, true}, sdk::SoftmaxShape{64, 32, 32, false}}) {
    const Shape shape{s.batch, s.rows, s.cols};
    auto scores = random_values(static_cast<std::size_t>(shape.numel()), 43, -3.f, 3.f);
    const std::size_t nan_row = 5, inf_row = 6;
    scores[nan_row * static_cast<std::size_t>(s.cols) + 2] =
        std::numeric_limits<float>::quiet_NaN();
    scores[inf_row * static_cast<std::size_t>(s.cols) + 1] = std::numeric_limits<float>::infinity();
    auto x = upload(scores, shape);
    auto p = zeros(shape);
    tested_attention->softmax_forward(x.tested->view(), s, 0.5f, p.tested->view());
    const auto got = tested_values(p);
    for (std::int64_t r = 0; r < s.batch * s.rows; ++r) {
      const std::int64_t visible = s.causal ? r % s.rows + 1 : s.cols;
      for (std::int64_t j = 0; j < visible; ++j) {
        const float v = got[static_cast<std::size_t>(r * s.cols + j)];
        if (r == static_cast<std::int64_t>(nan_row) ||
            (r == static_cast<std::int64_t>(inf_row) && visible > 1))
          EXPECT_TRUE(std::isnan(v)) << "row " << r << " key " << j << ": " << v;
        else
          EXPECT_TRUE(std::isfinite(v)) << "row " << r << " key " << j << ": " << v;
      }
    }
  }
}

// Flash attention (attention facet 1.1) against a double-precision reference of the same causal
// attention, from the values each dtype stores. Several heads and sequences, T past one tile of
// 64 and not a multiple of it, T = 1, an odd-sized head.
struct FlashCase {
  std::int64_t batch, tokens, heads, head_dim;
};

// What flash_forward and flash_backward should give, in double: out [N, T, H, D], lse [N, H, T],
// dqkv [N, T, 3, H, D].
struct FlashReference {
  std::vector<float> out, lse, dqkv;
};

FlashReference flash_reference(const FlashCase& c, const std::vector<double>& qkv,
                               const std::vector<double>& dout, double scale) {
  const std::int64_t t_len = c.tokens, h_n = c.heads, d = c.head_dim;
  auto at = [&](std::int64_t n, std::int64_t t, std::int64_t p, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>((((n * t_len + t) * 3 + p) * h_n + h) * d + e);
  };
  auto o_at = [&](std::int64_t n, std::int64_t t, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>(((n * t_len + t) * h_n + h) * d + e);
  };
  FlashReference r;
  r.out.resize(static_cast<std::size_t>(c.batch * t_len * h_n * d));
  r.lse.resize(static_cast<std::size_t>(c.batch * h_n * t_len));
  std::vector<double> dqkv(qkv.size(), 0.0);
  const auto tn = static_cast<std::size_t>(t_len);
  for (std::int64_t n = 0; n < c.batch; ++n)
    for (std::int64_t h = 0; h < h_n; ++h) {
      std::vector<double> p(tn * tn, 0.0), dp(tn * tn, 0.0);
      for (std::int64_t i = 0; i < t_len; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
        std::vector<double> s(tn, 0.0);
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += qkv[at(n, i, 0, h, e)] * qkv[at(n, j, 1, h, e)];
          s[static_cast<std::size_t>(j)] = scale * dot;
          mx = std::max(mx, scale * dot);
        }
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        r.lse[static_cast<std::size_t>((n * h_n + h) * t_len + i)] =
            static_cast<float>(mx + std::log(sum));
        for (std::int64_t j = 0; j <= i; ++j)
          p[static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j)] =
              std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
        for (std::int64_t e = 0; e < d; ++e) {
          double o = 0.0;
          for (std::int64_t j = 0; j <= i; ++j)
            o += p[static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j)] *
                 qkv[at(n, j, 2, h, e)];
          r.out[o_at(n, i, h, e)] = static_cast<float>(o);
        }
      }
      // dP = dO·vᵀ, dS = P∘(dP − rowsum(P∘dP))·scale, dq = dS·k, dk = dSᵀ·q, dv = Pᵀ·dO.
      for (std::int64_t i = 0; i < t_len; ++i) {
        double delta = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += dout[o_at(n, i, h, e)] * qkv[at(n, j, 2, h, e)];
          const std::size_t ij = static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j);
          dp[ij] = dot;
          delta += p[ij] * dot;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const std::size_t ij = static_cast<std::size_t>(i) * tn + static_cast<std::size_t>(j);
          const double ds = p[ij] * (dp[ij] - delta) * scale;
          for (std::int64_t e = 0; e < d; ++e) {
            dqkv[at(n, i, 0, h, e)] += ds * qkv[at(n, j, 1, h, e)];
            dqkv[at(n, j, 1, h, e)] += ds * qkv[at(n, i, 0, h, e)];
            dqkv[at(n, j, 2, h, e)] += p[ij] * dout[o_at(n, i, h, e)];
          }
        }
      }
    }
  r.dqkv.assign(dqkv.begin(), dqkv.end());
  return r;
}

TEST_P(Conformance, FlashAttentionForwardAndBackwardAgainstADoubleReference) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  if (tested_attention->version() < sdk::FacetVersion{1, 1})
    GTEST_SKIP() << "attention facet " << sdk::to_string(tested_attention->version())
                 << " predates flash attention (1.1)";
  for (const FlashCase c :
       {FlashCase{2, 70, 3, 24}, FlashCase{1, 1, 2, 8}, FlashCase{1, 129, 1, 16}})
    for (DType dt : kStorageFloats) {
      const std::vector<DType> fwd{dt}, bwd{dt, dt};
      if (!tested_attention->supports(sdk::AttentionOp::flash_forward, fwd) ||
          !tested_attention->supports(sdk::AttentionOp::flash_backward, bwd))
        continue;
      // 1.2: a shape the backend's fused kernel has no variant for (the host runs it unfused).
      if (tested_attention->version() >= sdk::FacetVersion{1, 2} &&
          !tested_attention->flash_refusal({0, c.tokens, c.heads, c.head_dim, 3, 0, 0}, dt).empty())
        continue;
      const std::string what = std::string(sdk::dtype_name(dt)) + " N " + std::to_string(c.batch) +
                               " T " + std::to_string(c.tokens) + " H " + std::to_string(c.heads) +
                               " D " + std::to_string(c.head_dim);
      const std::int64_t rows = c.batch * c.tokens, width = c.heads * c.head_dim;
      const Shape qkv_shape{c.batch, c.tokens, 3 * width}, out_shape{c.batch, c.tokens, width};
      const auto qkv_values =
          random_values(static_cast<std::size_t>(rows * 3 * width), 71, -2.f, 2.f);
      const auto dout_values = random_values(static_cast<std::size_t>(rows * width), 72);
      std::vector<double> q_stored(qkv_values.size()), g_stored(dout_values.size());
      for (std::size_t i = 0; i < q_stored.size(); ++i) q_stored[i] = stored(qkv_values[i], dt);
      for (std::size_t i = 0; i < g_stored.size(); ++i) g_stored[i] = stored(dout_values[i], dt);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
      const auto want = flash_reference(c, q_stored, g_stored, scale);

      auto qkv = upload(qkv_values, qkv_shape, dt);
      auto dout = upload(dout_values, out_shape, dt);
      auto out = zeros(out_shape, dt);
      auto lse = zeros(Shape{c.batch, c.heads, c.tokens});
      auto dqkv = zeros(qkv_shape, dt);
      const sdk::HeadLayout l{c.batch, c.tokens, c.heads, c.head_dim, 3, 0, 0};
      tested_attention->flash_forward(qkv.tested->view(), l, scale, out.tested->view(),
                                      lse.tested->view());
      tested_attention->flash_backward(qkv.tested->view(), out.tested->view(), dout.tested->view(),
                                       lse.tested->view(), l, scale, dqkv.tested->view());
      // One rounding of the output (half an ulp of dt) over FP32 sums of about T + D terms, and
      // one of the probabilities before P·v, which the contract lets a Tensor Core kernel make
      // (FlashAttention does; exact for fp32, half an ulp of dt otherwise). The gradients add a
      // rounding of their own and one of the score gradient before its products with q and k,
      // and D_i = Σ dO·O reads the rounded output (half an ulp each), over a chain of four such
      // sums.
      const double fp32_sums = static_cast<double>(c.tokens + c.head_dim) * 0x1p-24;
      const double intermediate = dt == DType::fp32 ? 0.0 : ulp(dt) / 2;
      EXPECT_LE(relative_difference(tested_values(out), want.out),
                ulp(dt) / 2 + intermediate + fp32_sums)
          << "flash_forward out, " << what;
      EXPECT_LE(relative_difference(tested_values(lse), want.lse), 1e-6 + fp32_sums)
          << "flash_forward lse, " << what;
      EXPECT_LE(relative_difference(tested_values(dqkv), want.dqkv),
                ulp(dt) + 2 * intermediate + 4 * fp32_sums)
          << "flash_backward dqkv, " << what;
      // Deterministic: the same call again gives the same bits.
      auto again = zeros(qkv_shape, dt);
      tested_attention->flash_backward(qkv.tested->view(), out.tested->view(), dout.tested->view(),
                                       lse.tested->view(), l, scale, again.tested->view());
      EXPECT_EQ(tested_values(again), tested_values(dqkv)) << "flash_backward again, " << what;
    }
}

// attention 1.3: a decode step over a KV cache is the last rows of causal attention over the
// whole sequence (the double reference above): a prefill (start 0) and steps whose keys cross a
// tile, from a cache that split_heads filled, into an output of the cache's dtype or fp32; the
// same bits on a second call; and its argument checks. Starts 50 (tiles of 64) and 100 (tiles of
// 128, the CPU's and the CUDA kernel's) put queries that see nothing of the last key tile beside
// queries that do; length 203 crosses tiles of 128, so a running maximum is rescaled.
TEST_P(Conformance, FlashDecodeIsTheLastRowsOfCausalAttention) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  if (tested_attention->version() < sdk::FacetVersion{1, 3})
    GTEST_SKIP() << "attention facet " << sdk::to_string(tested_attention->version())
                 << " predates flash_decode (1.3)";
  struct DecodeCase {
    std::int64_t len, cap;
    std::vector<std::int64_t> starts;
  };
  const DecodeCase cases[] = {{77, 90, {0, 50, 70, 76}}, {203, 210, {0, 100, 130, 190, 202}}};
  for (const DecodeCase& dc : cases) {
    const std::int64_t heads = 3, d = 20, cap = dc.cap, len = dc.len;
    const FlashCase whole{1, len, heads, d};
    const std::int64_t width = heads * d;
    const auto qkv_values = random_values(static_cast<std::size_t>(len * 3 * width), 81, -2.f, 2.f);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (DType dt : kStorageFloats)
      for (DType ot : {dt, DType::fp32})
        for (std::int64_t start : dc.starts) {
          const std::vector<DType> dtypes{dt, ot};
          if (!tested_attention->supports(sdk::AttentionOp::flash_decode, dtypes)) continue;
          const std::int64_t rows = len - start;
          const std::string what = std::string(sdk::dtype_name(dt)) + " into " +
                                   std::string(sdk::dtype_name(ot)) + ", queries [" +
                                   std::to_string(start) + ", " + std::to_string(len) + ")";
          std::vector<double> stored_qkv(qkv_values.size());
          for (std::size_t i = 0; i < stored_qkv.size(); ++i)
            stored_qkv[i] = stored(qkv_values[i], dt);
          const auto want_all = flash_reference(
              whole, stored_qkv, std::vector<double>(static_cast<std::size_t>(len * width)), scale);
          const std::vector<float> want(want_all.out.begin() + start * width, want_all.out.end());
          auto qkv = upload(qkv_values, Shape{1, len, 3 * width}, dt);
          auto cache = zeros(Shape{3 * heads * cap * d}, dt);
          tested_attention->split_heads(qkv.tested->view(), {1, len, heads, d, 3, cap, 0},
                                        cache.tested->view());
          auto out = zeros(Shape{1, rows, width}, ot);
          const sdk::HeadLayout l{1, rows, heads, d, 3, cap, start};
          tested_attention->flash_decode(cache.tested->view(), l, scale, out.tested->view());
          const double fp32_sums = static_cast<double>(len + d) * 0x1p-24;
          EXPECT_LE(relative_difference(tested_values(out), want), ulp(ot) / 2 + fp32_sums) << what;
          auto again = zeros(Shape{1, rows, width}, ot);
          tested_attention->flash_decode(cache.tested->view(), l, scale, again.tested->view());
          EXPECT_EQ(tested_values(again), tested_values(out)) << "again, " << what;
          if (start != 70) continue;
          // Bad arguments: two sequences, queries past the cache, an output over the cache, one of
          // the wrong size.
          const TensorView c = cache.tested->view(), o = out.tested->view();
          EXPECT_THROW(
              tested_attention->flash_decode(c, {2, rows, heads, d, 3, cap, start}, scale, o),
              sdk::BackendError)
              << what;
          EXPECT_THROW(tested_attention->flash_decode(
                           c, {1, rows, heads, d, 3, cap, cap - rows + 1}, scale, o),
                       sdk::BackendError)
              << what;
          EXPECT_THROW(tested_attention->flash_decode(c, l, scale, {c.data, ot, o.shape}),
                       sdk::BackendError)
              << what;
          EXPECT_THROW(
              tested_attention->flash_decode(c, l, scale, {o.data, ot, Shape{1, rows - 1, width}}),
              sdk::BackendError)
              << what;
        }
  }
}

// An infinite key: keys 0..149 hold −inf in one dimension that every query weights by +1, so
// their scores are −inf and the exact softmax gives them weight 0. Rows that also see a finite key
// are finite, even when −inf fills the whole first key tile (128 on the CPU and on CUDA): an
// online softmax that rescales by exp(m − top) with both −inf would turn them NaN.
TEST_P(Conformance, FlashDecodeGivesKeysWithMinusInfiniteScoresNoWeight) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  if (tested_attention->version() < sdk::FacetVersion{1, 3})
    GTEST_SKIP() << "attention facet " << sdk::to_string(tested_attention->version())
                 << " predates flash_decode (1.3)";
  const std::int64_t heads = 2, d = 16, len = 203, cap = 210, infinite_keys = 150;
  const std::int64_t width = heads * d;
  std::vector<float> qkv_values =
      random_values(static_cast<std::size_t>(len * 3 * width), 83, -2.f, 2.f);
  for (std::int64_t t = 0; t < len; ++t)
    for (std::int64_t h = 0; h < heads; ++h) {
      qkv_values[static_cast<std::size_t>(t * 3 * width + h * d)] = 1.0f;  // q's dimension 0
      if (t < infinite_keys)
        qkv_values[static_cast<std::size_t>(t * 3 * width + width + h * d)] = -INFINITY;
    }
  const float scale = 0.25f;
  for (DType dt : kStorageFloats) {
    const std::vector<DType> dtypes{dt, dt};
    if (!tested_attention->supports(sdk::AttentionOp::flash_decode, dtypes)) continue;
    std::vector<double> stored_qkv(qkv_values.size());
    for (std::size_t i = 0; i < stored_qkv.size(); ++i) stored_qkv[i] = stored(qkv_values[i], dt);
    const auto want_all =
        flash_reference({1, len, heads, d}, stored_qkv,
                        std::vector<double>(static_cast<std::size_t>(len * width)), scale);
    // Unsaturated: -inf stays -inf in 16 bits (upload() would make it the lowest finite value).
    const auto qkv = make_on(*tested_, qkv_values, Shape{1, len, 3 * width}, dt, 1.0f,
                             /*saturate=*/false);
    auto cache = zeros(Shape{3 * heads * cap * d}, dt);
    tested_attention->split_heads(qkv->view(), {1, len, heads, d, 3, cap, 0}, cache.tested->view());
    // A prefill (rows before key 150 see only −inf: 0 / 0 there, as in the exact softmax, and
    // not compared) and a step past the infinite keys.
    for (std::int64_t start : {std::int64_t{0}, std::int64_t{160}}) {
      const std::int64_t rows = len - start;
      auto out = zeros(Shape{1, rows, width}, dt);
      tested_attention->flash_decode(cache.tested->view(), {1, rows, heads, d, 3, cap, start},
                                     scale, out.tested->view());
      const std::int64_t first = std::max(start, infinite_keys);
      const std::vector<float> all = tested_values(out);
      const std::vector<float> got(all.begin() + (first - start) * width, all.end());
      const std::vector<float> want(want_all.out.begin() + first * width, want_all.out.end());
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << sdk::dtype_name(dt) << " from " << start;
      EXPECT_LE(relative_difference(got, want), ulp(dt) / 2 + (len + d) * 0x1p-24)
          << sdk::dtype_name(dt) << " from " << start;
    }
  }
}

// The flash ops' argument checks, in the first storage dtype the backend's flash attention takes
// (fp32 on the CPU, bf16 on CUDA), at a shape it takes (head dimension 8).
TEST_P(Conformance, FlashAttentionRejectsMisshapenArguments) {
  MIXTRAIN_FACETS(attention, AttentionFacet);
  auto* f = tested_attention;
  const sdk::HeadLayout l{2, 5, 2, 8, 3, 0, 0};
  std::optional<DType> taken;
  if (f->version() >= sdk::FacetVersion{1, 1})
    for (DType dt : kStorageFloats) {
      const std::vector<DType> fwd{dt}, bwd{dt, dt};
      if (!f->supports(sdk::AttentionOp::flash_forward, fwd) ||
          !f->supports(sdk::AttentionOp::flash_backward, bwd))
        continue;
      if (f->version() >= sdk::FacetVersion{1, 2} && !f->flash_refusal(l, dt).empty()) continue;
      taken = dt;
      break;
    }
  if (!taken) GTEST_SKIP() << "the attention facet offers no flash attention at this shape";
  const DType dt = *taken, other = dt == DType::fp32 ? DType::bf16 : DType::fp32;
  auto qkv = zeros(Shape{2, 5, 48}, dt);
  auto out = zeros(Shape{2, 5, 16}, dt);
  auto lse = zeros(Shape{2, 2, 5});
  auto dqkv = zeros(Shape{2, 5, 48}, dt);
  auto short_out = zeros(Shape{2, 5, 15}, dt);
  auto other_out = zeros(Shape{2, 5, 16}, other);
  auto narrow_lse = zeros(Shape{2, 2, 5}, DType::fp16);
  auto other_dqkv = zeros(Shape{2, 5, 48}, other);
  const TensorView q = qkv.tested->view(), o = out.tested->view(), s = lse.tested->view();
  const std::string what = std::string(sdk::dtype_name(dt));
  EXPECT_NO_THROW(f->flash_forward(q, l, 0.5f, o, s)) << what;
  sdk::HeadLayout two_parts = l;
  two_parts.parts = 2;
  sdk::HeadLayout cached = l;
  cached.head_tokens = 9;
  EXPECT_THROW(f->flash_forward(q, two_parts, 0.5f, o, s), sdk::BackendError) << what;
  EXPECT_THROW(f->flash_forward(q, cached, 0.5f, o, s), sdk::BackendError) << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, short_out.tested->view(), s), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, other_out.tested->view(), s), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, o, narrow_lse.tested->view()), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_forward(q, l, 0.5f, q, s), sdk::BackendError) << what;  // out overlaps qkv
  EXPECT_NO_THROW(f->flash_backward(q, o, o, s, l, 0.5f, dqkv.tested->view())) << what;
  // dqkv in another dtype than dout, or over qkv itself.
  EXPECT_THROW(f->flash_backward(q, o, o, s, l, 0.5f, other_dqkv.tested->view()), sdk::BackendError)
      << what;
  EXPECT_THROW(f->flash_backward(q, o, o, s, l, 0.5f, q), sdk::BackendError) << what;
}

}  // namespace
}  // namespace mixtrain::conformance
