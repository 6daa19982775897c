// The communicator suite's training tests (contract in communicator_conformance.h): the kit's MLP
// trained by the host through the communicator under test, against one process on the same global
// batch, and resumed from its checkpoint.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "communicator_fixture.h"
#include "component_training.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain::conformance::internal {

void link_communicator_training() {}

namespace {

namespace fs = std::filesystem;
using Losses = std::map<std::int64_t, double>;

struct DataParallelSetting {
  std::string name;
  bool shard_optimizer, overlap;
};

class CommunicatorTraining : public CommunicatorConformance {
 protected:
  void SetUp() override {
    CommunicatorConformance::SetUp();
    if (HasFatalFailure()) return;
    // Rank 0 writes the runs; every rank names the same folder (the host warns otherwise).
    std::string mine = scratch_.path().string();
    std::vector<std::byte> bytes(mine.size());
    std::memcpy(bytes.data(), mine.data(), mine.size());
    comm().broadcast_host(bytes, 0);
    shared_.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void TearDown() override {
    // Rank 0 removes its scratch folder with this object: no rank may still read a checkpoint.
    if (!HasFatalFailure()) comm().barrier();
  }

  // The kit's MLP over `sets` (the global batch divides among the ranks).
  std::vector<std::string> config(std::vector<std::string> sets) const {
    sets.insert(sets.begin(), GetParam().options.config_overrides.begin(),
                GetParam().options.config_overrides.end());
    sets.push_back("data.batch_size=" + std::to_string(8 * world()));
    return sets;
  }

  // Trains the session on the communicator's backend, through the communicator when
  // `setting` is given, else as one process: the losses of every step this rank was told.
  Losses train(TinySession s, const fs::path& run_dir,
               const std::optional<DataParallelSetting>& setting,
               std::optional<fs::path> resume = {}) {
    if (setting) {
      s.components.backend = backend_ptr();
      s.components.communicator = communicator_ptr();
      s.experiment.distributed.shard_optimizer = setting->shard_optimizer;
      s.experiment.distributed.overlap = setting->overlap;
    }
    Losses losses;
    core::TrainOptions opt;
    opt.run_dir = run_dir;
    opt.resume = std::move(resume);
    opt.on_record = [&losses](std::string_view line) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("step") && !j.contains("split"))
        losses[j["step"].get<std::int64_t>()] =
            j["loss"].is_null() ? std::nan("") : j["loss"].get<double>();
    };
    core::Trainer(s.experiment, std::move(s.components), opt).run();
    return losses;
  }

  // Rank 0's losses on every rank, through the host broadcast the suite tested.
  Losses rank_zero(const Losses& mine) {
    std::vector<std::byte> bytes(mine.size() * 16);
    std::size_t at = 0;
    for (const auto& [step, loss] : mine) {
      std::memcpy(bytes.data() + at, &step, 8);
      std::memcpy(bytes.data() + at + 8, &loss, 8);
      at += 16;
    }
    comm().broadcast_host(bytes, 0);
    Losses out;
    for (std::size_t i = 0; i + 16 <= bytes.size(); i += 16) {
      std::int64_t step = 0;
      double loss = 0;
      std::memcpy(&step, bytes.data() + i, 8);
      std::memcpy(&loss, bytes.data() + i + 8, 8);
      out[step] = loss;
    }
    return out;
  }

  fs::path shared() const { return shared_; }
  std::shared_ptr<sdk::DeviceBackend> backend_ptr() {
    return made_communicator(GetParam()).backend;
  }
  std::shared_ptr<sdk::Communicator> communicator_ptr() {
    return made_communicator(GetParam()).comm;
  }
  ScratchFolder scratch_;

 private:
  std::string shared_;
};

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// Every setting of the host's data parallel that changes which collectives run: the optimizer's
// state sharded (reduce-scatter and all-gather), and buckets reduced during backward or after it.
TEST_P(CommunicatorTraining, TheRanksTrainAsOneProcessOnTheGlobalBatch) {
  const auto sets = config({"run.steps=12"});
  const Losses one = train(tiny_session(TinyModel::mlp, sets, scratch_.path()),
                           scratch_.path() / ("one-rank-" + std::to_string(rank())), std::nullopt);
  ASSERT_EQ(one.size(), 12u) << "the one-process run logged " << one.size() << " steps";
  for (const DataParallelSetting& setting :
       {DataParallelSetting{"unsharded", false, true}, DataParallelSetting{"sharded", true, true},
        DataParallelSetting{"not_overlapped", false, false}}) {
    const Losses mine = train(tiny_session(TinyModel::mlp, sets, scratch_.path()),
                              shared() / ("ranks-" + setting.name), setting);
    const Losses first = rank_zero(mine);
    EXPECT_EQ(mine.size(), 12u) << setting.name << ": rank " << rank() << " was told "
                                << mine.size() << " steps' losses";
    for (const auto& [step, loss] : mine) {
      EXPECT_TRUE(first.count(step) && same_bits(first.at(step), loss))
          << setting.name << ": rank " << rank() << "'s loss at step " << step << " is " << loss
          << ", rank 0's " << (first.count(step) ? first.at(step) : std::nan(""))
          << ": the ranks must hold the same weights";
      if (!one.count(step)) continue;
      // Relative, down to a floor: only the order of the gradients' reduction differs.
      EXPECT_LE(std::abs(loss - one.at(step)), 1e-5 * std::max(std::abs(one.at(step)), 1e-2))
          << setting.name << ": step " << step << " on " << world() << " ranks gives " << loss
          << ", one process " << one.at(step);
    }
  }
}

TEST_P(CommunicatorTraining, ARunResumedOnTheSameRanksRepeatsTheLossesBitForBit) {
  const auto sets = config({"run.steps=12", "checkpoint.every=6"});
  const DataParallelSetting setting{"unsharded", false, true};
  const Losses full =
      train(tiny_session(TinyModel::mlp, sets, scratch_.path()), shared() / "full", setting);
  const Losses resumed =
      train(tiny_session(TinyModel::mlp, sets, scratch_.path()), shared() / "resumed", setting,
            shared() / "full" / "checkpoints" / "step-00000006.mxt");
  ASSERT_EQ(full.size(), 12u);
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed.begin()->first, 7);
  for (const auto& [step, loss] : resumed)
    EXPECT_TRUE(full.count(step) && same_bits(loss, full.at(step)))
        << "rank " << rank() << ": the resumed run gives " << loss << " at step " << step
        << " where the uninterrupted one gave "
        << (full.count(step) ? full.at(step) : std::nan(""));
}

INSTANTIATE_TEST_SUITE_P(communicator, CommunicatorTraining,
                         ::testing::ValuesIn(registered_communicators()),
                         [](const auto& info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CommunicatorTraining);

}  // namespace
}  // namespace mixtrain::conformance::internal
