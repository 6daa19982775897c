// Malformed-input corpus: well over a hundred damaged inputs, each generated here from a shipped
// config or from a small real run, each run through the real `mixtrain` executable. A bad input
// must end in exit 2 with an `error:` line on stderr and never in a signal or a hang. A bad plugin
// file must never stop the others: the command goes on (exit 0) and `plugins` lists the library
// as failed. A control test shows that the undamaged inputs are accepted, so each damaged one
// fails because of its damage. MIXTRAIN_CORPUS_KEEP=1 keeps the generated inputs in /tmp.
//
// Families: config files, --set lines, .npy files, IDX files (plain and gzip), native checkpoints
// (edits re-encoded with a valid CRC so they reach the JSON parser), safetensors files, plugin
// files.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "native_file_layout.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
namespace ckpt = mixtrain::checkpoint_native;

const std::string kInt64Max = std::to_string(std::numeric_limits<std::int64_t>::max());

// ---- running the executable -------------------------------------------------------------------

struct Outcome {
  bool exited = false;    // WIFEXITED
  int exit_code = -1;     // WEXITSTATUS when exited
  bool signaled = false;  // WIFSIGNALED (a crash), killed by the watchdog excluded
  int signal = 0;
  bool hung = false;  // still running at the watchdog's limit, then killed
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

// Runs `mixtrain ARGS` in `cwd` (fork/exec, no shell, so a signal is seen as a signal). The
// watchdog only turns a hang into a failure instead of a stuck suite; it is not a timing check.
Outcome run_mixtrain(const std::vector<std::string>& args, const fs::path& cwd,
                     const std::string& plugin_path = {}) {
  constexpr auto kWatchdog = std::chrono::seconds(30);
  const fs::path out_file = cwd / "stdout.txt", err_file = cwd / "stderr.txt";
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "MIXTRAIN_PLUGIN_PATH=", 21) != 0) env_strings.emplace_back(*e);
  if (!plugin_path.empty()) env_strings.push_back("MIXTRAIN_PLUGIN_PATH=" + plugin_path);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = MIXTRAIN_EXE;
  std::vector<std::string> arg_strings = args;
  argv.push_back(exe.data());
  for (auto& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || ::chdir(cwd.c_str()) != 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  Outcome r;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + kWatchdog;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.hung = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!r.hung) {
    r.exited = WIFEXITED(status);
    r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
    r.signaled = WIFSIGNALED(status);
    r.signal = r.signaled ? WTERMSIG(status) : 0;
  }
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  return r;
}

bool has_error_line(const std::string& err) {
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("error:", 0) == 0) return true;
  return false;
}

template <class T>
std::vector<T> operator+(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- byte-level builders ----------------------------------------------------------------------

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  // A corpus entry whose edit no longer applies would test the undamaged input: fail loudly.
  if (at == std::string::npos) throw std::runtime_error("corpus edit: '" + from + "' not found");
  return text.replace(at, from.size(), to);
}

template <class T>
std::string le(T v) {
  std::string s(sizeof(T), '\0');
  for (std::size_t i = 0; i < sizeof(T); ++i)
    s[i] = static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF);
  return s;
}

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string gzip(const std::string& data) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("deflateInit2");
  std::string out(deflateBound(&zs, static_cast<uLong>(data.size())) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// A .npy file of the given header dict and data, padded as numpy.save() pads it.
std::string npy(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += '\0';
  s += major == 1 ? le<std::uint16_t>(static_cast<std::uint16_t>(header.size()))
                  : le<std::uint32_t>(static_cast<std::uint32_t>(header.size()));
  return s + header + data;
}

std::string npy_dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

constexpr int kRows = 40, kFeatures = 4;

std::string feature_bytes(int rows = kRows, int features = kFeatures) {
  std::string s;
  for (int i = 0; i < rows * features; ++i)
    s += le<std::uint32_t>(std::bit_cast<std::uint32_t>(static_cast<float>((i * 7) % 11) / 11.0f));
  return s;
}
std::string label_bytes(int rows = kRows) {
  std::string s;
  for (int i = 0; i < rows; ++i) s += le<std::int64_t>(i % 2);
  return s;
}
std::string good_features_npy() {
  return npy(npy_dict("<f4", "(" + std::to_string(kRows) + ", " + std::to_string(kFeatures) + ")"),
             feature_bytes());
}
std::string good_labels_npy() {
  return npy(npy_dict("<i8", "(" + std::to_string(kRows) + ",)"), label_bytes());
}

std::string idx(std::uint8_t type, std::uint8_t rank, const std::vector<std::uint32_t>& dims,
                const std::string& data) {
  std::string s = {'\0', '\0', static_cast<char>(type), static_cast<char>(rank)};
  for (auto d : dims) s += be32(d);
  return s + data;
}
std::string pixels(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37) % 256);
  return s;
}
std::string good_images_idx() {
  return idx(0x08, 3, {kRows, 2, 2}, pixels(kRows * 4));
}
std::string good_labels_idx() {
  std::string s;
  for (int i = 0; i < kRows; ++i) s += static_cast<char>(i % 2);
  return idx(0x08, 1, {kRows}, s);
}

// A native checkpoint taken apart: the header JSON and the data section.
struct NativeFile {
  json header;
  std::string data;
};

NativeFile read_native(const fs::path& p) {
  const std::string bytes = slurp(p);
  const auto pre = ckpt::decode_preamble(reinterpret_cast<const std::byte*>(bytes.data()));
  NativeFile f;
  f.header = json::parse(bytes.substr(ckpt::kPreambleSize, pre.header_length));
  f.data = bytes.substr(ckpt::data_section_offset(pre.header_length));
  return f;
}

// Lays a header text and data section out as the writer does, with the header's real CRC so an
// edit reaches the parser behind the CRC check.
std::string encode_native(const std::string& header_text, const std::string& data,
                          std::uint32_t version = ckpt::kFormatVersion, std::uint32_t flags = 0) {
  ckpt::Preamble pre;
  pre.format_version = version;
  pre.flags = flags;
  pre.header_length = header_text.size();
  pre.header_crc32 =
      static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(header_text.data()),
                                       static_cast<uInt>(header_text.size())));
  const auto p = ckpt::encode_preamble(pre);
  std::string s(reinterpret_cast<const char*>(p.data()), p.size());
  s += header_text;
  s.resize(ckpt::data_section_offset(header_text.size()), '\0');
  return s + data;
}

std::string encode_safetensors(const std::string& header_text, const std::string& data) {
  return le<std::uint64_t>(header_text.size()) + header_text + data;
}

// ---- the corpus -------------------------------------------------------------------------------

// What a correct executable does with the input.
enum class Expect {
  bad_input,       // exit 2, an `error:` line on stderr
  plugin_listed,   // `plugins`: exit 0, the library listed among those that failed to load
  plugin_ignored,  // any other command: exit 0, the bad library stops nothing
};

struct Invocation {
  Invocation() = default;
  explicit Invocation(std::vector<std::string> a) : args(std::move(a)) {}
  std::vector<std::string> args;
  std::string plugin_path;  // MIXTRAIN_PLUGIN_PATH for the run; empty: unset
  Expect expect = Expect::bad_input;
  std::string library;  // plugin_listed: the file name that must be listed
};

