// The README's Python steps run as written on a machine set up by its second command: every
// ```python block and every python / tensorboard command of its shell blocks, found by
// readme_python_steps.h, runs under the interpreter it names, in a folder holding the files those
// steps read, written by mixtrain. A python step passes when it exits 0 and writes nothing to
// stderr (transformers reports missing or unexpected weights there, not by failing); a tensorboard
// step is run with --inspect (it reads the event files and prints their tags instead of serving
// them), which must find event files. A step whose interpreter or one of its modules is missing
// here is not run, and the test skips naming them; a step marked `readme-test: skip` is counted.
// The extractor's refusals are tested on small documents of their own.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "python_peers.h"
#include "readme_python_steps.h"

namespace mixtrain::test {
namespace {

using readme::extract_python_steps;
using readme::SnippetError;
using readme::Step;

// The message of the SnippetError `markdown` raises, or "" when it is accepted.
std::string refusal(const std::string& markdown) {
  try {
    extract_python_steps(markdown, "README.md");
  } catch (const SnippetError& e) {
    return e.what();
  }
  return {};
}

// ---- the extractor -------------------------------------------------------------------------

TEST(ReadmePythonSteps, FindsBlocksAndCommandsWithTheirInterpreterAndModules) {
  const auto steps = extract_python_steps(R"(# Title

Run `~/.cache/mixtrain/peers/bin/tensorboard --logdir runs/`, or see `python3-torch`.

- A list item:

  ```python
  # Run with ~/.cache/mixtrain/peers/bin/python (transformers)
  from transformers import GPT2LMHeadModel
  if True:
      import json, torch.nn as nn
  ```

```sh
mixtrain train x.toml && /usr/bin/python3 -c "import numpy as np; d = 1; import torch" 2>&1
~/.cache/mixtrain/peers/bin/tensorboard --logdir runs/   # the dashboard
mixtrain predict a \
    --out p.npy
```
```toml
python3 = "not a command"
```
)",
                                          "README.md");
  ASSERT_EQ(steps.size(), 3u);

  EXPECT_TRUE(steps[0].block);
  EXPECT_EQ(steps[0].line, 7);
  EXPECT_EQ(steps[0].interpreter->path, "~/.cache/mixtrain/peers/bin/python");
  // De-indented as the list item indents it, nested indentation kept: it runs as Python.
  EXPECT_EQ(
      steps[0].source,
      "# Run with ~/.cache/mixtrain/peers/bin/python (transformers)\n"
      "from transformers import GPT2LMHeadModel\nif True:\n    import json, torch.nn as nn\n");
  EXPECT_EQ(steps[0].modules, (std::vector<std::string>{"transformers", "json", "torch"}));

  EXPECT_FALSE(steps[1].block);
  EXPECT_EQ(steps[1].line, 15);
  EXPECT_EQ(steps[1].interpreter->path, "/usr/bin/python3");
  EXPECT_EQ(steps[1].source,
            R"(/usr/bin/python3 -c "import numpy as np; d = 1; import torch" 2>&1)");
  EXPECT_EQ(steps[1].modules, (std::vector<std::string>{"numpy", "torch"}));

