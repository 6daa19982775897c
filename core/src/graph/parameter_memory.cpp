#include "mixtrain/core/graph/parameter_memory.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "graph/parameter_memory_json.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/quantized_weight.h"

namespace mixtrain::core {

namespace {
std::size_t bytes_of(const Tensor& t) {
  return t.empty() ? 0 : t.bytes();
}
}  // namespace

ParameterMemory measure_parameter_memory(const Model& model, std::size_t optimizer_state_bytes) {
  ParameterMemory m;
  m.optimizer_state_bytes = optimizer_state_bytes;
  for (const auto& layer : model.layers())
    for (const ModelParameter& p : layer->parameters()) {
      if (p.frozen) {
        m.frozen += p.numel();
        m.frozen_bytes += p.stored_bytes();
        if (p.quantized()) {
          m.quantized += p.numel();
          m.quantized_bytes += p.stored_bytes();
          m.quantized_format = p.quant.format;
          m.quantized_detail = format_detail(p.quant);
        }
        continue;
      }
      m.trainable += p.numel();
      m.master_bytes += bytes_of(p.master);
      m.gradient_bytes += bytes_of(p.grad);
      m.working_bytes += bytes_of(p.working);
    }
  return m;
}

std::string parameter_memory_line(const ParameterMemory& m) {
  using P = ParameterMemory;
  char quantized[200] = "";
  if (m.quantized > 0)
    std::snprintf(quantized, sizeof quantized, "; %lld of them %s at %.4f (%s)",
                  static_cast<long long>(m.quantized), format_label(m.quantized_format).c_str(),
                  P::per(m.quantized_bytes, m.quantized), m.quantized_detail.c_str());
  const double full = m.full_fine_tune_bytes();
  char line[640];
  std::snprintf(
      line, sizeof line,
      "# bytes per parameter: frozen base %.4f (%lld parameters%s); trainable %lld: masters %.2f, "
      "gradients %.2f, working copies %.2f, optimizer state %.2f; masters and optimizer state "
      "%.2f%% of a full fine-tune's\n",
      P::per(m.frozen_bytes, m.frozen), static_cast<long long>(m.frozen), quantized,
      static_cast<long long>(m.trainable), P::per(m.master_bytes, m.trainable),
      P::per(m.gradient_bytes, m.trainable), P::per(m.working_bytes, m.trainable),
      P::per(m.optimizer_state_bytes, m.trainable),
      full > 0 ? 100.0 * static_cast<double>(m.masters_and_state_bytes()) / full : 100.0);
  return line;
}

nlohmann::json parameter_memory_json(const ParameterMemory& m) {
  using P = ParameterMemory;
  const double full = m.full_fine_tune_bytes();
  nlohmann::json j = {{"frozen_parameters", m.frozen},
                      {"frozen_bytes", m.frozen_bytes},
                      {"trainable_parameters", m.trainable},
                      {"master_bytes", m.master_bytes},
                      {"gradient_bytes", m.gradient_bytes},
                      {"working_copy_bytes", m.working_bytes},
                      {"optimizer_state_bytes", m.optimizer_state_bytes},
                      {"bytes_per_parameter",
                       {{"frozen_base", P::per(m.frozen_bytes, m.frozen)},
                        {"masters", P::per(m.master_bytes, m.trainable)},
                        {"gradients", P::per(m.gradient_bytes, m.trainable)},
                        {"working_copies", P::per(m.working_bytes, m.trainable)},
                        {"optimizer_state", P::per(m.optimizer_state_bytes, m.trainable)}}},
                      {"full_fine_tune_masters_and_state_bytes", full},
                      {"masters_and_state_share_of_full_fine_tune",
                       full > 0 ? static_cast<double>(m.masters_and_state_bytes()) / full : 1.0}};
  if (m.quantized > 0) {
    // The format's key: "nf4", "fp8_block", "mxfp8".
    std::string key = frozen_format_name(m.quantized_format);
    std::replace(key.begin(), key.end(), '-', '_');
    j[key + "_parameters"] = m.quantized;
    j[key + "_bytes"] = m.quantized_bytes;
    j["bytes_per_parameter"][key] = P::per(m.quantized_bytes, m.quantized);
  }
  return j;
}

}  // namespace mixtrain::core