// The real artefacts the cases derive from, each made on first use (a ctest process runs one
// case, so most never pay for the training run).
class Base {
 public:
  explicit Base(fs::path dir) : dir_(std::move(dir)) {}
  static std::string config(const std::string& name) {
    return std::string(MIXTRAIN_CONFIGS_DIR) + "/" + name;
  }
  static std::string quickstart() { return config("quickstart.toml"); }
  const fs::path& dir() const { return dir_; }
  // The step-5 checkpoint of a quickstart run.
  const fs::path& checkpoint();
  // The step-5 checkpoint of a quickstart run with these --set lines (a dynamic scaler, SGD,
  // an FP8 policy: states with more to damage), one per distinct `sets`.
  const fs::path& checkpoint_with(const std::vector<std::string>& sets);
  // That checkpoint exported to safetensors.
  const fs::path& weights();
  // A real plugin library of this build.
  static fs::path plugin();

 private:
  fs::path dir_, checkpoint_, weights_;
  std::map<std::vector<std::string>, fs::path> variants_;
};

struct Case {
  std::string family, name;
  std::function<Invocation(Base&, const fs::path& dir)> make;
};

// Commands each family runs its input through.
// gtest names the case in a failure instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << "/" << c.name;
}

std::vector<std::string> check_with(const std::string& config, std::vector<std::string> sets = {}) {
  std::vector<std::string> a = {"check", config};
  for (auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}
std::vector<std::string> train_with(const std::string& config, const fs::path& dir,
                                    std::vector<std::string> sets = {}) {
  std::vector<std::string> a = {
      "train", config, "--run-dir", (dir / "run").string(), "--set", "backend.threads=1"};
  for (auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

const fs::path& Base::checkpoint() {
  if (checkpoint_.empty()) {
    const auto r = run_mixtrain(train_with(quickstart(), dir_, {"run.steps=5"}), dir_);
    if (r.exit_code != 0) throw std::runtime_error("the base run failed: " + r.err);
    checkpoint_ = dir_ / "run" / "checkpoints" / "step-00000005.mxt";
  }
  return checkpoint_;
}

const std::vector<std::string> kDynamicSets = {"scaler.type=dynamic", "optimizer.type=sgd",
                                               "optimizer.momentum=0.9"};
const std::vector<std::string> kFp8Sets = {"precision.policy=fp8-delayed"};

const fs::path& Base::checkpoint_with(const std::vector<std::string>& sets) {
  auto& path = variants_[sets];
  if (path.empty()) {
    auto all = sets;
    all.push_back("run.steps=5");
    const auto d = dir_ / ("variant" + std::to_string(variants_.size()));
    fs::create_directories(d);
    const auto r = run_mixtrain(train_with(quickstart(), d, all), d);
    if (r.exit_code != 0) throw std::runtime_error("a base run failed: " + r.err);
    path = d / "run" / "checkpoints" / "step-00000005.mxt";
  }
  return path;
}

const fs::path& Base::weights() {
  if (weights_.empty()) {
    const auto out = dir_ / "weights.safetensors";
    const auto r = run_mixtrain(
        {"export", checkpoint().string(), "--format", "safetensors", "--out", out.string()}, dir_);
    if (r.exit_code != 0) throw std::runtime_error("the base export failed: " + r.err);
    weights_ = out;
  }
  return weights_;
}

fs::path Base::plugin() {
  auto p = fs::path(MIXTRAIN_EXE).parent_path().parent_path() / "lib" / "mixtrain" / "plugins" /
           "libmixtrain_scalers.so";
  if (!fs::exists(p)) throw std::runtime_error("no plugin at " + p.string());
  return p;
}

std::vector<Case> config_cases() {
  std::vector<Case> cs;
  auto add_text = [&](std::string name, std::function<std::string()> text, bool train = false) {
    cs.push_back({"config", std::move(name), [text, train](Base&, const fs::path& dir) {
                    const auto cfg = dir / "bad.toml";
                    spit(cfg, text());
                    return Invocation{train ? train_with(cfg.string(), dir, {"run.steps=1"})
                                            : check_with(cfg.string())};
                  }});
  };
  auto qs = [] { return slurp(Base::quickstart()); };
  // An edit of the quickstart: `from` replaced by `to`.
  auto edit = [&](std::string name, std::string from, std::string to, bool train = false) {
    add_text(
        std::move(name), [qs, from, to] { return replace_once(qs(), from, to); }, train);
  };

  // Each shipped config, damaged three ways.
  for (const char* shipped : {"quickstart", "mlp-bf16", "mlp-fp16", "mlp-fp32", "mlp-fp8-current",
                              "mlp-fp8", "mlp-tf32", "underflow-demo"}) {
    std::string id = shipped;
    for (auto& c : id)
      if (c == '-') c = '_';
    const std::string file = Base::config(std::string(shipped) + ".toml");
    // Cut inside a table header: "[o" never closes.
    add_text("Truncated_" + id, [file] {
      const auto text = slurp(file);
      return text.substr(0, text.find('[', text.size() / 2) + 2);
    });
    add_text("UnknownRunKey_" + id,
             [file] { return replace_once(slurp(file), "[run]\n", "[run]\nstepz = 3\n"); });
    add_text("DuplicateRunTable_" + id, [file] { return slurp(file) + "\n[run]\nseed = 2\n"; });
  }

  add_text("EmptyFile", [] { return std::string(); });
  add_text("BinaryGarbage", [] { return pixels(4096); });
  add_text("NulByteInString", [qs] {
    return replace_once(qs(), "name = \"quickstart\"", std::string("name = \"quick\0start\"", 20));
  });
  add_text("InvalidUtf8InString", [qs] {
    return replace_once(qs(), "name = \"quickstart\"", "name = \"quick\xff\xfe\"");
  });
  add_text("DeeplyNestedArray", [qs] {
    return replace_once(
        qs(), "[run]\n",
        "[run]\nnest = " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  });
  add_text("MegabyteKey", [qs] {
    return replace_once(qs(), "[run]\n", "[run]\n" + std::string(1 << 20, 'k') + " = 1\n");
  });
  add_text("UnknownSection", [qs] { return qs() + "\n[bogus]\nx = 1\n"; });
  edit("StepsIsAString", "steps = 300", "steps = \"ten\"");
  edit("StepsIsAFloat", "steps = 300", "steps = 1.5");
  edit("StepsNegative", "steps = 300", "steps = -1");
  edit("StepsBeyondInt64", "steps = 300", "steps = 99999999999999999999");
  edit("StepsIsADate", "steps = 300", "steps = 1979-05-27");
  edit("DuplicateKey", "steps = 300", "steps = 300\nsteps = 301");
  // The whole layer array replaced.
  auto layers = [qs](const std::string& value) {
    return [qs, value] {
      auto text = qs();
      const auto begin = text.find("layers = [");
      const auto end = text.find("\n]\n", begin);
      if (begin == std::string::npos || end == std::string::npos)
        throw std::runtime_error("corpus edit: no layer array in the quickstart");
      return text.replace(begin, end + 2 - begin, "layers = " + value);
    };
  };
  add_text("LayersEmpty", layers("[]"));  // issue 10 item 6 (helper B): misleading message
  add_text("LayersIsAString", layers("\"fc1\""));
  add_text("LayersOfIntegers", layers("[1, 2, 3]"));
  edit("LayerWithoutType", "{ type = \"relu\" },", "{ name = \"r\" },");
  edit("UnknownLayerType", "{ type = \"relu\" },", "{ type = \"conv\" },");
  edit("DropoutPOne", "{ type = \"relu\" },", "{ type = \"dropout\", p = 1.0 },");
  edit("DropoutPNegative", "{ type = \"relu\" },", "{ type = \"dropout\", p = -0.5 },");
  edit("DropoutPIsAString", "{ type = \"relu\" },", "{ type = \"dropout\", p = \"half\" },");
  edit("LayerOutZero", "out = 128 }", "out = 0 }");
  edit("LayerOutInt64Max", "out = 128 }", "out = " + kInt64Max + " }", /*train=*/true);
  edit("HeadOutInt64Max", "out = 10 }", "out = " + kInt64Max + " }", /*train=*/true);
  edit("DuplicateLayerName", "name = \"fc2\"", "name = \"fc1\"");
  edit("EvalBatchSizeInt64Max", "batch_size = 128",
       "batch_size = 128\neval_batch_size = " + kInt64Max,
       /*train=*/true);
  edit("BatchSizeZero", "batch_size = 128", "batch_size = 0");
  edit("DataClassesInt64Max", "batch_size = 128", "batch_size = 128\nclasses = " + kInt64Max,
       /*train=*/true);  // issue 10 item 6 (helper B): narrowed to int32 silently
  edit("NumClassesInt64Max", "num_classes = 10", "num_classes = " + kInt64Max, /*train=*/true);
  edit("RowsInt64Max", "rows = 8192", "rows = " + kInt64Max, /*train=*/true);
  edit("FeaturesInt64Max", "features = 32", "features = " + kInt64Max, /*train=*/true);
  edit("EvalFractionAboveOne", "eval_fraction = 0.1", "eval_fraction = 1.5");
  edit("EvalFractionNan", "eval_fraction = 0.1", "eval_fraction = nan");
  edit("NoiseInf", "noise = 1.0", "noise = inf");
  edit("LrInf", "lr = 0.003", "lr = inf");  // issue 10 item 6 (helper B)
  edit("LrNan", "lr = 0.003", "lr = nan");
  edit("Lr1e308", "lr = 0.003", "lr = 1e308");  // issue 10 item 6 (helper B)
  edit("LrNegative", "lr = 0.003", "lr = -0.1");
  edit("StaticScaleInf", "type = \"none\"", "type = \"static\"\nscale = inf");
  edit("UnknownPolicy", "policy = \"fp32\"", "policy = \"fp7\"");
  edit("UnknownCheckpointFormat", "format = \"native\"", "format = \"pickle\"");
  edit("PluginPathsWrongType", "[backend]", "[plugins]\npaths = 5\n\n[backend]");
  edit("MixedTypeArray", "warmup_steps = 20", "warmup_steps = [1, \"two\"]");
  cs.push_back({"config", "DirectoryAsConfig", [](Base&, const fs::path& dir) {
                  fs::create_directories(dir / "cfgdir");
                  return Invocation{check_with((dir / "cfgdir").string())};
                }});
  cs.push_back({"config", "MissingConfigFile", [](Base&, const fs::path& dir) {
                  return Invocation{check_with((dir / "nowhere.toml").string())};
                }});
  return cs;
}

std::vector<Case> set_cases() {
  std::vector<Case> cs;
  auto add = [&](std::string name, std::vector<std::string> sets, bool train = false) {
    cs.push_back({"set", std::move(name), [sets, train](Base&, const fs::path& dir) {
                    auto s = sets;
                    if (train) s.push_back("run.steps=1");
                    return Invocation{train ? train_with(Base::quickstart(), dir, s)
                                            : check_with(Base::quickstart(), s)};
                  }});
  };
  // issue 10 item 4 (helper B): std::stoul out_of_range, exit 1 "error: stoul".
  add("HugeLayerIndex", {"model.layers.99999999999999999999.out=5"});
  add("LayerIndexPastTheEnd", {"model.layers.5.out=5"});
  add("NegativeLayerIndex", {"model.layers.-1.out=5"});
  add("LayerIndexNotANumber", {"model.layers.x.out=5"});
  add("NoEquals", {"run.steps"});
  add("EmptyKey", {"=5"});
  add("EmptyValue", {"run.steps="});
  add("EmptyPathSegment", {"run..steps=1"});
  add("PathThroughAValue", {"run.steps.x=1"});
  add("TableReplacedByValue", {"run=1"});
  add("StepsNotANumber", {"run.steps=abc"});
  add("StepsNegative", {"run.steps=-1"});
  add("StepsBeyondInt64", {"run.steps=99999999999999999999999"});
  add("NotAChoice", {"run.on_nonfinite=maybe"});
  add("BadInlineTable", {"model.layers=[{type=\"linear\",out=}]"});
  add("LrInf", {"optimizer.lr=inf"});      // issue 10 item 6 (helper B)
  add("Lr1e308", {"optimizer.lr=1e308"});  // issue 10 item 6 (helper B)
  add("LrNan", {"optimizer.lr=nan"});
  add("StaticScaleInf", {"scaler.type=static", "scaler.scale=inf"});
  add("DataClassesInt64Max", {"data.classes=" + kInt64Max}, true);  // issue 10 item 6 (helper B)
  add("EvalBatchSizeInt64Max", {"data.eval_batch_size=" + kInt64Max}, true);  // item 5 (B)
  add("LayerOutInt64Max", {"model.layers.0.out=" + kInt64Max}, true);         // item 5 (B)
  add("BatchSizeZero", {"data.batch_size=0"});
  add("UnknownOptimizer", {"optimizer.type=adamx"});
  add("UnknownDataSource", {"data.source=csv"});
  add("UnknownKey", {"optimizer.weight_decy=0.1"});
  return cs;
}

// A config of a tiny model over npy or IDX files.
std::string file_data_config(const std::string& source, const fs::path& a, const fs::path& b) {
  const bool npy = source == "npy";
  return "[run]\nname = \"corpus\"\nsteps = 1\n[backend]\ntype = \"cpu\"\n[model]\n"
         "layers = [ { type = \"linear\", out = 2 } ]\n[data]\nsource = \"" +
         source + "\"\nbatch_size = 8\n[data." + source + "]\n" + (npy ? "features" : "images") +
         " = \"" + a.string() + "\"\nlabels = \"" + b.string() + "\"\n";
}

std::vector<Case> npy_cases() {
  std::vector<Case> cs;
  // `bad` replaces the features (or, with labels = true, the labels) file.
  auto add = [&](std::string name, std::function<std::string()> bad, bool labels = false) {
    cs.push_back({"npy", std::move(name), [bad, labels](Base&, const fs::path& dir) {
                    const auto x = dir / "x.npy", y = dir / "y.npy";
                    spit(x, labels ? good_features_npy() : bad());
                    spit(y, labels ? bad() : good_labels_npy());
                    const auto cfg = dir / "npy.toml";
                    spit(cfg, file_data_config("npy", x, y));
                    return Invocation{train_with(cfg.string(), dir)};
                  }});
  };
  const std::string shape = "(" + std::to_string(kRows) + ", " + std::to_string(kFeatures) + ")";
  auto good = [] { return good_features_npy(); };
  add("Empty", [] { return std::string(); });
  add("NineBytes", [good] { return good().substr(0, 9); });
  add("BadMagic", [good] { return "XNUMPY" + good().substr(6); });
  add("NpzArchive", [] { return std::string("PK\x03\x04") + pixels(200); });
  add("TextFile", [] { return std::string("0.1,0.2,0.3\n0.4,0.5,0.6\n"); });
  add("Version9", [good] {
    auto s = good();
    s[6] = 9;
    return s;
  });
  add("HeaderLengthPastEnd",
      [good] { return good().substr(0, 8) + le<std::uint16_t>(60000) + "{"; });
  add("HeaderCutShort", [good] { return good().substr(0, 40); });
  add("HeaderNotADict", [] { return npy("['<f4', False, (40, 4)]", feature_bytes()); });
  add("HeaderUnterminatedString",
      [] { return npy("{'descr: '<f4', 'fortran_order': False}", ""); });
  add("HeaderMissingShape",
      [] { return npy("{'descr': '<f4', 'fortran_order': False, }", feature_bytes()); });
  add("HeaderUnknownKey", [shape] {
    return npy("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", 'x': 1, }",
               feature_bytes());
  });
  add("HeaderDuplicateKey", [shape] {
    return npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }",
               feature_bytes());
  });
  add("DescrFloat16",
      [shape] { return npy(npy_dict("<f2", shape), feature_bytes().substr(0, 320)); });
  add("DescrBigEndian", [shape] { return npy(npy_dict(">f4", shape), feature_bytes()); });
  add("DescrObject", [shape] { return npy(npy_dict("|O", shape), feature_bytes()); });
  add("DescrStructured", [shape] {
    return npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': " + shape + ", }",
               feature_bytes());
  });
  add("DescrHugeItemSize", [shape] { return npy(npy_dict("<f99", shape), feature_bytes()); });
  add("ShapeOverflows64Bits",
      [] { return npy(npy_dict("<f4", "(4294967296, 4294967296, 16)"), feature_bytes()); });
  add("ShapeEntryTooLarge",
      [] { return npy(npy_dict("<f4", "(99999999999999999999999, 4)"), ""); });
  add("ShapeNegative", [] { return npy(npy_dict("<f4", "(-40, 4)"), feature_bytes()); });
  add("ZeroRows", [] { return npy(npy_dict("<f4", "(0, 4)"), ""); });
  add("ZeroFeatures", [] { return npy(npy_dict("<f4", "(40, 0)"), ""); });
  add("RankOne", [] { return npy(npy_dict("<f4", "(160,)"), feature_bytes()); });
  add("DataTruncated",
      [shape] { return npy(npy_dict("<f4", shape), feature_bytes().substr(0, 300)); });
  add("DataExtraBytes", [shape] { return npy(npy_dict("<f4", shape), feature_bytes() + "xxxx"); });
  add("NanFeature", [shape] {
    auto d = feature_bytes();
    d.replace(20, 4, le<std::uint32_t>(0x7fc00000u));
    return npy(npy_dict("<f4", shape), d);
  });
  add("InfFeature", [shape] {
    auto d = feature_bytes();
    d.replace(20, 4, le<std::uint32_t>(0x7f800000u));
    return npy(npy_dict("<f4", shape), d);
  });
  add("Float64BeyondFloat32", [shape] {
    std::string d;
    for (int i = 0; i < kRows * kFeatures; ++i)
      d += le<std::uint64_t>(std::bit_cast<std::uint64_t>(1e300));
    return npy(npy_dict("<f8", shape), d);
  });
  add(
      "LabelsFloat", [] { return npy(npy_dict("<f4", "(40,)"), feature_bytes().substr(0, 160)); },
      true);
  add(
      "LabelsNegative",
      [] {
        auto d = label_bytes();
        d.replace(8, 8, le<std::int64_t>(-3));
        return npy(npy_dict("<i8", "(40,)"), d);
      },
      true);
  add(
      "LabelsHuge",
      [] {
        auto d = label_bytes();
        d.replace(8, 8, le<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()));
        return npy(npy_dict("<u8", "(40,)"), d);
      },
      true);
  add(
      "LabelsTwoColumns", [] { return npy(npy_dict("<i8", "(20, 2)"), label_bytes()); }, true);
  add(
      "LabelsRowCountMismatch", [] { return npy(npy_dict("<i8", "(39,)"), label_bytes(39)); },
      true);
  return cs;
}

