// PluginRegistry against the libraries of tests/plugins: one good plugin and one library per
// failure mode. Each case lives in its own folder, so a test scans exactly what it needs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/loss_scaler.h"
#include "mixtrain/sdk/precision_policy.h"
#include "mixtrain/sdk/version.h"

namespace fs = std::filesystem;
using mixtrain::core::LibraryRecord;
using mixtrain::core::PluginRegistry;
using mixtrain::sdk::ComponentKind;
namespace sdk = mixtrain::sdk;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(MIXTRAIN_TEST_PLUGIN_DIR) / name; }

const std::vector<std::string> kBadCases = {"abi_mismatch",      "fingerprint_mismatch",
                                            "unresolved_symbol", "throwing_components",
                                            "not_a_plugin",      "null_components"};

// Good first, so it is the first provider of "test_constant" when "duplicate" comes later.
std::vector<fs::path> all_cases() {
  std::vector<fs::path> dirs = {case_dir("good")};
  for (const auto& c : kBadCases) dirs.push_back(case_dir(c));
  dirs.push_back(case_dir("throwing_factory"));
  dirs.push_back(case_dir("duplicate"));
  return dirs;
}

struct Line {
  sdk::LogLevel level;
  std::string component, message;
};

class CapturingSink final : public sdk::LogSink {
 public:
  void write(sdk::LogLevel level, std::string_view component, std::string_view message) override {
    lines.push_back({level, std::string(component), std::string(message)});
  }
  bool enabled(sdk::LogLevel) const override { return true; }
  std::vector<Line> lines;
};

const LibraryRecord* record_in(const PluginRegistry& r, const std::string& case_name) {
  for (const auto& l : r.libraries())
    if (l.path.parent_path().filename() == case_name) return &l;
  return nullptr;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<sdk::RawOption> no_raw;

sdk::Options resolve_for(const mixtrain::core::LoadedComponent& c,
                         const std::vector<sdk::RawOption>& raw = no_raw) {
  return sdk::Options::resolve("scaler", c.info.options, raw, {"test.toml", 1, 1});
}

// Runs `f`, which must throw sdk::PluginError, and returns it.
template <class F>
std::optional<sdk::PluginError> plugin_error(F&& f) {
  try {
    f();
  } catch (const sdk::PluginError& e) {
    return e;
  }
  return std::nullopt;
}

class registry_AllCases : public ::testing::Test {
 protected:
  void SetUp() override { registry.scan(all_cases()); }
  CapturingSink sink;
  PluginRegistry registry{&sink};
};

TEST(registry_TestPlugins, EveryCaseWasBuiltIntoItsOwnFolder) {
  for (const auto& c : all_cases()) {
    ASSERT_TRUE(fs::is_directory(c)) << c;
    int libs = 0;
    for (const auto& f : fs::directory_iterator(c))
      if (f.path().extension() == ".so") ++libs;
    EXPECT_EQ(libs, 1) << c;
  }
}

TEST_F(registry_AllCases, GoodPluginLoadsAndListsItsComponents) {
  const auto* good = record_in(registry, "good");
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->loaded) << good->error;
  EXPECT_EQ(good->plugin_name, "test_good");
  EXPECT_EQ(good->plugin_version, "1.2.3");
  EXPECT_TRUE(good->error.empty());

  const auto* scaler = registry.find(ComponentKind::scaler, "test_constant");
  ASSERT_NE(scaler, nullptr);
  EXPECT_EQ(scaler->plugin_name, "test_good");
  EXPECT_EQ(scaler->library.filename(), "libmixtrain_test_good.so");
  EXPECT_EQ(scaler->info.description, "test scaler with a constant scale");
  ASSERT_EQ(scaler->info.options.size(), 2u);
  EXPECT_EQ(scaler->info.options[0].name, "scale");
  EXPECT_EQ(scaler->info.options[1].name, "mode");

  const auto* policy = registry.find(ComponentKind::policy, "test_fp32");
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(policy->plugin_name, "test_good");

  auto policies = registry.names(ComponentKind::policy);
  EXPECT_EQ(policies, std::vector<std::string>{"test_fp32"});
  // Kinds are separate namespaces.
  EXPECT_EQ(registry.find(ComponentKind::policy, "test_constant"), nullptr);
  EXPECT_EQ(registry.find(ComponentKind::optimizer, "test_constant"), nullptr);
}

