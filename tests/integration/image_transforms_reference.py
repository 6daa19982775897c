"""PIL / torchvision reference for the image folder's decoding and transforms (run by
tests/unit/core/data/test_image_transforms_parity.cpp under /usr/bin/python3: Debian's Pillow 9.4,
torchvision 0.14, numpy).

Usage: image_transforms_reference.py OUT_DIR

Writes image files into OUT_DIR (JPEG through PIL with several subsamplings, gray, progressive,
CMYK, odd sizes; PNG through a small writer of its own, since PIL cannot write interlaced,
16-bit RGB or low-bit-depth PNGs) and, for each, what torchvision's ImageFolder pipeline gives:
  <name>.decoded      PIL.Image.open(f).convert("RGB") as raw [H, W, 3] bytes
  <name>.crop<k>      F.resized_crop(img, top, left, h, w, [oh, ow], BILINEAR) (then hflip when
                      mirrored) as raw [3, oh, ow] bytes
  <name>.center<k>    CenterCrop([oh, ow])(Resize(s)(img)) (then hflip) as raw [3, oh, ow] bytes
and OUT_DIR/manifest.txt, one line each:
  image <file> <height> <width>
  crop <file> <k> <top> <left> <h> <w> <oh> <ow> <mirror>
  center <file> <k> <s> <oh> <ow> <mirror>
  refused <file>                               (PIL cannot open or decode it)
  decoded <file> <height> <width>              (a damage sweep's file PIL opens: its
                                                .decoded only, no transforms)
Files already in OUT_DIR named cpp_* are decoded and transformed too. The damage sweep
(damage_sweep) cuts two small JPEGs, a baseline and a progressive one, at every third byte and
flips one bit of them at seeded places: PIL's verdict on each is the one the loader must give.
Exit status 77 when PIL, numpy or torchvision cannot be imported (the test skips).
"""
import os
import random
import struct
import sys
import warnings
import zlib

try:
    import numpy as np
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
except ImportError as e:  # the C++ test skips on 77
    print(f"cannot import: {e}", file=sys.stderr)
    sys.exit(77)


