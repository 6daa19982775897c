// The terms a resume keeps (train/resume_terms.h): read from a checkpoint's "resume" entry, or
// from its resolved config when it predates the entry; a malformed entry names its field.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "mixtrain/sdk/error.h"
#include "train/resume_terms.h"

namespace mixtrain::core {
namespace {

using Metadata = std::map<std::string, std::string>;

TEST(ResumeTerms, TheEntryRoundTrips) {
  const ResumeTerms t{64, 2, 300};
  const auto back =
      read_resume_terms(Metadata{{"resume", resume_terms_to_json(t).dump()}}, "c.mxt");
  EXPECT_EQ(back.batch_size, 64);
  EXPECT_EQ(back.accumulate, 2);
  EXPECT_EQ(back.schedule_steps, 300);
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

TEST(ResumeTerms, AMalformedEntryNamesTheFileAndTheField) {
  for (const auto& [entry, field] : std::map<std::string, std::string>{
           {R"({"batch_size": 0, "accumulate": 1, "schedule_steps": 5})", "resume.batch_size"},
           {R"({"batch_size": 8, "accumulate": 1.5, "schedule_steps": 5})", "resume.accumulate"},
           {R"({"batch_size": 8, "accumulate": 1})", "resume.schedule_steps"},
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