TEST_F(registry_AllCases, EveryLibraryIsRecordedOnce) {
  EXPECT_EQ(registry.libraries().size(), all_cases().size());
  for (const auto& c : kBadCases) {
    const auto* rec = record_in(registry, c);
    ASSERT_NE(rec, nullptr) << c;
    EXPECT_FALSE(rec->loaded) << c;
    EXPECT_FALSE(rec->error.empty()) << c;
  }
  // Scanning the same folders again loads nothing twice.
  const auto scalers = registry.names(ComponentKind::scaler);
  registry.scan(all_cases());
  EXPECT_EQ(registry.libraries().size(), all_cases().size());
  EXPECT_EQ(registry.names(ComponentKind::scaler), scalers);
}

TEST_F(registry_AllCases, AbiMismatchNamesBothVersionsAndRegistersNothing) {
  const auto* rec = record_in(registry, "abi_mismatch");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  const auto theirs = std::to_string(sdk::kSdkAbiVersion + 100);
  const auto ours = std::to_string(sdk::kSdkAbiVersion);
  EXPECT_TRUE(contains(rec->error, "ABI")) << rec->error;
  EXPECT_TRUE(contains(rec->error, "version " + theirs)) << rec->error;
  EXPECT_TRUE(contains(rec->error, "version " + ours)) << rec->error;
  // Nothing beyond the first two members was read: the components were never asked for.
  EXPECT_EQ(registry.find(ComponentKind::policy, "abi_mismatch_policy"), nullptr);
  EXPECT_TRUE(rec->plugin_name.empty());
}

TEST_F(registry_AllCases, FingerprintMismatchNamesBothFingerprints) {
  const auto* rec = record_in(registry, "fingerprint_mismatch");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  EXPECT_TRUE(contains(rec->error, "fingerprint")) << rec->error;
  EXPECT_TRUE(contains(rec->error, "othercc-99/otherstdlib/c++20")) << rec->error;
  EXPECT_TRUE(contains(rec->error, sdk::kBuildFingerprint)) << rec->error;
  EXPECT_EQ(registry.find(ComponentKind::policy, "fingerprint_mismatch_policy"), nullptr);
}

TEST_F(registry_AllCases, UnresolvedSymbolIsNamedFromTheLoader) {
  const auto* rec = record_in(registry, "unresolved_symbol");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  EXPECT_TRUE(contains(rec->error, "mixtrain_test_missing_symbol")) << rec->error;
  EXPECT_TRUE(contains(rec->error, "undefined symbol")) << rec->error;
  // The loader's text alone: not Boost's wrapping, nor the stale errno it appends.
  EXPECT_FALSE(contains(rec->error, "boost::dll")) << rec->error;
  EXPECT_FALSE(contains(rec->error, "dlerror system message")) << rec->error;
  EXPECT_TRUE(rec->error.ends_with("mixtrain_test_missing_symbol")) << rec->error;
}

// A plugin that calls the support library without carrying it: the core's copy is hidden (each
// plugin runs the helpers it was built with), so the load fails, naming the fix.
TEST(registry, APluginWithoutTheSupportLibraryIsRefusedNamingIt) {
  PluginRegistry registry;
  registry.scan({case_dir("without_support")});
  ASSERT_EQ(registry.libraries().size(), 1u);
  const auto& rec = registry.libraries().front();
  EXPECT_FALSE(rec.loaded);
  EXPECT_TRUE(contains(rec.error, "undefined symbol: _ZN8mixtrain3sdk11decode_fp16")) << rec.error;
  EXPECT_TRUE(contains(rec.error, "linking mixtrain::sdk_support")) << rec.error;
}

