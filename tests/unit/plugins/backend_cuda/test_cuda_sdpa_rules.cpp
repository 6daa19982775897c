// The CUDA backend's flash-attention rules (cuda_sdpa_rules.h), on the host: the dims and strides
// cuDNN is told address exactly the elements of the attention facet's layouts, which shapes and
// devices are refused and why, and the plan-cache key; where the cuDNN frontend was found, the
// graphs built on those rules through the frontend's own validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <unordered_set>
#include <vector>

#include "cuda_sdpa_rules.h"
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
#include "cuda_sdpa_graphs.h"
#endif

namespace mixtrain::backend_cuda::sdpa {
namespace {

using sdk::DType;

// The element a strided view puts at (n, h, t, d).
std::int64_t address(const Strided& s, std::int64_t n, std::int64_t h, std::int64_t t,
                     std::int64_t d) {
  return s.offset + n * s.stride[0] + h * s.stride[1] + t * s.stride[2] + d * s.stride[3];
}

TEST(CudaSdpaRules, QKVViewsAddressTheInterleavedProjectionOutput) {
  const Key k{2, 5, 3, 8, DType::bf16, 0.35f, true};
  const std::int64_t hd = k.heads * k.head_dim;
  std::set<std::int64_t> seen;
  for (int part = 0; part < 3; ++part) {
    const Strided s = qkv_part(k, part);
    EXPECT_EQ(s.dim, (std::array<std::int64_t, 4>{2, 3, 5, 8})) << "part " << part;
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t t = 0; t < 5; ++t)
          for (std::int64_t d = 0; d < 8; ++d) {
            // qkv [N, T, 3, H, D], as the attention facet lays it out.
            const std::int64_t want = ((n * k.tokens + t) * 3 + part) * hd + h * k.head_dim + d;
            ASSERT_EQ(address(s, n, h, t, d), want)
                << "part " << part << " n " << n << " h " << h << " t " << t << " d " << d;
            seen.insert(want);
          }
    // k's and v's views start 16 bytes after a 16-byte boundary when H·D is a multiple of 8.
    EXPECT_EQ(s.offset * 2 % 16, 0) << "part " << part;
  }
  // The three views cover qkv exactly once.
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(2 * 5 * 3 * hd));
  EXPECT_EQ(*seen.rbegin(), 2 * 5 * 3 * hd - 1);
}

TEST(CudaSdpaRules, OutputAndStatisticsViewsAddressTheirLayouts) {
  const Key k{2, 4, 3, 16, DType::fp16, 0.25f, true};
  const Strided o = token_major(k), st = stats(k);
  EXPECT_EQ(st.dim, (std::array<std::int64_t, 4>{2, 3, 4, 1}));
  std::unordered_set<std::int64_t> seen_o, seen_s;
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t t = 0; t < 4; ++t) {
        // lse [N, H, T].
        EXPECT_EQ(address(st, n, h, t, 0), (n * 3 + h) * 4 + t);
        seen_s.insert(address(st, n, h, t, 0));
        for (std::int64_t d = 0; d < 16; ++d) {
          // out [N, T, H, D].
          EXPECT_EQ(address(o, n, h, t, d), ((n * 4 + t) * 3 + h) * 16 + d);
          seen_o.insert(address(o, n, h, t, d));
        }
      }
  EXPECT_EQ(seen_o.size(), 2u * 4 * 3 * 16);
  EXPECT_EQ(seen_s.size(), 2u * 3 * 4);
}

TEST(CudaSdpaRules, ThePlanTimeProbeIsOneSequence) {
  const Key probe{0, 1024, 12, 64, DType::bf16, 0.125f, true};
  EXPECT_EQ(qkv_part(probe, 1).dim[0], 1);
  EXPECT_EQ(token_major(probe).dim[0], 1);
  EXPECT_EQ(stats(probe).dim[0], 1);
}

