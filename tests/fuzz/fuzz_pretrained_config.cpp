// Fuzzes the JSON config files of folders other libraries save (core/checkpoint/hf_folder.h's
// config.json and checkpoint/peft_adapter.h's adapter_config.json): files from the Hub, read
// before anything else of the folder. Input: byte 0 picks the reader (even: a Hugging Face GPT-2
// config.json, odd: a PEFT adapter_config.json), the rest is the file's text. sdk::ConfigError is
// the expected rejection; anything else escaping, a crash, a hang or a target rule that holds
// for no module name of a read config's own list is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_support.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/sdk/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto text = mixtrain::fuzz::as_view(data + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      mixtrain::core::parse_hf_gpt2_config(text, "fuzz/config.json");
      return 0;
    }
    const auto config = mixtrain::core::parse_peft_adapter_config(text, "fuzz/adapter_config.json");
    // A list's own entries are module names it adapts (PEFT's suffix rule).
    for (const auto& name : config.target_names)
      if (!mixtrain::core::peft_targets(config, "transformer.h.0." + name)) std::abort();
    mixtrain::core::peft_targets(config, "transformer.h.11.attn.c_attn");
    mixtrain::core::peft_targets(config, "lm_head");
  } catch (const mixtrain::sdk::ConfigError&) {
  }
  return 0;
}
