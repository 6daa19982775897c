// `mixtrain plugins` through the real executable: search path warnings, --describe, and a
// truncated library in the search path.
#include <fstream>

#include "cli_test_support.h"
#include "scoped_env.h"

namespace {

using namespace mixtrain::test;
using CliPlugins = CliTest;

TEST_F(CliPlugins, MissingSearchPathIsAWarning) {
  const auto nowhere = dir_ / "no-such-plugins";
  {
    const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", nowhere.string().c_str());
    auto r = run("plugins");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("plugin search path entry " + nowhere.string() + " does not exist"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.out.find(nowhere.string() + " (does not exist)"), std::string::npos) << r.out;
    // The missing component's error names the missing folder too.
    r = run("check " + quickstart() + " --set scaler.type=dynamc");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("no scaler named 'dynamc'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("do not exist: " + nowhere.string()), std::string::npos) << r.err;
  }
  // A folder named in the config's [plugins] paths, relative to the config.
  auto cfg = write_file("cfg.toml", slurp(quickstart()) + "\n[plugins]\npaths = [\"gone\"]\n");
  auto r = run("check " + cfg.string() + " --set scaler.type=dynamc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find((dir_ / "gone").string()), std::string::npos) << r.err;
  // Without a missing entry there is no warning.
  r = run("plugins");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("does not exist"), std::string::npos) << r.out;
}

// A [plugins] paths entry that can load nothing is a typo or a misnamed library: a run says so at
// the entry's config line even when it needs no component from there.
TEST_F(CliPlugins, ConfigPathsThatLoadNothingAreWarnedAtTheirLine) {
  const auto config_text = slurp(quickstart());
  auto missing = write_file("missing.toml", config_text + "\n[plugins]\npaths = [\"gone\"]\n");
  auto r = run("check " + missing.string() + " --skip-rehearsal");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("missing.toml:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[plugins] paths entry " + (dir_ / "gone").string() + " does not exist"),
            std::string::npos)
      << r.err;

  // A folder whose library lacks the libmixtrain_ prefix is never scanned.
  fs::create_directories(dir_ / "mine");
  write_file("mine/libmy_scaler.so", "not loaded");
  auto misnamed = write_file("misnamed.toml", config_text + "\n[plugins]\npaths = [\"mine\"]\n");
  r = run("check " + misnamed.string() + " --skip-rehearsal");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("holds no libmixtrain_*.so, only libmy_scaler.so"), std::string::npos)
      << r.err;

  // A rightly named library is scanned: if it fails to load, that is the library's warning, not
  // the entry's.
  fs::create_directories(dir_ / "ours");
  write_file("ours/libmixtrain_broken.so", "not an ELF file");
  auto named = write_file("named.toml", config_text + "\n[plugins]\npaths = [\"ours\"]\n");
  r = run("check " + named.string() + " --skip-rehearsal");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("[plugins] paths entry"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("libmixtrain_broken.so was skipped"), std::string::npos) << r.err;
}

// A plugin component whose option shares a name with a key the host keeps ([scaler] type) could
// never be set flat: it is ignored at load with a warning naming the option, as other schema
// faults are, so `plugins` shows it and selecting it says why it is missing.
TEST_F(CliPlugins, AComponentOptionNamedLikeAHostKeyIsIgnoredAtLoad) {
  const std::string lib_dir = std::string(MIXTRAIN_TEST_PLUGIN_DIR) + "/duplicate";
  auto cfg =
      write_file("cfg.toml", slurp(quickstart()) + "\n[plugins]\npaths = [\"" + lib_dir + "\"]\n");
  const std::string warning =
      "scaler 'test_declares_type' of libmixtrain_test_duplicate.so ignored: it declares option "
      "'type', which [scaler] keeps for mixtrain itself";
  auto r = run("check " + cfg.string() + " --skip-rehearsal --set scaler.type=test_declares_type");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no scaler named 'test_declares_type'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(warning), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("option_schema()"), std::string::npos) << r.err;
  // Not selected, the run goes on, and the warning is still given.
  r = run("check " + cfg.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(warning), std::string::npos) << r.err;
  // `plugins` shows it too, before any config selects it.
  const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", lib_dir.c_str());
  r = run("plugins");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find(warning), std::string::npos) << r.out << r.err;
}