  EXPECT_EQ(steps[2].line, 16);
  EXPECT_EQ(steps[2].interpreter->tool, readme::Tool::tensorboard);
  EXPECT_EQ(steps[2].source, "~/.cache/mixtrain/peers/bin/tensorboard --logdir runs/");
  for (const auto& s : steps) EXPECT_EQ(s.skip_reason, "");
}

TEST(ReadmePythonSteps, RefusesAnUnterminatedFence) {
  const auto why = refusal("text\n\n```python\n# Run with /usr/bin/python3\nimport torch\n");
  EXPECT_TRUE(has(why, "README.md:3: ")) << why;
  EXPECT_TRUE(has(why, "```python fence opened here is never closed")) << why;
}

TEST(ReadmePythonSteps, RefusesACommandThatNamesNoKnownInterpreter) {
  for (const auto* command :
       {"python3 -c 'import torch'", "/opt/conda/bin/python x.py", "tensorboard --logdir runs/",
        "pip install safetensors", "mixtrain train a.toml; PYTHONPATH=. python script.py"}) {
    const auto why = refusal(std::string("intro\n```sh\n") + command + "\n```\n");
    EXPECT_TRUE(has(why, "README.md:3: the command `")) << command << ": " << why;
    EXPECT_TRUE(has(why, "names no interpreter a fresh machine has")) << why;
    // The message says what to write instead.
    EXPECT_TRUE(has(why, "/usr/bin/python3 (Debian's")) << why;
    EXPECT_TRUE(has(why, "~/.cache/mixtrain/peers/bin/tensorboard")) << why;
  }
}

TEST(ReadmePythonSteps, RefusesAPythonBlockWithoutItsInterpreter) {
  auto why = refusal("```python\nimport torch\n```\n");
  EXPECT_TRUE(has(why, "README.md:1: a ```python block names its interpreter on its first line"))
      << why;
  why = refusal("```python\n# Run with python3\nimport torch\n```\n");
  EXPECT_TRUE(has(why, "README.md:1: `python3` names no interpreter")) << why;
  // A TensorBoard is no Python interpreter.
  why =
      refusal("```python\n# Run with ~/.cache/mixtrain/peers/bin/tensorboard\nimport torch\n```\n");
  EXPECT_TRUE(has(why, "names no interpreter")) << why;
}

// The outside tester's step: safetensors under Debian's python3, refused without running it.
TEST(ReadmePythonSteps, RefusesAPeersModuleUnderDebiansPython) {
  auto why = refusal(
      "```python\n# Run with /usr/bin/python3\nimport json\nfrom safetensors import "
      "safe_open\n```\n");
  EXPECT_TRUE(has(why,
                  "README.md:1: the step under /usr/bin/python3 imports safetensors, which "
                  "only the Python peers have: name ~/.cache/mixtrain/peers/bin/python"))
      << why;
  why = refusal("```sh\n/usr/bin/python3 -c 'import tensorboard'\n```\n");
  EXPECT_TRUE(has(why, "README.md:2: the step under /usr/bin/python3 imports tensorboard")) << why;
  EXPECT_EQ(refusal("```python\n# Run with ~/.cache/mixtrain/peers/bin/python\n"
                    "from safetensors import safe_open\n```\n"),
            "");
}

TEST(ReadmePythonSteps, RefusesABareCommandInTheProse) {
  const auto why = refusal("Then\nrun `tensorboard --logdir runs/` and look.\n");
  EXPECT_TRUE(has(why, "README.md:2: the inline code `tensorboard --logdir runs/` runs")) << why;
  // A span split over two lines is one span, at the line it opens on.
  EXPECT_TRUE(has(refusal("a `python3 -c\n'import torch'` b\n"), "README.md:1: the inline code"));
  // Backticks with no closing run in their paragraph are literal text.
  EXPECT_EQ(refusal("a ` python3\n\nb ` c\n"), "");
  // A tool's name alone is a name (the `tensorboard` metrics sink), not a command.
  EXPECT_EQ(refusal("the `tensorboard` sink; `python3`\n"), "");
}

TEST(ReadmePythonSteps, AMarkerSkipsTheNextBlockAndNothingElse) {
  const auto steps = extract_python_steps(
      "intro\n<!-- readme-test: skip (downloads CIFAR-10) -->\n\n```sh\n"
      "/usr/bin/python3 -c 'import torchvision'\n```\n```sh\n"
      "~/.cache/mixtrain/peers/bin/tensorboard --logdir runs/\n```\n",
      "README.md");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].skip_reason, "downloads CIFAR-10");
  EXPECT_EQ(steps[1].skip_reason, "");
}

