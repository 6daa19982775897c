#!/usr/bin/env python3
"""torchvision's ImageFolder with the held-out transform (Resize, CenterCrop), for the image-folder
parity test (test_image_folder.cpp): every image of ROOT, in ImageFolder's order, as uint8
[N, 3, SIZE, SIZE] (PILToTensor: the bytes before ToTensor's scaling) in OUT/pixels.bin, the labels
as int64 in OUT/labels.bin, and the class names, one a line, in OUT/classes.txt.

Usage: image_folder_reference.py ROOT SIZE RESIZE OUT   (Debian's /usr/bin/python3: PIL, torchvision)
"""
import os
import sys

import numpy as np
import torchvision
from torchvision import transforms


def main():
    root, size, resize, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    held_out = transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(size),
                                   transforms.PILToTensor()])
    folder = torchvision.datasets.ImageFolder(root, transform=held_out)
    pixels = np.stack([folder[i][0].numpy() for i in range(len(folder))]).astype(np.uint8)
    labels = np.array([label for _, label in folder.samples], dtype=np.int64)
    pixels.tofile(os.path.join(out, "pixels.bin"))
    labels.tofile(os.path.join(out, "labels.bin"))
    with open(os.path.join(out, "classes.txt"), "w") as f:
        f.write("".join(name + "\n" for name in folder.classes))


if __name__ == "__main__":
    main()
