// The option schema of the CUDA backend, header-only: the plugin module declares it without
// linking the CUDA libraries, which load only when a CUDA backend is created.
#pragma once

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>

#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::backend_cuda {

inline sdk::OptionSchema cuda_backend_option_schema() {
  return {
      sdk::OptionSpec::integer(
          "device", 0,
          "CUDA device index (as CUDA_VISIBLE_DEVICES numbers them); when not set, a rank "
          "that an MPI launcher started takes its local rank's GPU (the local rank modulo "
          "the visible devices), else device 0")
          .at_least(0)
          .at_most(1023),
      sdk::OptionSpec::boolean(
          "fp8_fast_accumulation", false,
          "FP8 GEMMs without cuBLASLt's periodic promotion of the accumulator to FP32 "
          "(CUBLASLT_MATMUL_DESC_FAST_ACCUM): faster on Hopper, less exact"),
      sdk::OptionSpec::integer(
          "gemm_autotune", 0,
          "0: every GEMM shape runs cuBLASLt's first heuristic algorithm (reproducible); N >= "
          "2: at a shape's first run, time the heuristic's first N algorithms on the real "
          "operands and keep the fastest (like cudnn.benchmark; 8 is a good N)")
          .at_least(0)
          .at_most(64),
      sdk::OptionSpec::integer(
          "conv_autotune", 0,
          "0: every convolution shape runs the first cuDNN engine the search accepts "
          "(reproducible); N >= 2: at a shape's first run, time the search's first N "
          "engines on the real operands and keep the fastest (cudnn.benchmark's choice; "
          "deterministic ones only while deterministic_convolutions is on)")
          .at_least(0)
          .at_most(64),
      sdk::OptionSpec::boolean(
          "deterministic_attention", true,
          "flash attention's backward (cuDNN's SDPA) on its deterministic kernels: the same "
          "bits on every run, which bit-exact resume needs; false lets cuDNN pick its "
          "faster kernels that accumulate dq with atomics"),
      sdk::OptionSpec::boolean(
          "gemm_realign", false,
          "large 16-bit GEMMs whose rows are not 16 bytes apart (the LM head's odd "
          "vocabulary, 50257) run on copies with padded rows, so cuBLASLt takes its Tensor "
          "Core kernels; off until measured on a GPU (bench/gpu, variant +realign)"),
      sdk::OptionSpec::boolean(
          "deterministic_convolutions", true,
          "convolutions on cuDNN's deterministic engines first (the same bits on every "
          "run, which bit-exact resume needs); false takes cuDNN's heuristic order, "
          "non-deterministic engines included, as PyTorch does by default"),
      sdk::OptionSpec::boolean(
          "layernorm_backward_one_pass", true,
          "the layer norm's backward sums dgamma and dbeta in the pass that writes dx (one "
          "read of dy and x); false runs the column sums as a pass of their own first (the "
          "A/B of bench/gpu, variant +ln2pass); both are deterministic"),
      sdk::OptionSpec::boolean(
          "fp8_cast_transpose", true,
          "an FP8 operand's cast also writes its transpose in the same pass (gemm facet "
          "1.6), so the backward's GEMMs read x, dy and W transposed without a transpose "
          "kernel each; false casts only and lets each GEMM transpose (the A/B of "
          "bench/gpu, variant +plaincast); the same bits either way"),
      sdk::OptionSpec::boolean(
          "fp8_gradient_cast", true,
          "an FP8 gradient's cast also sums the bias gradient and, after a gelu its linear "
          "runs as an epilogue, computes that gelu's gradient, in the same pass (gemm facet "
          "1.7); false runs them as passes of their own (the A/B of bench/gpu, variant "
          "+nogradcast); the same codes, the bias gradients summed in another order; needs "
          "fp8_cast_transpose"),
      sdk::OptionSpec::boolean(
          "conv_dgrad_accumulate", true,
          "a convolution adds its data gradient into the FP32 sum of a tensor read several "
          "times (convolution facet 1.1; a pointwise one on 16-bit operands as one cuBLASLt "
          "GEMM with beta = 1, others cuDNN's beta = 1 where a mode A engine takes it, else "
          "its usual dgrad into scratch and one add); false writes it apart for the host's axpy "
          "(the A/B of bench/gpu, variant +convaxpy)"),
      sdk::OptionSpec::boolean(
          "conv_wgrad_in_operand_dtype", false,
          "a convolution on bf16 or fp16 operands takes its weight gradient from cuDNN in "
          "that dtype (its FP32 sum rounded once, as PyTorch AMP's dw is) and adds it into "
          "the FP32 gradient, for cuDNN's engines with a 16-bit output (heuristics mode A "
          "has none for an FP32 dw from 16-bit operands: its fallback engine took 31 of "
          "ResNet-50's 67 ms a step on an H200: a CNN trained in bf16 wants it on); false "
          "keeps dw FP32 and unrounded, as the conformance suite holds it"),
      sdk::OptionSpec::boolean(
          "conv_workspace", true,
          "a convolution takes cuDNN's workspace and its route's scratch from the host's step "
          "memory, live at the op's step only (convolution facet 1.2: ResNet-50's stem wants "
          "103 MB); false keeps them in the backend's own scratch, grown to the largest call and "
          "held (the A/B of bench/gpu, variant +convscratch); the same plans either way, except "
          "that conv_autotune in the caller's workspace times only the candidates that fit it")};
}

