#include "mixtrain/core/graph/model_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "config/reading.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/memory_plan.h"

namespace mixtrain::core {

namespace {

std::string dtype_text(sdk::DType t) {
  return std::string(sdk::dtype_name(t));
}

std::string bytes_text(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// "# trainable: 330 parameters in 2 tensors, 2.58 KiB <what>:" and the tensors' names, wrapped.
std::string share_lines(const char* what, const ModelSummary::Share& share,
                        const std::string& bytes_are) {
  std::string out = "# " + std::string(what) + ": " +
                    count_text(static_cast<double>(share.parameters)) + " parameters in " +
                    std::to_string(share.names.size()) + " tensor" +
                    (share.names.size() == 1 ? "" : "s") + ", " + bytes_text(share.bytes) + " " +
                    bytes_are + ":\n";
  std::string line = "#  ";
  for (std::size_t i = 0; i < share.names.size(); ++i) {
    const std::string name = " " + share.names[i] + (i + 1 < share.names.size() ? "," : "");
    if (line.size() + name.size() > 100 && line.size() > 3) {
      out += line + "\n";
      line = "#  ";
    }
    line += name;
  }
  return out + line + "\n";
}

// A node's input shapes per sample, separated by spaces.
std::string inputs_text(const NodeSummary& n) {
  std::string inputs;
  for (const auto& in : n.input_shapes) inputs += (inputs.empty() ? "" : " ") + ops::shape_text(in);
  return inputs;
}

}  // namespace

std::string count_text(double v) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.2f%s", v, units[u]);
  return buf;
}

ModelSummary summarize_model(const Model& model, std::int64_t batch_rows,
                             std::int64_t micro_batches) {
  ModelSummary s;
  s.batch_rows = batch_rows;
  s.micro_batches = micro_batches;
  const auto& layers = model.layers();
  // Whose forward runs again: a recomputed sum of linears runs its linears' GEMMs again too.
  std::vector<bool> recomputed(layers.size(), false);
  for (const RecomputedOutput& r : plan_recomputation(model.plan(), layers)) {
    recomputed[r.node] = true;
    for (const std::size_t q : r.inputs_run) recomputed[q] = true;
    const Layer& l = *layers[r.node];
    s.recomputed.push_back(l.name());
    // A sum recomputed with its linears counts under their type, the one model.recompute names.
    const std::string& type =
        l.recomputes_output()
            ? l.type()
            : layers[model.plan().root(model.plan().node(r.node).inputs.front()).position()]
                  ->type();
    if (std::find(s.recomputed_types.begin(), s.recomputed_types.end(), type) ==
        s.recomputed_types.end())
      s.recomputed_types.push_back(type);
    s.recomputed_bytes +=
        l.planned_output_bytes(batch_rows * model.plan().node(r.node).rows_per_sample);
  }
  // Whether each parameter trains, by name: a tied one (an lm_head reading wte) is its owner's.
  std::map<std::string, bool> trains_by_name;
  for (const auto& l : layers)
    for (const auto& p : l->parameters()) trains_by_name[p.name] = !p.frozen;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = *layers[i];
    NodeSummary n;
    n.name = l.name();
    n.op = l.type();
    const GraphPlan& plan = model.plan();
    for (TensorId t : plan.node(i).inputs)
      n.input_shapes.push_back(t.is_node() ? plan.node(t.position()).shape
                               : plan.input().sample_shape.empty()
                                   ? std::vector<std::int64_t>{model.input_features()}
                                   : plan.input().sample_shape);
    n.output_shape = plan.node(i).shape;
    std::int64_t rows_per_sample = 1;
    for (std::size_t d = 0; d + 1 < n.output_shape.size(); ++d)
      rows_per_sample *= n.output_shape[d];
    n.forward_flops_per_sample = l.forward_flops_per_row() * rows_per_sample;
    for (const auto& p : l.parameters()) {
      const auto numel = p.numel();
      n.parameters += numel;
      // A frozen parameter is its one stored copy; a trainable one adds a master and a gradient.
      const std::size_t bytes = p.frozen ? p.stored_bytes()
                                         : static_cast<std::size_t>(numel) * 8 +
                                               (p.working.empty() ? 0 : p.working.bytes());
      s.parameter_bytes += bytes;
      ModelSummary::Share& share = p.frozen ? s.frozen : s.trainable;
      share.names.push_back(p.name);
      share.parameters += numel;
      share.bytes += bytes;
      if (p.quantized()) {
        s.quantized_parameters += numel;
        s.quantized_label = format_label(p.quant.format);
      }
    }
    n.precision = l.precision();
    s.parameters += n.parameters;
    s.forward_flops_per_sample += n.forward_flops_per_sample;
    // The backward Executor::backward runs for this node (the contract's rule).
    const PlannedNode& planned = model.plan().node(i);
    const std::int64_t f = n.forward_flops_per_sample;
    std::int64_t backward = 0;
    if (planned.needs_grad) {
      bool input_grad = false;
      for (TensorId t : planned.inputs)
        input_grad = input_grad || model.plan().needs_grad(model.plan().root(t));
      // A weight gradient runs where a weight (not a bias: a column sum, no GEMM) trains, the
      // op's own or one it reads from another (a tie).
      bool weights = false, trains = false;
      for (const auto& p : l.parameters()) {
        weights = true;
        trains = trains || (!p.frozen && !p.name.ends_with(".bias"));
      }
      for (const auto& shared : l.shared_parameters()) {
        weights = true;
        const auto it = trains_by_name.find(shared.source);
        trains = trains || (it != trains_by_name.end() && it->second);
      }
      backward = weights ? (trains ? f : 0) + (input_grad ? f : 0) : (input_grad ? 2 * f : 0);
    }
    s.training_flops_per_sample += f + backward + (recomputed[i] ? f : 0);
    s.nodes.push_back(std::move(n));
  }
  s.training_flops_per_step = s.training_flops_per_sample * batch_rows * micro_batches;
  const auto plan = model.plan_activations(batch_rows);
  s.activation_bytes = plan.arena_bytes;
  s.activation_bytes_unplanned = plan.sum_bytes;
  s.activation_bytes_fp32 = model.plan_activations(batch_rows, sdk::DType::fp32).arena_bytes;
  return s;
}

