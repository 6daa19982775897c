// The component kit's checkpoint format suite (contract in component_conformance.h): round trips,
// the host's resume and weights-only start through the format, atomic writes, and damaged files.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "component_training.h"
#include "conformance_fixture.h"
#include "mixtrain/conformance/component_conformance.h"
#include "mixtrain/core/checkpoint/format_set.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/format_streamed_write.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::conformance {

namespace {
std::vector<ComponentUnderTest<CheckpointFormatFactory>>& formats() {
  static std::vector<ComponentUnderTest<CheckpointFormatFactory>> list;
  return list;
}
}  // namespace

void add_checkpoint_format(std::string name, CheckpointFormatFactory make) {
  std::vector<std::string> taken;
  for (const auto& c : formats()) taken.push_back(c.name);
  internal::check_test_name("checkpoint_format", name, taken);
  formats().push_back({std::move(name), std::move(make)});
}
const std::vector<ComponentUnderTest<CheckpointFormatFactory>>& registered_checkpoint_formats() {
  return formats();
}

namespace {

namespace fs = std::filesystem;
using internal::TinyModel;
using sdk::DType;

constexpr const char* kWeightsOnly = "mixtrain.weights_only";

// Values in [-4, 4) encoded in `dtype` (finite in every format), or integers for int32.
sdk::HostTensor random_tensor(std::string name, DType dtype, std::vector<std::int64_t> shape,
                              std::mt19937& rng) {
  sdk::HostTensor t{std::move(name), dtype, std::move(shape), {}};
  const auto n = static_cast<std::size_t>(t.numel());
  t.bytes.resize(n * sdk::dtype_size(dtype));
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = u(rng);
    std::byte* at = t.bytes.data() + i * sdk::dtype_size(dtype);
    switch (dtype) {
      case DType::fp32:
        std::memcpy(at, &x, 4);
        break;
      case DType::tf32: {
        const float r = sdk::round_to_tf32(x);
        std::memcpy(at, &r, 4);
        break;
      }
      case DType::fp16: {
        const std::uint16_t b = sdk::encode_fp16(x);
        std::memcpy(at, &b, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t b = sdk::encode_bf16(x);
        std::memcpy(at, &b, 2);
        break;
      }
      case DType::fp8_e4m3:
        *at = static_cast<std::byte>(sdk::encode_fp8_e4m3(x, sdk::Overflow::saturate));
        break;
      case DType::fp8_e5m2:
        *at = static_cast<std::byte>(sdk::encode_fp8_e5m2(x, sdk::Overflow::saturate));
        break;
      case DType::int32: {
        const auto v = static_cast<std::int32_t>(rng());
        std::memcpy(at, &v, 4);
        break;
      }
    }
  }
  return t;
}

// Every dtype in a [3, 5] tensor, a scalar, an empty tensor, and 1 MiB of fp32; names as the host
// gives them ("param/...", "optimizer/...") and metadata as it writes it (JSON text), with an
// empty value and non-ASCII UTF-8.
sdk::TrainingState kit_state() {
  std::mt19937 rng(7);
  sdk::TrainingState st;
  for (const DType t : sdk::kAllDTypes)
    st.tensors.push_back(
        random_tensor("param/every." + std::string(sdk::dtype_name(t)), t, {3, 5}, rng));
  st.tensors.push_back(random_tensor("param/scalar", DType::fp32, {}, rng));
  st.tensors.push_back(random_tensor("buffer/empty", DType::fp32, {0, 4}, rng));
  st.tensors.push_back(random_tensor("param/big.weight", DType::fp32, {512, 512}, rng));
  st.tensors.push_back(random_tensor("optimizer/adamw.m/big.weight", DType::fp32, {512, 2}, rng));
  st.metadata["mixtrain.state_version"] = "1";
  st.metadata["progress"] = R"({"step": 6, "applied": 6, "skipped": 0, "last_loss": 1.5})";
  st.metadata["empty"] = "";
  st.metadata["utf8"] = "Größe, 步骤, ✓";
  return st;
}

std::string describe(const sdk::HostTensor& t) {
  std::string shape;
  for (const auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  return "'" + t.name + "' " + std::string(sdk::dtype_name(t.dtype)) + " [" + shape + "] (" +
         std::to_string(t.bytes.size()) + " bytes)";
}

void expect_same_state(const sdk::TrainingState& want, const sdk::TrainingState& got) {
  std::map<std::string, const sdk::HostTensor*> by_name;
  for (const auto& t : got.tensors)
    EXPECT_TRUE(by_name.emplace(t.name, &t).second) << "read back twice: '" << t.name << "'";
  for (const auto& t : want.tensors) {
    const auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      ADD_FAILURE() << "written but not read back: " << describe(t);
      continue;
    }
    const sdk::HostTensor& r = *it->second;
    EXPECT_TRUE(r.dtype == t.dtype && r.shape == t.shape && r.bytes == t.bytes)
        << "wrote " << describe(t) << ", read " << describe(r)
        << (r.bytes.size() == t.bytes.size() && r.bytes != t.bytes ? " with other bytes" : "");
  }
  EXPECT_EQ(got.tensors.size(), want.tensors.size()) << "tensors read that were not written";
  for (const auto& [key, value] : want.metadata) {
    const auto it = got.metadata.find(key);
    if (it == got.metadata.end())
      ADD_FAILURE() << "metadata '" << key << "' was not read back";
    else
      EXPECT_EQ(it->second, value) << "metadata '" << key << "'";
  }
}

std::set<std::string> folder_entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

std::vector<char> file_bytes(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const fs::path& f, const char* data, std::size_t n) {
  std::ofstream out(f, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(n));
}

class CheckpointFormatConformance
    : public ::testing::TestWithParam<ComponentUnderTest<CheckpointFormatFactory>> {
 protected:
  void SetUp() override {
    try {
      format_ = GetParam().make();
    } catch (const std::exception& e) {
      FAIL() << "checkpoint format '" << GetParam().name
             << "' could not be made: " << internal::failure_text(e);
    }
  }
  fs::path file(const std::string& stem) const {
    return scratch_.path() / (stem + format_->file_extension());
  }
  // read() of a file that is not a good checkpoint: a CheckpointError naming it. Returns "" when
  // so, else what happened.
  std::string refused_as_damaged(const fs::path& f) const {
    try {
      format_->read(f);
      return "it was read as a checkpoint";
    } catch (const sdk::CheckpointError& e) {
      if (std::string(e.what()).find(f.filename().string()) == std::string::npos)
        return std::string("the CheckpointError does not name the file: ") + e.what();
      return "";
    } catch (const std::exception& e) {
      return std::string("it threw another exception than CheckpointError: ") + e.what();
    }
  }
  // The tiny MLP with this format in place of the native one, for saves and for loads by
  // extension (checkpoint.init_from, eval's weights).
  internal::TinySession session(std::vector<std::string> sets) {
    auto s = internal::tiny_session(TinyModel::mlp, sets, scratch_.path());
    s.components.checkpoint_format = GetParam().make();
    // First: a weights-only load takes the first format that reads the file's extension.
    core::NamedFormat named;
    named.name = GetParam().name;
    named.origin = "the format under test";
    named.format = s.components.checkpoint_format;
    s.components.weight_formats.insert(s.components.weight_formats.begin(), std::move(named));
    return s;
  }

  std::shared_ptr<sdk::CheckpointFormat> format_;
  internal::ScratchFolder scratch_;
};

TEST_P(CheckpointFormatConformance, TheExtensionIsADotAndAName) {
  // The host's rule when it makes a format: a dot, then letters, digits, '_' or '-'.
  const std::string ext = format_->file_extension();
  bool ok = ext.size() >= 2 && ext[0] == '.';
  for (std::size_t i = 1; ok && i < ext.size(); ++i) {
    const auto c = static_cast<unsigned char>(ext[i]);
    ok = std::isalnum(c) != 0 || c == '_' || c == '-';
  }
  EXPECT_TRUE(ok) << "file_extension() is '" << ext << "': the host names checkpoints "
                  << "step-NNNNNNNN<ext> and refuses an extension other than a dot and letters, "
                     "digits, '_' or '-'";
  // Nor may it be another format's: the host picks a file's reader by its extension, and refuses
  // a configured format whose extension a loaded one claims (mixtrain's .mxt, .safetensors).
  core::PluginRegistry registry(&core::host_log_sink());
  registry.scan(plugin_search_path());
  for (const auto& c : registry.components()) {
    if (c.info.kind != sdk::ComponentKind::checkpoint_format || c.info.name == GetParam().name)
      continue;
    std::string theirs;
    try {
      theirs = registry
                   .create<sdk::CheckpointFormat>(
                       c, sdk::Options::resolve("checkpoint", c.info.options, {}, {}))
                   ->file_extension();
    } catch (const std::exception&) {
      continue;  // a format that cannot be made claims nothing
    }
    EXPECT_NE(theirs, ext) << "'" << ext << "' is the extension of format '" << c.info.name << "' ("
                           << c.library.filename().string()
                           << "): the host refuses a configured format that claims it";
  }
}

TEST_P(CheckpointFormatConformance, ARoundTripGivesBackEveryTensorAndEntry) {
  const sdk::TrainingState st = kit_state();
  format_->write(file("kit"), st);
  const sdk::TrainingState back = format_->read(file("kit"));
  if (back.metadata.count(kWeightsOnly) != 0)
    GTEST_SKIP() << "the format keeps weights only ('" << kWeightsOnly
                 << "'): ARunStartsFromTheWeightsItWrote checks it";
  expect_same_state(st, back);
}

// A host training state (a trained MLP's weights, AdamW's moments, the metadata the host writes):
// resumed through the format, the run repeats the uninterrupted run's losses bit for bit.
TEST_P(CheckpointFormatConformance, AResumedRunRepeatsTheLossesBitForBit) {
  const std::vector<std::string> sets = {"run.steps=12", "checkpoint.every=6"};
  const fs::path full = scratch_.path() / "full", resumed = scratch_.path() / "resumed";
  {
    auto s = session(sets);
    core::TrainOptions opt;
    opt.run_dir = full;
    core::Trainer(s.experiment, std::move(s.components), opt).run();
  }
  const fs::path at6 = full / "checkpoints" / ("step-00000006" + format_->file_extension());
  ASSERT_TRUE(fs::exists(at6)) << at6;
  const sdk::TrainingState st = format_->read(at6);
  if (st.metadata.count(kWeightsOnly) != 0)
    GTEST_SKIP() << "the format keeps weights only: a resume refuses its files";
  {
    auto s = session(sets);
    core::TrainOptions opt;
    opt.run_dir = resumed;
    opt.resume = at6;
    core::Trainer(s.experiment, std::move(s.components), opt).run();
  }
  const auto want = internal::step_losses(full), got = internal::step_losses(resumed);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.begin()->first, 7);
  for (const auto& [step, loss] : got)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(loss), std::bit_cast<std::uint64_t>(want.at(step)))
        << "the resumed run differs at step " << step << ": " << loss << " where it was "
        << want.at(step);
}

