#!/usr/bin/env python3
"""Write text file(s) as an llm.c token file that mixtrain can train on.

By default every byte of the input files (read one after another) becomes one token, so the
vocabulary is 256 and no tokenizer is needed: Python standard library only, any python3 runs it.
With --tokenizer DIR the text is encoded by the tokenizer of a Hugging Face model folder, for a
model of that vocabulary: AutoTokenizer.from_pretrained(DIR) when the folder has config.json or
tokenizer_config.json, else its tokenizer.json alone, else its GPT-2 vocab.json + merges.txt.
That needs transformers, so run it with the Python peers, ~/.cache/mixtrain/peers/bin/python.

Each output is written to a temporary file beside it and renamed into place only once every part
is written, so a failure while writing leaves the existing outputs as they were; their folders are
made, an existing one is replaced only with --force, and an input is never an output, --force or
not.

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
import os
import struct
import sys
import tempfile

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


def write_all(parts):
    """Writes each (path, tokens) of `parts`; none is renamed into place before all are written."""
    umask = os.umask(0)
    os.umask(umask)
    staged = []
    try:
        for path, tokens in parts:
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=folder)
            staged.append((temp, path, len(tokens)))
            with os.fdopen(fd, "wb") as out:
                out.write(token_file_bytes(tokens))
            os.chmod(temp, 0o666 & ~umask)  # mkstemp's 0600 would differ from open()'s
        for temp, path, _ in staged:
            os.replace(temp, path)
    finally:
        for temp, _, _ in staged:
            if os.path.exists(temp):
                os.remove(temp)
    for _, path, count in staged:
        print("%s: %d tokens" % (path, count))


def load_tokenizer(folder):
    """The tokenizer of the Hugging Face model folder `folder` (see the module's docstring)."""
    # A name that is no folder would send transformers to the Hugging Face Hub.
    if not os.path.isdir(folder):
        raise ValueError("no such folder (a Hugging Face model folder with its tokenizer files)")
    def has(name):
        return os.path.isfile(os.path.join(folder, name))
    from transformers import AutoTokenizer, GPT2TokenizerFast, PreTrainedTokenizerFast
    # AutoTokenizer needs one of these to know the tokenizer's class.
    if has("config.json") or has("tokenizer_config.json"):
        return AutoTokenizer.from_pretrained(folder)
    if has("tokenizer.json"):
        return PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    if has("vocab.json") and has("merges.txt"):
        return GPT2TokenizerFast(vocab_file=os.path.join(folder, "vocab.json"),
                                 merges_file=os.path.join(folder, "merges.txt"))
    raise ValueError("holds no tokenizer: it needs tokenizer.json, or vocab.json and merges.txt")


def encode(text, folder):
    """The ids of `text` (UTF-8 str) under the tokenizer of the model folder `folder`."""
    tokenizer = load_tokenizer(folder)
    # The whole text is one sequence: no model's length limit applies to a token file.
    tokenizer.model_max_length = sys.maxsize
    ids = tokenizer.encode(text)
    if ids and max(ids) > 0xFFFF:
        raise ValueError("%s's ids reach %d, past a token file's uint16" % (folder, max(ids)))
    return ids


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where the names lead
        return os.path.realpath(a) == os.path.realpath(b)


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
    parser.add_argument("--force", action="store_true",
                        help="replace --out and --val-out if they exist (an input never)")
    args = parser.parse_args()

    outputs = [args.out] + ([args.val_out] if args.val_out is not None else [])
    if args.val_out is not None and same_file(args.out, args.val_out):
        parser.error("--out and --val-out are the same file, %s: the validation part would "
                     "replace the training part" % args.out)
    for name in args.inputs:
        if not os.path.isfile(name):
            parser.error("%s is %s" % (name, "a folder, not a text file" if os.path.isdir(name)
                                       else "not a file that exists"))
        for out in outputs:
            if same_file(name, out):
                parser.error("%s is an input and an output; an input is never overwritten "
                             "(--force or not): write the tokens elsewhere" % name)
    for out in outputs:
        if os.path.isdir(out):
            parser.error("%s is a folder; give a file name for the token file" % out)
        if os.path.exists(out) and not args.force:
            parser.error("%s exists; add --force to replace it, or write elsewhere" % out)

    data = bytearray()
    starts = []  # where each input begins in `data`
    for name in args.inputs:
        with open(name, "rb") as f:
            chunk = f.read()
        if not chunk:
            parser.error("%s is empty" % name)
        starts.append(len(data))
        data += chunk
    if args.tokenizer is not None:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            i = max(k for k in range(len(starts)) if starts[k] <= e.start)
            parser.error("--tokenizer reads UTF-8 text, but %s has byte 0x%02x at offset %d that "
                         "is not UTF-8 (without --tokenizer every byte is a token)"
                         % (args.inputs[i], data[e.start], e.start - starts[i]))
        try:
            data = encode(text, args.tokenizer)
        except Exception as e:  # transformers' and tokenizers' own errors, a corrupt file's too
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
    write_all([(args.out, train)] + ([(args.val_out, val)] if val is not None else []))


if __name__ == "__main__":
    main()
