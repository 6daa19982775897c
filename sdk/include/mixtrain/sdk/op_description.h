// OpDescription: what the host tells a precision policy about one op (node) of the model graph.
//
// Contract
// - name is the node's name, unique in the model; kind is its op ("linear", "relu", "gelu",
//   "layernorm", "add", "reshape", "flatten", "embedding", "position_embedding", "attention").
//   The loss (softmax cross-entropy) is computed by the host in FP32 and is not planned.
// - gemms lists the op's logical GEMMs in a fixed order. Each has a name unique within the op
//   (no '.'; a linear has one, "matmul") and the roles of the operands its products read: the
//   forward product reads input and weight, the data- and weight-gradient products read
//   grad_output with weight and input. An op without GEMMs has an empty list. A GEMM without a
//   weight operand multiplies activations (attention's q·kᵀ and P·v): FP8 recipes such as
//   Transformer Engine's keep those in 16 bits (reads_weight() tells them apart).
// - precision_sensitive is the op's own trait (normalisation statistics, softmax, loss,
//   reductions): the host keeps every tensor of such an op in FP32 whatever the policy plans,
//   so a policy needs no deny-list of op kinds; it may read the flag, e.g. to log the choice.
// - OperandSlot names one operand of one GEMM of one node: "<node>.<gemm>.<role>"
//   ("fc1.matmul.input"). It keys FP8 scaling state and the host's FP8 statistics.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mixtrain::sdk {

enum class OperandRole { input, weight, grad_output };
std::string_view operand_role_name(OperandRole r) noexcept;

struct GemmDescription {
  std::string name;                   // unique within the op, no '.': "matmul"
  std::vector<OperandRole> operands;  // roles its forward / dgrad / wgrad products read
  bool reads_weight() const {
    for (OperandRole r : operands)
      if (r == OperandRole::weight) return true;
    return false;
  }
};

struct OpDescription {
  std::string name;                    // node name, unique in the model ("fc1", "head")
  std::string kind;                    // "linear", "relu", "gelu", "layernorm", "add", ...
  std::int64_t in_features = 0;        // last dimension of the (first) input
  std::int64_t out_features = 0;       // last dimension of the output
  std::vector<GemmDescription> gemms;  // empty: the op runs no GEMM
  bool precision_sensitive = false;    // the host keeps the whole op in FP32
  bool has_gemm() const { return !gemms.empty(); }
  bool has_weight_gemm() const {
    for (const auto& g : gemms)
      if (g.reads_weight()) return true;
    return false;
  }
};

class OperandSlot {
 public:
  OperandSlot(std::string node, std::string gemm, OperandRole role)
      : node_(std::move(node)), gemm_(std::move(gemm)), role_(role) {
    name_ = node_ + "." + gemm_ + "." + std::string(operand_role_name(role_));
  }
  const std::string& node() const { return node_; }
  const std::string& gemm() const { return gemm_; }
  OperandRole role() const { return role_; }
  const std::string& name() const { return name_; }  // "<node>.<gemm>.<role>"

 private:
  std::string node_, gemm_;
  OperandRole role_;
  std::string name_;
};

}  // namespace mixtrain::sdk
