"""Training steps of a 2-layer MLP under a block-scaled recipe, in NumPy, from the recipes'
published definitions (not from mixtrain's code): test_block_scaled_policies compares mixtrain's
CPU simulator with it.

The recipes (Transformer Engine's Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling; OCP MX
v1.0; NVIDIA's NVFP4): each GEMM operand is quantized in blocks along the dimension that GEMM
reduces over — forward y = x.W^T over `in`, dgrad dx = dy.W over `out`, wgrad dW = dy^T.x over the
batch rows — so x and dy are quantized once per pass that reads them, and 2-D weight blocks
(128x128, 16x16) serve forward and dgrad. A dimension the block does not divide is zero-padded.
The GEMMs multiply the dequantized blocks in float64; their fp32 outputs, the loss (fp32 logits,
float64 softmax cross-entropy) and SGD (fp32) are the base recipe "fp32".

NVFP4's random Hadamard transform (a case with "hadamard"): before the wgrad GEMM, dy and x are
each multiplied along the batch rows, per 16 rows (zero-padded), by the 16x16 matrix the case gives
for that layer and step (H.D/4, its signs drawn by mixtrain from the run's seed; the matrix is
data here), in float64 rounded to fp32, and then quantized.

Reads a JSON file {x: [N, IN], labels: [N], weights: {fc1.weight, fc1.bias, head.weight, head.bias},
head_scale, lr, steps, cases: [{name, recipe, options, frozen, hadamard?: [per step {fc1, head:
256 values}]}]} and prints
{"results": [{"name", "losses", "weights", "weights_unquantized"}]}: per case the loss of each step
and the weights after the last, with quantization and without it (the same steps in fp32).
"""
import json
import sys

import numpy as np

f32 = np.float32
FLT_MAX = np.finfo(np.float32).max

# Element formats: mantissa bits, smallest normal exponent, largest finite value, emax (OCP MX).
ELEMENTS = {
    "e4m3": (3, -6, 448.0, 8),
    "e5m2": (2, -14, 57344.0, 15),
    "e2m1": (1, 0, 6.0, 2),
}


def encode(v, element):
    """Round fp32 values to the element format: nearest even, saturating; as float64 values."""
    mbits, emin, largest, _ = ELEMENTS[element]
    a = np.abs(v.astype(np.float64))
    _, e = np.frexp(a)  # a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    e = np.maximum(np.where(a > 0, e - 1, emin), emin)
    quantum = np.ldexp(1.0, (e - mbits).astype(np.int64))
    r = np.minimum(np.round(a / quantum) * quantum, largest)  # np.round: half to even
    return np.copysign(r, v)


