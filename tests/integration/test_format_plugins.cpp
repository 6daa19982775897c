// A checkpoint format from a plugin outside mixtrain's own folder (tests/plugins/format_faults:
// the native format's bytes under an extension of its own, misbehaving on request), through the
// real executable: export finds it through the run's config.toml, as `train --resume RUN` does,
// and says how to load it where it is not loaded; its extension is checked when it is made; a
// damaged state it reads, or a write of it that throws, is named as possibly its fault; and a
// long one_of list of its options keeps `describe`'s table readable.
#include <algorithm>
#include <sstream>

#include "cli_test_support.h"
#include "scoped_env.h"

namespace {

using namespace mixtrain::test;

const std::string kPluginDir = std::string(MIXTRAIN_TEST_PLUGIN_DIR) + "/format_faults";

class FormatPlugins : public CliTest {
 protected:
  // The quickstart, checkpointing in `faulty` (.flt files) loaded through [plugins] paths.
  fs::path faulty_config() {
    std::string text = slurp(quickstart());
    const std::string native = "format = \"native\"";
    text.replace(text.find(native), native.size(), "format = \"faulty\"");
    return write_file("faulty.toml", text + "\n[plugins]\npaths = [\"" + kPluginDir + "\"]\n");
  }

  // A 10-step run of it with checkpoints at steps 5 and 10.
  fs::path trained_run(const std::string& name, const std::string& sets = "") {
    const auto run_dir = dir_ / name;
    auto r = run("train " + faulty_config().string() +
                 " --set run.steps=10 --set run.eval_every=0 --set checkpoint.every=5"
                 " --set backend.threads=1 --run-dir " +
                 run_dir.string() + sets);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return run_dir;
  }
};

TEST_F(FormatPlugins, ExportReadsARunsPluginFormatThroughTheRunsConfig) {
  const auto run_dir = trained_run("run");
  ASSERT_TRUE(fs::exists(run_dir / "checkpoints" / "step-00000010.flt"));

  // No MIXTRAIN_PLUGIN_PATH: the run's config.toml names the plugin's folder.
  const auto out = dir_ / "x.mxt";
  auto r = run("export " + run_dir.string() + " --format native --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "step-00000010.flt")) << r.out;
  EXPECT_TRUE(fs::exists(out));
  // The file itself, too.
  r = run("export " + (run_dir / "checkpoints" / "step-00000005.flt").string() +
          " --format native --out " + (dir_ / "y.mxt").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // A run whose config no longer loads the plugin: which format its files are, and how to load it.
  const auto config = run_dir / "config.toml";
  std::string text = slurp(config);
  text.replace(text.find("[plugins]"), std::string("[plugins]").size(), "[unused_plugins]");
  text.erase(text.find("[unused_plugins]"));
  std::ofstream(config) << text;
  r = run("export " + run_dir.string() + " --format native --out " + (dir_ / "z.mxt").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "step-*.flt found")) << r.err;
  EXPECT_TRUE(has(r.err, "its format 'faulty' (the run's checkpoint.format) is not loaded"))
      << r.err;
  EXPECT_TRUE(has(r.err, "MIXTRAIN_PLUGIN_PATH")) << r.err;
  r = run("export " + (run_dir / "checkpoints" / "step-00000005.flt").string() +
          " --format native --out " + (dir_ / "z.mxt").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "its format 'faulty' (the run's checkpoint.format) is not loaded"))
      << r.err;
  EXPECT_TRUE(has(r.err, "MIXTRAIN_PLUGIN_PATH")) << r.err;
  // Loaded as the hint says, it reads.
  const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", kPluginDir.c_str());
  r = run("export " + run_dir.string() + " --format native --out " + (dir_ / "z.mxt").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(FormatPlugins, AFormatsExtensionIsCheckedWhenItIsMade) {
  const auto config = faulty_config().string();
  const std::string train = "train " + config + " --set run.steps=2 --set run.eval_every=0";
  struct Case {
    std::string ext, says;
  };
  for (const Case& c : std::vector<Case>{{"flt", "does not start with a dot"},
                                         {"../evil", "holds '.'"},
                                         {"/abs", "does not start with a dot"},
                                         {".a/b", "holds '/'"},
                                         {".", "is a dot alone"}}) {
    auto r = run(train + " --run-dir " + (dir_ / "r").string() +
                 " --set 'checkpoint.faulty.ext=" + c.ext + "'");
    EXPECT_EQ(r.exit_code, 2) << c.ext << ": " << r.err;
    EXPECT_TRUE(has(r.err, "checkpoint_format 'faulty'")) << c.ext << ": " << r.err;
    EXPECT_TRUE(has(r.err, "its file extension '" + c.ext + "' " + c.says))
        << c.ext << ": " << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "r" / "checkpoints")) << c.ext;
  }
  // Another format's extension: a built-in's, or another plugin's.
  auto r = run(train + " --run-dir " + (dir_ / "r").string() + " --set checkpoint.faulty.ext=.mxt");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'faulty'")) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'native'")) << r.err;
  r = run(train + " --run-dir " + (dir_ / "r").string() + " --set checkpoint.faulty.ext=.flt2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'faulty2'")) << r.err;
  // Export's --format is held to the same rule.
  const auto run_dir = trained_run("run");
  const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", kPluginDir.c_str());
  r = run("export " + run_dir.string() + " --format native --out " + (dir_ / "x.mxt").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(FormatPlugins, ADamagedStateItReadsIsNamedAsPossiblyItsFault) {
  const auto run_dir = trained_run("run");
  const auto config = faulty_config().string();
  const std::string eval = "eval " + config + " --checkpoint " + run_dir.string();
  auto r = run(eval + " --set checkpoint.faulty.mode=dup_tensor");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'faulty' (plugin format_faults")) << r.err;
  EXPECT_TRUE(has(r.err, "read tensor 'param/")) << r.err;
  EXPECT_TRUE(has(r.err, "twice")) << r.err;
  EXPECT_FALSE(has(r.err, "matches no parameter")) << r.err;

  const std::string blame = "or the format plugin 'faulty' that read the file";
  for (const std::string mode : {"lose_tensor", "wrong_dtype"}) {
    r = run(eval + " --set checkpoint.faulty.mode=" + mode);
    EXPECT_EQ(r.exit_code, 2) << mode << ": " << r.err;
    EXPECT_TRUE(has(r.err, "different model")) << mode << ": " << r.err;
    EXPECT_TRUE(has(r.err, blame)) << mode << ": " << r.err;
  }
  r = run("train " + config + " --resume " + run_dir.string() +
          " --set run.steps=12 --set run.eval_every=0 --set checkpoint.every=5"
          " --set checkpoint.faulty.mode=drop_metadata");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "no 'mixtrain.state_version' entry")) << r.err;
  EXPECT_TRUE(has(r.err, blame)) << r.err;
  // A resume reads more than the weights: each is blamed on the format too.
  struct Case {
    std::string mode, says;
  };
  for (const Case& c : std::vector<Case>{
           {"extra_tensor", "tensor 'param/ghost.weight' matches no parameter or buffer"},
           {"short_bytes", "but the file gave"},
           {"drop_progress",
            "no 'progress' entry: the file holds a training state ('mixtrain.state_version' and "
            "the optimizer's slots) without all of its metadata (it lacks 'progress', "
            "'sampler')"}}) {
    r = run("train " + config + " --resume " + run_dir.string() +
            " --set run.steps=12 --set run.eval_every=0 --set checkpoint.every=5"
            " --set checkpoint.faulty.mode=" +
            c.mode);
    EXPECT_EQ(r.exit_code, 2) << c.mode << ": " << r.err;
    EXPECT_TRUE(has(r.err, c.says)) << c.mode << ": " << r.err;
    EXPECT_TRUE(has(r.err, blame)) << c.mode << ": " << r.err;
    EXPECT_FALSE(has(r.err, "holds weights only")) << c.mode << ": " << r.err;
  }
  // Export reads through the format too.
  const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", kPluginDir.c_str());
  r = run("export " + run_dir.string() + " --format native --from faulty --out " +
          (dir_ / "x.mxt").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(FormatPlugins, AWriteThatThrowsSaysWhichSaveFailedAndWhatIsLeft) {
  const auto config = faulty_config().string();
  const std::string train =
      "train " + config + " --set run.steps=10 --set run.eval_every=0 --set checkpoint.every=5";
  // Not a UserError: the plugin's internal error, exit 1, with the run's context.
  auto r = run(train + " --set checkpoint.faulty.mode=throw_second_write --run-dir " +
               (dir_ / "a").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "the step-10 checkpoint was not written")) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'faulty' (plugin format_faults")) << r.err;
  EXPECT_TRUE(has(r.err, "faulty: simulated I/O failure")) << r.err;
  EXPECT_TRUE(has(r.err, (dir_ / "a" / "checkpoints" / "step-00000005.flt").string())) << r.err;
  EXPECT_TRUE(has(r.err, "--resume " + (dir_ / "a").string())) << r.err;
  // A CheckpointError: exit 2, the same context.
  r = run(train + " --set checkpoint.faulty.mode=refuse_second_write --run-dir " +
          (dir_ / "b").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the step-10 checkpoint was not written")) << r.err;
  EXPECT_TRUE(has(r.err, "faulty: simulated full disk")) << r.err;
  EXPECT_TRUE(has(r.err, (dir_ / "b" / "checkpoints" / "step-00000005.flt").string())) << r.err;
  EXPECT_TRUE(has(r.err, "free some disk space; then continue it with --resume")) << r.err;
}

// A format that writes in place leaves a torn file when it fails midway: the save removes what it
// left at a path that was free, so `--resume` takes the checkpoint before it, and names a file
// that was there before as possibly damaged (not the host's to delete), with the checkpoint to
// resume from instead.
TEST_F(FormatPlugins, ATornWriteIsRemovedOrNamedAsPossiblyDamaged) {
  const auto config = faulty_config().string();
  const std::string train =
      "train " + config + " --set run.steps=10 --set run.eval_every=0 --set checkpoint.every=5";
  const auto run_dir = dir_ / "a";
  auto r =
      run(train + " --set checkpoint.faulty.mode=torn_second_write --run-dir " + run_dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto torn = run_dir / "checkpoints" / "step-00000010.flt";
  const auto kept = run_dir / "checkpoints" / "step-00000005.flt";
  EXPECT_TRUE(has(r.err, "the step-10 checkpoint was not written")) << r.err;
  EXPECT_TRUE(has(r.err, "removed what the format left at " + torn.string())) << r.err;
  EXPECT_TRUE(has(r.err, "the newest checkpoint this run has is " + kept.string())) << r.err;
  EXPECT_FALSE(fs::exists(torn));
  r = run("train --resume " + run_dir.string() +
          " --set run.steps=10 --set checkpoint.faulty.mode=ok");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out + r.err, "resumed from " + kept.string())) << r.out << r.err;

  const auto planted = dir_ / "b";
  r = run(train + " --set checkpoint.faulty.mode=plant_then_torn_second_write --run-dir " +
          planted.string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto damaged = planted / "checkpoints" / "step-00000010.flt";
  EXPECT_TRUE(has(r.err, damaged.string() + " was there before this save")) << r.err;
  EXPECT_TRUE(has(r.err, "checkpoint format 'faulty' (plugin format_faults")) << r.err;
  EXPECT_TRUE(has(r.err, "may have damaged it")) << r.err;
  EXPECT_TRUE(has(r.err, "--resume " + (planted / "checkpoints" / "step-00000005.flt").string()))
      << r.err;
  EXPECT_TRUE(fs::exists(damaged));
}

// A plugin format's read() that throws what is no sdk::UserError: exit 1, naming the file and the
// plugin, for a resume and for export alike.
TEST_F(FormatPlugins, AReadThatThrowsNamesTheFileAndThePlugin) {
  // It writes as the native format does; its config.toml keeps the mode for export.
  const auto run_dir = trained_run("run", " --set checkpoint.faulty.mode=throw_read");
  const auto file = run_dir / "checkpoints" / "step-00000010.flt";
  for (const std::string& args :
       {"train " + faulty_config().string() + " --resume " + run_dir.string() +
            " --set run.steps=12 --set checkpoint.faulty.mode=throw_read",
        "export " + run_dir.string() + " --format native --out " + (dir_ / "x.mxt").string()}) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, file.string() + ": checkpoint format 'faulty' (plugin format_faults"))
        << args << "\n"
        << r.err;
    EXPECT_TRUE(has(r.err, "failed reading it: faulty: simulated read failure")) << args << "\n"
                                                                                 << r.err;
    EXPECT_TRUE(has(r.err, "threw no sdk::UserError")) << args << "\n" << r.err;
  }
}

// A long one_of list wraps within its column instead of padding every row to its width.
TEST_F(FormatPlugins, DescribeWrapsALongRange) {
  const ScopedEnv env("MIXTRAIN_PLUGIN_PATH", kPluginDir.c_str());
  auto r = run("describe checkpoint.faulty");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::size_t widest = 0;
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("  ")) widest = std::max(widest, line.size());
  EXPECT_LE(widest, 100u) << r.out;
  for (const std::string mode : {"ok,", "dup_tensor,", "refuse_second_write"})
    EXPECT_TRUE(has(r.out, mode)) << r.out;
}

}  // namespace
