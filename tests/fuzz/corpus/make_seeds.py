#!/usr/bin/python3
"""Writes the fuzz harnesses' seed corpora: a few small valid inputs and near-valid variants.

    /usr/bin/python3 tests/fuzz/corpus/make_seeds.py     (re-run after changing a format)

Deterministic: the same files every run, so the committed corpora only change with this script.
Input shapes are the harnesses' (see each tests/fuzz/fuzz_<name>.cpp).
"""
import gzip
import io
import json
import pathlib
import struct
import zlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]


def put(harness, name, data):
    d = HERE / harness
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# ---- config: TOML, optionally "#--set" and override lines ------------------------------------
quick = (REPO / "configs/quickstart.toml").read_text()
put("fuzz_config", "quickstart.toml", quick)
put("fuzz_config", "quickstart_set.toml",
    quick + "#--set\noptimizer.type=sgd\noptimizer.lr=0.05\nmodel.layers.0.out=64\n")
for cfg in ["mlp-bf16.toml", "mlp-fp8.toml", "mlp-fp16.toml"]:
    put("fuzz_config", cfg, (REPO / "configs" / cfg).read_text())
put("fuzz_config", "minimal.toml",
    '[model]\nlayers = [{ type = "linear", out = 4 }]\n[data]\nsource = "synthetic"\n')
put("fuzz_config", "npy_data.toml",
    '[model]\nlayers = [{ type = "linear", out = 3 }]\n'
    '[data]\nsource = "npy"\n[data.npy]\nfeatures = "x.npy"\nlabels = "y.npy"\n'
    "#--set\ndata.npy.classes=3\nscaler.type=dynamic\n")
put("fuzz_config", "bad_override.toml", "[run]\nsteps = 1\n#--set\nmodel.layers.9999.out=5\n")


# ---- npy: features file, "--labels--\n", labels file ------------------------------------------
def npy(arr):
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
y = np.array([0, 1, 2, 1], dtype=np.int64)
put("fuzz_npy", "f32_i64.bin", npy(x) + b"--labels--\n" + npy(y))
put("fuzz_npy", "f64_u8.bin", npy(x.astype(np.float64)) + b"--labels--\n" + npy(y.astype(np.uint8)))
put("fuzz_npy", "rank3_i32col.bin",
    npy(x.reshape(4, 3, 1)) + b"--labels--\n" + npy(y.astype(np.int32).reshape(4, 1)))
put("fuzz_npy", "truncated.bin", npy(x)[:-5] + b"--labels--\n" + npy(y))
put("fuzz_npy", "rows_mismatch.bin", npy(x) + b"--labels--\n" + npy(y[:3]))
put("fuzz_npy", "same_file.bin", npy(y.astype(np.int16)))


# ---- idx: images file, "--labels--\n", labels file (plain or gzip) ---------------------------
def idx(arr, code=0x08):
    head = struct.pack(">HBB", 0, code, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return head + arr.astype(">u1").tobytes()


imgs = (np.arange(4 * 2 * 3) % 256).astype(np.uint8).reshape(4, 2, 3)
labs = np.array([0, 1, 1, 0], dtype=np.uint8)
gz = lambda b: gzip.compress(b, mtime=0)
put("fuzz_idx", "plain.bin", idx(imgs) + b"--labels--\n" + idx(labs))
put("fuzz_idx", "gzip.bin", gz(idx(imgs)) + b"--labels--\n" + gz(idx(labs)))
put("fuzz_idx", "rank2.bin", idx(imgs.reshape(4, 6)) + b"--labels--\n" + gz(idx(labs)))
put("fuzz_idx", "rank4.bin", idx(imgs.reshape(4, 2, 3, 1)) + b"--labels--\n" + idx(labs))
put("fuzz_idx", "truncated_gzip.bin", gz(idx(imgs))[:-6] + b"--labels--\n" + idx(labs))
put("fuzz_idx", "bad_dtype.bin", idx(imgs, 0x0D) + b"--labels--\n" + idx(labs))


# ---- tokens: one llm.c token file; byte 12 (header[3]) picks the block size, byte 13 the split --
def token_file(tokens, magic=20240520, version=1, count=None, block_byte=7, split_byte=2):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count)
    header += bytes([block_byte, split_byte, 0, 0]) + bytes(4 * 252)
    return header + b"".join(struct.pack("<H", t) for t in tokens)


toks = [(i * 7919) % 50257 for i in range(96)] + [50256]
put("fuzz_tokens", "valid.bin", token_file(toks))
put("fuzz_tokens", "valid_no_split.bin", token_file(toks, block_byte=31, split_byte=0))
put("fuzz_tokens", "one_window.bin", token_file(toks[:9], block_byte=7, split_byte=0))
put("fuzz_tokens", "out_of_vocab.bin", token_file(toks[:10] + [60000] + toks[10:20]))
put("fuzz_tokens", "truncated.bin", token_file(toks, count=len(toks) + 5))
put("fuzz_tokens", "trailing.bin", token_file(toks, count=len(toks) - 3))
put("fuzz_tokens", "version2.bin", token_file(toks, version=2))
put("fuzz_tokens", "short_header.bin", token_file(toks)[:700])
put("fuzz_tokens", "text.bin", b"Not a token file, just text.\n" * 8)


