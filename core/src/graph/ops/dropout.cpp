#include "graph/ops/dropout.h"

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/random.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

namespace {
std::uint64_t node_seed(std::uint64_t run_seed, const std::string& node) {
  return derive_seed(run_seed, (node + ".dropout").c_str());
}

// sdk::dropout_keeps steps its state by this (2^64 / golden ratio) per element.
constexpr std::uint64_t kElementStep = 0x9E3779B97F4A7C15ull;

// a⁻¹ mod 2^64 for odd a by Newton's iteration (correct bits double: 3, 6, ..., 96).
constexpr std::uint64_t inverse_mod_2_64(std::uint64_t a) {
  std::uint64_t x = a;
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}

// The inverse of sdk::dropout_mix: each xor-shift undone by xoring in its shifts again, each
// multiply by the constant's inverse.
constexpr std::uint64_t dropout_unmix(std::uint64_t z) {
  z ^= (z >> 31) ^ (z >> 62);
  z *= inverse_mod_2_64(0x94D049BB133111EBull);
  z ^= (z >> 27) ^ (z >> 54);
  z *= inverse_mod_2_64(0xBF58476D1CE4E5B9ull);
  z ^= (z >> 30) ^ (z >> 60);
  return z;
}
static_assert(dropout_unmix(sdk::dropout_mix(0x0123456789ABCDEFull)) == 0x0123456789ABCDEFull);
static_assert(dropout_unmix(sdk::dropout_mix(~0ull)) == ~0ull);
}  // namespace

// dropout_keeps reads element i at state + (i + 1)·step, state = mix(seed ^ mix(stream + step)):
// a seed whose state is state + first·step reads element first + i there. mix is a bijection, so
// that seed exists and is unmix(state + first·step) ^ mix(stream + step). The backends need no
// offset argument, and first = 0 gives the key back.
sdk::DropoutKey dropout_key_from_element(sdk::DropoutKey key, std::uint64_t first) {
  if (first == 0) return key;
  const std::uint64_t stream_mix = sdk::dropout_mix(key.stream + kElementStep);
  const std::uint64_t state = sdk::dropout_mix(key.seed ^ stream_mix);
  return {dropout_unmix(state + first * kElementStep) ^ stream_mix, key.stream};
}

DropoutLayer::DropoutLayer(std::string name, std::int64_t features, float p)
    : Layer(std::move(name), "dropout", features, features), p_(p), seed_(node_seed(0, name_)) {
  // The mask comes from the key, so backward needs only dy.
  traits_.backward_reads_inputs = false;
  // The key holds the step and micro-batch (key), so a step graph cannot replay it.
  traits_.varies_per_step = p_ > 0.0f;
}

sdk::DropoutKey DropoutLayer::key(std::int64_t elements) const {
  const sdk::DropoutKey base{seed_, (static_cast<std::uint64_t>(step()) << 32) |
                                        static_cast<std::uint32_t>(micro_batch())};
  const SampleRange mine = samples();
  if (mine.first == 0 || mine.count <= 0) return base;
  const std::int64_t per_sample = elements / mine.count;
  return dropout_key_from_element(base, static_cast<std::uint64_t>(mine.first * per_sample));
}

void DropoutLayer::init_parameters(std::uint64_t seed) {
  seed_ = node_seed(seed, name_);
}

std::vector<BackendNeed> DropoutLayer::backend_needs(DType input) const {
  if (p_ == 0.0f) return {};  // never calls the facet
  const DType grad = storage_of(precision_.activation_grad);
  return {{sdk::DropoutOp::dropout_forward, {input, storage_of(precision_.activation)}},
          {sdk::DropoutOp::dropout_backward, {grad, grad}}};
}

void DropoutLayer::pass_through(TensorView from, TensorView to) {
  if (storage_of(from.dtype) == storage_of(to.dtype))
    backend_->copy(to, from);
  else
    backend_->cast(from, to);
}

void DropoutLayer::forward(TensorView x, std::int64_t rows) {
  const TensorView y = output(rows);
  if (!training() || p_ == 0.0f) {
    pass_through(x, y);
    return;
  }
  facets().call(sdk::DropoutOp::dropout_forward)->dropout_forward(x, y, p_, key(x.numel()));
}

void DropoutLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t) {
  if (dx.empty()) return;
  if (!training() || p_ == 0.0f) {
    pass_through(dy, dx);
    return;
  }
  facets().call(sdk::DropoutOp::dropout_backward)->dropout_backward(dy, dx, p_,
                                                                    key(dy.numel()));
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition dropout_op() {
  OpDefinition op;
  op.type = "dropout";
  op.keeps_layout = true;
  op.summary = "x · mask / (1 - p) in training (torch.nn.Dropout), x in evaluation";
  // Its mask comes from a key of the step, micro-batch and samples, which its backward reads
  // again: run again in that backward, it draws the same mask, and moves no generator state.
  op.recomputable = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::number("p", 0.5, "probability of zeroing an element, in [0, 1)")
            .at_least(0.0)
            .at_most(1.0)};
  };
  op.build = [](const OpNode& node) {
    const double p = node.options.get_double("p");
    if (p >= 1.0)
      throw OpSpecError("p", "p = 1 would zero every element, and scale by 1 / (1 - p) = inf",
                        "use a p below 1 (torch's default is 0.5), or remove the node");
    return BuiltOp{
        std::make_unique<DropoutLayer>(node.name, node.inputs[0].back(), static_cast<float>(p)),
        node.inputs[0]};
  };
  return op;
}

}  // namespace mixtrain::core