TEST(CudaSdpaRules, RefusesWhatCudnnsSupportMatrixExcludes) {
  // GPT-2's heads on Hopper and Ampere: taken.
  EXPECT_EQ(static_refusal(1024, 64, DType::bf16, 90), "");
  EXPECT_EQ(static_refusal(1024, 64, DType::fp16, 80), "");
  EXPECT_EQ(static_refusal(1, 8, DType::bf16, 90), "");
  EXPECT_EQ(static_refusal(77, 256, DType::bf16, 90), "");
  // Each refusal says what and by how much.
  const std::string fp32 = static_refusal(1024, 64, DType::fp32, 90);
  EXPECT_NE(fp32.find("fp16 or bf16, not fp32"), std::string::npos) << fp32;
  const std::string turing = static_refusal(1024, 64, DType::fp16, 75);
  EXPECT_NE(turing.find("sm_75"), std::string::npos) << turing;
  for (std::int64_t d : {4, 12, 36, 100}) {
    const std::string odd = static_refusal(64, d, DType::bf16, 90);
    EXPECT_NE(odd.find("multiple of 8"), std::string::npos) << odd;
    EXPECT_NE(odd.find(std::to_string(d)), std::string::npos) << odd;
  }
  const std::string ampere_wide = static_refusal(64, 160, DType::bf16, 86);
  EXPECT_NE(ampere_wide.find("at most 128 on sm_86"), std::string::npos) << ampere_wide;
  EXPECT_EQ(static_refusal(64, 160, DType::bf16, 90), "");
  const std::string too_wide = static_refusal(64, 264, DType::bf16, 90);
  EXPECT_NE(too_wide.find("at most 256"), std::string::npos) << too_wide;
  EXPECT_NE(static_refusal(0, 64, DType::bf16, 90), "");
}

TEST(CudaSdpaRules, KeysTellShapesScalesAndDeterminismApart) {
  const Key a{8, 1024, 12, 64, DType::bf16, 0.125f, true};
  Key b = a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(KeyHash{}(a), KeyHash{}(b));
  std::vector<Key> others(6, a);
  others[0].batch = 4;
  others[1].tokens = 512;
  others[2].head_dim = 128;
  others[3].dtype = DType::fp16;
  others[4].scale = std::nextafter(0.125f, 1.0f);
  others[5].deterministic = false;
  std::unordered_set<Key, KeyHash> keys{a};
  for (const Key& o : others) {
    EXPECT_NE(o, a);
    keys.insert(o);
  }
  EXPECT_EQ(keys.size(), 7u);
  EXPECT_EQ(key_text(a), "N 8 T 1024 H 12 D 64 bf16 scale 0.125 deterministic");
  EXPECT_NE(key_text(others[5]).find("non-deterministic"), std::string::npos);
  // The scale is compared by its bits, as it is hashed: a NaN scale finds its own entry again
  // (one graph, not one per call), and -0 is not +0.
  Key nan = a, zero = a, negative_zero = a;
  nan.scale = std::numeric_limits<float>::quiet_NaN();
  zero.scale = 0.0f;
  negative_zero.scale = -0.0f;
  EXPECT_EQ(nan, nan);
  keys.insert(nan);
  keys.insert(nan);
  keys.insert(zero);
  keys.insert(negative_zero);
  EXPECT_EQ(keys.size(), 10u);
}

#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
// The forward and backward graphs pass the frontend's validation for Hopper (sm_90) wherever
// static_refusal takes the shape: GPT-2 small's and medium's heads at the kit's batch, the
// plan-time probe (one sequence), an odd sequence, the widest and a narrow head dim, both dtypes,
// both backward kernels. And the frontend's checks are real: a head dim static_refusal refuses
// fails its validation too.
TEST(CudaSdpaGraphs, EveryShapeTheRulesTakeValidatesForHopper) {
  const Key shapes[] = {
      {8, 1024, 12, 64, DType::bf16, 0.125f, true}, {8, 1024, 16, 64, DType::bf16, 0.125f, true},
      {0, 1024, 12, 64, DType::bf16, 0.125f, true}, {3, 77, 3, 128, DType::bf16, 0.088f, true},
      {2, 64, 2, 256, DType::bf16, 0.0625f, true},  {2, 33, 4, 8, DType::bf16, 0.35f, true}};
  for (Key k : shapes)
    for (DType dt : {DType::bf16, DType::fp16})
      for (bool deterministic : {true, false}) {
        k.dtype = dt;
        k.deterministic = deterministic;
        ASSERT_EQ(static_refusal(k.tokens, k.head_dim, dt, 90), "") << key_text(k);
        EXPECT_EQ(SdpaGraphs::host_validate(k, 90), "") << key_text(k);
      }
  const Key odd{2, 64, 2, 12, DType::bf16, 0.3f, true};
  ASSERT_NE(static_refusal(odd.tokens, odd.head_dim, odd.dtype, 90), "");
  EXPECT_NE(SdpaGraphs::host_validate(odd, 90), "") << key_text(odd);
}
#endif  // MIXTRAIN_HAVE_CUDNN_FRONTEND

}  // namespace
}  // namespace mixtrain::backend_cuda::sdpa
