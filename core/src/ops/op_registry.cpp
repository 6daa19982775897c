#include "ops/op_registry.h"

namespace mixtrain::core {

namespace {
const std::vector<OpDefinition>& op_table() {
  static const std::vector<OpDefinition> table = {
      linear_op(), relu_op(), gelu_op(), layernorm_op(), add_op(), reshape_op(), flatten_op(),
  };
  return table;
}
}  // namespace

const OpDefinition* find_op(std::string_view type) {
  for (const auto& op : op_table())
    if (op.type == type) return &op;
  return nullptr;
}

const std::vector<std::string>& op_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> t;
    for (const auto& op : op_table()) t.push_back(op.type);
    return t;
  }();
  return types;
}

}  // namespace mixtrain::core
