// The conformance kit's registry (backend_conformance.h): the reference factory, the backends
// under test, and the one instantiation of the Conformance suite over them. The tests themselves
// live in conformance_<area>.cpp, one file per group of facets.
#include "mixtrain/conformance/backend_conformance.h"

#include <optional>
#include <utility>

#include "conformance_fixture.h"
#include "mixtrain/core/plugins/registry.h"

namespace mixtrain::conformance {

namespace {
BackendFactory& stored_reference() {
  static BackendFactory f;
  return f;
}
std::vector<BackendUnderTest>& backends() {
  static std::vector<BackendUnderTest> b;
  return b;
}
std::optional<std::vector<std::filesystem::path>>& search_path() {
  static std::optional<std::vector<std::filesystem::path>> p;
  return p;
}

// A program links the kit as a static library, and a linker takes an archive's object only for a
// symbol the program uses: every program calls set_reference(), so it names one symbol of each
// test file, and every file's tests register.
void link_all_test_files() {
  internal::link_kernels();
  internal::link_gemm();
  internal::link_weight_formats();
  internal::link_attention();
  internal::link_embedding_dropout();
  internal::link_foreach_memory();
  internal::link_image_input();
  internal::link_training();
  internal::link_convolution();
  internal::link_batch_norm();
}
}  // namespace

void set_plugin_search_path(std::vector<std::filesystem::path> folders_or_files) {
  search_path() = std::move(folders_or_files);
}

std::vector<std::filesystem::path> plugin_search_path() {
  return search_path() ? *search_path() : core::PluginRegistry::default_search_path();
}

const BackendFactory& reference_factory() {
  return stored_reference();
}

void set_reference(BackendFactory make) {
  link_all_test_files();
  stored_reference() = std::move(make);
}
void add_backend(std::string name, BackendFactory make, std::vector<std::string> config_overrides) {
  backends().push_back({std::move(name), std::move(make), std::move(config_overrides)});
}
const std::vector<BackendUnderTest>& registered_backends() {
  return backends();
}

namespace {
using internal::Conformance;
INSTANTIATE_TEST_SUITE_P(conformance, Conformance, ::testing::ValuesIn(registered_backends()),
                         [](const auto& info) { return info.param.name; });
// A program that tests only scalers and optimizers (component_conformance.h) registers no backend:
// GoogleTest would otherwise fail it for an empty instantiation.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);
}  // namespace

}  // namespace mixtrain::conformance