std::vector<Case> idx_cases() {
  std::vector<Case> cs;
  auto add = [&](std::string name, std::function<std::string()> bad, bool labels = false,
                 bool gz = false) {
    cs.push_back({"idx", std::move(name), [bad, labels, gz](Base&, const fs::path& dir) {
                    const auto x = dir / (gz ? "images.idx.gz" : "images.idx");
                    const auto y = dir / "labels.idx";
                    spit(x, labels ? good_images_idx() : bad());
                    spit(y, labels ? bad() : good_labels_idx());
                    const auto cfg = dir / "idx.toml";
                    spit(cfg, file_data_config("idx", x, y));
                    return Invocation{train_with(cfg.string(), dir)};
                  }});
  };
  auto good = [] { return good_images_idx(); };
  add("Empty", [] { return std::string(); });
  add("ThreeBytes", [] { return std::string("\0\0\x08", 3); });
  add("BadMagic", [good] { return "\x01\x02" + good().substr(2); });
  add("FloatElementType", [] { return idx(0x0D, 3, {kRows, 2, 2}, pixels(kRows * 16)); });
  add("ImagesRankOne", [] { return idx(0x08, 1, {kRows}, pixels(kRows)); });
  add("ImagesRankNine", [] {
    return idx(0x08, 9, {kRows, 1, 1, 1, 1, 1, 1, 1, 1}, pixels(kRows));
  });
  add("DimsCutShort", [good] { return good().substr(0, 10); });
  add("DataTruncated", [good] { return good().substr(0, good().size() - 7); });
  add("DataExtraBytes", [good] { return good() + "xyz"; });
  add("ZeroRows", [] { return idx(0x08, 3, {0, 2, 2}, ""); });
  add("ZeroWidth", [] { return idx(0x08, 3, {kRows, 0, 2}, ""); });
  add("ShapeOverflows64Bits", [] {
    return idx(0x08, 4, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 2}, pixels(64));
  });
  add("ShapeLargerThanFile", [] { return idx(0x08, 3, {60000, 28, 28}, pixels(1000)); });
  add(
      "LabelsRankThree", [good] { return good(); }, true);  // images given as labels
  add(
      "LabelsRowCountMismatch", [] { return idx(0x08, 1, {kRows - 1}, pixels(kRows - 1)); }, true);
  add(
      "GzipTruncated",
      [good] {
        const auto z = gzip(good());
        return z.substr(0, z.size() / 2);
      },
      false, true);
  add(
      "GzipCorruptDeflate",
      [good] {
        auto z = gzip(good());
        for (std::size_t i = 12; i < z.size() - 8; i += 3) z[i] = static_cast<char>(z[i] ^ 0x55);
        return z;
      },
      false, true);
  add(
      "GzipBadCrc",
      [good] {
        auto z = gzip(good());
        z[z.size() - 6] = static_cast<char>(z[z.size() - 6] ^ 0xFF);
        return z;
      },
      false, true);
  add(
      "GzipHeaderOnly", [] { return std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10); },
      false, true);
  add(
      "GzipOfBadMagic", [good] { return gzip("\x01\x02" + good().substr(2)); }, false, true);
  add(
      "GzipOfTruncatedData", [good] { return gzip(good().substr(0, good().size() - 9)); }, false,
      true);
  add(
      "GzipClaimsHugeShape",
      [] {
        return gzip(idx(0x08, 3, {1u << 30, 1000, 1000}, pixels(4096)));
      },
      false, true);
  add(
      "GzipTrailingData", [good] { return gzip(good() + "extra"); }, false, true);
  return cs;
}