TEST(ReadmePythonSteps, RefusesAMarkerThatMarksNoStep) {
  EXPECT_TRUE(has(refusal("<!-- readme-test: skip (x) -->\nsome text\n```sh\nls\n```\n"),
                  "README.md:1: readme-test marker followed by text, not a fenced block"));
  EXPECT_TRUE(has(refusal("a\n<!-- readme-test: skip (x) -->\n```sh\nmixtrain train\n```\n"),
                  "README.md:2: readme-test marker over a fenced block with no Python step"));
  EXPECT_TRUE(has(refusal("a\n\n<!-- readme-test: skip (x) -->\n"),
                  "README.md:3: readme-test marker at the end of the file"));
  EXPECT_TRUE(has(refusal("<!-- readme-test: skip (x) -->\n<!-- readme-test: skip (y) -->\n"),
                  "README.md:1: readme-test marker followed by another marker"));
  for (const auto* bad : {"<!-- readme-test: skipp (x) -->", "<!-- readme-test: skip -->",
                          "<!-- readme-test: skip () -->", "<!--readme-test: skip (x)-->"})
    EXPECT_TRUE(has(refusal(std::string(bad) + "\n```sh\n/usr/bin/python3 x.py\n```\n"),
                    "README.md:1: `" + std::string(bad) + "` is no readme-test marker"))
        << bad;
}

// ---- the README's steps --------------------------------------------------------------------

class ReadmePython : public CliTest {
 protected:
  // The interpreter a step names, where this machine has it: the peers' prefix read as
  // cmake/setup-debian.sh places the venv.
  static std::string on_this_machine(const std::string& text) {
    std::string out = text;
    const std::string prefix(readme::kPeersPrefix);
    for (auto at = out.find(prefix); at != std::string::npos;
         at = out.find(prefix, at + prefix.size()))
      out.replace(at, prefix.size(), peers_venv().string());
    return out;
  }

