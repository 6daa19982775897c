#!/usr/bin/python3
"""Images per second through ImageNet's training transform on JPEG files, mixtrain's image-folder
loader against torchvision's ImageFolder + DataLoader, side by side in one run on this CPU.

    /usr/bin/python3 bench/loader/image_folder_bench.py --mixtrain build/bin/mixtrain [--threads 2]

The folder (made once, in /tmp/mixtrain-image-folder-bench): 8 classes of 64 JPEGs, 500x375
(ImageNet's typical size) at quality 90, 4:2:0, of smooth random content. mixtrain trains
bench/loader/image-folder-224.toml (a global-average-pool and linear head: decoding dominates)
with data.image_folder.threads = --threads, its loader thread on (the default); the figure is its
samples/s over the steps after the first 5 (each step's samples_per_s,
combined as the rate over those steps). torchvision: ImageFolder with RandomResizedCrop(224),
RandomHorizontalFlip() and PILToTensor() (bytes, as mixtrain's batches are; and, as usual,
ToTensor() + Normalize()) through a DataLoader of --threads workers, batch 64, the same count of
batches after 5 of warm-up. torch uses one intra-op thread per worker, as its workers do anyway.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from host_cpu import cpu_name  # noqa: E402

ROOT = "/tmp/mixtrain-image-folder-bench"
HERE = os.path.dirname(os.path.abspath(__file__))


def make_folder():
    from PIL import Image
    train = os.path.join(ROOT, "train")
    if os.path.isdir(train):
        return train
    rng = np.random.default_rng(0)
    for c in range(8):
        os.makedirs(os.path.join(train, "class%d" % c))
        for i in range(64):
            small = rng.random((12, 16, 3)) * 255
            image = Image.fromarray(small.astype(np.uint8)).resize((500, 375), Image.BICUBIC)
            image.save(os.path.join(train, "class%d" % c, "%03d.jpg" % i), quality=90)
    return train


def mixtrain_rate(exe, train, threads, steps):
    shutil.rmtree(os.path.join(ROOT, "run"), ignore_errors=True)
    cmd = [exe, "train", os.path.join(HERE, "image-folder-224.toml"), "--run-dir",
           os.path.join(ROOT, "run"), "--set", "data.image_folder.train=" + train,
           "--set", "data.image_folder.threads=%d" % threads, "--set", "run.steps=%d" % steps,
           "--set", "run.log_every=1", "--set", "backend.cpu.threads=%d" % threads]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("mixtrain failed (exit %d):\n%s" % (done.returncode, done.stderr[-2000:]))
    rates = []
    with open(os.path.join(ROOT, "run", "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("step", 0) > 5 and "samples_per_s" in record:
                rates.append(record["samples_per_s"])
    # Each step's rate; their harmonic mean is the rate over those steps.
    return len(rates) / sum(1.0 / r for r in rates)


def torch_rate(train, threads, batches, normalize):
    import torch
    import torchvision
    from torchvision import transforms
    torch.set_num_threads(1)
    last = [transforms.ToTensor(), transforms.Normalize([0.485, 0.456, 0.406],
                                                        [0.229, 0.224, 0.225])] \
        if normalize else [transforms.PILToTensor()]
    transform = transforms.Compose([transforms.RandomResizedCrop(224),
                                    transforms.RandomHorizontalFlip()] + last)
    data = torchvision.datasets.ImageFolder(train, transform=transform)
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=threads,
                                         drop_last=True, persistent_workers=True)
    done, start = 0, None
    while done < batches + 5:
        for _ in loader:
            done += 1
            if done == 5:
                start = time.perf_counter()
            if done == batches + 5:
                break
    return 64 * batches / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixtrain", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args()
    train = make_folder()
    print("# CPU: %s, %d threads; 512 JPEGs 500x375 in %s" % (cpu_name(), args.threads, train))
    rows = [("mixtrain image_folder (bytes, normalised in the backend's decode)",
             mixtrain_rate(args.mixtrain, train, args.threads, args.steps)),
            ("torchvision ImageFolder + DataLoader, PILToTensor (bytes)",
             torch_rate(train, args.threads, args.steps - 5, False)),
            ("torchvision ImageFolder + DataLoader, ToTensor + Normalize",
             torch_rate(train, args.threads, args.steps - 5, True))]
    print("| loader | images/s |\n|---|---:|")
    for name, rate in rows:
        print("| %s | %.0f |" % (name, rate))


if __name__ == "__main__":
    main()