// ---- native checkpoints ----

enum class CkptCommand { resume, eval, export_ };

std::vector<std::string> checkpoint_command(CkptCommand c, const fs::path& file,
                                            const fs::path& dir) {
  switch (c) {
    case CkptCommand::resume:
      return train_with(Base::quickstart(), dir, {"run.steps=7"}) +
             std::vector<std::string>{"--resume", file.string()};
    case CkptCommand::eval:
      return {"eval",         Base::quickstart(), "--set", "backend.threads=1",
              "--checkpoint", file.string()};
    case CkptCommand::export_:
      return {"export",      file.string(), "--format",
              "safetensors", "--out",       (dir / "out.safetensors").string()};
  }
  return {};
}

std::vector<Case> native_cases() {
  std::vector<Case> cs;
  // `make` turns the base checkpoint's bytes into the damaged file's bytes.
  auto add_bytes = [&](std::string name, std::function<std::string(const std::string&)> make,
                       CkptCommand c = CkptCommand::resume) {
    cs.push_back({"native", std::move(name), [make, c](Base& base, const fs::path& dir) {
                    const auto file = dir / "bad.mxt";
                    spit(file, make(slurp(base.checkpoint())));
                    return Invocation{checkpoint_command(c, file, dir)};
                  }});
  };
  // `edit` changes the header JSON; the file is re-encoded with a valid CRC.
  auto add_edit = [&](std::string name, std::function<void(json&)> edit,
                      CkptCommand c = CkptCommand::resume) {
    add_bytes(
        std::move(name), [edit](const std::string&) -> std::string { return {}; }, c);
    cs.back().make = [edit, c](Base& base, const fs::path& dir) {
      auto f = read_native(base.checkpoint());
      edit(f.header);
      const auto file = dir / "bad.mxt";
      spit(file, encode_native(f.header.dump(), f.data));
      return Invocation{checkpoint_command(c, file, dir)};
    };
  };
  // `edit` changes one JSON-encoded metadata value (progress, sampler, scaler, optimizer...).
  auto add_meta = [&](std::string name, std::string key, std::function<void(json&)> edit,
                      CkptCommand c = CkptCommand::resume) {
    add_edit(
        std::move(name),
        [key, edit](json& h) {
          auto value = json::parse(h["metadata"][key].get<std::string>());
          edit(value);
          h["metadata"][key] = value.dump();
        },
        c);
  };
  auto header_text = [](const std::string& text) {
    return [text](const std::string& bytes) {
      const auto pre = ckpt::decode_preamble(reinterpret_cast<const std::byte*>(bytes.data()));
      return encode_native(text, bytes.substr(ckpt::data_section_offset(pre.header_length)));
    };
  };

  add_bytes("Empty", [](const std::string&) { return std::string(); });
  add_bytes("TruncatedInPreamble", [](const std::string& b) { return b.substr(0, 20); });
  add_bytes("TruncatedInHeader", [](const std::string& b) { return b.substr(0, 200); });
  add_bytes("TruncatedInData", [](const std::string& b) { return b.substr(0, b.size() / 2); });
  add_bytes(
      "TruncatedByOneByte", [](const std::string& b) { return b.substr(0, b.size() - 1); },
      CkptCommand::eval);
  add_bytes(
      "TruncatedForExport", [](const std::string& b) { return b.substr(0, b.size() - 100); },
      CkptCommand::export_);
  add_bytes("BadMagic", [](const std::string& b) { return "MIXTRAIM" + b.substr(8); });
  add_bytes("FormatVersion2", [](const std::string& b) {
    return b.substr(0, 8) + le<std::uint32_t>(2) + b.substr(12);
  });
  add_bytes("UnknownFlag", [](const std::string& b) {
    return b.substr(0, 12) + le<std::uint32_t>(1) + b.substr(16);
  });
  add_bytes("HeaderLengthMax", [](const std::string& b) {
    return b.substr(0, 16) + le<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()) +
           b.substr(24);
  });
  add_bytes("HeaderLengthPastEnd", [](const std::string& b) {
    return b.substr(0, 16) + le<std::uint64_t>(b.size()) + b.substr(24);
  });
  add_bytes("HeaderCrcMismatch", [](const std::string& b) {
    auto s = b;
    s[40] = static_cast<char>(s[40] ^ 1);
    return s;
  });
  // A byte of the first tensor's data (a weight, which eval reads); a byte near the end (the
  // optimizer's last slot, which only a resume reads: eval leaves the slots on disk).
  add_bytes(
      "TensorDataFlipped",
      [](const std::string& b) {
        auto s = b;
        const auto pre = ckpt::decode_preamble(reinterpret_cast<const std::byte*>(b.data()));
        const auto header = json::parse(b.substr(ckpt::kPreambleSize, pre.header_length));
        const auto at = ckpt::data_section_offset(pre.header_length) +
                        header["tensors"][0]["offset"].get<std::size_t>() + 1;
        s[at] = static_cast<char>(s[at] ^ 0x5a);
        return s;
      },
      CkptCommand::eval);
  add_bytes("OptimizerDataFlipped", [](const std::string& b) {
    auto s = b;
    s[s.size() - 10] = static_cast<char>(s[s.size() - 10] ^ 0x5a);
    return s;
  });
  add_bytes("HeaderNotJson", header_text("{\"metadata\": {,}"));
  add_bytes("HeaderIsAnArray", header_text("[1, 2, 3]"));
  add_bytes(
      "HeaderInvalidUtf8",
      header_text("{\"metadata\": {\"a\": \"\xff\xfe\"}, \"tensors\": [], \"data_length\": 0}"));
  add_bytes("HeaderNestedDeeply", header_text("{\"metadata\": " + std::string(100000, '[') +
                                              std::string(100000, ']') + "}"));
  add_edit("NoMetadata", [](json& h) { h.erase("metadata"); });
  add_edit("NoTensors", [](json& h) { h.erase("tensors"); });
  add_edit("TensorsIsAnObject", [](json& h) { h["tensors"] = json::object(); });
  add_edit("DataLengthWrong",
           [](json& h) { h["data_length"] = h["data_length"].get<std::uint64_t>() + 64; });
  add_edit("DataLengthNegative", [](json& h) { h["data_length"] = -1; });
  add_edit("TensorOffsetPastData",
           [](json& h) { h["tensors"][0]["offset"] = std::uint64_t{1} << 40; });
  add_edit("TensorOffsetNegative", [](json& h) { h["tensors"][0]["offset"] = -64; });
  add_edit("TensorOffsetMisaligned", [](json& h) { h["tensors"][1]["offset"] = 16385; });
  add_edit("TensorLengthMismatchesShape", [](json& h) { h["tensors"][0]["shape"] = {128, 33}; });
  add_edit("TensorShapeOverflows", [](json& h) {
    h["tensors"][0]["shape"] = {std::uint64_t{1} << 32, std::uint64_t{1} << 32, 16};
  });
  add_edit("TensorUnknownDtype", [](json& h) { h["tensors"][0]["dtype"] = "fp64x"; });
  add_edit("TensorNameMissing", [](json& h) { h["tensors"][0].erase("name"); });
  add_edit("TensorDuplicateName",
           [](json& h) { h["tensors"][1]["name"] = h["tensors"][0]["name"]; });
  add_edit(
      "TensorCrcWrong", [](json& h) { h["tensors"][0]["crc32"] = 12345; }, CkptCommand::eval);
  add_edit(
      "ParamMissing", [](json& h) { h["tensors"].erase(0); }, CkptCommand::eval);
  add_edit("ProgressNotJson", [](json& h) { h["metadata"]["progress"] = "{step: 5"; });
  add_edit("SamplerMissing", [](json& h) { h["metadata"].erase("sampler"); });
  add_edit("OptimizerNotJson", [](json& h) { h["metadata"]["optimizer"] = "[]"; });
  // issue 10 item 3 (helper C): resumed "at step -1000000000000" and trained forever.
  add_meta("ProgressStepMinus1e12", "progress", [](json& p) { p["step"] = -1000000000000LL; });
  // issue 10 item 3 (helper C): 2^64-1 wrapped to -1, exit 0.
  add_meta("ProgressStepUint64Max", "progress",
           [](json& p) { p["step"] = std::numeric_limits<std::uint64_t>::max(); });
  add_meta("ProgressStepInt64Max", "progress",  // issue 10 items 3 and 5 (helper C)
           [](json& p) { p["step"] = std::numeric_limits<std::int64_t>::max(); });
  add_meta("ProgressStepIsAString", "progress", [](json& p) { p["step"] = "5"; });
  add_meta("ProgressStepFraction", "progress", [](json& p) { p["step"] = 5.5; });
  add_meta("ProgressAppliedStepsInt64Max", "progress",  // issue 10 item 5 (helper C)
           [](json& p) { p["applied_steps"] = std::numeric_limits<std::int64_t>::max(); });
  add_meta("ProgressSkippedStepsNegative", "progress", [](json& p) { p["skipped_steps"] = -1; });
  add_meta("ProgressLastLoss1e300", "progress",  // issue 10 item 6 (helper C): overflows float
           [](json& p) { p["last_loss"] = 1e300; });
  add_meta("SamplerEpochInt64Max", "sampler",  // issue 10 item 5 (helper C): ++epoch_ overflows
           [](json& s) { s["epoch"] = std::numeric_limits<std::int64_t>::max(); });
  add_meta("SamplerEpochNegative", "sampler", [](json& s) { s["epoch"] = -1; });
  add_meta("SamplerPositionPastRows", "sampler", [](json& s) { s["position"] = 1000000; });
  add_meta("SamplerRowsMismatch", "sampler", [](json& s) { s["rows"] = 12; });
  // issue 10 items 3 and 5 (helper C): a scaler step count far beyond progress.step.
  add_meta("ScalerStepsInt64Max", "scaler",
           [](json& s) { s["values"]["steps"]["int"] = std::numeric_limits<std::int64_t>::max(); });
  add_meta("ScalerOtherComponent", "scaler", [](json& s) { s["component"] = "dynamic"; });
  add_meta("OptimizerStepInt64Max", "optimizer",  // issue 10 item 5 (helper C): AdamW step
           [](json& s) { s["values"]["step"]["int"] = std::numeric_limits<std::int64_t>::max(); });
  add_meta("OptimizerStepNegative", "optimizer", [](json& s) { s["values"]["step"]["int"] = -5; });
  add_meta("OptimizerOtherComponent", "optimizer", [](json& s) { s["component"] = "sgd"; });
  add_meta("OptimizerStateVersion99", "optimizer", [](json& s) { s["version"] = 99; });
  // issue 10 item 6 (helper C): accepted.
  add_edit("StateVersion2", [](json& h) { h["metadata"]["mixtrain.state_version"] = "2"; });
  add_edit("StateVersionNotANumber",
           [](json& h) { h["metadata"]["mixtrain.state_version"] = "one"; });
  return cs;
}