  // Why `s` cannot run here ("" when it can): its interpreter is absent, or a module the setup
  // installs does not import. A module outside the setup's lists is not asked about: the step
  // then fails on it, as it would for a reader.
  std::string missing(const Step& s) {
    const auto interpreter = on_this_machine(std::string(s.interpreter->path));
    if (!fs::exists(interpreter))
      return interpreter + " is absent (bash cmake/setup-debian.sh --tests makes it)";
    std::string modules;
    for (const auto& m : s.modules) {
      const bool setup =
          std::count(readme::kDebianModules.begin(), readme::kDebianModules.end(), m) ||
          std::count(readme::kPeersOnlyModules.begin(), readme::kPeersOnlyModules.end(), m);
      if (setup) modules += (modules.empty() ? "" : ", ") + m;
    }
    if (modules.empty()) return {};
    const auto key = interpreter + " " + modules;
    if (!imports_.count(key))
      imports_[key] =
          std::system((interpreter + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0;
    if (imports_[key]) return {};
    return interpreter + " cannot import all of " + modules +
           " (bash cmake/setup-debian.sh --tests)";
  }

  // The files the README's steps read, beside each other as in the folder above configs/, each
  // written as the README's commands write it but without their training: `export --initial`
  // writes what a trained run's export writes, from the starting weights.
  void write_readme_files(const fs::path& work) {
    fs::create_directories(work / "runs" / "gpt-tiny-fp32");
    // transformers' GPT2LMHeadModel.from_pretrained("runs/gpt-tiny-fp32/step-00000300-hf").
    auto r = run("export " + config("gpt-tiny-fp32.toml") +
                     " --initial --layout hf --out runs/gpt-tiny-fp32/step-00000300-hf",
                 work);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // torchvision's resnet18 and safetensors' load_file("resnet18.safetensors"); its
    // normalisation computed from a training split of 128 synthetic images, not the config's
    // 8000.
    r = run("export " + config("resnet18-bf16.toml") +
                " --initial --out resnet18.safetensors --set data.synthetic.rows=128",
            work);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // `tensorboard --logdir runs/`: a run with TensorBoard's event file.
    r = run(
        "train " + quickstart() +
            " --set run.steps=10 --set 'run.metrics=[\"tensorboard\"]' --run-dir runs/quickstart",
        work);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  // Runs the step in `work`; a failure names the step and what it printed.
  void run_step(const Step& s, const fs::path& work, const std::string& where) {
    const auto script = dir_ / ("step-" + std::to_string(s.line));
    std::string command;
    if (s.block) {
      std::ofstream(script.string() + ".py") << s.source;
      command = on_this_machine(std::string(s.interpreter->path)) + " " + script.string() + ".py";
    } else {
      const bool tensorboard = s.interpreter->tool == readme::Tool::tensorboard;
      std::ofstream(script.string() + ".sh")
          << on_this_machine(s.source) << (tensorboard ? " --inspect" : "") << "\n";
      command = "/bin/sh " + script.string() + ".sh";
    }
    const auto out = dir_ / "step.out", err = dir_ / "step.err";
    const int status = std::system(("cd '" + work.string() + "' && " + command + " >" +
                                    out.string() + " 2>" + err.string() + " </dev/null")
                                       .c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const auto stdout_text = slurp(out), stderr_text = slurp(err);
    EXPECT_EQ(code, 0) << where << " `" << s.source << "`:\n" << stdout_text << stderr_text;
    if (s.interpreter->tool == readme::Tool::tensorboard) {
      EXPECT_TRUE(has(stdout_text, "Found event files in:"))
          << where << " `" << s.source << " --inspect` found no event files:\n"
          << stdout_text << stderr_text;
    } else if (code == 0) {
      EXPECT_EQ(stderr_text, "") << where << " `" << s.source << "` wrote to stderr";
    }
  }

  std::map<std::string, bool> imports_;
};

// The other READMEs (plugins, samples, bench) are held to the same rule, checked but not run:
// every Python step names an interpreter that has what it imports. bench/gpu's README describes a
// bare GPU image, whose Python is not this machine's: it is the one left out.
TEST(ReadmePythonSteps, EveryReadmeInTheTreeNamesItsInterpreters) {
  const fs::path root(MIXTRAIN_SOURCE_DIR);
  std::size_t checked = 0, steps = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().filename() != "README.md") continue;
    const auto rel = fs::relative(e.path(), root);
    const auto top = rel.begin()->string();
    if (top.starts_with(".") || top.starts_with("build") || rel == fs::path("bench/gpu/README.md"))
      continue;
    try {
      steps += extract_python_steps(slurp(e.path()), rel.string()).size();
    } catch (const SnippetError& err) {
      ADD_FAILURE() << err.what();
    }
    ++checked;
  }
  // The top README, the plugins' and the samples': a walk that found few means a wrong root.
  EXPECT_GE(checked, 15u);
  EXPECT_GE(steps, 5u);
}

TEST_F(ReadmePython, EveryStepRunsUnderTheInterpreterItNames) {
  const fs::path readme = fs::path(MIXTRAIN_SOURCE_DIR) / "README.md";
  std::vector<Step> steps;
  try {
    steps = extract_python_steps(slurp(readme), "README.md");
  } catch (const SnippetError& e) {
    FAIL() << e.what();
  }
  std::vector<const Step*> to_run;
  std::vector<std::string> marked, not_here;
  for (const auto& s : steps) {
    const auto where = "README.md:" + std::to_string(s.line);
    if (!s.skip_reason.empty()) {
      marked.push_back(where + " (" + s.skip_reason + ")");
    } else if (auto why = missing(s); !why.empty()) {
      not_here.push_back(where + ": " + why);
    } else {
      to_run.push_back(&s);
    }
  }
  // At least the transformers and safetensors blocks and the tensorboard command: fewer means
  // the extractor lost steps, and the test would pass by running none.
  EXPECT_GE(steps.size() - marked.size(), 3u);
  // Marking a step is a deliberate change of this count: today the CIFAR-10 download, GPT-2's
  // from the Hugging Face Hub, the tokenizer lines on a folder DIR, and the four Python steps of
  // the fine-tuning walk, which read what its mixtrain commands write (test_finetune_walk.cpp
  // runs them all, in order). (An image folder needs no conversion since data.source =
  // "image_folder" reads it.)
  EXPECT_EQ(marked.size(), 7u) << ::testing::PrintToString(marked);

  if (!to_run.empty()) {
    const auto work = dir_ / "work";
    fs::create_directories(work);
    write_readme_files(work);
    if (HasFatalFailure()) return;
    for (const auto* s : to_run) run_step(*s, work, "README.md:" + std::to_string(s->line));
  }
  if (!not_here.empty())
    GTEST_SKIP() << to_run.size() << " of the README's Python steps ran; not run here: "
                 << ::testing::PrintToString(not_here);
}

}  // namespace
}  // namespace mixtrain::test
