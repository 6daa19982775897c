// The facet list (sdk/facet_list.h) is the one registry of facets: the host's needs and bindings
// are generated from it, a plan binds each facet once and its calls compare no names, and
// docs/architecture.md's facet table says what the list and the headers say.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

// Every facet of the list with what the code says of it.
struct ListedFacet {
  std::string name, version;
  bool has_ops = false;
};
template <class... Fs>
std::vector<ListedFacet> listed(sdk::FacetList<Fs...>) {
  return {
      ListedFacet{std::string(Fs::kName), sdk::to_string(Fs::kVersion), requires {typename Fs::Op;
}
}  // namespace
...
};  // namespace mixtrain::core
}

TEST(FacetList, TheNeedsVariantHasOneAlternativePerFacetWithOps) {
  std::size_t with_ops = 0;
  for (const auto& f : listed(sdk::Facets{})) with_ops += f.has_ops ? 1 : 0;
  EXPECT_EQ(std::variant_size_v<decltype(BackendNeed::op)>, with_ops);
  EXPECT_GE(with_ops, 13u);
  // Each op enum maps back to its own facet.
  static_assert(std::is_same_v<FacetOf<sdk::GemmOp>::type, sdk::GemmFacet>);
  static_assert(std::is_same_v<FacetOf<sdk::DropoutOp>::type, sdk::DropoutFacet>);
  EXPECT_EQ(need_op_name({sdk::BatchNormOp::batchnorm_statistics, {DType::fp32}}),
            "batch_norm.batchnorm_statistics");
}

TEST(FacetList, EveryNameIsUnique) {
  std::map<std::string, int> seen;
  for (const auto& f : listed(sdk::Facets{})) EXPECT_EQ(++seen[f.name], 1) << f.name;
}

// A backend that counts its facet lookups.
class CountingBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    ++lookups;
    return in_->find_facet(name);
  }
  int lookups = 0;
};

TEST(FacetList, APlanBindsEachFacetOnceAndItsStepsLookNothingUp) {
  auto b = std::make_shared<CountingBackend>();
  ModelSpec spec;
  spec.layers = {test_support::op("linear", "fc1", {{"out", std::int64_t{16}}}, {}, {}),
                 test_support::op("gelu", "act", {}, {}, {}),
                 test_support::op("layernorm", "norm", {}, {}, {}),
                 test_support::op("linear", "head", {{"out", std::int64_t{3}}}, {}, {})};
  Model m(b, spec, 6, 3);
  m.allocate(8);
  m.init_parameters(5);
  const int after_planning = b->lookups;
  EXPECT_GT(after_planning, 0);
  std::vector<float> x(8 * 6, 0.25f);
  std::vector<std::int32_t> y(8, 1);
  b->copy_from_host(m.input(8), x.data());
  b->copy_from_host(m.labels(8), y.data());
  for (int step = 0; step < 3; ++step) {
    m.forward(8);
    m.loss(8, 1.0f, true);
    m.backward(8);
  }
  EXPECT_EQ(b->lookups, after_planning) << "a training step looked a facet up by name";
}

// The rows of docs/architecture.md's facet table: name -> {header, version}, in order.
std::vector<std::vector<std::string>> facet_table() {
  std::ifstream in(std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/docs/architecture.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto start = doc.find("## Backends and facets");
  const auto end = doc.find("\n## ", start + 1);
  std::istringstream section(doc.substr(start, end - start));
  const std::regex row(R"(^\| `([a-z_]+)` \| `([a-z_]+\.h)` \| ([0-9]+\.[0-9]+) \|)");
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(section, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) rows.push_back({m[1], m[2], m[3]});
  }
  return rows;
}

// Whether a facet header is a component's (a precision policy's policy_*.h, an optimizer's
// optimizer_*.h, a checkpoint format's format_*.h): found on the component by dynamic_cast, in no
// list.
bool component_facet_header(const std::string& file) {
  return file.rfind("policy_", 0) == 0 || file.rfind("optimizer_", 0) == 0 ||
         file.rfind("format_", 0) == 0;
}

// The backend facets' rows.
std::vector<std::vector<std::string>> backend_facet_rows() {
  std::vector<std::vector<std::string>> rows;
  for (auto& row : facet_table())
    if (!component_facet_header(row[1])) rows.push_back(row);
  return rows;
}

TEST(FacetList, TheArchitectureTableListsEveryFacetWithItsHeaderAndVersion) {
  const auto rows = backend_facet_rows();
  const auto facets = listed(sdk::Facets{});
  ASSERT_EQ(rows.size(), facets.size()) << "docs/architecture.md's facet table has " << rows.size()
                                        << " rows, sdk/facet_list.h " << facets.size() << " facets";
  for (std::size_t i = 0; i < facets.size(); ++i) {
    EXPECT_EQ(rows[i][0], facets[i].name) << "row " << i;
    EXPECT_EQ(rows[i][2], facets[i].version) << facets[i].name;
    // The header named is the one that declares the facet's kName.
    std::ifstream h(std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/sdk/include/mixtrain/sdk/" +
                    rows[i][1]);
    std::stringstream text;
    text << h.rdbuf();
    EXPECT_NE(text.str().find("kName = \"" + facets[i].name + "\""), std::string::npos)
        << rows[i][1] << " does not declare facet " << facets[i].name;
  }
}

// Component facets (policy_*.h, optimizer_*.h and format_*.h, found on the component by
// dynamic_cast) are in no list: each such header under sdk/ has one row in the component facet
// table, with its kName and kVersion.
TEST(FacetList, TheArchitectureTableListsEveryComponentFacetWithItsHeaderAndVersion) {
  std::map<std::string, std::vector<std::string>> rows;  // header -> {name, version}
  for (const auto& row : facet_table())
    if (component_facet_header(row[1])) rows[row[1]] = {row[0], row[2]};
  const std::filesystem::path sdk =
      std::filesystem::path(MIXTRAIN_TEST_SOURCE_DIR) / "sdk/include/mixtrain/sdk";
  std::size_t headers = 0;
  for (const auto& entry : std::filesystem::directory_iterator(sdk)) {
    const std::string file = entry.path().filename().string();
    if (!component_facet_header(file) || entry.path().extension() != ".h") continue;
    ++headers;
    ASSERT_TRUE(rows.count(file)) << "docs/architecture.md's component facet table has no row for "
                                  << file;
    std::ifstream h(entry.path());
    std::stringstream text;
    text << h.rdbuf();
    const std::string name = rows[file][0], version = rows[file][1];
    EXPECT_NE(text.str().find("kName = \"" + name + "\""), std::string::npos)
        << file << " does not declare facet " << name;
    const auto dot = version.find('.');
    EXPECT_NE(text.str().find("kVersion{" + version.substr(0, dot) + ", " +
                              version.substr(dot + 1) + "}"),
              std::string::npos)
        << file << " is not at version " << version;
  }
  EXPECT_EQ(rows.size(), headers) << "a component facet row names a header that does not exist";
  EXPECT_GE(headers, 2u);
}

}  // namespace
}  // namespace mixtrain::core