// Edits of the dynamic-scaler + SGD checkpoint, resumed with the same config.
std::vector<Case> component_state_cases() {
  std::vector<Case> cs;
  std::vector<std::string> variant = kDynamicSets;
  std::string prefix = "Dynamic";
  auto add = [&](std::string name, std::function<void(json&)> edit) {
    cs.push_back({"native", prefix + name, [edit, variant](Base& base, const fs::path& dir) {
                    auto f = read_native(base.checkpoint_with(variant));
                    edit(f.header);
                    const auto file = dir / "bad.mxt";
                    spit(file, encode_native(f.header.dump(), f.data));
                    auto sets = variant;
                    sets.push_back("run.steps=7");
                    return Invocation{train_with(Base::quickstart(), dir, sets) +
                                      std::vector<std::string>{"--resume", file.string()}};
                  }});
  };
  // `edit` changes one entry of a component's JSON state ("scaler" or "optimizer").
  auto add_value = [&](std::string name, std::string key, std::string entry, json value) {
    add(std::move(name), [key, entry, value](json& h) {
      auto state = json::parse(h["metadata"][key].get<std::string>());
      if (value.is_null())
        state["values"].erase(entry);
      else
        state["values"][entry] = value;
      h["metadata"][key] = state.dump();
    });
  };
  const auto big = std::numeric_limits<std::int64_t>::max();
  add_value("ScaleZero", "scaler", "scale", {{"double", 0.0}});
  add_value("ScaleNegative", "scaler", "scale", {{"double", -1.0}});
  add_value("ScaleBeyondFloat", "scaler", "scale", {{"double", 1e300}});
  add_value("ScaleIsAString", "scaler", "scale", {{"string", "65536"}});
  add_value("ScaleMissing", "scaler", "scale", json());
  add_value("GrowthTrackerNegative", "scaler", "growth_tracker", {{"int", -1}});
  // issue 10 item 3 (helper C): out of range, the tracker only counts up to growth_interval.
  add_value("GrowthTrackerInt64Max", "scaler", "growth_tracker", {{"int", big}});
  add_value("HysteresisNegative", "scaler", "hysteresis_left", {{"int", -1}});
  // issue 10 item 3 (helper C): out of range, hysteresis_left is at most the hysteresis.
  add_value("HysteresisInt64Max", "scaler", "hysteresis_left", {{"int", big}});
  // issue 10 items 3 and 5 (helper C): a step count far beyond progress.step.
  add_value("StepsInt64Max", "scaler", "steps", {{"int", big}});
  add_value("SkippedStepsInt64Max", "scaler", "skipped_steps", {{"int", big}});
  add_value("SgdStepInt64Max", "optimizer", "step", {{"int", big}});
  add_value("SgdStepNegative", "optimizer", "step", {{"int", -1}});
  add("MomentumBufferMissing", [](json& h) {
    auto& t = h["tensors"];
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i]["name"] == "optimizer/fc1.weight.momentum_buffer") {
        t.erase(i);
        return;
      }
    throw std::runtime_error("corpus edit: no momentum buffer in the checkpoint");
  });
  add("MomentumBufferWrongShape", [](json& h) {
    for (auto& t : h["tensors"])
      if (t["name"] == "optimizer/fc1.weight.momentum_buffer") {
        t["shape"] = {32, 128};
        return;
      }
    throw std::runtime_error("corpus edit: no momentum buffer in the checkpoint");
  });

  // fp8-delayed's per-slot scales and amax histories.
  variant = kFp8Sets;
  prefix = "Fp8";
  add_value("ScaleZero", "policy", "slot.0.scale", {{"double", 0.0}});
  add_value("ScaleNegative", "policy", "slot.0.scale", {{"double", -2.0}});
  add_value("ScaleBeyondFloat", "policy", "slot.1.scale", {{"double", 1e300}});
  add_value("ScaleMissing", "policy", "slot.1.scale", json());
  add_value("HistoryShort", "policy", "slot.0.amax_history", {{"floats", {1.0, 2.0}}});
  add_value("HistoryNegativeAmax", "policy", "slot.2.amax_history",
            {{"floats", std::vector<double>(1024, -1.0)}});
  add_value("HistoryIsAnInt", "policy", "slot.2.amax_history", {{"int", 3}});
  add_value("PositionNegative", "policy", "slot.0.position", {{"int", -1}});
  add_value("PositionPastHistory", "policy", "slot.0.position", {{"int", 1024}});
  add_value("PositionInt64Max", "policy", "slot.0.position", {{"int", big}});
  add_value("HistoryLengthDiffers", "policy", "amax_history_len", {{"int", 16}});
  add_value("IntervalZero", "policy", "interval", {{"int", 0}});
  // issue 10 items 3 and 5: an applied-step count far beyond progress.step.
  add_value("AppliedStepsInt64Max", "policy", "applied_steps", {{"int", big}});
  // A policy state written by another policy, resumed with a config that names this one (here a
  // --merge file): refused naming both. Only a --set precision.policy switches deliberately
  // (test_block_scaled_policies), so this case names the policy through a file, not kFp8Sets.
  cs.push_back({"native", "Fp8PolicyOtherComponent", [](Base& base, const fs::path& dir) {
                  auto f = read_native(base.checkpoint_with(kFp8Sets));
                  auto state = json::parse(f.header["metadata"]["policy"].get<std::string>());
                  state["component"] = "fp8-current";
                  f.header["metadata"]["policy"] = state.dump();
                  const auto file = dir / "bad.mxt";
                  spit(file, encode_native(f.header.dump(), f.data));
                  const auto policy = dir / "policy.toml";
                  spit(policy, "[precision]\npolicy = \"fp8-delayed\"\n");
                  return Invocation{train_with(Base::quickstart(), dir, {"run.steps=7"}) +
                                    std::vector<std::string>{"--merge", policy.string(), "--resume",
                                                             file.string()}};
                }});
  return cs;
}

