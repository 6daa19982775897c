// PEFT adapters into a new run; see train/peft_import.h for the contract.
#include "train/peft_import.h"

#include <map>

#include "config/lora_section.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/graph/lora.h"

namespace mixtrain::core {

namespace {

// The tensor's values as FP32: fp16 and bf16 (a model saved in half precision) widen exactly.
// The safetensors reader hands every floating-point tensor over as FP32 (fp16, bf16 and fp8
// widened exactly): anything else is no adapter's.
void check_fp32(const sdk::HostTensor& t, const std::filesystem::path& file) {
  if (t.dtype != sdk::DType::fp32)
    throw sdk::CheckpointError(
        file.string() + ": tensor '" + t.name + "' is " + std::string(sdk::dtype_name(t.dtype)),
        "PEFT's adapters are floating point (fp32, fp16 or bf16); save the adapter again from a "
        "model in one of those");
}

}  // namespace

void load_peft_adapter(Trainer::State& s) {
  const PeftAdapterSource& source = s.e.from_peft;
  if (s.initial_adapters_from)
    throw sdk::ConfigError(
        source.where, "model.lora.from_peft",
        "checkpoint.init_from (" + s.initial_adapters_from->string() +
            ") holds trained LoRA adapters, and from_peft names others: the run would start "
            "from from_peft's, dropping the checkpoint's",
        "keep one: remove from_peft to start from the checkpoint's adapters, or start from a "
        "base without adapters (the base model, or the checkpoint folded with `mixtrain export "
        "CKPT --merge-lora`)");
  const PeftAdapterFolder adapter = open_peft_adapter_at(source);
  check_peft_agreement(s.e, adapter);
  const auto& file = adapter.weights_file;
  sdk::TrainingState st;
  try {
    st = weights_format_for(s.c, file).read(file);
  } catch (const sdk::CheckpointError& e) {
    throw sdk::CheckpointError(e.what(),
                               "save the adapter again with PeftModel.save_pretrained(folder, "
                               "safe_serialization=True)");
  }
  std::map<std::string, const sdk::HostTensor*> by_name;
  for (const auto& t : st.tensors) by_name[t.name] = &t;
  std::size_t loaded = 0;
  for (auto* p : s.model->parameters()) {
    if (!is_lora_parameter(p->name)) continue;
    const bool a = p->name.ends_with(".lora_A.weight");
    const std::string node =
        p->name.substr(0, p->name.size() - std::string(".lora_A.weight").size());
    const std::string name = peft_tensor_name(peft_module_name(node, source.gpt_modules),
                                              a ? LoraFactor::a : LoraFactor::b);
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw sdk::CheckpointError(
          file.string() + ": no tensor '" + name + "' for the adapter parameter '" + p->name + "'",
          "the folder's adapter_config.json adapts '" + node +
              "' but its weights do not: its two files are of different adapters; save the "
              "adapter again with PeftModel.save_pretrained");
    const sdk::HostTensor& t = *it->second;
    const auto expected = p->shape().to_vector();
    if (t.shape != expected) {
      // lora_A is [r, in], lora_B [out, r]: an r of its own is the folder's two files disagreeing.
      const std::size_t r_dim = a ? 0 : 1;
      const bool other_r = t.shape.size() == 2 && t.shape[r_dim] != expected[r_dim];
      throw sdk::CheckpointError(
          file.string() + ": tensor '" + name + "' has shape " +
              sdk::Shape::from_vector(t.shape).to_string() + " but the adapter parameter '" +
              p->name + "' expects " + p->shape().to_string(),
          other_r
              ? "its rank is not adapter_config.json's r = " + std::to_string(adapter.config.r) +
                    ": the folder's two files are of different adapters; save the adapter "
                    "again with PeftModel.save_pretrained"
              : "an adapter fits " + peft_base_model_text(adapter.config) +
                    ": start from that model ([model] from_pretrained)");
    }
    check_fp32(t, file);
    const auto* values = reinterpret_cast<const float*>(t.bytes.data());
    if (!p->master.empty())
      s.c.backend->copy_from_host(p->master.view(), values);
    else
      set_parameter_from_fp32(s.c.backend, *p, values);  // [train] frozen it
    by_name.erase(it);
    ++loaded;
  }
  if (!by_name.empty()) {
    std::string names;
    std::size_t shown = 0;
    for (const auto& [name, t] : by_name)
      if (shown++ < 4) names += (names.empty() ? "" : ", ") + name;
    if (by_name.size() > 4) names += ", … (" + std::to_string(by_name.size()) + " in all)";
    throw sdk::CheckpointError(
        file.string() + ": " + names +
            " match no adapter of this model, so they would be "
            "dropped",
        "mixtrain loads lora_A and lora_B of the linear modules adapter_config.json's "
        "target_modules names in this model: start from " +
            peft_base_model_text(adapter.config) +
            ", or merge an adapter with more into its base model in PEFT (merge_and_unload) "
            "and start from that folder ([model] from_pretrained)");
  }
  s.model->refresh_working_copies();
  reset_ema(s);  // the EMA of initial weights starts at them
  s.log.info("LoRA adapters loaded from " + source.folder.string() + " (" +
             std::to_string(loaded / 2) + " modules, PEFT layout)");
}

}  // namespace mixtrain::core