std::string node_shapes_text(const NodeSummary& n) {
  return inputs_text(n) + " -> " + ops::shape_text(n.output_shape);
}

std::string render_model_summary(const ModelSummary& s) {
  std::string out = "# model:\n";
  char line[512];
  std::snprintf(line, sizeof line, "#   %-16s %-10s %-24s %-12s %10s %12s  %s\n", "node", "op",
                "inputs", "output", "params", "FLOPs/sample", "weight/gemm_in/act/act_grad");
  out += line;
  for (const auto& n : s.nodes) {
    const std::string inputs = inputs_text(n);
    const auto& p = n.precision;
    std::snprintf(line, sizeof line, "#   %-16s %-10s %-24s %-12s %10s %12s  %s/%s/%s/%s\n",
                  n.name.c_str(), n.op.c_str(), inputs.c_str(),
                  ops::shape_text(n.output_shape).c_str(),
                  n.parameters ? count_text(static_cast<double>(n.parameters)).c_str() : "-",
                  count_text(static_cast<double>(n.forward_flops_per_sample)).c_str(),
                  dtype_text(p.weight).c_str(), dtype_text(p.gemm_input).c_str(),
                  dtype_text(p.activation).c_str(), dtype_text(p.activation_grad).c_str());
    out += line;
  }
  std::snprintf(
      line, sizeof line,
      "# totals: %s parameters (%lld), %s forward FLOPs per sample, %s FLOPs per "
      "training step (batch %lld%s, the forward and the backward that runs)\n",
      count_text(static_cast<double>(s.parameters)).c_str(), static_cast<long long>(s.parameters),
      count_text(static_cast<double>(s.forward_flops_per_sample)).c_str(),
      count_text(static_cast<double>(s.training_flops_per_step)).c_str(),
      static_cast<long long>(s.batch_rows),
      s.micro_batches > 1 ? (" x " + std::to_string(s.micro_batches) + " micro-batches").c_str()
                          : "");
  out += line;
  const double saved = s.activation_bytes_fp32 > 0
                           ? 100.0 * (1.0 - static_cast<double>(s.activation_bytes) /
                                                static_cast<double>(s.activation_bytes_fp32))
                           : 0.0;
  // Activations alone: a run's whole memory (optimizer state, the step's buffers, the backend's
  // scratch) is `check`'s memory report, train/memory_report.h.
  std::snprintf(line, sizeof line,
                "# planned activation memory (activations alone, batch %lld): %s under this "
                "policy (%s in fp32, %.0f%% saved; %s without reuse); weights, their gradients "
                "and working copies: %s\n",
                static_cast<long long>(s.batch_rows), bytes_text(s.activation_bytes).c_str(),
                bytes_text(s.activation_bytes_fp32).c_str(), saved,
                bytes_text(s.activation_bytes_unplanned).c_str(),
                bytes_text(s.parameter_bytes).c_str());
  out += line;
  if (!s.recomputed.empty()) {
    const std::string types = join_names(s.recomputed_types);
    std::snprintf(line, sizeof line,
                  "# recomputed for the backward (model.recompute): %zu %s outputs, %s at batch "
                  "%lld not kept past their forward reads; each is computed again just before "
                  "the first backward that reads it\n",
                  s.recomputed.size(), types.c_str(), bytes_text(s.recomputed_bytes).c_str(),
                  static_cast<long long>(s.batch_rows));
    out += line;
  }
  if (!s.frozen.names.empty()) {
    out += share_lines("trainable", s.trainable,
                       "of FP32 masters, gradients and working copies, plus the optimizer's state");
    out += share_lines("frozen", s.frozen,
                       s.quantized_parameters > 0
                           ? "stored once, linear weights as " + s.quantized_label + " (" +
                                 std::to_string(s.quantized_parameters) +
                                 " parameters), the rest in the dtype their ops compute with; no "
                                 "weight gradient, FP32 master or optimizer state"
                           : "stored once in the dtype their ops compute with; no weight "
                             "gradient, FP32 master or optimizer state");
  }
  return out;
}

}  // namespace mixtrain::core