std::vector<Case> safetensors_cases() {
  std::vector<Case> cs;
  // `make` turns the exported file's bytes into the damaged file's bytes.
  auto add_bytes = [&](std::string name, std::function<std::string(const std::string&)> make,
                       bool init_from = false) {
    cs.push_back(
        {"safetensors", std::move(name), [make, init_from](Base& base, const fs::path& dir) {
           const auto file = dir / "bad.safetensors";
           spit(file, make(slurp(base.weights())));
           if (init_from)
             return Invocation{
                 train_with(Base::quickstart(), dir,
                            {"run.steps=1", "checkpoint.init_from=" + file.string()})};
           return Invocation{{"eval", Base::quickstart(), "--set", "backend.threads=1",
                              "--checkpoint", file.string()}};
         }});
  };
  auto split = [](const std::string& b) {
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
      n |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    return std::pair{json::parse(b.substr(8, n)), b.substr(8 + n)};
  };
  auto add_edit = [&](std::string name, std::function<void(json&, std::string&)> edit,
                      bool init_from = false) {
    add_bytes(
        std::move(name),
        [split, edit](const std::string& b) {
          auto [h, data] = split(b);
          edit(h, data);
          return encode_safetensors(h.dump(), data);
        },
        init_from);
  };
  auto header_text = [split](const std::string& text) {
    return
        [split, text](const std::string& b) { return encode_safetensors(text, split(b).second); };
  };
  add_bytes("Empty", [](const std::string&) { return std::string(); });
  add_bytes("SevenBytes", [](const std::string& b) { return b.substr(0, 7); });
  add_bytes("HeaderLengthMax", [](const std::string& b) {
    return le<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()) + b.substr(8);
  });
  add_bytes("HeaderLengthPastEnd",
            [](const std::string& b) { return le<std::uint64_t>(b.size()) + b.substr(8); });
  add_bytes("HeaderLengthZero",
            [](const std::string& b) { return le<std::uint64_t>(0) + b.substr(8); });
  add_bytes("TruncatedData", [](const std::string& b) { return b.substr(0, b.size() - 100); });
  add_bytes(
      "TruncatedForInit", [](const std::string& b) { return b.substr(0, b.size() / 2); }, true);
  add_bytes("HeaderNotJson", header_text("{\"fc1.weight\": {"));
  add_bytes("HeaderIsAnArray", header_text("[]"));
  add_bytes("HeaderInvalidUtf8", header_text("{\"\xff\xfe\": {}}"));
  add_bytes("HeaderNestedDeeply",
            header_text("{\"a\": " + std::string(50000, '[') + std::string(50000, ']') + "}"));
  add_edit("UnknownDtype", [](json& h, std::string&) { h["fc1.weight"]["dtype"] = "F99"; });
  add_edit("DtypeNotAString", [](json& h, std::string&) { h["fc1.weight"]["dtype"] = 7; });
  add_edit("ShapeMismatchesOffsets", [](json& h, std::string&) {
    h["fc1.weight"]["shape"] = {128, 31};
  });
  add_edit("ShapeNegative", [](json& h, std::string&) { h["fc1.bias"]["shape"] = {-128}; });
  add_edit("ShapeOverflows", [](json& h, std::string&) {
    h["fc1.weight"]["shape"] = {std::uint64_t{1} << 32, std::uint64_t{1} << 32, 4};
  });
  add_edit("OffsetsReversed", [](json& h, std::string&) {
    h["fc1.bias"]["data_offsets"] = {16896, 16384};
  });
  add_edit("OffsetsPastData", [](json& h, std::string&) {
    h["head.bias"]["data_offsets"] = {88064, 88064 + (std::uint64_t{1} << 40)};
  });
  add_edit("OffsetsOverlap", [](json& h, std::string&) {
    h["fc1.bias"]["data_offsets"] = {16000, 16512};
  });
  add_edit("OffsetsMissing", [](json& h, std::string&) { h["fc1.bias"].erase("data_offsets"); });
  add_edit("OffsetsHaveThreeEntries", [](json& h, std::string&) {
    h["fc1.bias"]["data_offsets"] = {16384, 16896, 1};
  });
  add_edit("TensorIsAString", [](json& h, std::string&) { h["fc1.bias"] = "x"; });
  add_edit("MetadataNotAnObject", [](json& h, std::string&) { h["__metadata__"] = 5; });
  add_edit("MetadataValueNotAString", [](json& h, std::string&) { h["__metadata__"]["step"] = 5; });
  add_edit(
      "ParameterMissing", [](json& h, std::string&) { h.erase("fc2.weight"); }, true);
  add_edit(
      "WrongShapeForModel",
      [](json& h, std::string&) {
        h["fc1.weight"]["shape"] = {32, 128};
      },
      true);
  add_edit(
      "ParameterRenamed",
      [](json& h, std::string&) {
        h["fc2.weight.old"] = h["fc2.weight"];
        h.erase("fc2.weight");
      },
      true);
  return cs;
}

