#!/usr/bin/env python3
"""Write a toy classification dataset as a features/labels .npy pair that mixtrain can train on.

This is also the reference for the .npy layout mixtrain reads (see core/include/mixtrain/core/
data/dataset.h, load_npy):

  <out>_x.npy  float32 (float64 is converted), C order, shape [N, D]
               (or [N, d1, d2, ...], flattened to D = d1*d2*...), all values finite
  <out>_y.npy  integer class indices (int8/16/32/64 or uint8/16/32/64), shape [N] (or [N, 1]),
               values in [0, classes); the number of classes is max label + 1 unless the config
               declares it

Little-endian only, Fortran order is rejected: plain numpy.save() of a numeric array is right.

Every class has rows (as even a share as --rows allows). An existing <out>_x.npy or <out>_y.npy
is replaced only with --force.

Usage:
  python3 make_npy_dataset.py --kind spiral --rows 3000 --classes 3 --out data/spiral
  python3 make_npy_dataset.py --kind blobs --features 16 --classes 5 --out data/blobs
"""
import argparse
import os

import numpy as np


def spiral(rows, classes, noise, rng):
    """Interleaved 2-D spiral arms, one per class: not linearly separable, easy for an MLP."""
    per_class = np.full(classes, rows // classes)
    per_class[: rows % classes] += 1
    xs, ys = [], []
    for c, n in enumerate(per_class):
        radius = np.linspace(0.05, 1.0, n)
        angle = np.linspace(0.0, 4.0, n) + c * 2.0 * np.pi / classes
        angle = angle + rng.normal(scale=noise, size=n)
        xs.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        ys.append(np.full(n, c))
    return np.concatenate(xs), np.concatenate(ys)


def blobs(rows, classes, features, noise, rng):
    """Gaussian class clusters around random centres at distance 4 from the origin."""
    centres = rng.normal(size=(classes, features))
    centres *= 4.0 / np.linalg.norm(centres, axis=1, keepdims=True)
    y = np.arange(rows) % classes  # every class present; the caller shuffles the rows
    x = centres[y] + noise * rng.normal(size=(rows, features))
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=["spiral", "blobs"], default="spiral")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--features", type=int, default=2, help="blobs only; spiral is 2-D")
    parser.add_argument("--noise", type=float, default=None,
                        help="angle jitter (spiral, default 0.2) or cluster std (blobs, default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="spiral", help="output prefix: writes <out>_x.npy, <out>_y.npy")
    parser.add_argument("--force", action="store_true",
                        help="replace <out>_x.npy and <out>_y.npy if they exist")
    args = parser.parse_args()
    if args.classes < 2 or args.rows < args.classes:
        parser.error("need --classes >= 2 and --rows >= --classes (a row for every class), got "
                     "--rows %d --classes %d" % (args.rows, args.classes))
    if args.features < 1:
        parser.error("need --features >= 1, got %d" % args.features)
    if args.noise is not None and not args.noise >= 0.0:
        parser.error("need --noise >= 0, got %g" % args.noise)
    for name in (args.out + "_x.npy", args.out + "_y.npy"):
        if os.path.exists(name) and not args.force:
            parser.error("%s exists; add --force to replace it, or choose another --out" % name)

    rng = np.random.default_rng(args.seed)
    if args.kind == "spiral":
        x, y = spiral(args.rows, args.classes, 0.2 if args.noise is None else args.noise, rng)
    else:
        x, y = blobs(args.rows, args.classes, args.features,
                     1.0 if args.noise is None else args.noise, rng)
    order = rng.permutation(len(y))  # mixtrain shuffles too, but files are nicer shuffled
    x = np.ascontiguousarray(x[order], dtype=np.float32)
    y = y[order].astype(np.int64)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.save(args.out + "_x.npy", x)
    np.save(args.out + "_y.npy", y)
    print(f"wrote {args.out}_x.npy {x.shape} float32 and {args.out}_y.npy {y.shape} int64, "
          f"{args.classes} classes")


if __name__ == "__main__":
    main()
