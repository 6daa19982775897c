// `mixtrain export` of a run: which checkpoint it reads and where the file goes, and which of its
// weights (master, EMA) its files hold; `export CONFIG --initial`: its options and layouts, and
// what it refuses. (That --initial writes the trainer's
// own step-0 weights, bit for bit, is test_export_initial.cpp's.)
#include <cstring>
#include <fstream>

#include "cli_test_support.h"
#include "safetensors_test_support.h"

namespace {

using namespace mixtrain::test;
using CliExport = CliTest;

// A run folder or its checkpoints/ folder means the newest checkpoint, as for `eval
// --checkpoint` and `train --resume`; the export lands in the run folder, not in checkpoints/.
TEST_F(CliExport, TakesARunOrItsCheckpointsFolderAndWritesBesideTheRun) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set run.steps=10 --set run.eval_every=0 --set checkpoint.every=5"
               " --set backend.threads=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto checkpoints = run_dir / "checkpoints";
  ASSERT_TRUE(fs::exists(checkpoints / "step-00000005.mxt"));
  ASSERT_TRUE(fs::exists(checkpoints / "step-00000010.mxt"));

  r = run("export " + checkpoints.string() + " --format safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = run_dir / "step-00000010.safetensors";
  EXPECT_TRUE(fs::exists(out)) << r.out;
  EXPECT_FALSE(fs::exists(checkpoints / "step-00000010.safetensors"));
  EXPECT_NE(r.out.find("step-00000010.mxt"), std::string::npos) << r.out;

  // The same from the run folder: the file exists, so it is refused until --force.
  const auto before = slurp(out);
  r = run("export " + run_dir.string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out), before);
  r = run("export " + run_dir.string() + " --format safetensors --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(out), before);  // the same checkpoint, exported again

  // A checkpoint file named directly also exports beside the run.
  r = run("export " + (checkpoints / "step-00000005.mxt").string() + " --format safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run_dir / "step-00000005.safetensors"));
  EXPECT_NE(slurp(run_dir / "step-00000005.safetensors"), before);

  // eval accepts the run folder too, and the export evaluates like the newest checkpoint.
  const auto config = (run_dir / "config.toml").string();
  auto a = run("eval " + config + " --checkpoint " + run_dir.string());
  auto b = run("eval " + config + " --checkpoint " + out.string());
  auto c = run("eval " + config + " --checkpoint " + (checkpoints / "step-00000010.mxt").string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(json::parse(a.out), json::parse(c.out));
  EXPECT_EQ(json::parse(b.out)["eval_loss"], json::parse(c.out)["eval_loss"]);

  // An export in the native format holds the weights alone, as the safetensors one does, not the
  // AdamW moments (twice the weights again) it could never resume from.
  const auto native = run_dir / "weights.mxt";
  r = run("export " + run_dir.string() + " --format native --out " + native.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(fs::file_size(native) * 2, fs::file_size(checkpoints / "step-00000010.mxt"));
  const auto converted = dir_ / "converted.safetensors";
  r = run("export " + native.string() + " --format safetensors --out " + converted.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(slurp(converted) == before);
}

// Weights leave a checkpoint without its optimizer's slots (core/checkpoint/weights_read.h):
// with the last slot's data damaged, export and eval give what they gave from the intact file,
// and only a resume, which needs the slots, refuses it.
TEST_F(CliExport, WeightsAreReadWithoutTheOptimizersSlots) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set run.steps=2 --set run.eval_every=0 --set backend.threads=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto checkpoint = run_dir / "checkpoints" / "step-00000002.mxt";
  const auto config = (run_dir / "config.toml").string();
  r = run("export " + checkpoint.string() + " --format safetensors --out intact.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto evaluated = run("eval " + config + " --checkpoint " + checkpoint.string());
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.err;
  auto bytes = slurp(checkpoint);
  bytes[bytes.size() - 10] = static_cast<char>(bytes[bytes.size() - 10] ^ 0x5a);
  std::ofstream(checkpoint, std::ios::binary | std::ios::trunc) << bytes;
  r = run("export " + checkpoint.string() + " --format safetensors --out damaged.safetensors",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(slurp(dir_ / "damaged.safetensors") == slurp(dir_ / "intact.safetensors"));
  const auto again = run("eval " + config + " --checkpoint " + checkpoint.string());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(json::parse(again.out), json::parse(evaluated.out));
  r = run("train --resume " + checkpoint.string() + " --set run.steps=3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch in the data of tensor 'optimizer/"), std::string::npos)
      << r.err;
}

// An --out named with another checkpoint format's extension is refused: readers choose the
// format by it, so safetensors bytes named .mxt would be misread (and a run's checkpoints/ would
// list them). Any other name is written with a warning, as predict's --out not named .npy is.
TEST_F(CliExport, AnOutNamedForAnotherFormatIsRefusedAndAnyOtherNameWarned) {
  auto r = run("train " + quickstart() +
                   " --set run.steps=2 --set run.eval_every=0 --set backend.threads=1"
                   " --set data.synthetic.rows=512 --run-dir run",
               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run --format safetensors --out weights.mxt", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--out weights.mxt is named as a native checkpoint (.mxt), but --format "
                       "safetensors writes .safetensors files"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--out weights.safetensors"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "weights.mxt"));
  r = run("export run --format native --out weights.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("named as a safetensors checkpoint"), std::string::npos) << r.err;
  r = run("export run --format safetensors --out weights.bin", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --out weights.bin is written as --format safetensors "
                       "(.safetensors) whatever its name"),
            std::string::npos)
      << r.err;
  r = run("export run --format safetensors --out weights.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// --initial reads a config: a checkpoint or a run folder given to it says so, not a TOML error
// about the bytes of a binary file.
TEST_F(CliExport, InitialGivenACheckpointOrARunFolderSaysItReadsAConfig) {
  auto r = run("train " + quickstart() +
                   " --set run.steps=2 --set run.eval_every=0 --set backend.threads=1"
                   " --set data.synthetic.rows=512 --run-dir run",
               dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export run/checkpoints/step-00000002.mxt --initial --out initial.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("export --initial reads a config, but run/checkpoints/step-00000002.mxt "
                       "looks like a checkpoint (native, .mxt)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("TOML"), std::string::npos) << r.err;
  r = run("export run --initial --out initial.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("export --initial reads a config, but run is a folder"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run/config.toml"), std::string::npos) << r.err;
}

TEST_F(CliExport, FolderWithoutCheckpointsExits2) {
  fs::create_directories(dir_ / "empty" / "checkpoints");
  auto r = run("export " + (dir_ / "empty").string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no checkpoint (step-*.mxt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((dir_ / "empty" / "checkpoints").string()), std::string::npos) << r.err;
  r = run("export " + (dir_ / "nowhere").string() + " --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
}

// The quickstart MLP on a few rows: --initial opens the config's data as `train` does.
const std::string kSmallMlp = " --set data.synthetic.rows=512 --set backend.threads=1";

TEST_F(CliExport, InitialRefusesBadInputWithExit2) {
  const auto cfg = quickstart() + kSmallMlp;
  const auto out = dir_ / "initial.safetensors";

  auto r = run("export " + cfg + " --initial --format safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("export --initial needs --out"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--out initial.safetensors"), std::string::npos) << r.err;

  r = run("export " + cfg + " --initial --format safetensors --from native --out " + out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--from names the format of a checkpoint"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));

  // --set belongs to a config; a checkpoint carries its own.
  write_file("some.mxt", "not read");
  r = run("export " + (dir_ / "some.mxt").string() +
          " --format safetensors --set run.seed=2 --out " + out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--set changes a config"), std::string::npos) << r.err;

  // A missing output folder is named, in both modes, before anything is read.
  const auto missing = dir_ / "no-such-folder";
  for (const std::string& source : {cfg + " --initial", (dir_ / "some.mxt").string()}) {
    r = run("export " + source + " --format safetensors --out " +
            (missing / "w.safetensors").string());
    EXPECT_EQ(r.exit_code, 2) << source;
    EXPECT_NE(r.err.find(missing.string() + ", does not exist"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("mkdir -p " + missing.string()), std::string::npos) << r.err;
  }

  // An existing file is kept without --force.
  write_file("initial.safetensors", "keep me");
  r = run("export " + cfg + " --initial --format safetensors --out " + out.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(out.string() + " already exists"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out), "keep me");
  r = run("export " + cfg + " --initial --format safetensors --force --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(slurp(out), "keep me");
  EXPECT_NE(r.out.find("initial weights of " + quickstart() + ", run.seed 1"), std::string::npos)
      << r.out;
}

TEST_F(CliExport, InitialTakesTheFormatsDtypesAndSeedsOfExport) {
  const auto cfg = quickstart() + kSmallMlp;
  const auto fp32 = dir_ / "fp32.safetensors";
  auto r = run("export " + cfg + " --initial --format safetensors --out " + fp32.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto weights = read_st(fp32);
  std::vector<std::string> names;
  for (const auto& t : weights.tensors) names.push_back(t.name);
  // read_st lists the tensors by name, not in file order.
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight",
                                             "head.bias", "head.weight"}));
  EXPECT_EQ(weights.metadata.value("step", ""), "0");
  EXPECT_EQ(weights.metadata.value("format", ""), "pt");

  // The same seed gives the same file; another seed other weights.
  r = run("export " + cfg + " --initial --format safetensors --force --out " + fp32.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_st(fp32).tensors.at(0).bytes, weights.tensors.at(0).bytes);
  const auto reseeded = dir_ / "seed-2.safetensors";
  r = run("export " + cfg + " --set run.seed=2 --initial --format safetensors --out " +
          reseeded.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto other = read_st(reseeded);
  ASSERT_EQ(other.tensors.size(), weights.tensors.size());
  EXPECT_NE(other.tensors.at(0).bytes, weights.tensors.at(0).bytes);
  EXPECT_NE(other.metadata.value("mixtrain.config", "").find("seed = 2"), std::string::npos);

  // --dtype is the writer's.
  const auto bf16 = dir_ / "bf16.safetensors";
  r = run("export " + cfg + " --initial --format safetensors --dtype bf16 --out " + bf16.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& t : read_st(bf16).tensors) EXPECT_EQ(t.dtype, "BF16") << t.name;

  // The native format holds the same weights: exported on to safetensors, the same file.
  const auto native = dir_ / "initial.mxt";
  r = run("export " + cfg + " --initial --format native --out " + native.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto converted = dir_ / "converted.safetensors";
  r = run("export " + native.string() + " --format safetensors --out " + converted.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(slurp(converted) == slurp(fp32));

  // The gpt2 layout is refused for a model that is not a gpt preset, as for a checkpoint.
  r = run("export " + cfg + " --initial --format safetensors --layout gpt2 --out " +
          (dir_ / "gpt2.safetensors").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not the weights of a GPT-2 model"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "gpt2.safetensors"));
}

// A tiny gpt preset in GPT-2's layout: GPT2Model's names and Conv1D weights, the transposes of
// the native export's; read back with init_layout = "gpt2", the native weights again.
TEST_F(CliExport, InitialGpt2LayoutOfATinyGpt) {
  const std::string cfg = config("gpt-tiny-fp32.toml") +
                          " --set model.gpt.n_layer=1 --set model.gpt.n_head=2"
                          " --set model.gpt.n_embd=16 --set data.block_size=8"
                          " --set backend.threads=1";
  const auto native = dir_ / "native.safetensors", gpt2 = dir_ / "gpt2.safetensors";
  auto r = run("export " + cfg + " --initial --format safetensors --out " + native.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export " + cfg + " --initial --format safetensors --layout gpt2 --out " + gpt2.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Hugging Face GPT-2 layout"), std::string::npos) << r.out;

  auto n = read_st(native), g = read_st(gpt2);
  EXPECT_EQ(g.metadata.value("layout", ""), "gpt2");
  EXPECT_EQ(g.metadata.value("n_head", ""), "2");
  EXPECT_EQ(g.metadata.value("n_layer", ""), "1");
  EXPECT_EQ(g.metadata.value("n_positions", ""), "8");
  EXPECT_EQ(g.metadata.value("step", ""), "0");
  const auto* wte = g.find("wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->bytes, n.find("wte.weight")->bytes);
  const auto* attn = g.find("h.0.attn.c_attn.weight");
  const auto* attn_native = n.find("h.0.attn.c_attn.weight");
  ASSERT_NE(attn, nullptr);
  ASSERT_NE(attn_native, nullptr);
  ASSERT_EQ(attn->shape, (std::vector<std::int64_t>{16, 48}));  // Conv1D [in, out]
  ASSERT_EQ(attn_native->shape, (std::vector<std::int64_t>{48, 16}));
  for (std::size_t i = 0; i < 16; ++i)
    for (std::size_t o = 0; o < 48; ++o)
      EXPECT_EQ(
          std::memcmp(&attn->bytes[(i * 48 + o) * 4], &attn_native->bytes[(o * 16 + i) * 4], 4), 0)
          << "[" << i << ", " << o << "]";

  const auto round_trip = dir_ / "round-trip.safetensors";
  r = run("export " + cfg + " --set checkpoint.init_from=" + gpt2.string() +
          " --set checkpoint.init_layout=gpt2 --set run.seed=9 --initial --format safetensors"
          " --out " +
          round_trip.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto back = read_st(round_trip);
  ASSERT_EQ(back.tensors.size(), n.tensors.size());
  for (std::size_t i = 0; i < n.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].name, n.tensors[i].name);
    EXPECT_TRUE(back.tensors[i].bytes == n.tensors[i].bytes) << n.tensors[i].name;
  }
}

}  // namespace

namespace {

// A run that evaluates with its EMA (eval.weights = "ema") exports the EMA by default, in every
// layout, so the export evaluates as `eval` of the run does; --weights master writes the trained
// weights; --weights ema of a run without [ema] exits 2.
TEST_F(CliExport, ARunThatEvaluatesItsEmaExportsTheEma) {
  const auto run_dir = dir_ / "run";
  const std::string sets =
      " --set run.steps=20 --set run.eval_every=0 --set backend.threads=1 --set ema.decay=0.8";
  auto r =
      run("train " + quickstart() + sets + " --set eval.weights=ema --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export " + run_dir.string() + " --format safetensors --out ema.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("EMA weights (eval.weights = \"ema\")"), std::string::npos) << r.out;
  r = run("export " + run_dir.string() +
              " --format safetensors --weights master --out master.safetensors",
          dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("EMA"), std::string::npos) << r.out;

  // Each export evaluates as the run does with the weights it holds.
  const auto config = (run_dir / "config.toml").string();
  auto loss = [&](const std::string& checkpoint, const std::string& weights) {
    const auto e = run(
        "eval " + config + " --set eval.weights=" + weights + " --checkpoint " + checkpoint, dir_);
    EXPECT_EQ(e.exit_code, 0) << e.err;
    return json::parse(e.out)["eval_loss"].get<double>();
  };
  const double run_ema = loss(run_dir.string(), "ema"),
               run_master = loss(run_dir.string(), "master");
  EXPECT_NE(run_ema, run_master);
  EXPECT_EQ(loss("ema.safetensors", "master"), run_ema);
  EXPECT_EQ(loss("master.safetensors", "master"), run_master);
  // Under the run's own eval.weights = "ema", the EMA export is taken silently and the master
  // export is named for what it holds.
  auto as_run = [&](const std::string& checkpoint) {
    const auto e = run("eval " + config + " --checkpoint " + checkpoint, dir_);
    EXPECT_EQ(e.exit_code, 0) << e.err;
    return e;
  };
  const auto of_ema = as_run("ema.safetensors");
  EXPECT_EQ(json::parse(of_ema.out)["eval_loss"].get<double>(), run_ema);
  EXPECT_EQ(of_ema.err.find("EMA"), std::string::npos) << of_ema.err;
  const auto of_master = as_run("master.safetensors");
  EXPECT_EQ(json::parse(of_master.out)["eval_loss"].get<double>(), run_master);
  EXPECT_NE(of_master.err.find("is an export of the run's master weights, not an EMA"),
            std::string::npos)
      << of_master.err;
  // Each export says which weights it holds.
  EXPECT_EQ(read_st(dir_ / "ema.safetensors").metadata["mixtrain.weights"], "ema");
  EXPECT_EQ(read_st(dir_ / "master.safetensors").metadata["mixtrain.weights"], "master");

  const auto plain = dir_ / "plain";
  ASSERT_EQ(
      run("train " + quickstart() + " --set run.steps=5 --run-dir " + plain.string()).exit_code, 0);
  r = run("export " + plain.string() + " --format safetensors --weights ema --out p.safetensors",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("holds no EMA weights"), std::string::npos) << r.err;
  r = run("export " + quickstart() + " --initial --weights ema --out i.safetensors", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

// The checkpoint's EMA covers what its run trained; eval under a config that freezes other
// layers takes every average the file holds (a layer frozen now but trained then gets its EMA; a
// layer frozen then, trained now, keeps its one copy), so it gives the run's own evaluation.
TEST_F(CliExport, EvalTakesEveryAverageTheCheckpointHoldsWhateverTheConfigFreezes) {
  const std::string sets = " --set run.steps=20 --set run.eval_every=0 --set backend.threads=1 "
                           "--set ema.decay=0.8 --set eval.weights=ema";
  for (const std::string frozen : {"[]", "[\"fc1\"]"}) {
    const auto run_dir = dir_ / ("run" + std::to_string(frozen.size()));
    auto r = run("train " + quickstart() + sets + " --set train.frozen='" + frozen +
                 "' --run-dir " + run_dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto config = (run_dir / "config.toml").string();
    auto loss = [&](const std::string& set) {
      const auto e = run("eval " + config + set + " --checkpoint " + run_dir.string(), dir_);
      EXPECT_EQ(e.exit_code, 0) << e.err;
      EXPECT_EQ(e.err.find("holds no EMA"), std::string::npos) << e.err;
      return json::parse(e.out)["eval_loss"].get<double>();
    };
    const double own = loss("");
    EXPECT_EQ(loss(" --set train.frozen='[\"fc1\"]'"), own) << "trained with " << frozen;
    EXPECT_EQ(loss(" --set train.frozen='[]'"), own) << "trained with " << frozen;
    EXPECT_NE(loss(" --set eval.weights=master"), own) << "trained with " << frozen;
  }
}

// A resume that drops the checkpoint's EMA, or changes its decay, says so (the next checkpoint
// no longer holds what the run averaged); a checkpoint format that keeps weights only says at
// the start that its files hold no EMA.
TEST_F(CliExport, DroppingOrChangingTheEmaOrAFormatThatCannotKeepItIsSaid) {
  const auto run_dir = dir_ / "run";
  const std::string sets = " --set backend.threads=1 --set run.eval_every=0";
  auto r = run("train " + quickstart() + sets + " --set run.steps=4 --set ema.decay=0.8" +
               " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("does not keep the EMA"), std::string::npos) << r.err;  // native keeps it
  r = run("train --resume " + run_dir.string() + " --set run.steps=6 --set ema.decay=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the EMA was kept with decay 0.8 and continues with 0.5"),
            std::string::npos)
      << r.err;
  r = run("train --resume " + run_dir.string() + " --set run.steps=8 --set ema.decay=0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("holds an EMA of the weights, which this config keeps none of"),
            std::string::npos)
      << r.err;
  r = run("train " + quickstart() + sets + " --set run.steps=2 --set ema.decay=0.8" +
          " --set checkpoint.format=safetensors --run-dir " + (dir_ / "st").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("checkpoint.format = \"safetensors\" does not keep the EMA"),
            std::string::npos)
      << r.err;
  for (const auto& f : fs::directory_iterator(dir_ / "st" / "checkpoints"))
    EXPECT_EQ(f.path().filename().string().find("probe"), std::string::npos) << f.path();
}

// Delayed scaling's amax histories travel in the export: eval of it scales as eval of the
// checkpoint does (without them it evaluated from scales of 1, other numbers with no warning).
TEST_F(CliExport, ADelayedScalingRunsExportEvaluatesUnderItsScales) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set precision.policy=fp8-delayed --set run.steps=30 --set run.eval_every=0"
               " --set backend.threads=1 --run-dir " +
               run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("export " + run_dir.string() + " --format safetensors --out w.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto meta = read_st(dir_ / "w.safetensors").metadata;
  EXPECT_EQ(meta.at("policy"), "fp8-delayed");
  EXPECT_EQ(json::parse(meta.at("mixtrain.policy_state").get<std::string>())["component"],
            "fp8-delayed");
  const auto config_file = (run_dir / "config.toml").string();
  const auto of_run = run("eval " + config_file + " --checkpoint " + run_dir.string());
  const auto of_export =
      run("eval " + config_file + " --checkpoint " + (dir_ / "w.safetensors").string());
  ASSERT_EQ(of_run.exit_code, 0) << of_run.err;
  ASSERT_EQ(of_export.exit_code, 0) << of_export.err;
  EXPECT_EQ(json::parse(of_export.out), json::parse(of_run.out)) << of_export.out;
}

// A run whose escalation promoted an op exports that plan with the weights: the export evaluates
// as the run does (without it the promoted fp16 op overflowed again: a NaN loss).
TEST_F(CliExport, AnEscalatedRunsExportEvaluatesUnderItsPromotedPlan) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + config("overflow-demo.toml") +
               " --set precision.policy=fp16-mixed --set precision.escalate.after=3" +
               " --set run.steps=20 --set run.eval_every=0 --set data.batch_size=32" +
               " --set data.synthetic.rows=2048 --set model.layers.0.out=32" +
               " --set model.layers.3.out=32 --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NE(r.err.find("promoted"), std::string::npos) << r.err;
  r = run("export " + run_dir.string() + " --format safetensors --out w.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto config_file = (run_dir / "config.toml").string();
  const auto of_run = run("eval " + config_file + " --checkpoint " + run_dir.string());
  const auto of_export = run("eval " + config_file + " --checkpoint " +
                             (dir_ / "w.safetensors").string());
  ASSERT_EQ(of_run.exit_code, 0) << of_run.err;
  ASSERT_EQ(of_export.exit_code, 0) << of_export.err;
  const auto a = json::parse(of_run.out), b = json::parse(of_export.out);
  ASSERT_TRUE(a["eval_loss"].is_number()) << of_run.out;
  EXPECT_EQ(b["eval_loss"], a["eval_loss"]) << of_export.out;
}

}  // namespace
