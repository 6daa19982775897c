// Every integer flag of every command, found in its --help (INT, UINT), refuses a number past its
// type's range and a negative one (no integer flag of mixtrain takes one) as a command-line error:
// exit 2 naming the flag and the value, nothing saturated or wrapped and then run.
#include <regex>
#include <set>

#include "cli_test_support.h"

namespace mixtrain::test {
namespace {

using IntegerFlags = CliTest;

// The flags whose value --help shows as INT or UINT.
std::set<std::string> integer_flags(const std::string& help) {
  std::set<std::string> flags;
  static const std::regex option(R"(\s(--[a-z][a-z-]*)\s+U?INT\b)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), option);
       it != std::sregex_iterator(); ++it)
    flags.insert((*it)[1]);
  return flags;
}

TEST_F(IntegerFlags, EveryCommandRefusesOverflowAndNegativeValues) {
  // What each command requires besides the flag, so the flag's value is the only error.
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"train", "cfg.toml"},
      {"check", "cfg.toml"},
      {"eval", "cfg.toml --checkpoint c"},
      {"compare", "run"},
      {"export", "c --format safetensors"},
      {"calibrate", "cfg.toml"},
      {"sample", "cfg.toml --checkpoint c --prompt p"},
      {"predict", "cfg.toml --checkpoint c --input x.npy --out p.npy"},
      {"describe", ""},
      {"plugins", ""}};
  std::size_t checked = 0;
  for (const auto& [command, required] : commands) {
    const auto help = run(command + " --help");
    ASSERT_EQ(help.exit_code, 0) << command << "\n" << help.err;
    for (const auto& flag : integer_flags(help.out)) {
      for (const std::string value : {"99999999999999999999", "18446744073709551616", "-1",
                                      "-99999999999999999999", "12abc"}) {
        const std::string args = command + " " + required + " " + flag + " " + value;
        const auto r = run(args, dir_);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
        EXPECT_TRUE(has(r.err, flag + ": " + value + " is ")) << args << "\n" << r.err;
        EXPECT_TRUE(has(r.err, "give a whole number")) << args << "\n" << r.err;
      }
      ++checked;
    }
  }
  // calibrate --steps; sample --tokens, --top-k, --seed; predict --top-k, --stride.
  EXPECT_EQ(checked, 6u) << "the integer flags of the command line changed: update this count";
}

TEST_F(IntegerFlags, ARangeNamesItsBoundsAndAcceptsTheLargestValue) {
  auto r = run("sample cfg.toml --checkpoint c --prompt p --tokens 1000001", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(
      has(r.err, "--tokens: 1000001 is out of range: give a whole number from 0 to 1000000"))
      << r.err;
  r = run("calibrate cfg.toml --steps 0", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "--steps: 0 is out of range: give a whole number 1 or more")) << r.err;
  // In range, the flag passes and the command goes on to its next error: the missing config.
  r = run("sample cfg.toml --checkpoint c --prompt p --seed 18446744073709551615", dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_FALSE(has(r.err, "--seed")) << r.err;
  EXPECT_TRUE(has(r.err, "cfg.toml")) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