def blocks_of(x, br, bc):
    """x [R, C] zero-padded to whole blocks, as [R/br, C/bc, br, bc]."""
    r, c = x.shape
    rp, cp = -(-r // br) * br, -(-c // bc) * bc
    p = np.zeros((rp, cp), dtype=f32)
    p[:r, :c] = x
    return p.reshape(rp // br, br, cp // bc, bc).transpose(0, 2, 1, 3)


def unblock(b, shape):
    gr, gc, br, bc = b.shape
    return b.transpose(0, 2, 1, 3).reshape(gr * br, gc * bc)[: shape[0], : shape[1]]


def quantize(x, block, element, scale, power_of_two=False):
    """Dequantized values (float64) of x [R, C] quantized in blocks (br, bc)."""
    x = x.astype(f32)
    b = blocks_of(x, *block)
    amax = np.abs(b).max(axis=(2, 3)).astype(f32)
    largest = f32(ELEMENTS[element][2])
    with np.errstate(divide="ignore", over="ignore"):
        if scale == "fp32":  # TE's Float8BlockScaling: s = max / amax in fp32, decode 1/s
            s = np.where(amax > 0, largest / amax, f32(1)).astype(f32)
            s = np.where(np.isinf(s), FLT_MAX, s).astype(f32)
            if power_of_two:
                _, e = np.frexp(s)
                s = np.ldexp(f32(1), e - 1).astype(f32)
            decode = (f32(1) / s).astype(f32)
            codes = encode((b * s[:, :, None, None]).astype(f32), element)
            return unblock(codes * decode[:, :, None, None].astype(np.float64), x.shape)
        if scale in ("e8m0", "e8m0_round_up"):  # OCP MX: a power of two 2^k per block
            _, e = np.frexp(amax.astype(np.float64))
            k = (e - 1) - ELEMENTS[element][3]  # floor(log2 amax) - emax_elem
            if scale == "e8m0_round_up":  # TE's MXFP8: the smallest k that saturates nothing
                k = np.where(amax.astype(np.float64) > float(largest) * np.ldexp(1.0, k), k + 1, k)
            k = np.where(amax > 0, np.clip(k, -127, 127), -127)
            p = np.ldexp(1.0, k)[:, :, None, None]
            codes = encode((b.astype(np.float64) / p).astype(f32), element)
            return unblock(codes * p, x.shape)
        if scale == "nvfp4":  # E4M3 block scales under an fp32 tensor scale
            gamax = f32(np.abs(x).max())
            s_enc = f32(f32(6 * 448) / gamax) if gamax > 0 else f32(1)
            s_enc = FLT_MAX if np.isinf(s_enc) else s_enc
            s_dec = f32(f32(1) / s_enc)
            d = encode((amax * f32(s_enc * f32(1.0 / 6.0))).astype(f32), "e4m3").astype(f32)
            e = np.where(d > 0, np.minimum(f32(1) / (d * s_dec).astype(f32), FLT_MAX), f32(0))
            codes = encode((b * e.astype(f32)[:, :, None, None]).astype(f32), element)
            return unblock(codes * (d.astype(np.float64) * float(s_dec))[:, :, None, None], x.shape)
    raise ValueError(scale)


def hadamard_rows(t, m):
    """M.t per 16 rows of t [R, C], the rows zero-padded to a multiple of 16: fp32 [R16, C]."""
    r, c = t.shape
    r16 = -(-r // 16) * 16
    p = np.zeros((r16, c), dtype=np.float64)
    p[:r] = t
    out = np.einsum("ij,bjc->bic", m.astype(np.float64), p.reshape(r16 // 16, 16, c))
    return out.reshape(r16, c).astype(f32)


class Recipe:
    """The layout of each operand in each pass: q(role, pass, tensor) -> dequantized float64."""

    def __init__(self, recipe, options):
        self.recipe, self.options = recipe, options

    def q(self, role, gemm_pass, t):
        o = self.options
        # The dim this pass reduces over: forward and dgrad the operand's cols (x, dy) or W's
        # cols / rows; wgrad the batch rows of x and dy.
        along_rows = gemm_pass == "wgrad" or (role == "weight" and gemm_pass == "dgrad")
        if self.recipe == "fp8-block":
            block = (128, 128) if role == "weight" else ((128, 1) if along_rows else (1, 128))
            return quantize(t, block, "e4m3", "fp32", o.get("power_of_two_scales", True))
        if self.recipe == "mxfp8":
            element = "e5m2" if role == "grad_output" and o.get("fp8_format") == "hybrid" else "e4m3"
            rule = "e8m0" if o.get("scale_rule") == "ocp" else "e8m0_round_up"
            return quantize(t, (32, 1) if along_rows else (1, 32), element, rule)
        if self.recipe == "nvfp4":
            block = (16, 16) if role == "weight" else ((16, 1) if along_rows else (1, 16))
            return quantize(t, block, "e2m1", "nvfp4")
        raise ValueError(self.recipe)


class Exact:
    def q(self, role, gemm_pass, t):
        return t.astype(np.float64)


def train(d, case, recipe):
    n = len(d["labels"])
    x = np.array(d["x"], dtype=f32).reshape(n, -1)
    y = np.array(d["labels"], dtype=np.int64)
    w = {k: np.array(v, dtype=f32) for k, v in d["weights"].items()}
    w["fc1.weight"] = w["fc1.weight"].reshape(-1, x.shape[1])
    w["head.weight"] = w["head.weight"].reshape(-1, w["fc1.weight"].shape[0])
    alpha, lr = f32(d["head_scale"]), f32(d["lr"])
    frozen = set(case.get("frozen", []))
    q = recipe.q
    hadamard = case.get("hadamard") if isinstance(recipe, Recipe) else None
    losses = []
    for step in range(d["steps"]):
        def wgrad(layer, dy, inp):
            if hadamard is None:
                return q("grad_output", "wgrad", dy).T @ q("input", "wgrad", inp)
            m = np.array(hadamard[step][layer], dtype=np.float64).reshape(16, 16)
            return (q("grad_output", "wgrad", hadamard_rows(dy, m)).T
                    @ q("input", "wgrad", hadamard_rows(inp, m)))

        w1, b1, w2, b2 = w["fc1.weight"], w["fc1.bias"], w["head.weight"], w["head.bias"]
        # forward: y = alpha * (x . W^T) + b, fp32 outputs; relu on fc1
        z1 = (q("input", "forward", x) @ q("weight", "forward", w1).T).astype(f32) + b1
        h = np.maximum(z1, f32(0))
        z2 = (float(alpha) * (q("input", "forward", h) @ q("weight", "forward", w2).T)).astype(f32)
        z2 = z2 + b2
        # loss: mean softmax cross-entropy, its gradient in fp32
        z = z2.astype(np.float64)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(n), y]).mean()))
        p[np.arange(n), y] -= 1.0
        dz2 = (p / n).astype(f32)
        # head: dgrad over out, wgrad over the batch
        dh = (float(alpha) * (q("grad_output", "dgrad", dz2) @ q("weight", "dgrad", w2))).astype(f32)
        g = {
            "head.weight": float(alpha) * wgrad("head", dz2, h),
            "head.bias": dz2.astype(np.float64).sum(axis=0),
        }
        dz1 = np.where(h > 0, dh, f32(0)).astype(f32)
        g["fc1.weight"] = wgrad("fc1", dz1, x)
        g["fc1.bias"] = dz1.astype(np.float64).sum(axis=0)
        for k in w:
            if k not in frozen:
                w[k] = (w[k] - lr * g[k].astype(f32)).astype(f32)
    return losses, {k: v.reshape(-1).tolist() for k, v in w.items()}


with open(sys.argv[1]) as f:
    data = json.load(f)
results = []
for case in data["cases"]:
    losses, weights = train(data, case, Recipe(case["recipe"], case.get("options", {})))
    _, plain = train(data, case, Exact())
    results.append({"name": case["name"], "losses": losses, "weights": weights,
                    "weights_unquantized": plain})
print(json.dumps({"results": results}))
