"""Reads a run folder's TensorBoard event files with TensorBoard's own EventAccumulator (the
reader `tensorboard --logdir` uses) and prints what it found as one JSON object:
{"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, markdown], ...]},
 "plugins": {tag: plugin_name}}. Non-finite values print as null.

Usage: tensorboard_reader.py RUN_DIR
"""
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util


def main(run_dir):
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "texts": {}, "plugins": {}}
    for tag in tags[event_accumulator.SCALARS]:
        out["scalars"][tag] = [
            [e.step, e.value if math.isfinite(e.value) else None] for e in acc.Scalars(tag)]
    for tag in tags[event_accumulator.TENSORS]:
        meta = acc.SummaryMetadata(tag)
        out["plugins"][tag] = meta.plugin_data.plugin_name
        texts = []
        for e in acc.Tensors(tag):
            value = tensor_util.make_ndarray(e.tensor_proto)
            text = value.item() if value.shape == () else value.flatten()[0]
            texts.append([e.step, text.decode("utf-8")])
        out["texts"][tag] = texts
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
