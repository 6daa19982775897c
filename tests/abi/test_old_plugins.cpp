// Plugins built against an earlier SDK (old_plugins_load.sh builds them into
// $MIXTRAIN_OLD_PLUGIN_DIR) load into this host and work: the scaler sample (no facet) and the
// backend sample, whose gemm facet is an older minor (1.0) than this host's. The host uses what
// 1.0 declares and refuses, by name and version, only what a later minor appended.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/loss_scaler.h"

namespace {

using namespace mixtrain;
using sdk::DType;

class OldPlugins : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("MIXTRAIN_OLD_PLUGIN_DIR");
    if (dir == nullptr) GTEST_SKIP() << "run by old_plugins_load.sh, which builds the plugins";
    registry.scan({std::filesystem::path(dir)});
  }
  std::unique_ptr<sdk::Component> create(sdk::ComponentKind kind, const std::string& name) {
    const auto* c = registry.find(kind, name);
    EXPECT_NE(c, nullptr) << name;
    if (c == nullptr) return nullptr;
    const sdk::Options options = sdk::Options::resolve(name, c->info.options, {}, {});
    return c->info.create(options, sdk::PluginContext{sdk::Logger{}, c->plugin_name, name});
  }
  core::PluginRegistry registry;
};

TEST_F(OldPlugins, BothLoadWithoutAnError) {
  ASSERT_EQ(registry.libraries().size(), 2u);
  for (const auto& lib : registry.libraries())
    EXPECT_TRUE(lib.loaded) << lib.path << ": " << lib.error;
}

TEST_F(OldPlugins, TheScalerSampleScales) {
  auto c = create(sdk::ComponentKind::scaler, "adaptive");
  auto* scaler = dynamic_cast<sdk::LossScaler*>(c.get());
  ASSERT_NE(scaler, nullptr);
  const float before = scaler->scale();
  EXPECT_GT(before, 0.0f);
  const sdk::ScalerDecision overflow = scaler->update(true);
  EXPECT_FALSE(overflow.apply_step);
  EXPECT_LT(scaler->scale(), before);  // an overflow backs off
}

TEST_F(OldPlugins, TheBackendSampleServesItsMinorAndIsRefusedTheLaterOne) {
  auto c = create(sdk::ComponentKind::backend, "reference");
  auto* backend = dynamic_cast<sdk::DeviceBackend*>(c.get());
  ASSERT_NE(backend, nullptr);
  sdk::Facet* found = backend->find_facet(sdk::GemmFacet::kName);
  ASSERT_NE(found, nullptr);
  // Built before gemm's minor step: it says so, and this host is later.
  EXPECT_EQ(found->version(), (sdk::FacetVersion{1, 0}));
  ASSERT_GT(sdk::GemmFacet::kVersion.minor, 0);

  const std::vector<DType> f32{DType::fp32, DType::fp32, DType::fp32};
  EXPECT_EQ(core::unmet(*backend, {sdk::GemmOp::gemm, f32}), std::nullopt);
  const auto why = core::unmet(*backend, {sdk::GemmOp::gemm_grouped, f32});
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("gemm facet is version 1.0"), std::string::npos) << *why;
  EXPECT_NE(why->find("gemm_grouped needs 1.1"), std::string::npos) << *why;

  // A 1.0 call through the host's binding runs the old plugin's own code.
  const core::BoundFacets facets(*backend);
  const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};  // [2, 2] each
  auto* pa = static_cast<float*>(backend->allocate(sizeof a));
  auto* pb = static_cast<float*>(backend->allocate(sizeof b));
  auto* pc = static_cast<float*>(backend->allocate(sizeof a));
  backend->copy_from_host({pa, DType::fp32, sdk::Shape{2, 2}}, a);
  backend->copy_from_host({pb, DType::fp32, sdk::Shape{2, 2}}, b);
  sdk::GemmArgs g;
  g.a.view = {pa, DType::fp32, sdk::Shape{2, 2}};
  g.b.view = {pb, DType::fp32, sdk::Shape{2, 2}};
  g.c = {pc, DType::fp32, sdk::Shape{2, 2}};
  facets.call(sdk::GemmOp::gemm)->gemm(g);
  float out[4] = {};
  backend->copy_to_host(out, g.c);
  EXPECT_EQ(out[0], 19.0f);
  EXPECT_EQ(out[1], 22.0f);
  EXPECT_EQ(out[2], 43.0f);
  EXPECT_EQ(out[3], 50.0f);
  for (void* p : {static_cast<void*>(pa), static_cast<void*>(pb), static_cast<void*>(pc)})
    backend->deallocate(p);
}

}  // namespace