# ---- CIFAR-10: one binary batch file of 3073-byte records (label byte, R, G, B planes) ----------
def cifar_records(labels, first=0):
    out = bytearray()
    for r, label in enumerate(labels):
        out.append(label)
        out += bytes((first + r + 7 * i) % 256 for i in range(3072))
    return bytes(out)


put("fuzz_cifar", "one_record.bin", cifar_records([3]))
put("fuzz_cifar", "three_records.bin", bytes([13]) + cifar_records([0, 9, 4])[1:])
put("fuzz_cifar", "truncated.bin", cifar_records([1, 2])[:3073 + 1000])
put("fuzz_cifar", "label_10.bin", cifar_records([5, 10]))
put("fuzz_cifar", "empty.bin", b"")


# ---- native checkpoint: whole files ("MIXTRAIN...") or "<JSON>\0<data>" -----------------------
def native_parts(tensors, metadata):
    entries, data = [], b""
    for name, dtype, shape, payload in tensors:
        data += b"\0" * (-len(data) % 64)
        entries.append({"name": name, "dtype": dtype, "shape": shape, "offset": len(data),
                        "length": len(payload), "crc32": zlib.crc32(payload)})
        data += payload
    header = json.dumps({"metadata": metadata, "tensors": entries, "data_length": len(data)},
                        separators=(",", ":")).encode()
    return header, data


def native_file(header, data):
    pre = b"MIXTRAIN" + struct.pack("<IIQI", 1, 0, len(header), zlib.crc32(header))
    body = pre + header
    return body + b"\0" * (-len(body) % 64) + data


w = np.arange(6, dtype=np.float32).tobytes()
small = [("param/fc1.weight", "fp32", [2, 3], w), ("param/fc1.bias", "fp32", [2], w[:8]),
         ("optimizer/step", "int32", [], struct.pack("<i", 7))]
meta = {"mixtrain.state_version": "1", "progress": '{"step":10}'}
h, d = native_parts(small, meta)
put("fuzz_checkpoint_native", "whole.mxt", native_file(h, d))
put("fuzz_checkpoint_native", "parts.bin", h + b"\0" + d)
h2, d2 = native_parts([("a", "bf16", [2], b"\x80\x3f\x00\x40"), ("b", "fp8_e4m3", [1, 1], b"\x38")], {})
put("fuzz_checkpoint_native", "lowp_parts.bin", h2 + b"\0" + d2)
put("fuzz_checkpoint_native", "empty_parts.bin", native_parts([], {})[0] + b"\0")
put("fuzz_checkpoint_native", "truncated.mxt", native_file(h, d)[:-3])


# ---- safetensors: whole files or "<JSON>\0<buffer>" (the harness adds the length) --------------
def st_parts(tensors, metadata=None):
    header, buf = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(buf), len(buf) + len(payload)]}
        buf += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8), buf


sh, sb = st_parts([("fc1.weight", "F32", [2, 3], w), ("fc1.bias", "BF16", [2], b"\x80\x3f\x00\x40")],
                  {"format": "pt"})
put("fuzz_safetensors", "whole.safetensors", struct.pack("<Q", len(sh)) + sh + sb)
put("fuzz_safetensors", "parts.bin", sh + b"\0" + sb)
sh2, sb2 = st_parts([("x", "F16", [1], b"\x00\x3c"), ("n", "I32", [], b"\x01\0\0\0"),
                     ("e", "F8_E5M2", [2], b"\x3c\x40"), ("d", "F64", [1], struct.pack("<d", 1.5))])
put("fuzz_safetensors", "dtypes_parts.bin", sh2 + b"\0" + sb2)
put("fuzz_safetensors", "empty_parts.bin", b"{}      \0")
put("fuzz_safetensors", "hole.safetensors",
    struct.pack("<Q", len(sh)) + sh.replace(b"[0,24]", b"[0,20]") + sb)


# ---- training state: one JSON object, as fuzz_training_state.cpp reads it -------------------
def training_state(scaler, optimizer, policy, step=3, sampler=None):
    return json.dumps({
        "mixtrain.state_version": "1",
        "progress": {"applied_steps": step, "last_loss": 2.25, "skipped_steps": 0, "step": step},
        "sampler": sampler or {"epoch": 0, "position": step, "rows": 7373, "seed": 1},
        "scaler": scaler, "optimizer": optimizer, "policy": policy}, indent=1)


def state(component, values, version=1):
    return {"component": component, "values": values, "version": version}


dynamic = state("dynamic", {"growth_tracker": {"int": 3}, "hysteresis": {"int": 1},
                            "hysteresis_left": {"int": 1}, "scale": {"double": 65536.0},
                            "skipped_steps": {"int": 0}, "steps": {"int": 3}})