TEST_F(registry_AllCases, ThrowingComponentsIsRecordedWithItsMessage) {
  const auto* rec = record_in(registry, "throwing_components");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  EXPECT_TRUE(contains(rec->error, "components()")) << rec->error;
  EXPECT_TRUE(contains(rec->error, "component table exploded")) << rec->error;
}

TEST_F(registry_AllCases, NullComponentsFunctionIsReportedNotCalled) {
  const auto* rec = record_in(registry, "null_components");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  EXPECT_TRUE(contains(rec->error, "components")) << rec->error;
}

TEST_F(registry_AllCases, NotAPluginSaysSo) {
  const auto* rec = record_in(registry, "not_a_plugin");
  ASSERT_NE(rec, nullptr);
  EXPECT_FALSE(rec->loaded);
  EXPECT_TRUE(contains(rec->error, "not a mixtrain plugin")) << rec->error;
  EXPECT_TRUE(contains(rec->error, "mixtrain_plugin_descriptor")) << rec->error;
}

TEST_F(registry_AllCases, DuplicateIsIgnoredWithAWarningNamingTheFirstProvider) {
  const auto* rec = record_in(registry, "duplicate");
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->loaded) << rec->error;

  // The first provider keeps the name.
  const auto* c = registry.find(ComponentKind::scaler, "test_constant");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->plugin_name, "test_good");
  auto scalers = registry.names(ComponentKind::scaler);
  EXPECT_EQ(std::count(scalers.begin(), scalers.end(), "test_constant"), 1);
  // The rest of the duplicate library is still registered.
  const auto* only = registry.find(ComponentKind::scaler, "test_dup_only");
  ASSERT_NE(only, nullptr);
  EXPECT_EQ(only->plugin_name, "test_duplicate");
  EXPECT_EQ(registry.find(ComponentKind::scaler, "test_no_factory"), nullptr);

  const auto good_lib = (case_dir("good") / "libmixtrain_test_good.so").string();
  bool dup_warning = false, no_factory_warning = false;
  for (const auto& w : rec->warnings) {
    // Named as the dropped library registers it, and the library that keeps the name.
    if (contains(w, "scaler 'test_constant' of libmixtrain_test_duplicate.so ignored") &&
        contains(w, good_lib))
      dup_warning = true;
    if (contains(w, "test_no_factory") && contains(w, "no factory")) no_factory_warning = true;
  }
  EXPECT_TRUE(dup_warning) << ::testing::PrintToString(rec->warnings);
  EXPECT_TRUE(no_factory_warning) << ::testing::PrintToString(rec->warnings);

  // The warnings also reach the log sink.
  int logged = 0;
  for (const auto& l : sink.lines)
    if (l.level == sdk::LogLevel::warn &&
        contains(l.message, "scaler 'test_constant' of libmixtrain_test_duplicate.so ignored") &&
        contains(l.message, good_lib))
      ++logged;
  EXPECT_EQ(logged, 1);
}

// A component whose option schema its own rules refuse (a default outside its range, NaN, not a
// choice; a name declared twice) is ignored with a warning naming the option: its factory would
// get a default the host never checked.
TEST_F(registry_AllCases, AComponentWithABrokenSchemaIsIgnoredNamingTheOption) {
  const auto* rec = record_in(registry, "duplicate");
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->loaded) << rec->error;
  EXPECT_NE(registry.find(ComponentKind::scaler, "test_dup_only"), nullptr);
  for (const auto& [name, says] : std::vector<std::pair<std::string, std::string>>{
           {"test_default_out_of_range",
            "option 'n' has a default its own rules refuse: value 0 is out of range (allowed: >= "
            "1"},
           {"test_nan_default",
            "option 'x' has a default its own rules refuse: value nan is out of range (allowed: a "
            "finite number"},
           {"test_inf_default",
            "option 'x' has a default its own rules refuse: value inf is out of range (allowed: a "
            "finite number"},
           {"test_default_not_a_choice",
            "option 'mode' has a default its own rules refuse: 'fast' is not a valid choice (one "
            "of: slow, steady)"},
           {"test_option_twice", "option 'x' is declared twice"}}) {
    EXPECT_EQ(registry.find(ComponentKind::scaler, name), nullptr) << name;
    bool warned = false;
    for (const auto& w : rec->warnings)
      warned = warned || (contains(w, "scaler '" + name +
                                             "' of libmixtrain_test_duplicate.so ignored: " + says) &&
                          contains(w, "fix its option_schema()"));
    EXPECT_TRUE(warned) << name << ": " << ::testing::PrintToString(rec->warnings);
  }
  // The good plugin's schema (a range and a choice, both met by its defaults) passes.
  EXPECT_NE(registry.find(ComponentKind::scaler, "test_constant"), nullptr);
}

