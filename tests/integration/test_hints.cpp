// The hints of common mistakes point at what the user meant: a shortened choice, another tool's
// key name, a key in the wrong table, a Hugging Face folder given as a checkpoint; followed as
// written, they work.
#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

using Hints = CliTest;

TEST_F(Hints, ConfigMistakesSuggestWhatWasMeant) {
  const std::string check = "check " + quickstart() + " --set ";
  auto r = run(check + "precision.policy=fp16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "did you mean 'fp16-mixed'")) << r.err;
  r = run(check + "optimizer.adamw.learning_rate=0.1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "did you mean 'lr'")) << r.err;
  r = run(check + "run.lr=0.1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "did you mean optimizer.adamw.lr")) << r.err;
  EXPECT_FALSE(has(r.err, "'dir'")) << r.err;
}

TEST_F(Hints, AHuggingFaceFolderAsCheckpointNamesItsWeightsAndLayout) {
  fs::create_directory(dir_ / "hf");
  write_file("hf/config.json", "{}");
  write_file("hf/model.safetensors", "x");
  const auto r = run("eval " + quickstart() + " --checkpoint hf", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "hf is a Hugging Face model folder")) << r.err;
  EXPECT_TRUE(has(r.err, "--checkpoint hf/model.safetensors --layout gpt2")) << r.err;
}

TEST_F(Hints, ExportInitialWritesSafetensorsWithoutFormat) {
  const auto r = run("export " + quickstart() + " --initial --out init.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "(safetensors, initial weights")) << r.out;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "init.safetensors"));
}

// A preset's size that makes a node too small is blamed on that size, where it was set, and the
// hint sets it: wpe's positions come from model.gpt.block_size (model.gpt.positions is no key).
TEST_F(Hints, AGptSizeTooSmallForTheDataNamesThePresetKey) {
  const std::string check = "check " + config("gpt-tiny-fp32.toml") + " --skip-rehearsal ";
  auto r = run(check + "--set model.gpt.block_size=64");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "error: --set model.gpt.block_size=64: 'model.gpt.block_size': node "
                  "'wpe' (position_embedding): holds 64 positions"))
      << r.err;
  EXPECT_TRUE(has(r.err, "HINT: set model.gpt.block_size >= 128")) << r.err;
  r = run(check + "--set model.gpt.block_size=128");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// An empty config's hint says where the layers go; the line pasted above any header is named as
// [model]'s key, and pasted under the header it checks.
TEST_F(Hints, TheEmptyConfigHintWorksWhenPasted) {
  write_file("empty.toml", "");
  auto r = run("check empty.toml --skip-rehearsal", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string line =
      "layers = [ { type = \"linear\", out = 64 }, { type = \"relu\" }, { type = \"linear\", "
      "out = 10 } ]";
  EXPECT_TRUE(has(r.err, "HINT: under a [model] header, add " + line)) << r.err;
  write_file("flat.toml", line + "\n");
  r = run("check flat.toml --skip-rehearsal", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "flat.toml:1:1: 'layers': unknown key")) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean model.layers?")) << r.err;
  write_file("model.toml", "[model]\n" + line + "\n");
  r = run("check model.toml --skip-rehearsal", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// [model.resnet]'s lists are among its known keys and its did-you-mean.
TEST_F(Hints, AResnetKeyTypoOffersItsLists) {
  const auto r =
      run("check " + config("resnet20-fp32.toml") + " --skip-rehearsal --set model.resnet.blocs=3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "did you mean 'blocks'? known keys: blocks, widths, block")) << r.err;
}

// A config given to export without --initial is named as one, and the hint's command works.
TEST_F(Hints, ExportOfAConfigPointsAtInitial) {
  write_file("c.toml", slurp(quickstart()));
  auto r = run("export c.toml --format safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "c.toml is a config, not a checkpoint")) << r.err;
  EXPECT_TRUE(has(r.err, "`mixtrain export c.toml --initial --out initial.safetensors`")) << r.err;
  r = run("export c.toml --initial --out initial.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A run that is neither LoRA nor GPT: --layout peft offers the plain export (--layout hf would
// refuse it), which then works. eval with other data than the run's names [data], not [model].
TEST_F(Hints, AnMlpRunsHintsNameWhatFitsAnMlp) {
  ASSERT_EQ(run("train " + quickstart() + " --set run.steps=2 --run-dir r1", dir_).exit_code, 0);
  auto r = run("export r1 --layout peft", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "or the whole model with --format safetensors and no --layout")) << r.err;
  EXPECT_FALSE(has(r.err, "with --layout hf")) << r.err;
  r = run("export r1 --format safetensors", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run("eval " + quickstart() + " --checkpoint r1 --set data.synthetic.features=16", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "the file's model reads 32 features per sample, and this config's data "
                  "give 16: [data] sizes the model's input"))
      << r.err;
  EXPECT_FALSE(has(r.err, "check [model] layers")) << r.err;
}

// Token ids saved as .npy given to a text model's predict: the hint names what it reads.
TEST_F(Hints, PredictOfAnNpyOnATextModelNamesTheText) {
  write_file("t.txt", std::string(6000, 'x'));
  const std::string cfg = config("gpt-tiny-fp32.toml") +
                          " --set data.text.path=t.txt --set model.gpt.n_layer=1 "
                          "--set data.block_size=16";
  ASSERT_EQ(run("train " + cfg + " --set run.steps=1 --run-dir g", dir_).exit_code, 0);
  write_npy(dir_ / "ids.npy", "<i8", {2, 16}, std::vector<std::int64_t>(32, 7));
  auto r = run("predict " + cfg + " --checkpoint g --input ids.npy --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "ids.npy is a NumPy .npy file, but a language model predicts from a "
                  "token stream"))
      << r.err;
  EXPECT_TRUE(has(r.err, "pass the text itself as --input")) << r.err;
  EXPECT_FALSE(has(r.err, "data.source = \"npy\"")) << r.err;
  r = run("predict " + cfg + " --checkpoint g --input t.txt --out p.npy", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Every step skipped for a forward overflow: the hint does not offer a lower lr (no update was
// made), and its escalation route, followed as written, trains.
TEST_F(Hints, AForwardOverflowDivergenceOffersWhatWidensTheForward) {
  const std::string cmd = "train " + config("overflow-demo.toml") +
                          " --set precision.policy=fp16-mixed --set run.steps=6";
  auto r = run(cmd + " --run-dir a", dir_);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(has(r.err,
                  "every one of the 6 steps was skipped: the forward was not finite "
                  "(first: forward proj.output)"))
      << r.err;
  EXPECT_FALSE(has(r.err, "HINT: lower optimizer.lr")) << r.err;
  EXPECT_TRUE(has(r.err, "(`--set precision.escalate.after=3`)")) << r.err;
  r = run(cmd + " --set precision.escalate.after=3 --run-dir b", dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// "repeat the flag" is for values after one --set; a flag the command does not take (export has
// no --merge) gets only the pointer to --help.
TEST_F(Hints, AnExtraFlagIsNotTakenForASecondSetValue) {
  auto r = run("export r1 --format safetensors --merge m.toml", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "`mixtrain export --help` lists the arguments")) << r.err;
  EXPECT_FALSE(has(r.err, "repeat the flag")) << r.err;
  r = run("check " + quickstart() + " --set run.steps=1 run.seed=2", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "repeat the flag (--set a=1 --set b=2)")) << r.err;
}

// A checkpoint.init_from that does not exist is refused at its key, wherever it was given.
TEST_F(Hints, AMissingInitFromIsNamedAtItsKey) {
  auto r = run("check " + quickstart() + " --set checkpoint.init_from=missing.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "error: --set checkpoint.init_from=missing.safetensors: "
                  "'checkpoint.init_from': names"))
      << r.err;
  EXPECT_TRUE(has(r.err, "which does not exist")) << r.err;
  write_file("m.toml", "[checkpoint]\ninit_from = \"gone.mxt\"\n");
  r = run("check " + quickstart() + " --merge m.toml", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "m.toml:2:13: 'checkpoint.init_from'")) << r.err;
  EXPECT_FALSE(has(r.err, "--resume")) << r.err;
}

// A block instance's block or inputs changed with --set is blamed on the --set, not on the file's
// entry the --set replaced.
TEST_F(Hints, ABlockInstanceSetFromTheCommandLineIsBlamedOnTheSet) {
  write_file("blk.toml",
             "[model.blocks.residual]\n"
             "inputs = [\"x\"]\n"
             "nodes = [\n"
             "  { name = \"fc1\", type = \"linear\", out = 32, inputs = [\"x\"] },\n"
             "  { name = \"sum\", type = \"add\", inputs = [\"fc1\", \"x\"] },\n"
             "]\n"
             "[model]\n"
             "nodes = [\n"
             "  { name = \"res\", block = \"residual\", repeat = 2, inputs = [\"input\"] },\n"
             "  { name = \"head\", type = \"linear\", out = 10, inputs = [\"res\"] },\n"
             "]\n");
  ASSERT_EQ(run("check blk.toml --skip-rehearsal", dir_).exit_code, 0);
  auto r = run("check blk.toml --skip-rehearsal --set 'model.nodes.0.block=\"residul\"'", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "error: --set model.nodes.0.block=\"residul\": 'model.nodes[0].block': "
                  "unknown block 'residul'"))
      << r.err;
  r = run("check blk.toml --skip-rehearsal --set 'model.nodes.0.inputs=[\"input\", \"input\"]'",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "error: --set model.nodes.0.inputs=[\"input\", \"input\"]: "
                  "'model.nodes[0].inputs'"))
      << r.err;
}

// An override whose layers match nothing is blamed on its layers key, not on the table's header.
TEST_F(Hints, AnOverrideMatchingNothingPointsAtItsLayersKey) {
  write_file("o.toml", "[[precision.override]]\n\nlayers = \"zzz\"\ncompute = \"fp32\"\n");
  const auto r = run("check " + quickstart() + " --skip-rehearsal --merge o.toml", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "o.toml:3:10: 'precision.override.layers': 'zzz' matches no layer"))
      << r.err;
}

}  // namespace
}  // namespace mixtrain::test