// The weights a trained run writes through the format, loaded weights-only by a new session:
// it evaluates as the run did (bit for bit for a full state; within 1% for a weights-only format,
// which may narrow them).
TEST_P(CheckpointFormatConformance, ARunStartsFromTheWeightsItWrote) {
  const fs::path saved = file("trained");
  core::EvalResult want;
  {
    auto s = session({"run.steps=8"});
    core::TrainOptions opt;
    opt.run_dir = scratch_.path() / "trained-run";
    core::Trainer t(s.experiment, std::move(s.components), opt);
    t.run();
    want = t.evaluate();
    format_->write(saved, t.training_state(false));
  }
  const bool weights_only = format_->read(saved).metadata.count(kWeightsOnly) != 0;
  auto s = session({"run.steps=8"});
  core::TrainOptions opt;
  opt.trains = false;
  opt.write_outputs = false;
  opt.splits = core::DataSplits::held_out;
  opt.weights = saved;
  core::Trainer t(s.experiment, std::move(s.components), opt);
  const core::EvalResult got = t.evaluate();
  if (weights_only)
    EXPECT_NEAR(got.loss, want.loss, 0.01 * std::abs(want.loss));
  else
    EXPECT_EQ(std::bit_cast<std::uint64_t>(got.loss), std::bit_cast<std::uint64_t>(want.loss))
        << "evaluated " << got.loss << " from the file, " << want.loss << " in the run";
}