// An option named like a key its section keeps for mixtrain ([scaler] type, [optimizer]
// warmup_steps) could never be set flat: the component is ignored at load, as for any other schema
// fault, not only refused once a config selects it.
TEST_F(registry_AllCases, AComponentDeclaringAHostKeyIsIgnoredNamingTheKey) {
  const auto* rec = record_in(registry, "duplicate");
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->loaded) << rec->error;
  EXPECT_NE(registry.find(ComponentKind::scaler, "test_dup_only"), nullptr);
  for (const auto& [kind, name, says] :
       std::vector<std::tuple<ComponentKind, std::string, std::string>>{
           {ComponentKind::scaler, "test_declares_type",
            "scaler 'test_declares_type' of libmixtrain_test_duplicate.so ignored: it declares "
            "option 'type', which [scaler] keeps for mixtrain itself (keys of its own: type)"},
           {ComponentKind::optimizer, "test_declares_warmup_steps",
            "optimizer 'test_declares_warmup_steps' of libmixtrain_test_duplicate.so ignored: it "
            "declares option 'warmup_steps', which [optimizer] keeps for mixtrain itself (keys of "
            "its own: type, "}}) {
    EXPECT_EQ(registry.find(kind, name), nullptr) << name;
    bool warned = false;
    for (const auto& w : rec->warnings)
      warned = warned || (contains(w, says) && contains(w, "fix its option_schema()"));
    EXPECT_TRUE(warned) << name << ": " << ::testing::PrintToString(rec->warnings);
  }
}

// A name a config cannot write as `type = "NAME"` and `[scaler.NAME]` (a TOML bare key), or a kind
// outside the enum, is ignored with a warning naming the library; the library's others load.
TEST_F(registry_AllCases, ComponentsAConfigCannotNameAreIgnoredNamingTheLibrary) {
  const auto* rec = record_in(registry, "duplicate");
  ASSERT_NE(rec, nullptr);
  EXPECT_TRUE(rec->loaded) << rec->error;
  EXPECT_NE(registry.find(ComponentKind::scaler, "test_dup_only"), nullptr);
  for (const std::string name : {"", "test.dotted", "test spaced"}) {
    EXPECT_EQ(registry.find(ComponentKind::scaler, name), nullptr) << name;
    bool warned = false;
    for (const auto& w : rec->warnings)
      warned = warned ||
               contains(w, "scaler '" + name +
                               "' of libmixtrain_test_duplicate.so ignored: a config cannot name it");
    EXPECT_TRUE(warned) << "'" << name << "': " << ::testing::PrintToString(rec->warnings);
  }
  bool kind_warned = false;
  for (const auto& w : rec->warnings)
    kind_warned = kind_warned || contains(w, "component 'test_kind_99' of "
                                             "libmixtrain_test_duplicate.so ignored: its kind (99)");
  EXPECT_TRUE(kind_warned) << ::testing::PrintToString(rec->warnings);
  for (const auto& c : registry.components())
    EXPECT_NE(c.info.name, "test_kind_99");
}

