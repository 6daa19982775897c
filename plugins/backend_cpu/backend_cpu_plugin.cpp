// Plugin entry point: exports one component, backend "cpu".
#include <memory>

#include "cpu_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace {

using namespace mixtrain;

std::unique_ptr<sdk::Component> create_cpu_backend(const sdk::Options& options,
                                                   const sdk::PluginContext& context) {
  const auto threads = static_cast<int>(options.get_int("threads"));
  const std::string bf16 = options.get_string("bf16_gemm");
  const auto path = bf16 == "onednn"     ? backend_cpu::Bf16GemmPath::onednn
                    : bf16 == "emulated" ? backend_cpu::Bf16GemmPath::emulated
                                         : backend_cpu::Bf16GemmPath::automatic;
  const std::string conv = options.get_string("bf16_conv");
  const auto conv_path = conv == "onednn"     ? backend_cpu::Bf16ConvPath::onednn
                         : conv == "emulated" ? backend_cpu::Bf16ConvPath::emulated
                                              : backend_cpu::Bf16ConvPath::automatic;
  const std::string algorithm = options.get_string("conv_algorithm");
  const auto conv_algorithm = algorithm == "winograd" ? backend_cpu::ConvAlgorithm::winograd
                                                      : backend_cpu::ConvAlgorithm::direct;
  auto backend =
      std::make_unique<backend_cpu::CpuBackend>(threads, path, conv_path, conv_algorithm);
  if (options.get_bool("flush_denormals")) backend->flush_denormals();
  backend->set_conv_workspace(options.get_bool("conv_workspace"));
  const std::string conv_gemm = options.get_string("conv_gemm");
  backend->set_conv_gemm(conv_gemm == "gemm"          ? backend_cpu::ConvGemm::gemm
                         : conv_gemm == "convolution" ? backend_cpu::ConvGemm::convolution
                                                      : backend_cpu::ConvGemm::automatic);
  const std::string flash = options.get_string("flash_products");
  backend->set_flash_products(flash == "bf16"   ? backend_cpu::FlashProductsChoice::bf16
                              : flash == "fp32" ? backend_cpu::FlashProductsChoice::fp32
                                                : backend_cpu::FlashProductsChoice::automatic);
  context.logger.debug("cpu backend with " + std::to_string(backend->threads()) +
                       " threads, bf16_gemm = " + bf16 + ", bf16_conv = " + conv);
  // Winograd changes the numbers: say what runs whenever it was asked for. The direct
  // convolution's layout (cpu_conv_algorithm.h) is the same sum in another order: debug only,
  // and its probe (a oneDNN primitive descriptor) runs only when debug lines are written.
  if (conv_algorithm == backend_cpu::ConvAlgorithm::winograd)
    context.logger.info(backend->conv_algorithm_note());
  else if (context.logger.enabled(sdk::LogLevel::debug))
    context.logger.debug(backend->conv_algorithm_note());
  // Likewise the gradients' route: the GEMM sums in another order.
  if (conv_gemm != "auto")
    context.logger.info(backend->conv_gemm_note());
  else if (context.logger.enabled(sdk::LogLevel::debug))
    context.logger.debug(backend->conv_gemm_note());
  // And flash attention's: rounding P and dS to bf16 changes the numbers.
  if (flash != "auto")
    context.logger.info(backend->flash_products_note());
  else
    context.logger.debug(backend->flash_products_note());
  return backend;
}

std::vector<sdk::ComponentInfo> backend_cpu_components() {
  return {{sdk::ComponentKind::backend,
           "cpu",
           "CPU reference backend: oneDNN fp32/bf16 GEMM and convolution, exact tf32/fp16/fp8 "
           "emulation, OpenMP kernels",
           {sdk::OptionSpec::integer("threads", 0,
                                     "OpenMP threads for GEMMs and kernels (0 = OMP_NUM_THREADS, "
                                     "else all cores)")
                .at_least(0)
                .at_most(4096),
            sdk::OptionSpec::string("bf16_gemm", "auto",
                                    "bf16 GEMM path: auto (by CPU features), onednn (oneDNN bf16 "
                                    "matmul), emulated (exact decode + fp32 GEMM)")
                .one_of({"auto", "onednn", "emulated"}),
            sdk::OptionSpec::string("bf16_conv", "auto",
                                    "bf16 convolution path: auto (by CPU features), onednn "
                                    "(oneDNN bf16 convolution), emulated (exact decode + fp32 "
                                    "convolution)")
                .one_of({"auto", "onednn", "emulated"}),
            sdk::OptionSpec::string("conv_algorithm", "direct",
                                    "fp32 convolution algorithm: direct (the reference), winograd "
                                    "(oneDNN's Winograd F(4,3) for fp32 3x3 stride-1 convolutions "
                                    "where it pays, direct elsewhere; rounds differently)")
                .one_of({"direct", "winograd"}),
            sdk::OptionSpec::boolean(
                "flush_denormals", false,
                "flush subnormal floats (below 1.2e-38) to zero on the backend's threads, as "
                "torch.set_flush_denormal(True): x86 computes with them on a slow path, and a "
                "converged run (gradients near 0) ran 4-5x slower without it"),
            sdk::OptionSpec::boolean(
                "conv_workspace", true,
                "take a convolution's scratch (operands decoded to fp32, the fp32 output, "
                "blocked layouts) from the host's step memory, live at the op's step only; false "
                "keeps it in the backend's own buffers, grown to the largest call and held"),
            sdk::OptionSpec::string(
                "conv_gemm", "auto",
                "convolutions as one GEMM: auto (weight gradients dy^T cols, x's pixels "
                "gathered first past a 1x1 stride-1 kernel, of bf16 1x1 and wide 3x3 "
                "convolutions, the data gradients of bf16 unpadded 1x1 convolutions, added "
                "into an fp32 sum or not, and the forwards of bf16 unpadded 1x1 convolutions on "
                "7x7 maps, where the CPU has AMX-BF16: measured 1.1-5.1x faster there; oneDNN's "
                "convolution elsewhere), gemm (always the GEMM), convolution (never)")
                .one_of({"auto", "gemm", "convolution"}),
            sdk::OptionSpec::string(
                "flash_products", "auto",
                "flash attention's tile products: auto (bf16 for bf16 q, k and v where the CPU "
                "has AMX-BF16, P and dS rounded to bf16 as GPU flash attention does: measured "
                "3.5x faster products there; FP32 elsewhere), bf16 (always, for bf16 q, k, v), "
                "fp32 (exact FP32 products of the stored values)")
                .one_of({"auto", "bf16", "fp32"})},
           &create_cpu_backend}};
}

}  // namespace

MIXTRAIN_PLUGIN("backend_cpu", "0.1.0", backend_cpu_components)