// A run trained with a plugin scaler keeps its [scaler.NAME] table in config.toml: eval and
// predict, which use no scaler, read that config without the plugin (a warning names the table),
// while check, which trains, still refuses the table.
TEST_F(CliPlugins, AScalerTableOfAPluginNotLoadedIsAWarningForEval) {
  ASSERT_EQ(
      run("train " + quickstart() + " --set run.steps=10 --run-dir " + (dir_ / "run").string())
          .exit_code,
      0);
  auto cfg = write_file("cfg.toml", slurp(quickstart()) + "\n[scaler.chaos]\nlevel = 3\n");
  const std::string warning = "[scaler.chaos] (" + cfg.string() + ":";
  auto r = run("eval " + cfg.string() + " --checkpoint " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(warning), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no scaler named 'chaos' is loaded, and this command does not use the "
                       "scaler"),
            std::string::npos)
      << r.err;
  r = run("check " + cfg.string() + " --skip-rehearsal");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("'scaler.chaos': no scaler named 'chaos'"), std::string::npos) << r.err;
}

// A component that throws what no std::exception is, after it was built (the registry catches a
// factory's): the command ends with exit 1 and a message, not std::terminate's abort.
TEST_F(CliPlugins, AComponentThrowingANonStandardExceptionExitsOneWithAMessage) {
  auto cfg =
      write_file("cfg.toml", slurp(quickstart()) + "\n[plugins]\npaths = [\"" +
                                 std::string(MIXTRAIN_TEST_PLUGIN_DIR) + "/throwing_factory\"]\n");
  auto r = run("train " + cfg.string() + " --set scaler.type=test_update_throws_int --run-dir " +
               (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("an exception that is not a std::exception ended the command"),
            std::string::npos)
      << r.err;
}

// A plugin's component that throws a std::exception of its own after it was built: exit 1, its
// message, and the plugins loaded from outside mixtrain's folder named as where it may come from.
TEST_F(CliPlugins, AnInternalErrorNamesThePluginsFromOutsideMixtrainsFolder) {
  const std::string folder = std::string(MIXTRAIN_TEST_PLUGIN_DIR) + "/throwing_factory";
  auto cfg =
      write_file("cfg.toml", slurp(quickstart()) + "\n[plugins]\npaths = [\"" + folder + "\"]\n");
  auto r = run("train " + cfg.string() + " --set scaler.type=test_update_throws_runtime " +
               "--run-dir " + (dir_ / "run").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: update boom"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loaded plugins from outside mixtrain's plugin folder"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(folder + "/libmixtrain_test_throwing_factory.so (plugin "),
            std::string::npos)
      << r.err;
  // mixtrain's own plugins are not suspects.
  EXPECT_EQ(r.err.find("libmixtrain_scalers"), std::string::npos) << r.err;
}

// A copy of the executable with its libraries but no plugin folder (a broken install): `plugins`
// says where the folder should be.
TEST_F(CliPlugins, AnInstallWithoutItsPluginFolderIsNamed) {
  const auto prefix = dir_ / "bare";
  fs::create_directories(prefix / "bin");
  fs::create_directories(prefix / "lib");
  const fs::path built = fs::path(MIXTRAIN_EXE).parent_path().parent_path();
  fs::copy_file(MIXTRAIN_EXE, prefix / "bin" / "mixtrain");
  for (const char* lib : {"libmixtrain_core.so.0", "libmixtrain_sdk.so.0"})
    fs::copy_file(fs::canonical(built / "lib" / lib), prefix / "lib" / lib);
  const auto out = dir_ / "bare.out";
  const std::string cmd =
      (prefix / "bin" / "mixtrain").string() + " plugins >" + out.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(out);
  EXPECT_NE(slurp(out).find("no plugin folder beside this executable: " +
                            (prefix / "lib" / "mixtrain" / "plugins").string() + " does not exist"),
            std::string::npos)
      << slurp(out);
  // The build's own executable has one, and says nothing of the kind.
  EXPECT_EQ(run("plugins").out.find("no plugin folder beside"), std::string::npos);
}

TEST_F(CliPlugins, DescribePrintsTheOptionSchema) {
  auto r = run("plugins --describe dynamic");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("scaler/dynamic"), std::string::npos) << r.out;
  for (const char* column : {"OPTION", "TYPE", "DEFAULT", "RANGE", "DOC"})
    EXPECT_NE(r.out.find(column), std::string::npos) << column << "\n" << r.out;
  // Each option on one line with its type, default and range.
  bool found = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  growth_interval ", 0) == 0) {
      found = true;
      EXPECT_NE(line.find("integer"), std::string::npos) << line;
      EXPECT_NE(line.find(">= 1"), std::string::npos) << line;
    }
  EXPECT_TRUE(found) << r.out;

  // KIND/NAME gives the same schema; a component without options says so.
  auto k = run("plugins --describe scaler/dynamic");
  ASSERT_EQ(k.exit_code, 0) << k.err;
  EXPECT_EQ(k.out, r.out);
  auto none = run("plugins --describe scaler/none");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("no options"), std::string::npos) << none.out;
  // The log level is accepted after the subcommand and its option.
  EXPECT_EQ(run("plugins --describe dynamic --log-level error").exit_code, 0);
}