TEST(registry_Order, LaterFolderDoesNotOverrideEarlierOne) {
  // The reverse order: the duplicate library now provides test_constant first.
  PluginRegistry r;
  r.scan({case_dir("duplicate"), case_dir("good")});
  const auto* c = r.find(ComponentKind::scaler, "test_constant");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->plugin_name, "test_duplicate");
  const auto* good = record_in(r, "good");
  ASSERT_NE(good, nullptr);
  ASSERT_EQ(good->warnings.size(), 1u);
  EXPECT_TRUE(contains(good->warnings[0], "libmixtrain_test_duplicate.so")) << good->warnings[0];
}

TEST(registry_Isolation, EachBadLibraryAloneStillLetsTheGoodOneLoad) {
  for (const auto& bad : kBadCases) {
    // The bad library first, so a failure that poisoned later loads would show.
    PluginRegistry r;
    r.scan({case_dir(bad), case_dir("good")});
    ASSERT_EQ(r.libraries().size(), 2u) << bad;
    EXPECT_FALSE(r.libraries()[0].loaded) << bad;
    EXPECT_TRUE(r.libraries()[1].loaded) << bad << ": " << r.libraries()[1].error;
    EXPECT_NE(r.find(ComponentKind::scaler, "test_constant"), nullptr) << bad;
  }
}

// A static initializer that throws during dlopen cannot be caught (the process aborts): the last
// line before the abort names the library, what it threw and the fix. In a child process.
TEST(registry_ThrowingInitializerDeathTest, TheAbortNamesTheLibraryWhatItThrewAndTheFix) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto lib = case_dir("throwing_initializer") / "libmixtrain_test_throwing_initializer.so";
  ASSERT_TRUE(fs::exists(lib));
  EXPECT_DEATH(
      {
        PluginRegistry r;
        r.scan({case_dir("good"), case_dir("throwing_initializer")});
      },
      "error: the plugin library " + lib.string() +
          " threw while it was being loaded \\(its static initializers threw 'static init "
          "boom'\\).*HINT: fix or remove the plugin, or drop its folder from "
          "MIXTRAIN_PLUGIN_PATH");
}

// The handler is the loader's only while a library loads: afterwards terminate is as before.
TEST(registry_ThrowingInitializer, TheTerminateHandlerIsRestoredAfterLoading) {
  const auto before = std::get_terminate();
  PluginRegistry r;
  r.scan({case_dir("good")});
  EXPECT_EQ(std::get_terminate(), before);
}

TEST_F(registry_AllCases, RequireUnknownNameListsAvailableAndSuggestsAndNamesFailures) {
  auto err = plugin_error([&] { registry.require(ComponentKind::scaler, "test_constnt"); });
  ASSERT_TRUE(err.has_value());
  const std::string what = err->what();
  const std::string hint = err->hint();
  EXPECT_TRUE(contains(what, "no scaler named 'test_constnt'")) << what;
  EXPECT_TRUE(contains(what, "available: ")) << what;
  EXPECT_TRUE(contains(what, "test_constant")) << what;
  EXPECT_TRUE(contains(what, "test_dup_only")) << what;
  EXPECT_TRUE(contains(what, "test_throws_runtime")) << what;
  EXPECT_TRUE(contains(hint, "did you mean 'test_constant'?")) << hint;
  for (const auto& bad : kBadCases) {
    const auto* rec = record_in(registry, bad);
    ASSERT_NE(rec, nullptr);
    EXPECT_TRUE(contains(hint, rec->path.string())) << bad << ": " << hint;
  }
  EXPECT_TRUE(contains(hint, "MIXTRAIN_PLUGIN_PATH")) << hint;
  // The good library is not listed among the failures.
  EXPECT_FALSE(contains(hint, "libmixtrain_test_good.so")) << hint;
  EXPECT_TRUE(contains(err->full_message(), "HINT: did you mean")) << err->full_message();
}