// Over an older file, in a folder of other files: the new state whole, the others untouched, and
// no file left beside them (a temporary one).
TEST_P(CheckpointFormatConformance, AWriteReplacesTheFileWholeAndLeavesNothingBeside) {
  const fs::path dir = scratch_.path() / "folder";
  fs::create_directories(dir);
  const std::string other = "another run's bytes";
  write_bytes(dir / "other.bin", other.data(), other.size());
  const fs::path f = dir / ("ckpt" + format_->file_extension());
  sdk::TrainingState old_state = kit_state();
  old_state.metadata["which"] = "old";
  format_->write(f, old_state);
  sdk::TrainingState new_state;
  std::mt19937 rng(11);
  new_state.tensors.push_back(random_tensor("param/fc.weight", DType::fp32, {4, 3}, rng));
  new_state.metadata["mixtrain.state_version"] = "1";
  new_state.metadata["which"] = "new";
  format_->write(f, new_state);
  EXPECT_EQ(folder_entries(dir), (std::set<std::string>{"other.bin", f.filename().string()}));
  const auto kept = file_bytes(dir / "other.bin");
  EXPECT_EQ(std::string(kept.begin(), kept.end()), other);
  const sdk::TrainingState back = format_->read(f);
  EXPECT_EQ(back.metadata.count("which") ? back.metadata.at("which") : "", "new");
  EXPECT_EQ(back.find("param/every.fp32"), nullptr) << "the old file's tensors are still read";
}

