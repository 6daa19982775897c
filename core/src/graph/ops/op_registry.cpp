#include "graph/ops/op_registry.h"

#include "config/reading.h"

namespace mixtrain::core {

namespace {
std::vector<OpDefinition>& op_table() {
  static std::vector<OpDefinition> table = {
      linear_op(),  relu_op(),        gelu_op(),      layernorm_op(),          add_op(),
      reshape_op(), flatten_op(),     embedding_op(), position_embedding_op(), attention_op(),
      conv2d_op(),  batchnorm2d_op(), maxpool2d_op(), avgpool2d_op(),          global_avgpool_op(),
      dropout_op(),
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

const OpDefinition& require_op(const LayerSpec& layer, const std::string& table,
                               const std::string& more_hint) {
  if (const OpDefinition* op = find_op(layer.type)) return *op;
  sdk::SourceLocation where = layer.where;
  for (const auto& o : layer.options)
    if (o.key == "type") where = o.where;
  const auto near = sdk::closest_match(layer.type, op_types());
  throw sdk::ConfigError(
      where, table + ".type",
      layer.type.empty() ? "missing layer type" : "unknown layer type '" + layer.type + "'",
      (near.empty() ? "" : "did you mean '" + near + "'? ") + "one of: " + join_names(op_types()) +
          more_hint);
}

const std::vector<std::string>& op_types() {
  auto& types = type_list();
  if (types.empty())
    for (const auto& op : op_table()) types.push_back(op.type);
  return types;
}

std::vector<std::string> recomputable_op_types() {
  std::vector<std::string> types;
  for (const auto& op : op_table())
    if (op.recomputable) types.push_back(op.type);
  return types;
}

}  // namespace mixtrain::core
