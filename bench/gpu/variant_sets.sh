# The GPU kit's A/B variants (bench/gpu/README.md): each is a base policy and options, written
# <base>+<option>[+<option>...], which run_h200.sh's resnet50v and gpt2v stages run beside the base.
# Sourced by run_h200.sh and by tests/contracts/gpu_kit_variants_test.sh, which checks every
# default variant's options against the config schema (a misspelt key would cost a GPU run its
# row).
#
# variant_sets P prints the `--set` arguments of variant P, one per line; policy_name BASE the
# precision.policy a base stands for.
KIT_RN_VARIANTS="bf16+jpeg bf16+bf16sums bf16+convscratch bf16+convtune bf16+wgrad32 bf16+nofuse bf16+convaxpy bf16+floatpixels bf16+pageable bf16+nographs bf16+waited bf16+nondetconv bf16+tune"
KIT_GPT_VARIANTS="bf16+nopad fp8+headfp8 fp8+nogradcast fp8+mlpfp8 bf16+chunk2048 bf16+recompute bf16+recomputeblocks fp8+plaincast bf16+realign bf16+unfused bf16+nondet bf16+whole bf16+nofuse bf16+ln2pass bf16+nographs bf16+waited bf16+tune bf16+lora bf16+qlora fp8+stats"

policy_name() {
  case $1 in bf16) echo bf16-mixed ;; fp16) echo fp16-mixed ;; fp8) echo fp8-delayed ;; *) echo "$1" ;; esac
}

