#include "ops/op_registry.h"

namespace mixtrain::core {

namespace {
std::vector<OpDefinition>& op_table() {
  static std::vector<OpDefinition> table = {
      linear_op(), relu_op(), gelu_op(), layernorm_op(), add_op(), reshape_op(), flatten_op(),
  };
  return table;
}
std::vector<std::string>& type_list() {
  static std::vector<std::string> types;
  return types;
}
}  // namespace

void register_op(OpDefinition op) {
  for (auto& existing : op_table())
    if (existing.type == op.type) {
      existing = std::move(op);
      type_list().clear();
      return;
    }
  op_table().push_back(std::move(op));
  type_list().clear();
}

const OpDefinition* find_op(std::string_view type) {
  for (const auto& op : op_table())
    if (op.type == type) return &op;
  return nullptr;
}

const std::vector<std::string>& op_types() {
  auto& types = type_list();
  if (types.empty())
    for (const auto& op : op_table()) types.push_back(op.type);
  return types;
}

}  // namespace mixtrain::core