TEST_F(registry_AllCases, RequireFarMissHasNoSuggestionAndNamesTheConfigLocation) {
  auto err = plugin_error(
      [&] { registry.require(ComponentKind::policy, "zzzzzzzz", "run.toml:4:10: precision.policy"); });
  ASSERT_TRUE(err.has_value());
  const std::string what = err->what();
  EXPECT_EQ(what.rfind("run.toml:4:10: precision.policy: ", 0), 0u) << what;
  EXPECT_TRUE(contains(what, "no policy named 'zzzzzzzz'; available: test_fp32")) << what;
  EXPECT_FALSE(contains(err->hint(), "did you mean")) << err->hint();
}

TEST(registry_Empty, RequireWithNothingLoadedSaysNone) {
  PluginRegistry r;
  r.scan({case_dir("does_not_exist")});
  EXPECT_TRUE(r.libraries().empty());
  auto err = plugin_error([&] { r.require(ComponentKind::backend, "cpu"); });
  ASSERT_TRUE(err.has_value());
  EXPECT_TRUE(contains(err->what(), "no backend is available")) << err->what();
  EXPECT_FALSE(contains(err->hint(), "failed to load")) << err->hint();
}

TEST_F(registry_AllCases, RequireFindsAKnownName) {
  const auto& c = registry.require(ComponentKind::scaler, "test_constant");
  EXPECT_EQ(&c, registry.find(ComponentKind::scaler, "test_constant"));
}

TEST_F(registry_AllCases, CreateValidatedComponentAndPassContext) {
  const auto& c = registry.require(ComponentKind::scaler, "test_constant");
  auto opts = resolve_for(c, {{"scale", 8.0, {"test.toml", 3, 9}},
                              {"mode", std::string("halve"), {"test.toml", 4, 8}}});
  auto scaler = registry.create<sdk::LossScaler>(c, opts);
  ASSERT_NE(scaler, nullptr);
  EXPECT_EQ(scaler->scale(), 8.0f);
  auto d = scaler->update(true);
  EXPECT_FALSE(d.apply_step);
  EXPECT_EQ(d.scale_before, 8.0f);
  EXPECT_EQ(d.scale_after, 4.0f);

  bool logged = false;
  for (const auto& l : sink.lines)
    if (l.component == "scaler.test_constant" &&
        l.message == "created by plugin 'test_good' as 'test_constant'")
      logged = true;
  EXPECT_TRUE(logged);

  const auto& p = registry.require(ComponentKind::policy, "test_fp32");
  auto policy = registry.create<sdk::PrecisionPolicy>(
      p, sdk::Options::resolve("precision", {}, {}, {}));
  ASSERT_NE(policy, nullptr);
  EXPECT_FALSE(policy->needs_loss_scaling());
}

TEST_F(registry_AllCases, FactoryRuntimeErrorBecomesPluginErrorNamingComponentAndLibrary) {
  const auto& c = registry.require(ComponentKind::scaler, "test_throws_runtime");
  auto err = plugin_error([&] { registry.create<sdk::LossScaler>(c, resolve_for(c)); });
  ASSERT_TRUE(err.has_value());
  const std::string what = err->what();
  EXPECT_TRUE(contains(what, "scaler 'test_throws_runtime'")) << what;
  EXPECT_TRUE(contains(what, "plugin 'test_throwing_factory'")) << what;
  EXPECT_TRUE(contains(what, "libmixtrain_test_throwing_factory.so")) << what;
  EXPECT_TRUE(contains(what, "runtime boom in the factory")) << what;
}

TEST_F(registry_AllCases, FactoryUserErrorBecomesPluginErrorKeepingTheHint) {
  const auto& c = registry.require(ComponentKind::scaler, "test_throws_user");
  auto err = plugin_error([&] { registry.create<sdk::LossScaler>(c, resolve_for(c)); });
  ASSERT_TRUE(err.has_value());
  const std::string what = err->what();
  EXPECT_TRUE(contains(what, "scaler 'test_throws_user'")) << what;
  EXPECT_TRUE(contains(what, "libmixtrain_test_throwing_factory.so")) << what;
  EXPECT_TRUE(contains(what, "user boom in the factory")) << what;
  EXPECT_EQ(err->hint(), "set something else");
}