// The streamed facet's write of a state is write()'s file, byte for byte: with a reader that fills
// the format's buffer (as the host reads a device tensor) and with one that hands out the bytes it
// holds. Each tensor is asked for at most twice (a checksum pass, then the write), with a buffer of
// exactly its size.
TEST_P(CheckpointFormatConformance, AStreamedWriteIsTheWholeWriteByteForByte) {
  const auto* streamed = dynamic_cast<const sdk::StreamedWriteFacet*>(format_.get());
  if (streamed == nullptr) GTEST_SKIP() << "the format offers no streamed_write facet";
  const sdk::TrainingState st = kit_state();
  format_->write(file("whole"), st);
  std::vector<sdk::StreamedTensor> tensors;
  for (const auto& t : st.tensors) tensors.push_back({t.name, t.dtype, t.shape});
  for (const bool fills : {true, false}) {
    std::vector<int> reads(st.tensors.size(), 0);
    const fs::path f = file(fills ? "filled" : "held");
    streamed->write_streamed(
        f, tensors, st.metadata,
        [&](std::size_t i, std::span<std::byte> buffer) -> std::span<const std::byte> {
          EXPECT_LT(i, st.tensors.size()) << "asked for a tensor the state does not have";
          const auto& bytes = st.tensors.at(i).bytes;
          ++reads[i];
          if (!fills) return bytes;
          EXPECT_EQ(buffer.size(), bytes.size())
              << "the buffer for '" << st.tensors[i].name << "' is not its size";
          if (!bytes.empty() && !buffer.empty())
            std::memcpy(buffer.data(), bytes.data(), std::min(buffer.size(), bytes.size()));
          return buffer.first(std::min(buffer.size(), bytes.size()));
        });
    EXPECT_EQ(file_bytes(f), file_bytes(file("whole")))
        << "the streamed file (" << (fills ? "buffers filled" : "bytes held")
        << ") is not the file write() writes";
    for (std::size_t i = 0; i < reads.size(); ++i)
      EXPECT_LE(reads[i], 2) << "'" << st.tensors[i].name << "' was read " << reads[i] << " times";
  }
}

// What the host's reader throws (its refusal of weights that are not finite) comes out unchanged,
// wherever the format is in its write: the old file stays whole and nothing is left beside it.
TEST_P(CheckpointFormatConformance, AStreamedWriteStoppedByItsReaderLeavesTheOldFile) {
  const auto* streamed = dynamic_cast<const sdk::StreamedWriteFacet*>(format_.get());
  if (streamed == nullptr) GTEST_SKIP() << "the format offers no streamed_write facet";
  struct Refused {};
  const sdk::TrainingState st = kit_state();
  std::vector<sdk::StreamedTensor> tensors;
  for (const auto& t : st.tensors) tensors.push_back({t.name, t.dtype, t.shape});
  const fs::path dir = scratch_.path() / "stopped";
  fs::create_directories(dir);
  const fs::path f = dir / ("ckpt" + format_->file_extension());
  format_->write(f, st);
  const auto old_bytes = file_bytes(f);
  // Stopped at each read in turn (the formats' reads differ in number and order).
  for (int stop_at = 1;; ++stop_at) {
    int reads = 0;
    bool stopped = false;
    try {
      streamed->write_streamed(
          f, tensors, {{"mixtrain.state_version", "1"}, {"which", "new"}},
          [&](std::size_t i, std::span<std::byte>) -> std::span<const std::byte> {
            if (++reads == stop_at) throw Refused{};
            return st.tensors.at(i).bytes;
          });
    } catch (const Refused&) {
      stopped = true;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the reader's exception at read " << stop_at
                    << " came out as another: " << e.what();
      stopped = true;
    }
    if (!stopped) break;  // every read was passed: the write completed
    EXPECT_EQ(file_bytes(f), old_bytes) << "stopped at read " << stop_at;
    EXPECT_EQ(folder_entries(dir), std::set<std::string>{f.filename().string()})
        << "stopped at read " << stop_at;
    ASSERT_LT(stop_at, 100) << "more reads than the state has tensors twice";
  }
  EXPECT_EQ(format_->read(f).metadata.at("which"), "new");
}

