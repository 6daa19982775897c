// Model presets: a whole architecture from a few sizes, expanded into the model's op nodes.
//
// Contract
// - gpt_preset(): a GPT-2-style decoder ([model] preset = "gpt", sizes in [model.gpt]) as graph
//   nodes named exactly as Hugging Face GPT-2's modules, so parameter names need no mapping:
//   wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, h.<i>.attn, h.<i>.attn.c_proj, h.<i>.ln_2,
//   h.<i>.mlp.c_fc, h.<i>.mlp.gelu, h.<i>.mlp.c_proj, ln_f, and lm_head (no bias, tied to
//   wte.weight). Pre-LN blocks with residual adds (h.<i>.residual_1/2); GELU (tanh); init as
//   GPT-2: N(0, 0.02²), the residual projections N(0, (0.02/√(2·n_layer))²), biases 0.
// - Every node carries `where` (the [model.gpt] table) and `table` ("model.gpt"), so plan-time
//   errors point there; an option made from a size the config gives (LayerSpec::preset_keys)
//   carries that key's location instead, so an error about it points at the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/config/host_schemas.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

// What the gpt preset fixes rather than configures, for exports that must state it (Hugging
// Face's config.json): every LayerNorm's eps, and that it has no dropout.
inline constexpr double kGptLayerNormEps = 1e-5;
inline constexpr double kGptDropout = 0.0;

struct GptPreset {
  std::int64_t n_layer = 0, n_head = 0, n_embd = 0;
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 0;  // positions of wpe; 0: the data's block_size
  bool bias = true;
  bool fused_attention = true;  // false: every attention node gets fused = false
  sdk::SourceLocation where;
  // Where each [model.gpt] size the config gives was written (a --set names itself): a node's
  // error about an option made from a size (wpe's positions from block_size) points there.
  std::map<std::string, sdk::SourceLocation> key_where;
};

std::vector<LayerSpec> gpt_preset(const GptPreset& preset);

// - resnet_preset(): a ResNet of torchvision's BasicBlocks or Bottlenecks ([model] preset =
//   "resnet", sizes in [model.resnet], block = "basic" | "bottleneck"), nodes named as
//   torchvision's modules so parameter and buffer names need no mapping: conv1, bn1, relu,
//   (maxpool), then per block layer<s>.<b>.
//     basic:      {conv1 (3×3, stride), bn1, relu1, conv2 (3×3), bn2, add, relu2}
//     bottleneck: {conv1 (1×1), bn1, relu1, conv2 (3×3, stride), bn2, relu2, conv3 (1×1, 4·width),
//                  bn3, add, relu3} — torchvision's v1.5: the stride on conv2, expansion 4,
//   layer<s>.<b>.downsample.{0, 1} (a 1×1 conv with the block's stride + BN shortcut where the
//   stride or the channel count changes: "option B"; in a bottleneck net also layer1.0, whose
//   input has the stem's channels, not 4·width), avgpool (global), fc. Stage s > 1 starts with
//   stride 2. The relu/add nodes hold no tensors; their names are the preset's own.
//   Convolutions have no bias and torchvision's init (kaiming normal, fan_out); batch norm
//   γ = 1, β = 0 (no zero-init of the last BN of a block: torchvision's default); fc PyTorch's
//   nn.Linear default. ResNet-50 is blocks [3, 4, 6, 3], widths [64, 128, 256, 512], imagenet stem,
//   bottleneck: 25,557,032 parameters with 1000 classes, torchvision.models.resnet50's.
//   stem "cifar": 3×3 conv, stride 1 (ResNet-20/56 on 32×32); "imagenet": 7×7 conv, stride 2,
//   then a 3×3 max pool, stride 2 (ResNet-18/34/50).
struct ResNetPreset {
  std::vector<std::int64_t> blocks;  // blocks per stage
  std::vector<std::int64_t> widths;  // a stage's 3×3 channels; a bottleneck's output is 4× that
  ResNetBlock block = schema_default_choice(resnet_preset_schema(), "block", kResNetBlocks);
  ResNetStem stem = schema_default_choice(resnet_preset_schema(), "stem", kResNetStems);
  // 0: widths[0].
  std::int64_t stem_width = schema_default_int(resnet_preset_schema(), "stem_width");
  std::int64_t classes = schema_default_int(resnet_preset_schema(), "classes");
  sdk::SourceLocation where;
};

std::vector<LayerSpec> resnet_preset(const ResNetPreset& preset);

}  // namespace mixtrain::core