# <policy>[+nographs][+tune][+whole][+unfused][+nondet][+realign]: run.step_graphs = false
# (on CUDA the static step replays as a CUDA graph by default: what that gains);
# the cuda backend's gemm_autotune = 8; the logits computed whole (model.loss_chunk_rows =
# 0: the chunked loss's A/B); +chunk2048: the LM head's blocks of 2048 rows, not 1024 (its
# GEMMs twice as deep, at 2x the blocks' memory: toward 80 % of the square GEMM's rate); the unfused attention (flash's A/B); cuDNN's non-deterministic
# flash backward (deterministic_attention = false: what determinism costs); the LM head's
# GEMMs on padded rows (gemm_realign = true); +nopad: the LM head's blocks unpadded
# (model.loss_pad_classes = 0; on CUDA they are padded to 64 classes by default, 50257 ->
# 50304: what that gains); +headfp8: an FP8 policy's LM head in FP8 (a [[precision.override]];
# since session 59 the logits node computes in 16 bits by default, as Transformer Engine
# recipes keep the output layer, in the chunked loss's padded blocks: what that gains);
# +mlpfp8: FP8 in the MLP's linears only, attention's QKV and output projections in bf16
# (a [[precision.override]]: at 768 wide those GEMMs are a quarter of the MLP's each, and
# whether their FP8 saves more than their casts cost is what this answers);
# +nondetconv:
# cuDNN's heuristic order for the convolutions, non-deterministic engines included
# (deterministic_convolutions = false);
# +jpeg: the batches cut from JPEG files as ImageNet's are (data.source = "image_folder", its
# RandomResizedCrop on the host's decoding threads, one per core, on the loader thread while the
# GPU computes; $KIT_JPEG_DIR/train, which run_h200.sh writes: 1,024 500x375 JPEGs in 10 classes,
# the head still 1000 wide): what real images cost against the synthetic bytes of the base row,
# the question of issue 36's input pipeline;
# +floatpixels: the images decoded on the host and sent as fp32 (data.pixels = float32, the
# A/B of sending bytes and decoding them on the device); +pageable: the batches in
# ordinary memory, copied into the backend's pinned staging on the step's thread
# (data.pin_memory = false: what preparing them in page-locked memory gains); +nofuse: model.fuse_epilogues =
# false (batch norm + ReLU, add + ReLU and batch norm + add + ReLU unfused, and the linears'
# forward and backward epilogues: gelu, its gradient and the bias gradients; what they gain);
# +ln2pass: the layer norm's dgamma/dbeta as column sums in a pass of their own
# (layernorm_backward_one_pass = false: what the one-pass backward gains); +waited: the
# host waits for the gradient check before it queues the update (run.gated_update = false:
# what the gated update gains); +plaincast: FP8 operands cast alone, each GEMM transposing
# what it reads transposed (backend.cuda.fp8_cast_transpose = false: what the fused
# cast + transpose gains, and its memory); +nogradcast: an FP8 linear's bias gradient and its
# gelu's gradient as passes of their own before dy's cast (backend.cuda.fp8_gradient_cast =
# false: what folding them into the cast gains); +convaxpy: a block's first convolution writes
# its input gradient apart and an axpy adds it into the sum (conv_dgrad_accumulate = false:
# what the accumulating dgrad gains); +convtune: each convolution shape's fastest of the
# search's first 8 cuDNN engines (backend.cuda.conv_autotune = 8: what the engine choice
# costs, wgrad's first of all); +wgrad16: the weight gradient from cuDNN in bf16, rounded
# once as PyTorch AMP's is, then added into the FP32 gradient
# (backend.cuda.conv_wgrad_in_operand_dtype = true, which resnet50_sets sets on CUDA);
# +wgrad32: an FP32 dw from cuDNN (= false, the backend's default: what that choice gains);
# +bf16sums: a tensor read several times (a block's input) sums its gradient in bf16, as
# PyTorch AMP does (model.fp32_gradient_sums = false: half the bytes of each sum);
# +convscratch: cuDNN's workspaces in the backend's own scratch, held for the run
# (backend.cuda.conv_workspace = false: what planning them in the step's arena saves);
# +recompute: the gelu and layer norm outputs computed again for the backward instead of kept
# (model.recompute = ["gelu", "layernorm"]: the memory that saves and the time it costs);
# +recomputeblocks: every block computed again from its residual stream (model.recompute =
# ["layernorm", "linear", "attention", "gelu"], Hugging Face's gradient checkpointing);
# +lora: LoRA fine-tuning, rank 8 (alpha 16) on every linear of each block, the base frozen (PEFT's
# usual setup: what a fine-tune step costs against training every weight); +qlora: the same on an
# NF4 base decoded on the device before each GEMM (train.frozen_format = "nf4", QLoRA);
# +stats: a statistics step every 10 steps (run.underflow_every = 10, where the kit's base sets
# 0): FP8's per-operand saturation and underflow counts, and fp16's underflow pass, tallied on the
# device since session 86 (gradient_check 1.2) where they were read back to the host; what the
# default of 100 costs, ten times over.
variant_sets() {
  local p=$1 variant=()
  [[ $p == *+nographs* ]] && variant+=(--set run.step_graphs=false)
  [[ $p == *+tune* ]] && variant+=(--set backend.cuda.gemm_autotune=8)
  [[ $p == *+whole* ]] && variant+=(--set model.loss_chunk_rows=0)
  [[ $p == *+chunk2048* ]] && variant+=(--set model.loss_chunk_rows=2048)
  [[ $p == *+unfused* ]] && variant+=(--set model.gpt.fused_attention=false)
  # +nondet alone, not the +nondet of +nondetconv.
  [[ $p == *+nondet || $p == *+nondet+* ]] &&
    variant+=(--set backend.cuda.deterministic_attention=false)
  [[ $p == *+realign* ]] && variant+=(--set backend.cuda.gemm_realign=true)
  [[ $p == *+nopad* ]] && variant+=(--set model.loss_pad_classes=0)
  [[ $p == *+headfp8* ]] &&
    variant+=(--set 'precision.override=[{layers = "lm_head", gemm_input = "fp8_e4m3"}]')
  [[ $p == *+mlpfp8* ]] &&
    variant+=(--set 'precision.override=[{layers = "*.attn.c_*", gemm_input = "bf16"}]')
  [[ $p == *+nondetconv* ]] && variant+=(--set backend.cuda.deterministic_convolutions=false)
  [[ $p == *+floatpixels* ]] && variant+=(--set data.pixels=float32)
  [[ $p == *+jpeg* ]] &&
    variant+=(--set data.source=image_folder
      --set "data.image_folder.train=${KIT_JPEG_DIR:-/tmp/mixtrain-kit-jpeg}/train"
      --set "data.image_folder.size=${RN_IMAGE:-224}" --set data.classes=1000
      --set model.resnet.classes=1000
      --set data.normalize.from_training=false --set 'data.normalize.mean=[0.485, 0.456, 0.406]'
      --set 'data.normalize.std=[0.229, 0.224, 0.225]')
  [[ $p == *+pageable* ]] && variant+=(--set data.pin_memory=false)
  [[ $p == *+nofuse* ]] && variant+=(--set model.fuse_epilogues=false)
  [[ $p == *+ln2pass* ]] && variant+=(--set backend.cuda.layernorm_backward_one_pass=false)
  [[ $p == *+waited* ]] && variant+=(--set run.gated_update=false)
  [[ $p == *+plaincast* ]] && variant+=(--set backend.cuda.fp8_cast_transpose=false)
  [[ $p == *+nogradcast* ]] && variant+=(--set backend.cuda.fp8_gradient_cast=false)
  [[ $p == *+convaxpy* ]] && variant+=(--set backend.cuda.conv_dgrad_accumulate=false)
  [[ $p == *+convtune* ]] && variant+=(--set backend.cuda.conv_autotune=8)
  [[ $p == *+wgrad16* ]] && variant+=(--set backend.cuda.conv_wgrad_in_operand_dtype=true)
  [[ $p == *+wgrad32* ]] && variant+=(--set backend.cuda.conv_wgrad_in_operand_dtype=false)
  [[ $p == *+bf16sums* ]] && variant+=(--set model.fp32_gradient_sums=false)
  [[ $p == *+convscratch* ]] && variant+=(--set backend.cuda.conv_workspace=false)
  # +recompute alone, not the +recompute of +recomputeblocks.
  [[ $p == *+recompute || $p == *+recompute+* ]] &&
    variant+=(--set 'model.recompute=["gelu", "layernorm"]')
  [[ $p == *+recomputeblocks* ]] &&
    variant+=(--set 'model.recompute=["layernorm", "linear", "attention", "gelu"]')
  [[ $p == *+lora* || $p == *+qlora* ]] &&
    variant+=(--set model.lora.r=8 --set model.lora.alpha=16
      --set 'model.lora.targets=["h.*.attn.c_attn", "h.*.attn.c_proj", "h.*.mlp.c_fc", "h.*.mlp.c_proj"]')
  [[ $p == *+qlora* ]] && variant+=(--set train.frozen_format=nf4)
  [[ $p == *+stats* ]] && variant+=(--set run.underflow_every=10)
  ((${#variant[@]})) && printf '%s\n' "${variant[@]}"
  return 0
}