TEST_P(CheckpointFormatConformance, AWriteThatCannotBeMadeIsACheckpointError) {
  const fs::path f = scratch_.path() / "no" / "such" / ("folder" + format_->file_extension());
  try {
    format_->write(f, kit_state());
    ADD_FAILURE() << "wrote into a folder that does not exist: " << f;
  } catch (const sdk::CheckpointError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception than CheckpointError: " << e.what();
  }
  EXPECT_FALSE(fs::exists(scratch_.path() / "no"));
}

TEST_P(CheckpointFormatConformance, AMissingFileAFolderAnEmptyFileAndRandomBytesAreRefused) {
  EXPECT_EQ(refused_as_damaged(file("missing")), "") << "a missing file";
  fs::create_directories(file("a-folder"));
  EXPECT_EQ(refused_as_damaged(file("a-folder")), "") << "a folder";
  write_bytes(file("empty"), "", 0);
  EXPECT_EQ(refused_as_damaged(file("empty")), "") << "an empty file";
  std::mt19937 rng(3);
  for (const std::size_t n : {1u, 8u, 64u, 4096u}) {
    std::vector<char> noise(n);
    for (auto& c : noise) c = static_cast<char>(rng());
    write_bytes(file("noise"), noise.data(), n);
    EXPECT_EQ(refused_as_damaged(file("noise")), "") << n << " random bytes";
  }
}

// A file cut anywhere (a full disk, a copy in progress): every cut in the first 64 bytes, and 48
// more spread over the rest.
TEST_P(CheckpointFormatConformance, EveryTruncationIsACheckpointErrorNamingTheFile) {
  sdk::TrainingState st = kit_state();
  st.tensors.resize(st.tensors.size() - 2);  // without the MiB: many cuts, quickly
  format_->write(file("good"), st);
  const auto bytes = file_bytes(file("good"));
  ASSERT_GT(bytes.size(), 64u);
  std::set<std::size_t> cuts;
  for (std::size_t n = 0; n < 64; ++n) cuts.insert(n);
  for (std::size_t k = 0; k < 48; ++k) cuts.insert(64 + (bytes.size() - 64) * k / 48);
  cuts.insert(bytes.size() - 1);
  for (const std::size_t n : cuts) {
    write_bytes(file("cut"), bytes.data(), n);
    const std::string why = refused_as_damaged(file("cut"));
    EXPECT_EQ(why, "") << "the first " << n << " of " << bytes.size() << " bytes";
    if (!why.empty()) break;  // one cut says it; a hundred more would bury it
  }
}

// One byte changed: refused as damaged (a checksum finds it) or read as a state whose tensors'
// bytes fit their dtypes and shapes (a format without checksums reads other values); never a
// crash, another exception or a tensor whose bytes do not fit.
TEST_P(CheckpointFormatConformance, ADamagedByteIsRefusedOrReadInShape) {
  sdk::TrainingState st = kit_state();
  st.tensors.resize(st.tensors.size() - 2);
  format_->write(file("good"), st);
  const auto bytes = file_bytes(file("good"));
  std::set<std::size_t> at;
  for (std::size_t n = 0; n < std::min<std::size_t>(bytes.size(), 96); ++n) at.insert(n);
  for (std::size_t k = 0; k < 64; ++k) at.insert(bytes.size() * k / 64);
  at.insert(bytes.size() - 1);
  for (const std::size_t i : at)
    for (const unsigned char flip : {0x01, 0x80, 0xFF}) {
      auto damaged = bytes;
      damaged[i] = static_cast<char>(static_cast<unsigned char>(damaged[i]) ^ flip);
      write_bytes(file("damaged"), damaged.data(), damaged.size());
      try {
        const sdk::TrainingState got = format_->read(file("damaged"));
        for (const auto& t : got.tensors) {
          std::int64_t n = 0;
          try {
            n = t.numel();
          } catch (const std::exception&) {
            n = -1;
          }
          ASSERT_TRUE(n >= 0 &&
                      t.bytes.size() == static_cast<std::size_t>(n) * sdk::dtype_size(t.dtype))
              << "byte " << i << " ^ " << int(flip) << ": read " << describe(t)
              << ", whose bytes do not fit its shape";
        }
      } catch (const sdk::CheckpointError&) {
      } catch (const std::exception& e) {
        FAIL() << "byte " << i << " ^ " << int(flip)
               << ": threw another exception than CheckpointError: " << e.what();
      }
    }
}

INSTANTIATE_TEST_SUITE_P(checkpoint_format, CheckpointFormatConformance,
                         ::testing::ValuesIn(registered_checkpoint_formats()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CheckpointFormatConformance);

}  // namespace
}  // namespace mixtrain::conformance
