#include "command_inputs.h"

#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace fs = std::filesystem;

CommandInputs config_inputs(const ConfigArgs& cfg) {
  CommandInputs inputs{{"config", cfg.config}};
  for (const auto& merge : cfg.merges) inputs.push_back({"--merge", merge});
  return inputs;
}

bool is_input(const fs::path& out, const fs::path& input) {
  if (out.empty() || input.empty()) return false;
  std::error_code ec;
  // equivalent() reports an error, not false, when either path is missing: a new file is no input.
  return fs::equivalent(out, input, ec) && !ec;
}

void refuse_input_as_output(const std::string& out_flag, const fs::path& out,
                            const CommandInputs& inputs) {
  for (const auto& in : inputs)
    if (is_input(out, in.path))
      throw sdk::UserError(
          out_flag + " " + out.string() + " is the input " + in.argument + " " + in.path.string() +
              ": writing it would destroy what this command reads",
          "choose another " + out_flag + "; an input is never overwritten, --force or not");
}

}  // namespace mixtrain::cli