TEST_F(CliPlugins, DescribeSaysWhereTheOptionsGoAndCoversDataSources) {
  auto r = run("plugins --describe fp8-delayed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("options go in [precision.fp8-delayed]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  amax_history_len "), std::string::npos) << r.out;
  // The data sources are the host's, described the same way.
  r = run("plugins --describe npy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[data.npy]: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("options go in [data.npy] (or flat in [data] while it is selected: "
                       "source = \"npy\")"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  features "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(required)"), std::string::npos) << r.out;
  EXPECT_EQ(run("plugins --describe data/npy").out, r.out);
  r = run("plugins --describe data/npz");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'data/npy'"), std::string::npos) << r.err;
}

TEST_F(CliPlugins, DescribeUnknownExits2WithSuggestions) {
  auto r = run("plugins --describe dynamc");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no component named 'dynamc'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'dynamic'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("scaler/static"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  r = run("plugins --describe scalr/dynamic");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'scaler/dynamic'"), std::string::npos) << r.err;
  r = run("plugins --describe optimizer/dynamic");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("among the optimizer components"), std::string::npos) << r.err;
}

// A half-copied plugin is listed with its reason instead of killing the process (SIGBUS inside
// dlopen, before the headers were checked); the other libraries still load.
TEST_F(CliPlugins, TruncatedLibraryIsListedAndTheOthersLoad) {
  const auto real = fs::path(MIXTRAIN_EXE).parent_path().parent_path() / "lib" / "mixtrain" /
                    "plugins" / "libmixtrain_scalers.so";
  const auto bytes = slurp(real);
  ASSERT_GT(bytes.size(), 100000u) << real;
  for (std::size_t size : {1000, 100000}) {
    SCOPED_TRACE(size);
    // Under another name, and under the real one's name in another folder: the registry tells
    // libraries apart by path, so both are checked and the real one loads from the default folder.
    const auto other = dir_ / ("other-name-" + std::to_string(size));
    const auto same = dir_ / ("same-name-" + std::to_string(size));
    fs::create_directories(other);
    fs::create_directories(same);
    const auto cut_other = other / "libmixtrain_truncated.so";
    const auto cut_same = same / "libmixtrain_scalers.so";
    for (const auto& p : {cut_other, cut_same})
      std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
    const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", (other.string() + ":" + same.string()).c_str());

    auto r = run("plugins");
    ASSERT_EQ(r.exit_code, 0) << r.err;  // a signal would read as -1
    const auto failed = r.out.find("libraries that failed to load:");
    ASSERT_NE(failed, std::string::npos) << r.out;
    const std::string reason_start = "\n    cannot load the library: segment ";
    const std::string reason_end = "but the file has only " + std::to_string(size) + " bytes";
    for (const auto& p : {cut_other, cut_same}) {
      const auto at = r.out.find("  " + p.string() + reason_start, failed);
      ASSERT_NE(at, std::string::npos) << p << "\n" << r.out;
      EXPECT_NE(r.out.find(reason_end, at), std::string::npos) << r.out;
    }
    EXPECT_NE(r.out.find("dynamic        0.1.0    libmixtrain_scalers.so"), std::string::npos)
        << r.out;

    r = run("check " + quickstart() + " --set scaler.type=dynamic");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("# config OK"), std::string::npos) << r.out;
    // The run goes on, and says once per library that it skipped it.
    EXPECT_NE(r.err.find("plugin library " + cut_other.string() + " was skipped:"),
              std::string::npos)
        << r.err;
    r = run("train " + quickstart() + " --set run.steps=2 --run-dir " +
            (dir_ / ("run-" + std::to_string(size))).string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

}  // namespace