// ---- plugin files ----

std::vector<Case> plugin_cases() {
  std::vector<Case> cs;
  // The damaged library goes into a folder of its own on MIXTRAIN_PLUGIN_PATH, beside the real
  // ones.
  auto add = [&](std::string name, std::function<std::string(const std::string&)> make) {
    for (const char* command : {"plugins", "check", "train"}) {
      cs.push_back({"plugin", name + "_" + command, [make, command](Base&, const fs::path& dir) {
                      const auto folder = dir / "plugins";
                      fs::create_directories(folder);
                      spit(folder / "libmixtrain_x.so", make(slurp(Base::plugin())));
                      Invocation inv;
                      inv.plugin_path = folder.string();
                      inv.library = "libmixtrain_x.so";
                      const std::string c = command;
                      if (c == "plugins") {
                        inv.args = {"plugins"};
                        inv.expect = Expect::plugin_listed;
                      } else {
                        inv.args = c == "check"
                                       ? check_with(Base::quickstart())
                                       : train_with(Base::quickstart(), dir, {"run.steps=1"});
                        inv.expect = Expect::plugin_ignored;
                      }
                      return inv;
                    }});
    }
  };
  auto set_bytes = [](std::size_t at, std::string bytes) {
    return [at, bytes](const std::string& b) {
      return b.substr(0, at) + bytes + b.substr(at + bytes.size());
    };
  };
  // issue 10 item 1 (helper A): truncated plugins died of SIGBUS inside dlopen.
  for (std::size_t size : {0, 16, 63, 64, 1000, 4096, 100000})
    add("Truncated" + std::to_string(size),
        [size](const std::string& b) { return b.substr(0, std::min(size, b.size())); });
  add("TruncatedToHalf", [](const std::string& b) { return b.substr(0, b.size() / 2); });
  add("TextFile", [](const std::string&) { return std::string("this is not a library\n"); });
  add("ZeroFilled", [](const std::string& b) { return std::string(b.size(), '\0'); });
  // A real shared library that is no mixtrain plugin: zlib, found where this test loaded it from.
  add("NotAMixtrainPlugin", [](const std::string&) {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&zlibVersion), &info) == 0 || info.dli_fname == nullptr)
      throw std::runtime_error("cannot locate the zlib library");
    return slurp(info.dli_fname);
  });
  add("ElfMagicOnly", [](const std::string&) {
    return std::string(
        "\x7f"
        "ELF");
  });
  add("Elf32Class", set_bytes(4, "\x01"));                        // EI_CLASS: ELFCLASS32
  add("ElfBigEndian", set_bytes(5, "\x02"));                      // EI_DATA: ELFDATA2MSB
  add("ElfWrongMachine", set_bytes(18, le<std::uint16_t>(40)));   // e_machine: ARM
  add("ElfExecutableType", set_bytes(16, le<std::uint16_t>(2)));  // e_type: ET_EXEC
  add("ElfProgramHeadersPastEnd",
      set_bytes(32, le<std::uint64_t>(std::uint64_t{1} << 40)));               // e_phoff
  add("ElfProgramHeaderCountHuge", set_bytes(56, le<std::uint16_t>(0xFFFF)));  // e_phnum
  add("ElfProgramHeaderSizeWrong", set_bytes(54, le<std::uint16_t>(7)));       // e_phentsize
  add("ElfLoadSegmentPastEnd", [](const std::string& b) {  // the first PT_LOAD's p_filesz
    auto load = [&b](std::size_t at, std::size_t n) {
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < n; ++i)
        v |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
      return static_cast<std::size_t>(v);
    };
    const std::size_t phoff = load(32, 8), phentsize = load(54, 2), phnum = load(56, 2);
    for (std::size_t i = 0; i < phnum; ++i) {
      const std::size_t ph = phoff + i * phentsize;
      if (load(ph, 4) != 1) continue;  // PT_LOAD
      return b.substr(0, ph + 32) + le<std::uint64_t>(std::uint64_t{1} << 40) + b.substr(ph + 40);
    }
    throw std::runtime_error("the plugin has no PT_LOAD segment");
  });
  return cs;
}

