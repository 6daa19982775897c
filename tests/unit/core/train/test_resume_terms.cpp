// The terms a resume keeps (train/resume_terms.h): read from a checkpoint's "resume" entry, or
// from its resolved config when it predates the entry; a malformed entry names its field; another
// set of frozen parameters is refused, naming both, and so are other LoRA settings.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/error.h"
#include "train/resume_terms.h"

namespace mixtrain::core {
namespace {

using Metadata = std::map<std::string, std::string>;

TEST(ResumeTerms, TheEntryRoundTrips) {
  const ResumeTerms t{64,     2,        300, std::vector<std::string>{"fc1.bias", "fc1.weight"},
                      "none", "compute"};
  const auto back =
      read_resume_terms(Metadata{{"resume", resume_terms_to_json(t).dump()}}, "c.mxt");
  EXPECT_EQ(back.batch_size, 64);
  EXPECT_EQ(back.accumulate, 2);
  EXPECT_EQ(back.schedule_steps, 300);
  EXPECT_EQ(back.frozen, t.frozen);
}

TEST(ResumeTerms, NothingFrozenWritesTheEntryAsBeforeAndReadsBackAsKnown) {
  // A run without frozen parameters writes no "frozen" key (its checkpoints stay as they were);
  // reading one back, or a checkpoint from before the key, says nothing was frozen.
  const auto entry = resume_terms_to_json({8, 1, 5, std::vector<std::string>{}, "none", "compute"});
  EXPECT_FALSE(entry.contains("frozen")) << entry.dump();
  const auto back = read_resume_terms(Metadata{{"resume", entry.dump()}}, "c.mxt");
  ASSERT_TRUE(back.frozen.has_value());
  EXPECT_TRUE(back.frozen->empty());
  const auto old = read_resume_terms(Metadata{{"config", "[run]\nsteps = 5\n"}}, "c.mxt");
  ASSERT_TRUE(old.frozen.has_value());
  EXPECT_TRUE(old.frozen->empty());
  EXPECT_FALSE(read_resume_terms({}, "c.mxt").frozen.has_value());
}

TEST(ResumeTerms, AnotherSetOfFrozenParametersIsRefusedNamingBoth) {
  Experiment e;
  e.data.batch_size = 8;
  e.run.accumulate = 1;
  e.run.steps = 5;
  LrSchedule schedule;
  schedule.total_steps = 5;
  auto log = core_logger("test");
  const ResumeTerms trained{8,      1,        5, std::vector<std::string>{"fc1.bias", "fc1.weight"},
                            "none", "compute"};
  // The same set resumes; so does a checkpoint whose set is unknown.
  keep_resume_terms(trained, e, {"fc1.bias", "fc1.weight"}, schedule, 3, log, "c.mxt");
  keep_resume_terms(ResumeTerms{8, 1, 5, std::nullopt, std::nullopt, std::nullopt}, e,
                    {"head.weight"}, schedule, 3, log, "c.mxt");
  for (const auto& now : std::vector<std::vector<std::string>>{
           {}, {"fc1.weight"}, {"fc1.bias", "fc1.weight", "x.w"}}) {
    try {
      keep_resume_terms(trained, e, now, schedule, 3, log, "c.mxt");
      ADD_FAILURE() << now.size();
    } catch (const sdk::CheckpointError& error) {
      const std::string m = error.what();
      EXPECT_NE(m.find("c.mxt"), std::string::npos) << m;
      EXPECT_NE(m.find("trained with frozen parameters [fc1.bias, fc1.weight]"), std::string::npos)
          << m;
      EXPECT_NE(m.find(now.empty() ? "this one has no frozen parameters"
                                   : "this one has frozen parameters [" + now.front()),
                std::string::npos)
          << m;
      EXPECT_NE(std::string(error.hint()).find("[train]"), std::string::npos) << error.hint();
    }
  }
}

TEST(ResumeTerms, AnOlderCheckpointGivesThemFromItsResolvedConfig) {
  const Metadata m{{"config", "[run]\nsteps = 500\naccumulate = 4\n[data]\nbatch_size = 16\n"}};
  const auto t = read_resume_terms(m, "c.mxt");
  EXPECT_EQ(t.batch_size, 16);
  EXPECT_EQ(t.accumulate, 4);
  EXPECT_EQ(t.schedule_steps, 500);
  // Neither entry, or a config this build cannot read: unknown, nothing to check.
  EXPECT_EQ(read_resume_terms({}, "c.mxt").batch_size, 0);
  EXPECT_EQ(read_resume_terms(Metadata{{"config", "[run"}}, "c.mxt").schedule_steps, 0);
}

TEST(ResumeTerms, OtherLoraSettingsAreRefusedNamingBoth) {
  // Without LoRA the entry is as before; with it, the settings round-trip.
  const auto plain = resume_terms_to_json({8, 1, 5, std::vector<std::string>{}, "none", "compute"});
  EXPECT_FALSE(plain.contains("lora")) << plain.dump();
  EXPECT_EQ(read_resume_terms(Metadata{{"resume", plain.dump()}}, "c.mxt").lora, "none");
  EXPECT_EQ(read_resume_terms(Metadata{{"config", "[run]\nsteps = 5\n"}}, "c.mxt").lora, "none");
  Experiment e;
  e.data.batch_size = 8;
  e.run.accumulate = 1;
  e.run.steps = 5;
  e.model.lora.r = 8;
  e.model.lora.alpha = 16;
  ParameterPattern target;
  target.pattern = "h.*.attn.c_attn";
  e.model.lora.targets.push_back(target);
  const std::string now = lora_terms(e.model.lora);
  const auto entry = resume_terms_to_json({8, 1, 5, std::vector<std::string>{}, now, "compute"});
  const auto back = read_resume_terms(Metadata{{"resume", entry.dump()}}, "c.mxt");
  EXPECT_EQ(back.lora, now);
  LrSchedule schedule;
  schedule.total_steps = 5;
  auto log = core_logger("test");
  keep_lora_terms(back, e, "c.mxt");
  keep_resume_terms(back, e, {}, schedule, 3, log, "c.mxt");
  for (const auto& [was, said] : std::vector<std::pair<std::string, std::string>>{
           {"none", "trained with no LoRA, this one has LoRA r = 8, alpha = 16"},
           {"r = 4, alpha = 16, dropout = 0, targets = [\"h.*.attn.c_attn\"]",
            "trained with LoRA r = 4, alpha = 16, dropout = 0, targets = [\"h.*.attn.c_attn\"], "
            "this one has LoRA r = 8, alpha = 16, dropout = 0, targets = [\"h.*.attn.c_attn\"]"},
           // Stored as "%.17g" (and compared so), said in the shortest form that reads back.
           {"r = 8, alpha = 10.5, dropout = 0.10000000000000001, targets = [\"h.*.attn.c_attn\"]",
            "trained with LoRA r = 8, alpha = 10.5, dropout = 0.1, targets = "
            "[\"h.*.attn.c_attn\"], this one"}}) {
    ResumeTerms t{8, 1, 5, std::vector<std::string>{}, was, "compute"};
    try {
      keep_lora_terms(t, e, "c.mxt");
      ADD_FAILURE() << was;
    } catch (const sdk::CheckpointError& error) {
      const std::string m = error.what();
      EXPECT_NE(m.find("c.mxt: the run was " + said), std::string::npos) << m;
      EXPECT_NE(std::string(error.hint()).find("[model.lora]"), std::string::npos) << error.hint();
    }
  }
}

TEST(ResumeTerms, AnotherFrozenFormatIsRefusedNamingBoth) {
  // A compute-dtype base writes nothing new; an NF4 one records its block, and both read back.
  const auto plain = resume_terms_to_json({8, 1, 5, std::vector<std::string>{}, "none", "compute"});
  EXPECT_FALSE(plain.contains("frozen_format")) << plain.dump();
  EXPECT_EQ(read_resume_terms(Metadata{{"resume", plain.dump()}}, "c.mxt").frozen_format,
            "compute");
  EXPECT_EQ(read_resume_terms(Metadata{{"config", "[run]\nsteps = 5\n"}}, "c.mxt").frozen_format,
            "compute");
  Experiment e;
  e.model.freeze.format = FrozenFormat::nf4;
  e.model.freeze.block = 64;
  EXPECT_EQ(frozen_format_terms(e.model.freeze), "nf4 (blocks of 64)");
  const auto entry = resume_terms_to_json(
      {8, 1, 5, std::vector<std::string>{}, "none", frozen_format_terms(e.model.freeze)});
  const auto back = read_resume_terms(Metadata{{"resume", entry.dump()}}, "c.mxt");
  EXPECT_EQ(back.frozen_format, "nf4 (blocks of 64)");
  keep_frozen_format(back, e, "c.mxt");
  for (const auto& [was, now] : std::vector<std::pair<std::string, std::int64_t>>{
           {"compute", 64}, {"nf4 (blocks of 64)", 32}}) {
    e.model.freeze.block = now;
    try {
      keep_frozen_format(ResumeTerms{8, 1, 5, std::vector<std::string>{}, "none", was}, e, "c.mxt");
      ADD_FAILURE() << was;
    } catch (const sdk::CheckpointError& error) {
      const std::string m = error.what();
      EXPECT_NE(m.find("c.mxt: the run was trained with train.frozen_format = " + was +
                       ", this one has train.frozen_format = nf4 (blocks of " +
                       std::to_string(now) + ")"),
                std::string::npos)
          << m;
      EXPECT_NE(std::string(error.hint()).find("frozen_format"), std::string::npos);
    }
  }
  EXPECT_THROW(read_resume_terms(
                   Metadata{{"resume", R"({"batch_size": 8, "accumulate": 1, "schedule_steps": 5, )"
                                       R"("frozen_format": 4})"}},
                   "c.mxt"),
               sdk::CheckpointError);
}

TEST(ResumeTerms, AMalformedEntryNamesTheFileAndTheField) {
  for (const auto& [entry, field] : std::map<std::string, std::string>{
           {R"({"batch_size": 0, "accumulate": 1, "schedule_steps": 5})", "resume.batch_size"},
           {R"({"batch_size": 8, "accumulate": 1.5, "schedule_steps": 5})", "resume.accumulate"},
           {R"({"batch_size": 8, "accumulate": 1})", "resume.schedule_steps"},
           {R"({"batch_size": 8, "accumulate": 1, "schedule_steps": 5, "frozen": "a"})",
            "resume.frozen"},
           {R"({"batch_size": 8, "accumulate": 1, "schedule_steps": 5, "frozen": [1]})",
            "resume.frozen"},
           {R"({"batch_size": 8, "accumulate": 1, "schedule_steps": 5, "lora": 4})", "resume.lora"},
           {"[1, 2]", "'resume' entry"}}) {
    try {
      read_resume_terms(Metadata{{"resume", entry}}, "c.mxt");
      ADD_FAILURE() << entry;
    } catch (const sdk::CheckpointError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("c.mxt"), std::string::npos) << m;
      EXPECT_NE(m.find(field), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