struct LocalRank {
  int rank;
  const char* variable;  // the environment variable it came from
};

// The options' values as the runtime library takes them.
struct CudaOptions {
  int device = 0;
  bool device_from_local_rank = false;  // device is the local rank: the runtime takes it modulo
  bool fp8_fast_accumulation = false;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM on native FP8 GEMMs
  int gemm_autotune = 0;               // GemmTuning::autotune_candidates; 0 or 1: off
  bool gemm_realign = false;           // GemmTuning::realign
  bool deterministic_attention = true;
  bool deterministic_convolutions = true;
  bool layernorm_backward_one_pass = true;  // cuda_layer_norm_plan.h
  bool fp8_cast_transpose = true;           // gemm facet 1.6's cast_transpose offered
  bool fp8_gradient_cast = true;            // gemm facet 1.7's cast_transpose_gradient offered
  bool conv_dgrad_accumulate = true;        // convolution facet 1.1's accumulating dgrad offered
  int conv_autotune = 0;                    // ConvPlans' candidates timed per key; 0 or 1: off
  bool conv_wgrad_in_operand_dtype = false;  // conv::conv_routes' 16-bit dw route first
  bool conv_workspace = true;  // convolution facet 1.2: the caller's workspace asked for
  sdk::Logger logger{};  // the plugin context's: for what the backend says once (a hint)
};

// The options set to values that let two runs of one config differ in their last bits, each as
// "name = value", joined by ", "; "" when none is. Timed choices (autotuning picks whichever
// candidate measured fastest in this process) and cuDNN's non-deterministic kernels: bit-exact
// resume and run-to-run comparisons need the defaults, so the plugin says so once at creation.
inline std::string irreproducible_options(const CudaOptions& o) {
  std::string out;
  const auto add = [&out](const std::string& item) { out += (out.empty() ? "" : ", ") + item; };
  if (o.gemm_autotune >= 2) add("gemm_autotune = " + std::to_string(o.gemm_autotune));
  if (o.conv_autotune >= 2) add("conv_autotune = " + std::to_string(o.conv_autotune));
  if (!o.deterministic_attention) add("deterministic_attention = false");
  if (!o.deterministic_convolutions) add("deterministic_convolutions = false");
  return out;
}

// This process's rank among the ranks of its node, as launchers export it (Open MPI's
// OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID, torchrun's
// LOCAL_RANK, first found first); nullopt when none holds a non-negative integer. With `device`
// unset, each rank of a multi-GPU node then takes a GPU of its own, as the nccl communicator
// expects, where device 0 for every rank would put them all on one GPU (NCCL refuses that).
inline std::optional<LocalRank> local_rank_from_environment() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int rank = -1;
    const char* end = value + std::strlen(value);
    const auto [stop, ec] = std::from_chars(value, end, rank);
    if (ec == std::errc{} && stop == end && rank >= 0) return LocalRank{rank, name};
  }
  return std::nullopt;
}

// The runtime library's entry point: builds a CudaBackend from `options`, or returns null and
// writes the reason (CUDA's error text) and a hint into `error` and `hint` (each `size` bytes,
// NUL-terminated, truncated). C linkage and no exceptions across the dlopen boundary; the module
// and the runtime library are built together, so this signature (CudaOptions included) is private.
// The symbol's name changes with the signature, so a stale runtime library is refused by name
// instead of being called with the wrong arguments.
using CreateCudaBackendFn = void* (*)(const CudaOptions* options, char* error, char* hint,
                                      unsigned long size);
inline constexpr const char* kCreateCudaBackendSymbol = "mixtrain_backend_cuda_create_v9";
inline constexpr const char* kCudaRuntimeLibrary = "backend_cuda/libmixtrain_backend_cuda_runtime.so";

}  // namespace mixtrain::backend_cuda