TEST_F(registry_AllCases, FactoryConfigErrorPassesThroughWithItsLocation) {
  const auto& c = registry.require(ComponentKind::scaler, "test_throws_config");
  auto opts = resolve_for(c, {{"level", std::int64_t{7}, {"run.toml", 5, 9}}});
  try {
    registry.create<sdk::LossScaler>(c, opts);
    FAIL() << "expected a ConfigError";
  } catch (const sdk::ConfigError& e) {
    EXPECT_EQ(e.key(), "scaler.level");
    EXPECT_EQ(e.where().to_string(), "run.toml:5:9");
    EXPECT_TRUE(contains(e.what(), "level 7 is not supported here")) << e.what();
  }
}

TEST_F(registry_AllCases, NonStandardExceptionNullResultAndWrongInterfaceArePluginErrors) {
  auto check = [&](const std::string& name, const std::string& expected) {
    const auto& c = registry.require(ComponentKind::scaler, name);
    auto err = plugin_error([&] { registry.create<sdk::LossScaler>(c, resolve_for(c)); });
    ASSERT_TRUE(err.has_value()) << name;
    EXPECT_TRUE(contains(err->what(), name)) << err->what();
    EXPECT_TRUE(contains(err->what(), expected)) << err->what();
  };
  check("test_throws_int", "non-standard exception");
  check("test_returns_null", "factory returned nothing");
  check("test_wrong_interface", "another interface");
}

TEST(registry_Lifetime, CreatedObjectOutlivesTheRegistryAndHoldsItsLibrary) {
  std::shared_ptr<sdk::LossScaler> scaler;
  std::weak_ptr<void> library;
  long held_by_registry = 0;
  {
    PluginRegistry r;
    r.scan({case_dir("good")});
    const auto& c = r.require(ComponentKind::scaler, "test_constant");
    library = c.library_handle;
    held_by_registry = c.library_handle.use_count();
    scaler = r.create<sdk::LossScaler>(
        c, resolve_for(c, {{"scale", std::int64_t{16}, {"t.toml", 2, 9}}}));
    // The object's deleter holds one more reference to the library.
    EXPECT_EQ(c.library_handle.use_count(), held_by_registry + 1);
  }
  // The registry and its component table are gone; the library is not.
  ASSERT_FALSE(library.expired());
  EXPECT_GE(library.use_count(), 1);
  EXPECT_EQ(scaler->scale(), 16.0f);  // integer widened for a number option
  auto d = scaler->update(false);
  EXPECT_TRUE(d.apply_step);
  auto state = scaler->save_state();
  EXPECT_EQ(state.get<double>("scale"), 16.0);
  state.values["scale"] = 4.0;
  scaler->load_state(state);
  EXPECT_EQ(scaler->scale(), 4.0f);

  const long before_release = library.use_count();
  scaler.reset();  // runs the plugin's destructor through the deleter
  EXPECT_EQ(library.use_count(), before_release - 1);
}

TEST(registry_Scan, AcceptsSingleFilesAndIgnoresMissingEntries) {
  CapturingSink sink;
  PluginRegistry r(&sink);
  const auto lib = case_dir("good") / "libmixtrain_test_good.so";
  r.scan({case_dir("nowhere"), lib, lib});
  ASSERT_EQ(r.libraries().size(), 1u);
  EXPECT_TRUE(r.libraries()[0].loaded);
  bool reported = false;
  for (const auto& l : sink.lines)
    if (contains(l.message, (case_dir("nowhere")).string()) && contains(l.message, "does not exist"))
      reported = true;
  EXPECT_TRUE(reported);
  // The same library reached through its folder is not loaded again.
  r.scan({case_dir("good")});
  EXPECT_EQ(r.libraries().size(), 1u);
}

