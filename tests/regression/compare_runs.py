#!/usr/bin/env python3
"""Compares two mixtrain run folders for tests/regression/metrics_identical.sh.

Usage: compare_runs.py RUN_BEFORE RUN_AFTER
Prints one line, "identical ..." or "DIFFERENT ...", then (when different) the first differing
line of each side; exit status 0 = identical, 1 = different, 2 = could not compare.

metrics.jsonl: each line with its measured fields removed (TIMING_KEYS, below: time and memory) is compared byte for
byte. The removal is textual: the key, its value and one separating comma are cut out of the line
as the trainer wrote it, and nothing else is touched (no re-serialisation, so the numbers keep the
trainer's own formatting). Each cut is checked: the line minus the cut must parse to exactly the
original record less that key, in the same order, and the key must occur once in the line's text.

Checkpoints (checkpoints/*.mxt, the native format; plugins/checkpoint_native/README.md): the
tensor table (names, dtypes, shapes, offsets, lengths, CRC-32s), the tensor data bytes and the
metadata are compared, except metadata["config"], the resolved config, which holds each side's
own run.dir. Both sides must hold the same checkpoint file names.
"""
import json
import os
import re
import struct
import sys

# Fields of metrics.jsonl that measure the machine rather than the training. Evidence:
# core/src/train/trainer.cpp writes four kinds of records through MetricsLog
# (core/src/runs/metrics_log.cpp, metrics.jsonl by runs/jsonl_sink.cpp: nlohmann::json::dump(),
# compact, keys in std::map order): the training record {step, loss, loss_scale, next_loss_scale,
# skipped, lr, grad_norm, samples_per_s, epoch, device_memory_bytes, device_peak_memory_bytes,
# host_peak_rss_bytes[, nonfinite]}, the evaluation record {step, eval_loss, eval_accuracy}, and
# from core/src/train/step_statistics.cpp the underflow record {step, underflow_scale,
# underflow{...}[, skipped]} and the FP8 record {step, fp8{...}[, skipped]} (core/src/train/
# step.cpp tags a skipped step's). samples_per_s (rows over the window's wall
# time) depends on the clock; the three memory fields on the allocator and the process (a
# resumed run's host peak differs, and a build before them has none). There is no timestamp or
# wall time field in metrics.jsonl (wall_seconds is in summary.json, which is not compared).
TIMING_KEYS = ("samples_per_s", "device_memory_bytes", "device_peak_memory_bytes",
               "host_peak_rss_bytes")

# A JSON value as nlohmann::json::dump() writes a number or null (NaN and infinities are null).
_VALUE = r"(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|null)"


class CompareError(Exception):
    pass


def strip_line(line, where):
    """The line without its timing fields; raises CompareError if the cut cannot be proven."""
    try:
        pairs = json.loads(line, object_pairs_hook=lambda p: p)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{where}: not JSON: {exc}")
    if not isinstance(pairs, list):
        raise CompareError(f"{where}: not a JSON object")
    out = line
    for key in TIMING_KEYS:
        if not any(k == key for k, _ in pairs):
            continue
        name = re.escape(json.dumps(key))
        found = re.findall(name, out)
        if len(found) != 1:
            raise CompareError(f"{where}: {key} occurs {len(found)} times in the text")
        # ,"key":value   (not first)   or   "key":value,   (first, followed by another key)
        cut, n = re.subn(r"," + name + ":" + _VALUE + r"(?=[,}])", "", out)
        if n == 0:
            cut, n = re.subn(r"(?<=\{)" + name + ":" + _VALUE + r"(,|(?=\}))", "", out)
        if n != 1:
            raise CompareError(f"{where}: cannot cut {key} out of the line")
        expect = [(k, v) for k, v in json.loads(out, object_pairs_hook=lambda p: p) if k != key]
        if json.loads(cut, object_pairs_hook=lambda p: p) != expect:
            raise CompareError(f"{where}: cutting {key} changed other fields")
        out = cut
    return out


def stripped_metrics(run):
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        raise CompareError(f"{path}: missing")
    with open(path, "rb") as f:
        raw = f.read()
    if raw and not raw.endswith(b"\n"):
        raise CompareError(f"{path}: last line is not terminated")
    lines = raw.decode("utf-8").split("\n")[:-1] if raw else []
    out = [strip_line(l, f"{path}:{i + 1}") for i, l in enumerate(lines)]
    with open(os.path.join(run, "metrics.stripped.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(l + "\n" for l in out)
    return out


def first_difference(a, b):
    for i in range(max(len(a), len(b))):
        la = a[i] if i < len(a) else "<no line>"
        lb = b[i] if i < len(b) else "<no line>"
        if la != lb:
            return i + 1, la, lb
    return None


def read_mxt(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28 or data[:8] != b"MIXTRAIN":
        raise CompareError(f"{path}: not a native checkpoint")
    (hlen,) = struct.unpack_from("<Q", data, 16)
    header = json.loads(data[28:28 + hlen].decode("utf-8"))
    start = (28 + hlen + 63) // 64 * 64  # the data section is 64-byte aligned in the file
    return header, data[start:]


def checkpoint_names(run):
    folder = os.path.join(run, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder) if n.endswith(".mxt"))


def compare_checkpoints(a, b):
    """None when identical, else a reason; ("", n) when neither side has one."""
    na, nb = checkpoint_names(a), checkpoint_names(b)
    if na != nb:
        return f"checkpoint files differ: {na} vs {nb}", len(na)
    for name in na:
        ha, da = read_mxt(os.path.join(a, "checkpoints", name))
        hb, db = read_mxt(os.path.join(b, "checkpoints", name))
        ta, tb = ha.get("tensors", []), hb.get("tensors", [])
        if [t["name"] for t in ta] != [t["name"] for t in tb]:
            return f"{name}: tensor lists differ", len(na)
        for x, y in zip(ta, tb):
            if x != y or da[x["offset"]:x["offset"] + x["length"]] != db[y["offset"]:y["offset"] + y["length"]]:
                return f"{name}: tensor {x['name']} differs", len(na)
        if da != db:
            return f"{name}: data sections differ", len(na)
        ma = {k: v for k, v in ha.get("metadata", {}).items() if k != "config"}
        mb = {k: v for k, v in hb.get("metadata", {}).items() if k != "config"}
        for k in sorted(set(ma) | set(mb)):
            if ma.get(k) != mb.get(k):
                return f"{name}: metadata[{k!r}] differs", len(na)
    return None, len(na)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    a, b = sys.argv[1:]
    try:
        ma, mb = stripped_metrics(a), stripped_metrics(b)
        ckpt, n_ckpt = compare_checkpoints(a, b)
    except CompareError as exc:
        print(f"ERROR {exc}")
        return 2
    diff = first_difference(ma, mb)
    ck = "no checkpoint" if n_ckpt == 0 else f"{n_ckpt} checkpoint(s)"
    if diff is None and ckpt is None:
        print(f"identical ({len(ma)} lines, {ck} identical)")
        return 0
    if diff is None:
        print(f"DIFFERENT checkpoints ({len(ma)} metrics lines identical): {ckpt}")
        return 1
    line, la, lb = diff
    print(f"DIFFERENT metrics.jsonl line {line}" + (f"; also {ckpt}" if ckpt else ""))
    print(f"    before: {la}")
    print(f"    after:  {lb}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