std::vector<Case> all_cases() {
  return config_cases() + set_cases() + npy_cases() + idx_cases() + native_cases() +
         component_state_cases() + safetensors_cases() + plugin_cases();
}

// ---- the fixture ------------------------------------------------------------------------------

class MalformedInput : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    base_ = std::make_unique<Base>(fs::temp_directory_path() /
                                   ("mixtrain-malformed-" + std::to_string(::getpid())));
    fs::remove_all(base_->dir());
    fs::create_directories(base_->dir());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    // MIXTRAIN_CORPUS_KEEP=1 keeps every generated input for inspection.
    if (!::testing::UnitTest::GetInstance()->Failed() &&
        std::getenv("MIXTRAIN_CORPUS_KEEP") == nullptr)
      fs::remove_all(base_->dir(), ec);
  }

  fs::path case_dir() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();
    for (auto& c : name)
      if (c == '/') c = '_';
    auto d = base_->dir() / name;
    fs::create_directories(d);
    return d;
  }

  static std::unique_ptr<Base> base_;
};

std::unique_ptr<Base> MalformedInput::base_;

TEST_P(MalformedInput, IsRejectedCleanly) {
  const Case& c = GetParam();
  const auto dir = case_dir();
  const Invocation inv = c.make(*base_, dir);
  const Outcome r = run_mixtrain(inv.args, dir, inv.plugin_path);
  std::string command = "mixtrain";
  for (const auto& a : inv.args) command += " " + (a.size() > 200 ? a.substr(0, 200) + "..." : a);
  SCOPED_TRACE("input in " + dir.string() + "\ncommand: " + command + "\nstderr:\n" +
               r.err.substr(0, 4000));
  ASSERT_FALSE(r.hung) << "still running after the watchdog's limit (a hang)";
  ASSERT_FALSE(r.signaled) << "killed by signal " << r.signal << " (" << strsignal(r.signal) << ")";
  switch (inv.expect) {
    case Expect::bad_input:
      EXPECT_EQ(r.exit_code, 2);
      EXPECT_TRUE(has_error_line(r.err)) << "no line starting with 'error:' on stderr";
      break;
    case Expect::plugin_listed: {
      EXPECT_EQ(r.exit_code, 0);
      const auto failed = r.out.find("libraries that failed to load");
      ASSERT_NE(failed, std::string::npos) << r.out;
      EXPECT_NE(r.out.find(inv.library, failed), std::string::npos) << r.out;
      // The other libraries still load.
      EXPECT_NE(r.out.find("adamw"), std::string::npos) << r.out;
      break;
    }
    case Expect::plugin_ignored:
      EXPECT_EQ(r.exit_code, 0) << "a bad plugin library must not stop the others";
      break;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.family + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedInput, ::testing::ValuesIn(all_cases()), case_name);

// The undamaged inputs each family starts from are accepted, so a damaged one fails for its damage.
TEST(MalformedInputControls, UndamagedInputsAreAccepted) {
  const auto dir =
      fs::temp_directory_path() / ("mixtrain-malformed-controls-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto expect_ok = [&](const std::string& what, const std::vector<std::string>& args,
                       const std::string& plugin_path = {}) {
    const auto sub = dir / what;
    fs::create_directories(sub);
    auto a = args;
    for (auto& s : a)
      if (s == "@RUN") s = (sub / "run").string();
    const auto r = run_mixtrain(a, sub, plugin_path);
    EXPECT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    return r;
  };
  const std::string qs = Base::quickstart();
  expect_ok("config", {"check", qs});
  expect_ok("base_run", {"train", qs, "--run-dir", "@RUN", "--set", "backend.threads=1", "--set",
                         "run.steps=5"});
  const auto ckpt_file = dir / "base_run" / "run" / "checkpoints" / "step-00000005.mxt";
  ASSERT_TRUE(fs::exists(ckpt_file));

  // The re-encoder writes a file the reader accepts: an identity edit resumes.
  const auto f = read_native(ckpt_file);
  const auto reencoded = dir / "reencoded.mxt";
  spit(reencoded, encode_native(f.header.dump(), f.data));
  expect_ok("resume", {"train", qs, "--run-dir", "@RUN", "--set", "backend.threads=1", "--set",
                       "run.steps=7", "--resume", reencoded.string()});
  const auto weights = dir / "w.safetensors";
  expect_ok("export",
            {"export", reencoded.string(), "--format", "safetensors", "--out", weights.string()});
  expect_ok("eval_safetensors",
            {"eval", qs, "--set", "backend.threads=1", "--checkpoint", weights.string()});

  spit(dir / "x.npy", good_features_npy());
  spit(dir / "y.npy", good_labels_npy());
  spit(dir / "npy.toml", file_data_config("npy", dir / "x.npy", dir / "y.npy"));
  expect_ok("npy", {"train", (dir / "npy.toml").string(), "--run-dir", "@RUN"});
  spit(dir / "images.idx", good_images_idx());
  spit(dir / "images.idx.gz", gzip(good_images_idx()));
  spit(dir / "labels.idx", good_labels_idx());
  spit(dir / "idx.toml", file_data_config("idx", dir / "images.idx", dir / "labels.idx"));
  expect_ok("idx", {"train", (dir / "idx.toml").string(), "--run-dir", "@RUN"});
  spit(dir / "idxgz.toml", file_data_config("idx", dir / "images.idx.gz", dir / "labels.idx"));
  expect_ok("idx_gz", {"train", (dir / "idxgz.toml").string(), "--run-dir", "@RUN"});

  const auto r = expect_ok("plugins", {"plugins"});
  EXPECT_EQ(r.out.find("libraries that failed to load"), std::string::npos) << r.out;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