def content(h, w, channels, seed):
    """Smooth gradients with noise and a sharp edge: enough structure for JPEG and resampling."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h)[:, None, None]
    x = np.linspace(0.0, 1.0, w)[None, :, None]
    phase = rng.uniform(0, 6, size=(1, 1, channels))
    v = 127 + 100 * np.sin(6 * x + 4 * y + phase) + rng.normal(0, 20, size=(h, w, channels))
    v[: h // 3, : w // 2] = 255 - v[: h // 3, : w // 2]
    return np.clip(v, 0, 255).astype(np.uint8)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pack_rows(samples, bit_depth):
    """samples: [H, W*channels] integers -> list of packed rows (big-endian, MSB first)."""
    rows = []
    for row in samples:
        if bit_depth == 16:
            rows.append(row.astype(">u2").tobytes())
        elif bit_depth == 8:
            rows.append(row.astype(np.uint8).tobytes())
        else:
            per = 8 // bit_depth
            padded = np.zeros(((len(row) + per - 1) // per) * per, dtype=np.uint8)
            padded[: len(row)] = row
            groups = padded.reshape(-1, per)
            packed = np.zeros(len(groups), dtype=np.uint8)
            for i in range(per):
                packed |= (groups[:, i] << (8 - bit_depth * (i + 1))).astype(np.uint8)
            rows.append(packed.tobytes())
    return rows


ADAM7 = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)]


def write_png(path, samples, color_type, bit_depth, interlace=False, plte=None, trns=None):
    """samples: [H, W, channels] array of sample values; filter type 0 on every row."""
    h, w, c = samples.shape
    raw = b""
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for y0, x0, dy, dx in passes:
        sub = samples[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in pack_rows(sub.reshape(sub.shape[0], -1), bit_depth):
            raw += b"\x00" + row
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, int(interlace)))
    if plte is not None:
        out += png_chunk(b"PLTE", plte.astype(np.uint8).tobytes())
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    out += png_chunk(b"IDAT", zlib.compress(raw, 9))
    out += png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(out)


def make_images(d):
    files = []

    def jpeg(name, h, w, mode="RGB", **kw):
        arr = content(h, w, {"RGB": 3, "L": 1, "CMYK": 4}[mode], len(files))
        img = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)
        img.save(os.path.join(d, name), "JPEG", **kw)
        files.append(name)

    jpeg("j420.jpg", 375, 500, quality=90, subsampling=2)
    jpeg("j422.jpg", 333, 517, quality=85, subsampling=1)
    jpeg("j444.jpg", 100, 75, quality=95, subsampling=0)
    jpeg("jgray.jpg", 61, 97, mode="L", quality=90)
    jpeg("jprog.jpg", 120, 90, quality=80, progressive=True)
    jpeg("jcmyk.jpg", 50, 70, mode="CMYK", quality=90)
    jpeg("j1x1.jpg", 1, 1, quality=90)
    jpeg("j3x500.jpg", 3, 500, quality=90)
    jpeg("j500x3.jpg", 500, 3, quality=90, subsampling=2)
    jpeg("j517x333.jpg", 517, 333, quality=75, subsampling=2)

    rng = np.random.default_rng(7)

    def png(name, samples, color_type, bit_depth, **kw):
        write_png(os.path.join(d, name), samples, color_type, bit_depth, **kw)
        files.append(name)

    png("prgb.png", content(40, 53, 3, 100), 2, 8)
    png("prgba.png", content(33, 47, 4, 101), 6, 8)
    png("pgray.png", content(29, 31, 1, 102), 0, 8)
    png("pgraya.png", content(29, 31, 2, 103), 4, 8)
    png("prgb16.png", rng.integers(0, 65536, size=(21, 19, 3)), 2, 16)
    png("prgba16.png", rng.integers(0, 65536, size=(13, 17, 4)), 6, 16)
    png("pgraya16.png", rng.integers(0, 65536, size=(13, 17, 2)), 4, 16)
    # 16-bit gray: PIL opens mode "I" and convert("RGB") clips, so values near 0..300 are telling.
    png("pgray16.png", rng.integers(0, 300, size=(15, 22, 1)), 0, 16)
    png("pgray1.png", rng.integers(0, 2, size=(11, 13, 1)), 0, 1)
    png("pgray2.png", rng.integers(0, 4, size=(11, 13, 1)), 0, 2)
    png("pgray4.png", rng.integers(0, 16, size=(11, 13, 1)), 0, 4)
    plte = rng.integers(0, 256, size=(16, 3))
    png("ppal4trns.png", rng.integers(0, 16, size=(27, 35, 1)), 3, 4, plte=plte,
        trns=bytes([0, 128, 255, 7]))
    png("ppal8.png", rng.integers(0, 16, size=(27, 35, 1)), 3, 8, plte=plte)
    # Indices past the palette's end (PIL: gray (i, i, i)).
    png("ppal8short.png", rng.integers(0, 256, size=(9, 30, 1)), 3, 8, plte=plte[:5])
    png("ppal2short.png", rng.integers(0, 4, size=(7, 9, 1)), 3, 2, plte=plte[:3])
    png("pgray2trns.png", rng.integers(0, 4, size=(6, 7, 1)), 0, 2, trns=struct.pack(">H", 1))
    png("pgray16trns.png", rng.integers(0, 300, size=(6, 7, 1)), 0, 16, trns=struct.pack(">H", 5))
    png("prgb16trns.png", rng.integers(0, 65536, size=(6, 7, 3)), 2, 16, trns=struct.pack(">HHH", 1, 2, 3))
    png("prgbtrns.png", content(20, 20, 3, 104), 2, 8, trns=struct.pack(">HHH", 1, 2, 3))
    png("pinterlaced.png", content(37, 45, 3, 105), 2, 8, interlace=True)
    png("pinterlaced16a.png", rng.integers(0, 65536, size=(9, 10, 4)), 6, 16, interlace=True)
    png("pinterlaced1.png", rng.integers(0, 2, size=(10, 11, 1)), 0, 1, interlace=True)

    # Damaged files: which of them PIL opens is part of the parity (the manifest says).
    def flip(b, at):
        b[at] ^= 1
        return b

    def damaged(name, source, edit):
        with open(os.path.join(d, source), "rb") as f:
            data = bytearray(f.read())
        with open(os.path.join(d, name), "wb") as f:
            f.write(bytes(edit(data)))
        files.append(name)

    damaged("xjpeg_cut.jpg", "j444.jpg", lambda b: b[: len(b) // 2])
    damaged("xjpeg_no_eoi.jpg", "j444.jpg", lambda b: b[:-2])
    damaged("xjpeg_junk_before_eoi.jpg", "j444.jpg", lambda b: b[:-2] + b"\x00\x11\x22" + b[-2:])
    # Junk early in the entropy-coded data makes libjpeg warn before it finds the end missing.
    damaged("xjpeg_junk_then_cut.jpg", "j420.jpg",
            lambda b: b[: b.index(b"\xff\xda") + 40] + b"\xff\xd3" + b[b.index(b"\xff\xda") + 40 : -3000])
    damaged("xjpeg_flip_then_cut.jpg", "j420.jpg",
            lambda b: flip(b, b.index(b"\xff\xda") + 60)[:-3000])
    # Sampling factors outside the named subsamplings (Cb 2x1 beside Y 2x2): libjpeg
    # decodes them (the data then read as other blocks: libjpeg warns, PIL opens it).
    def odd_sampling(b):
        sof = b.index(b"\xff\xc0")
        b[sof + 14] = 0x21
        return b

    damaged("xjpeg_odd_sampling.jpg", "j420.jpg", odd_sampling)
    damaged("xjpeg_junk_between_segments.jpg", "j444.jpg",
            lambda b: b[: b.index(b"\xff\xc0")] + b"\x00\x12" + b[b.index(b"\xff\xc0") :])
    damaged("xpng_cut.png", "prgb.png", lambda b: b[: len(b) // 2])
    damaged("xpng_no_iend.png", "prgb.png", lambda b: b[:-12])

    damaged("xpng_bad_trns_crc.png", "prgbtrns.png", lambda b: flip(b, b.index(b"tRNS") + 10))
    damaged("xpng_bad_ihdr.png", "prgb.png", lambda b: flip(b, 17))
    return files


def chw(img):
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1)).tobytes()


def damage_sweep(d):
    """Damaged copies of two small JPEGs; PIL decides which open (the loader must agree)."""
    names = []
    rnd = random.Random(99)
    for stem, kw in (("sweep420", dict(quality=80, subsampling=2)),
                     ("sweepprog", dict(quality=75, progressive=True))):
        arr = content(30, 41, 3, len(stem))
        path = os.path.join(d, stem + ".jpg")
        Image.fromarray(arr, "RGB").save(path, "JPEG", **kw)
        with open(path, "rb") as f:
            data = f.read()
        os.remove(path)
        edits = [(f"{stem}_cut{n}.jpg", data[:n])
                 for n in sorted(set(range(4, len(data), 3)) | {len(data) - 3, len(data) - 2, len(data) - 1})]
        for k in range(40):
            at = rnd.randrange(2, len(data))
            flipped = bytearray(data)
            flipped[at] ^= 1 << rnd.randrange(8)
            edits.append((f"{stem}_flip{k}_{at}.jpg", bytes(flipped)))
        for name, body in edits:
            with open(os.path.join(d, name), "wb") as f:
                f.write(body)
            names.append(name)
    return names


def crop_cases(h, w, rnd):
    cases = [(0, 0, h, w, 224, 224), (0, 0, h, w, h, w), (0, 0, 1, 1, 5, 7), (0, 0, h, w, 1, 1),
             (h - 1, w - 1, 1, 1, 3, 2), (0, 0, h, w, min(2 * h + 1, 257), min(3 * w, 301))]
    for _ in range(6):
        bh, bw = rnd.randint(1, h), rnd.randint(1, w)
        top, left = rnd.randint(0, h - bh), rnd.randint(0, w - bw)
        oh, ow = rnd.choice([(224, 224), (17, 31), (64, 40), (bh, bw), (min(3 * bh, 300), bw)])
        cases.append((top, left, bh, bw, oh, ow))
    return cases


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    rnd = random.Random(1234)
    lines = []
    # Files the C++ test wrote first (cpp_*: e.g. libjpeg's YCCK, which PIL cannot write).
    given = sorted(n for n in os.listdir(d) if n.startswith("cpp_"))
    warnings.simplefilter("ignore")  # PIL's advice on palette transparency
    for name in make_images(d) + given:
        try:
            img = Image.open(os.path.join(d, name)).convert("RGB")
        except (OSError, SyntaxError, ValueError) as e:
            lines.append(f"refused {name}")
            print(f"PIL refuses {name}: {e}", file=sys.stderr)
            continue
        w, h = img.size
        with open(os.path.join(d, name + ".decoded"), "wb") as f:
            f.write(np.asarray(img).tobytes())
        lines.append(f"image {name} {h} {w}")
        for k, (top, left, bh, bw, oh, ow) in enumerate(crop_cases(h, w, rnd)):
            mirror = k % 2
            out = F.resized_crop(img, top, left, bh, bw, [oh, ow], T.InterpolationMode.BILINEAR)
            if mirror:
                out = F.hflip(out)
            with open(os.path.join(d, f"{name}.crop{k}"), "wb") as f:
                f.write(chw(out))
            lines.append(f"crop {name} {k} {top} {left} {bh} {bw} {oh} {ow} {mirror}")
        for k, (s, oh, ow) in enumerate([(256, 224, 224), (32, 40, 40), (7, 5, 9), (20, 20, 25)]):
            mirror = k % 2
            out = T.CenterCrop([oh, ow])(T.Resize(s)(img))
            if mirror:
                out = F.hflip(out)
            with open(os.path.join(d, f"{name}.center{k}"), "wb") as f:
                f.write(chw(out))
            lines.append(f"center {name} {k} {s} {oh} {ow} {mirror}")
    for name in damage_sweep(d):
        try:
            img = Image.open(os.path.join(d, name)).convert("RGB")
        except (OSError, SyntaxError, ValueError):
            lines.append(f"refused {name}")
            continue
        with open(os.path.join(d, name + ".decoded"), "wb") as f:
            f.write(np.asarray(img).tobytes())
        lines.append(f"decoded {name} {img.size[1]} {img.size[0]}")
    with open(os.path.join(d, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
