// The groups of `train --profile`'s table (profile_group, profiling_backend.h): every op of the
// GEMM facet lands in "GEMMs" or "casts", never in "other ops" (a wgrad with its bias gradient in
// the epilogue, gemm_gradient, once counted as "other ops": a third of a GPT step on the CPU), the
// scopes that name a stage (classifier, optimizer, ...) win over the op, and an op of no group
// stays "other ops".
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>

#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::core {
namespace {

ProfileEntry entry(std::string scope, std::string_view op) {
  return {std::move(scope), std::string(op), 1, 1.0};
}

TEST(ProfileGroup, EveryGemmFacetOpIsAGemmOrACast) {
  using sdk::GemmOp;
  // Every GemmOp, an op appended later included: the enum counts up from 0 (backend_gemm.h
  // appends at its end) and op_name answers "?" past the last (an enum class's values are ints).
  int i = 0;
  for (; sdk::op_name(static_cast<GemmOp>(i)) != "?"; ++i) {
    const auto op = static_cast<GemmOp>(i);
    const bool quantizes = op == GemmOp::quantize_block_scaled || op == GemmOp::cast_transpose ||
                           op == GemmOp::cast_transpose_gradient;
    EXPECT_EQ(profile_group(entry("linear", sdk::op_name(op))), quantizes ? "casts" : "GEMMs")
        << sdk::op_name(op);
    EXPECT_EQ(profile_group(entry("conv", sdk::op_name(op))), quantizes ? "casts" : "GEMMs")
        << sdk::op_name(op);
  }
  EXPECT_GT(i,
            static_cast<int>(GemmOp::cast_transpose_gradient));  // the walk reached the newest op
  EXPECT_EQ(profile_group(entry("lora", "cast")), "casts");
}

TEST(ProfileGroup, AStageScopeWinsOverItsOps) {
  EXPECT_EQ(profile_group(entry("classifier", "gemm_gradient")),
            "classifier (LM head GEMMs + cross-entropy)");
  EXPECT_EQ(profile_group(entry("classifier", "softmax_cross_entropy")),
            "classifier (LM head GEMMs + cross-entropy)");
  EXPECT_EQ(profile_group(entry("optimizer", "adamw_update_gated")), "optimizer");
  EXPECT_EQ(profile_group(entry("data", "copy_from_host")), "data (batch to device)");
  // A backend op of the data-parallel reducer (a device all-reduce, the copies around it).
  EXPECT_EQ(profile_group(entry("gradient all-reduce", "copy")), "gradient all-reduce");
}

TEST(ProfileGroup, OpsOfNoGroupAreOtherOps) {
  EXPECT_EQ(profile_group(entry("add", "add_backward")), "other ops");
  EXPECT_EQ(profile_group(entry("linear", "gemm_gradient_fused")), "other ops");  // not a name
  EXPECT_EQ(profile_group(entry("linear", "")), "other ops");
}

}  // namespace
}  // namespace mixtrain::core