adamw = state("adamw", {"step": {"int": 3}})
fp8_delayed = state("fp8-delayed", {
    "amax_compute_algo": {"string": "max"}, "amax_history_len": {"int": 4},
    "applied_steps": {"int": 3}, "base": {"string": "bf16-mixed"},
    "fp8_format": {"string": "hybrid"}, "interval": {"int": 1}, "margin": {"int": 0},
    "slot.0.amax_history": {"floats": [37.75, 36.75, 43.0, 0.0]},
    "slot.0.name": {"string": "fc1.grad_output"}, "slot.0.position": {"int": 3},
    "slot.0.scale": {"double": 1333.5814208984375},
    "slot.1.amax_history": {"floats": [4.8334, "inf", "nan", 0.0]},
    "slot.1.name": {"string": "fc1.input"}, "slot.1.position": {"int": 3},
    "slot.1.scale": {"double": 92.23564910888672}, "slots": {"int": 2}})
put("fuzz_training_state", "fp8_delayed.json", training_state(dynamic, adamw, fp8_delayed))
put("fuzz_training_state", "none_sgd_bf16.json",
    training_state(state("none", {"steps": {"int": 60}}), state("sgd", {"step": {"int": 60}}),
                   state("bf16-mixed", {}), step=60,
                   sampler={"epoch": 1, "position": 3, "rows": 7373, "seed": 1}))
put("fuzz_training_state", "static_current.json",
    training_state(state("static", {"steps": {"int": 3}, "skipped_steps": {"int": 0}}), adamw,
                   state("fp8-current", {"slots": {"int": 0}})))


# ---- pretrained config: byte 0 picks the reader (even config.json, odd adapter_config.json) ---
hf_config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
             "attn_pdrop": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
             "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 32, "n_head": 2,
             "n_inner": None, "n_layer": 2, "n_positions": 16, "resid_pdrop": 0.0,
             "scale_attn_weights": True, "tie_word_embeddings": True, "vocab_size": 64}
put("fuzz_pretrained_config", "hf_gpt2.json", "0" + json.dumps(hf_config, indent=2))
peft_config = {"base_model_name_or_path": "hf", "bias": "none", "fan_in_fan_out": True,
               "inference_mode": True, "init_lora_weights": True, "layers_pattern": None,
               "layers_to_transform": None, "lora_alpha": 8.0, "lora_dropout": 0.0,
               "modules_to_save": None, "peft_type": "LORA", "r": 4, "revision": None,
               "target_modules": ["c_attn", "c_proj"], "task_type": "CAUSAL_LM"}
put("fuzz_pretrained_config", "peft_list.json", "1" + json.dumps(peft_config, indent=2))
put("fuzz_pretrained_config", "peft_regex.json",
    "1" + json.dumps(dict(peft_config, target_modules=r".*\.h\.[01]\.(attn\.c_attn|mlp\.c_fc)")))
put("fuzz_pretrained_config", "peft_newer.json",
    "1" + json.dumps(dict(peft_config, use_rslora=False, use_dora=False, rank_pattern={},
                          alpha_pattern={}, layer_replication=None)))


# ---- image files: JPEG and PNG of each kind the decoders take, and damaged ones ---------------
def image_seeds():
    from PIL import Image  # Debian's python3-pil, beside torchvision

    ramp = np.zeros((9, 14, 3), np.uint8)
    ramp[..., 0] = np.arange(14) * 18
    ramp[..., 1] = (np.arange(9) * 28)[:, None]
    ramp[..., 2] = 200
    rgb = Image.fromarray(ramp)

    def save(image, **kw):
        buf = io.BytesIO()
        image.save(buf, **kw)
        return buf.getvalue()

    put("fuzz_image_file", "rgb_420.jpg", save(rgb, format="JPEG", quality=80))
    put("fuzz_image_file", "rgb_444.jpg", save(rgb, format="JPEG", quality=90, subsampling=0))
    put("fuzz_image_file", "progressive.jpg", save(rgb, format="JPEG", progressive=True))
    put("fuzz_image_file", "gray.jpg", save(rgb.convert("L"), format="JPEG"))
    put("fuzz_image_file", "cmyk.jpg", save(rgb.convert("CMYK"), format="JPEG"))
    put("fuzz_image_file", "truncated.jpg", save(rgb, format="JPEG")[:-40])
    put("fuzz_image_file", "rgb.png", save(rgb, format="PNG"))
    put("fuzz_image_file", "rgba.png", save(rgb.convert("RGBA"), format="PNG"))
    put("fuzz_image_file", "palette.png",
        save(rgb.convert("P", palette=Image.ADAPTIVE, colors=5), format="PNG", transparency=2))
    put("fuzz_image_file", "gray16.png",
        save(Image.fromarray((ramp[..., 0].astype(np.uint16) * 257)), format="PNG"))
    put("fuzz_image_file", "gray_alpha.png", save(rgb.convert("LA"), format="PNG"))
    put("fuzz_image_file", "truncated.png", save(rgb, format="PNG")[:-30])


image_seeds()
