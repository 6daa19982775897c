// Embedding gather and scatter-add, and dropout against the SDK's mask bit for bit.
#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_embedding_dropout() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, EmbeddingGatherWithAndWithoutAccumulate) {
  MIXTRAIN_FACETS(embedding, EmbeddingFacet);
  const std::int64_t vocab = 37, width = 24, rows = 29;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < ids.size(); ++r)
    ids[r] = static_cast<std::int32_t>((r * 7 + 3) % vocab);
  ids[5] = ids[9] = 0;  // repeats and both ends of the table
  ids[6] = static_cast<std::int32_t>(vocab - 1);
  DeviceTensor id(*tested_, DType::int32, Shape{rows});
  tested_->copy_from_host(id.view(), ids.data());
  const auto table_values = random_values(static_cast<std::size_t>(vocab * width), 43, -4.f, 4.f);
  const auto old_values = random_values(static_cast<std::size_t>(rows * width), 44, -4.f, 4.f);
  for (DType tt : kStorageFloats)
    for (DType ot : kStorageFloats) {
      if (!tested_embedding->supports(sdk::EmbeddingOp::gather, std::vector<DType>{tt, ot}))
        continue;
      for (bool accumulate : {false, true}) {
        auto table = upload(table_values, Shape{vocab, width}, tt);
        auto out = upload(old_values, Shape{rows, width}, ot);
        tested_embedding->gather(id.view(), table.tested->view(), out.tested->view(), accumulate);
        const auto got = tested_values(out);
        std::int64_t bad = 0, first = -1;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < width; ++j) {
            const auto i = static_cast<std::size_t>(r * width + j);
            const double t = stored(table_values[static_cast<std::size_t>(
                                        ids[static_cast<std::size_t>(r)] * width + j)],
                                    tt);
            const double want = accumulate ? stored(old_values[i], ot) + t : t;
            // One rounding into out's dtype (double-then-dtype here may differ by one ulp from
            // fp32-then-dtype when accumulating).
            if (std::abs(got[i] - want) > ulp(ot) * std::abs(want)) {
              ++bad;
              if (first < 0) first = static_cast<std::int64_t>(i);
            }
          }
        EXPECT_EQ(bad, 0) << dtypes_text({tt, ot}) << (accumulate ? " accumulate" : "")
                          << ": first wrong element " << first << " (row " << first / width << ")";
      }
    }
}

TEST_P(Conformance, EmbeddingScatterAddRepeatedIdsBothBetas) {
  MIXTRAIN_FACETS(embedding, EmbeddingFacet);
  const std::int64_t vocab = 19, width = 40, rows = 300;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  std::mt19937 rng(45);
  for (auto& v : ids)
    v = static_cast<std::int32_t>(rng() % 2 == 0 ? 3 : rng() % 12);  // ids >= 12 never occur
  DeviceTensor id(*tested_, DType::int32, Shape{rows});
  tested_->copy_from_host(id.view(), ids.data());
  const auto dy_values = random_values(static_cast<std::size_t>(rows * width), 46);
  const auto start = random_values(static_cast<std::size_t>(vocab * width), 47);
  for (DType dt : kStorageFloats) {
    if (!tested_embedding->supports(sdk::EmbeddingOp::scatter_add, std::vector<DType>{dt}))
      continue;
    auto dy = upload(dy_values, Shape{rows, width}, dt);
    for (float beta : {0.0f, 1.0f}) {
      auto table = upload(start, Shape{vocab, width});
      tested_embedding->scatter_add(id.view(), dy.tested->view(), table.tested->view(), beta);
      const auto got = tested_values(table);
      std::vector<double> sum(start.size(), 0.0);
      for (std::size_t r = 0; r < ids.size(); ++r)
        for (std::int64_t j = 0; j < width; ++j)
          sum[static_cast<std::size_t>(ids[r] * width + j)] += stored(
              dy_values[r * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)], dt);
      std::vector<float> want(start.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        want[i] = static_cast<float>(beta * static_cast<double>(start[i]) + sum[i]);
      const std::string what = std::string(sdk::dtype_name(dt)) + " beta " + std::to_string(beta);
      EXPECT_LE(relative_difference(got, want), 1e-6) << what;
      for (std::int64_t v = 12; v < vocab; ++v)  // rows no id names: 0, or as they were
        for (std::int64_t j = 0; j < width; ++j) {
          const auto i = static_cast<std::size_t>(v * width + j);
          EXPECT_EQ(got[i], beta == 0.0f ? 0.0f : start[i]) << what << " untouched row " << v;
        }
      // Deterministic: the same call again gives the same bits.
      auto again = upload(start, Shape{vocab, width});
      tested_embedding->scatter_add(id.view(), dy.tested->view(), again.tested->view(), beta);
      EXPECT_EQ(tested_values(again), got) << what << ", second run";
    }
  }
}

// The mask is the SDK's function of (key, index), so a backend must reproduce the reference's
// output bit for bit: same keep bits, one FP32 multiply, one rounding.
TEST_P(Conformance, DropoutMatchesTheSdkMaskBitForBitForwardAndBackward) {
  MIXTRAIN_FACETS(dropout, DropoutFacet);
  const std::int64_t rows = 97, cols = 131;  // odd sizes: no chunk or block lines up
  const auto values = random_values(static_cast<std::size_t>(rows * cols), 61, -3.f, 3.f);
  const sdk::DropoutKey key{0x1234'5678'9abc'def0ull, (7ull << 32) | 2u};
  for (const float p : {0.0f, 0.1f, 0.5f, 0.9f})
    for (DType xt : kStorageFloats)
      for (DType yt : kStorageFloats)
        for (const auto op : {sdk::DropoutOp::dropout_forward, sdk::DropoutOp::dropout_backward}) {
          if (!tested_dropout->supports(op, std::vector<DType>{xt, yt})) continue;
          auto x = upload(values, Shape{rows, cols}, xt);
          auto y = zeros(Shape{rows, cols}, yt);
          const bool fwd = op == sdk::DropoutOp::dropout_forward;
          (fwd ? ref_dropout->dropout_forward(x.ref->view(), y.ref->view(), p, key)
               : ref_dropout->dropout_backward(x.ref->view(), y.ref->view(), p, key));
          (fwd ? tested_dropout->dropout_forward(x.tested->view(), y.tested->view(), p, key)
               : tested_dropout->dropout_backward(x.tested->view(), y.tested->view(), p, key));
          const auto got = tested_values(y), want = ref_values(y);
          const auto in = tested_values(x);
          const std::uint32_t threshold = sdk::dropout_threshold(p);
          std::int64_t bad = 0, mask_bad = 0;
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++bad;
            const bool keep = sdk::dropout_keeps(key, i, threshold);
            if ((got[i] != 0.0f) != (keep && in[i] != 0.0f)) ++mask_bad;
          }
          const std::string what = std::string(sdk::op_name(op)) + " p = " + std::to_string(p) +
                                   " " + dtypes_text({xt, yt});
          EXPECT_EQ(bad, 0) << what << ": elements that differ from the reference";
          EXPECT_EQ(mask_bad, 0) << what << ": elements whose zero pattern is not the SDK mask";
        }
}

}  // namespace
}  // namespace mixtrain::conformance