TEST(registry_Scan, OnlyLibmixtrainSharedObjectsAreConsidered) {
  // A folder with a copy of the good plugin under a name the registry must skip.
  const auto dir = fs::temp_directory_path() / ("mixtrain_registry_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(case_dir("good") / "libmixtrain_test_good.so", dir / "libother_plugin.so");
  fs::copy_file(case_dir("good") / "libmixtrain_test_good.so", dir / "libmixtrain_copy.so.bak");
  PluginRegistry r;
  r.scan({dir});
  EXPECT_TRUE(r.libraries().empty());
  fs::remove_all(dir);
}

class registry_PluginPathEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("MIXTRAIN_PLUGIN_PATH")) saved_ = v;
  }
  void TearDown() override {
    if (saved_)
      ::setenv("MIXTRAIN_PLUGIN_PATH", saved_->c_str(), 1);
    else
      ::unsetenv("MIXTRAIN_PLUGIN_PATH");
  }
  std::optional<std::string> saved_;
};

TEST_F(registry_PluginPathEnv, DefaultSearchPathIsBuiltinFolderThenEnvironmentEntries) {
  const std::string good = case_dir("good").string();
  const std::string lib = (case_dir("duplicate") / "libmixtrain_test_duplicate.so").string();
  ASSERT_EQ(::setenv("MIXTRAIN_PLUGIN_PATH", (good + "::" + lib + ":").c_str(), 1), 0);
  auto path = PluginRegistry::default_search_path();
  ASSERT_EQ(path.size(), 3u) << ::testing::PrintToString(path);
  // The test binary is build/tests/test_registry, so ../lib/mixtrain/plugins is the build's
  // real plugin folder.
  const auto builtin = fs::path(MIXTRAIN_TEST_PLUGIN_DIR).parent_path().parent_path() / "lib" /
                       "mixtrain" / "plugins";
  EXPECT_EQ(fs::weakly_canonical(path[0]), fs::weakly_canonical(builtin));
  EXPECT_EQ(path[1], fs::path(good));
  EXPECT_EQ(path[2], fs::path(lib));

  // And the entries are honoured when scanned.
  PluginRegistry r;
  r.scan(path);
  EXPECT_NE(r.find(ComponentKind::scaler, "test_constant"), nullptr);
  EXPECT_NE(r.find(ComponentKind::scaler, "test_dup_only"), nullptr);
}

// The install's library folder may be lib64 or lib/<multiarch> (CMAKE_INSTALL_LIBDIR): the
// built-in folder is there, or under lib (the build tree) when only that one exists.
TEST(registry_BuiltinFolders, TheInstallsLibdirOrTheBuildTreesLib) {
  const fs::path prefix =
      fs::temp_directory_path() / ("mixtrain-builtin-" + std::to_string(::getpid()));
  fs::remove_all(prefix);
  const fs::path multiarch = "lib/x86_64-linux-gnu";
  const fs::path installed = prefix / multiarch / "mixtrain" / "plugins";
  const fs::path built = prefix / "lib" / "mixtrain" / "plugins";
  using Paths = std::vector<fs::path>;
  // Neither exists (a program that embeds the core): none, so no error warns of a missing one.
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, multiarch), Paths{});
  fs::create_directories(installed);
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, multiarch), Paths{installed});
  fs::create_directories(built);  // a stale install beside it: never scanned too
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, multiarch), Paths{installed});
  fs::remove_all(installed);
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, multiarch), Paths{built});
  // lib itself is listed once.
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, "lib"), Paths{built});
  EXPECT_EQ(PluginRegistry::builtin_folders(prefix, "lib64"), Paths{built});
  fs::remove_all(prefix);
}

TEST_F(registry_PluginPathEnv, WithoutTheVariableOnlyTheBuiltinFolder) {
  ::unsetenv("MIXTRAIN_PLUGIN_PATH");
  auto path = PluginRegistry::default_search_path();
  ASSERT_EQ(path.size(), 1u);
  EXPECT_EQ(path[0].filename(), "plugins");
}

}  // namespace
