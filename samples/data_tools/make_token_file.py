#!/usr/bin/env python3
"""Write text file(s) as an llm.c token file that mixtrain can train on.

By default every byte of the input files (read one after another) becomes one token, so the
vocabulary is 256 and no tokenizer is needed: Python standard library only, any python3 runs it.
With --tokenizer DIR the text is encoded by the tokenizer of a Hugging Face model folder
(`AutoTokenizer.from_pretrained(DIR)`: a GPT-2 folder's vocab.json + merges.txt or
tokenizer.json), for a model of that vocabulary; that needs transformers, so run it with the
Python peers, ~/.cache/mixtrain/peers/bin/python.

This is also the reference for the token file layout mixtrain reads with data.source = "tokens"
(see core/include/mixtrain/core/data/dataset.h, load_token_file; llm.c dev/data/data_common.py):

  header   256 little-endian int32 (1024 bytes):
             header[0] = 20240520   magic
             header[1] = 1          version: tokens are uint16
             header[2] = N          number of tokens
             header[3:] = 0
  tokens   N little-endian uint16, nothing after them

GPT-2 token files written by llm.c's dev/data scripts have the same layout (vocab_size 50257);
byte-level files from this script need vocab_size >= 256, --tokenizer files the tokenizer's. The same text can be read directly with
data.source = "text" (data.path = [...]); the .bin form is for llm.c interop, and for splitting
the held-out part into a file of its own.

Usage:
  python3 make_token_file.py /usr/share/common-licenses/GPL-3 --out data/gpl3.bin
  python3 make_token_file.py a.txt b.txt --out data/train.bin \\
      --val-out data/val.bin --val-fraction 0.1      (the last 10% of the tokens)
  ~/.cache/mixtrain/peers/bin/python make_token_file.py a.txt --tokenizer data/tiny-gpt2 \
      --out data/train.bin                           (the folder's tokens, not bytes)
"""
import argparse
import array
import math
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # header[2] is an int32


def token_file_bytes(tokens):
    """The llm.c token file holding `tokens` (bytes, or ids below 65536) as uint16 tokens."""
    header = struct.pack("<%di" % HEADER_INTS, MAGIC, VERSION, len(tokens),
                         *([0] * (HEADER_INTS - 3)))
    body = array.array("H", list(tokens))  # bytes given directly would be read as raw memory
    if sys.byteorder == "big":
        body.byteswap()  # the file is little-endian
    return header + body.tobytes()


def write(path, tokens):
    with open(path, "wb") as out:
        out.write(token_file_bytes(tokens))
    print("%s: %d tokens" % (path, len(tokens)))


def encode(text, folder):
    """The ids of `text` under the tokenizer of the model folder `folder`."""
    import os
    # A name that is no folder would send transformers to the Hugging Face Hub.
    if not os.path.isdir(folder):
        raise ValueError("no such folder (a Hugging Face model folder with its tokenizer files)")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # The whole text is one sequence: no model's length limit applies to a token file.
    tokenizer.model_max_length = sys.maxsize
    ids = tokenizer.encode(text.decode("utf-8"))
    if ids and max(ids) > 0xFFFF:
        raise ValueError("%s's ids reach %d, past a token file's uint16" % (folder, max(ids)))
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="text files, concatenated in this order")
    parser.add_argument("--out", default="tokens.bin", help="token file to write (training part)")
    parser.add_argument("--val-out", default=None,
                        help="also write the last --val-fraction of the tokens to this file "
                             "(never shuffled: it is the tail of the text)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of the tokens in --val-out (default 0.1)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="encode with this Hugging Face model folder's tokenizer instead of "
                             "one token per byte (needs transformers: the Python peers)")
    args = parser.parse_args()

    data = bytearray()
    for name in args.inputs:
        with open(name, "rb") as f:
            chunk = f.read()
        if not chunk:
            parser.error("%s is empty" % name)
        data += chunk
    if args.tokenizer is not None:
        try:
            data = encode(bytes(data), args.tokenizer)
        except (OSError, ValueError) as e:  # a missing folder, text that is not UTF-8, ...
            parser.error("--tokenizer %s: %s" % (args.tokenizer, e))

    train, val = data, None
    if args.val_out is not None:
        if not 0.0 < args.val_fraction < 1.0:
            parser.error("--val-fraction must be in (0, 1), got %g" % args.val_fraction)
        # Rounded half away from zero, as mixtrain's eval_fraction (llround): the same fraction
        # holds out the same tail either way.
        exact = len(data) * args.val_fraction
        held = math.floor(exact) + (1 if exact - math.floor(exact) >= 0.5 else 0)
        if held == 0 or held == len(data):
            parser.error("--val-fraction %g of %d tokens leaves one part empty"
                         % (args.val_fraction, len(data)))
        train, val = data[: len(data) - held], data[len(data) - held:]
    for part in (train, val):
        if part is not None and len(part) > MAX_TOKENS:
            parser.error("%d tokens do not fit the header's int32 count; split the text"
                         % len(part))
    write(args.out, train)
    if val is not None:
        write(args.val_out, val)


if __name__ == "__main__":
    main()
