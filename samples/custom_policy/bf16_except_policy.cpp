#include "bf16_except_policy.h"

#include <fnmatch.h>

#include <algorithm>
#include <string_view>

namespace mixtrain_samples {

namespace sdk = mixtrain::sdk;

namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

sdk::OptionSchema Bf16ExceptPolicy::option_schema() {
  return {sdk::OptionSpec::string("fp32_layers", "head*",
                                  "comma-separated globs of layer names kept entirely in fp32")};
}

Bf16ExceptPolicy::Bf16ExceptPolicy(const sdk::Options& options, const sdk::PluginContext& context)
    : logger_(context.logger) {
  const std::string list = options.get_string("fp32_layers");
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = std::min(list.find(',', start), list.size());
    auto glob = trim(std::string_view(list).substr(start, comma - start));
    if (!glob.empty()) globs_.push_back(std::move(glob));
    start = comma + 1;
  }
  logger_.info("bf16 everywhere except layers matching '" + list +
               "' (fp32); per-layer activation bytes per batch row follow. "
               "Memory estimate: a bf16 activation row costs half its fp32 size, so the saving "
               "is about half of the activation memory of the non-excepted layers");
}

bool Bf16ExceptPolicy::keeps_fp32(const std::string& layer_name) const {
  return std::any_of(globs_.begin(), globs_.end(), [&](const std::string& g) {
    return ::fnmatch(g.c_str(), layer_name.c_str(), 0) == 0;
  });
}

sdk::OpPrecision Bf16ExceptPolicy::plan(const sdk::OpDescription& op) const {
  sdk::OpPrecision p;  // every dtype fp32
  const char* why = "bf16";
  if (op.precision_sensitive) {
    // The host keeps a precision-sensitive op (statistics, softmax, loss) in FP32 whatever a
    // policy plans; planning it FP32 here only keeps this log line true.
    why = "fp32 (precision-sensitive op, pinned by the host)";
  } else if (keeps_fp32(op.name)) {
    why = "fp32 (fp32_layers)";
  } else {
    if (op.has_gemm()) {
      p.weight = sdk::DType::bf16;
      p.gemm_input = sdk::DType::bf16;
    }
    p.activation = sdk::DType::bf16;
    p.activation_grad = sdk::DType::bf16;
  }
  const auto row_bytes = op.out_features * static_cast<std::int64_t>(sdk::dtype_size(p.activation));
  logger_.info("layer '" + op.name + "' (" + op.kind + "): " + why + ", activations " +
               std::to_string(row_bytes) + " B/row (fp32 would be " +
               std::to_string(op.out_features * 4) + " B/row)");
  return p;
}

}  // namespace mixtrain_samples

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  using mixtrain_samples::Bf16ExceptPolicy;
  return {{mixtrain::sdk::ComponentKind::policy, "bf16-except",
           "bf16-mixed except layers matching fp32_layers (default \"head*\"), kept in fp32",
           Bf16ExceptPolicy::option_schema(), &mixtrain::sdk::make_component<Bf16ExceptPolicy>}};
}

}  // namespace

MIXTRAIN_PLUGIN("bf16_except", "1.0.0", components)
