# Injects channel outliers into a GPT's weights without changing the function it computes:
# in every block, channels 0-7 of the layer norm feeding a GEMM (ln_1 before attn.c_attn, ln_2
# before mlp.c_fc) are multiplied by FACTOR (scale and shift), and the GEMM weight's columns of
# those channels divided by it. In exact arithmetic the model is the same; the GEMM inputs now hold
# 8 channels FACTOR times larger than the rest (the "massive activations" of large language
# models), and the weights 8 columns FACTOR times smaller.
#
#   python3 inject_outliers.py IN.safetensors FACTOR OUT.safetensors
# (mixtrain's native names and [out, in] linear weights, as `mixtrain export --format safetensors`
# writes them.)
import sys

from safetensors.numpy import load_file, save_file

src, factor, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
channels = list(range(8))
w = load_file(src)
blocks = sorted({k.split(".")[1] for k in w if k.startswith("h.")})
if not blocks:
    sys.exit(f"{src}: no h.<i>.* tensors: not a gpt-preset model's native safetensors")
for b in blocks:
    for ln, gemm in (("ln_1", "attn.c_attn"), ("ln_2", "mlp.c_fc")):
        for p in ("weight", "bias"):
            w[f"h.{b}.{ln}.{p}"][channels] *= factor
        w[f"h.{b}.{gemm}.weight"][:, channels] /= factor
save_file(w, out)
