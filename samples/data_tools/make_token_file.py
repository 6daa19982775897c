#!/usr/bin/env python3
"""Write text file(s) as an llm.c token file that mixtrain can train on.

By default every byte of the input files (read one after another) becomes one token, so the
vocabulary is 256 and no tokenizer is needed: Python standard library only, any python3 runs it.
With --tokenizer DIR the text is encoded by the tokenizer of a Hugging Face model folder, for a
model of that vocabulary: AutoTokenizer.from_pretrained(DIR) when the folder has config.json or
tokenizer_config.json, else its tokenizer.json alone, else its GPT-2 vocab.json + merges.txt.
That needs transformers, so run it with the Python peers, ~/.cache/mixtrain/peers/bin/python.
Special tokens written in the text map to their ids, as with from_pretrained, whichever files the
folder holds: those its special_tokens_map.json, tokenizer_config.json and tokenizer.json name,
and <|endoftext|> when it is in the vocabulary ("a<|endoftext|>b" is 3 GPT-2 tokens, not 9).
Each input is UTF-8 text encoded on its own (a byte order mark starting it is dropped), so no
token spans two files; --eot-id N puts id N before each file's tokens, as llm.c's dev/data
scripts put <|endoftext|> (50256 in GPT-2) before each document. GPT-2's kind of tokenizer
encodes a file in pieces cut at lines where its pre-tokenizer never joins the two sides: the ids of
the whole file, in memory bounded by a piece rather than by the file.

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
  ~/.cache/mixtrain/peers/bin/python make_token_file.py a.txt --tokenizer data/tiny-gpt2 \\
      --out data/train.bin                           (the folder's tokens, not bytes)
  ~/.cache/mixtrain/peers/bin/python make_token_file.py a.txt b.txt --tokenizer data/gpt2 \\
      --eot-id 50256 --out data/train.bin            (<|endoftext|> before each file, as llm.c)
"""
import argparse
import array
import json
import math
import os
import re
import struct
import sys
import tempfile

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # header[2] is an int32
# Tokens are read, widened and written this many at a time, so no copy of the whole corpus is made.
BLOCK = 1 << 20
# Pieces of text a tokenizer encodes per call (characters): its working memory, some hundreds of
# bytes per character, is bounded by a batch, not by the corpus.
PIECE_CHARS = 1 << 16
BATCH_PIECES = 8
# Where GPT-2's pre-tokenizer never joins the two sides: a "\n" with non-space on both sides is a
# word of its own. Plain "\n(?=\S)" would cut inside words: a space or "\r" before the "\n" is
# one "\s+" word with it. Python's \s holds all of Unicode's White_Space (and \x1c-\x1f), so its
# \S allows no cut the pre-tokenizer's \S would not.
# A Windows line end ("\r\n") is cut between its two characters, where the pre-tokenizer splits
# too ("\r" is a word of its own before the "\n"); without that a CRLF file was one piece.
LINE_CUT = re.compile(r"(?<=\S)\n(?=\S)|(?<=\S\r)(?=\n\S)")


def write_tokens(out, tokens, begin, end):
    """Writes tokens[begin:end] (an array('H')) to `out` as an llm.c token file."""
    out.write(struct.pack("<%di" % HEADER_INTS, MAGIC, VERSION, end - begin,
                          *([0] * (HEADER_INTS - 3))))
    for start in range(begin, end, BLOCK):
        block = tokens[start:min(start + BLOCK, end)]
        if sys.byteorder == "big":
            block.byteswap()  # the file is little-endian
        block.tofile(out)


def write_all(tokens, parts):
    """Writes each (path, begin, end) of `parts`, tokens[begin:end]; none is renamed into place
    before all are written."""
    umask = os.umask(0)
    os.umask(umask)
    staged = []
    try:
        for path, begin, end in parts:
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=folder)
            staged.append((temp, path, end - begin))
            with os.fdopen(fd, "wb") as out:
                write_tokens(out, tokens, begin, end)
            os.chmod(temp, 0o666 & ~umask)  # mkstemp's 0600 would differ from open()'s
        for temp, path, _ in staged:
            os.replace(temp, path)
    finally:
        for temp, _, _ in staged:
            if os.path.exists(temp):
                os.remove(temp)
    for _, path, count in staged:
        print("%s: %d tokens" % (path, count))


def read_bytes(name, tokens):
    """Appends the bytes of file `name` to the array('H') `tokens`, one token each."""
    low = 0 if sys.byteorder == "little" else 1
    with open(name, "rb") as f:
        while True:
            chunk = f.read(BLOCK)
            if not chunk:
                return
            # array("H", chunk) would read the bytes as raw uint16s; widened, each is one token.
            wide = bytearray(2 * len(chunk))
            wide[low::2] = chunk
            tokens.frombytes(wide)


def load_tokenizer(folder):
    """The tokenizer of the Hugging Face model folder `folder` (see the module's docstring), its
    special tokens registered (register_special_tokens)."""
    # A name that is no folder would send transformers to the Hugging Face Hub.
    if not os.path.isdir(folder):
        raise ValueError("no such folder (a Hugging Face model folder with its tokenizer files)")
    def has(name):
        return os.path.isfile(os.path.join(folder, name))
    from transformers import AutoTokenizer, GPT2TokenizerFast, PreTrainedTokenizerFast
    # AutoTokenizer needs one of these to know the tokenizer's class.
    if has("config.json") or has("tokenizer_config.json"):
        tokenizer = AutoTokenizer.from_pretrained(folder)
    elif has("tokenizer.json"):
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    elif has("vocab.json") and has("merges.txt"):
        tokenizer = GPT2TokenizerFast(vocab_file=os.path.join(folder, "vocab.json"),
                                      merges_file=os.path.join(folder, "merges.txt"))
    else:
        raise ValueError("holds no tokenizer: it needs tokenizer.json, or vocab.json and "
                         "merges.txt")
    # Each file is one sequence: no model's length limit applies to a token file.
    tokenizer.model_max_length = sys.maxsize
    register_special_tokens(tokenizer, folder)
    return tokenizer


def register_special_tokens(tokenizer, folder):
    """Makes the special tokens `folder` names, and <|endoftext|> when it is in the vocabulary,
    special tokens of `tokenizer`: their text then maps to their ids, as from_pretrained makes it
    (the bare GPT2TokenizerFast and PreTrainedTokenizerFast constructors split it into pieces)."""
    if not getattr(tokenizer, "is_fast", False):
        return  # a slow tokenizer comes from AutoTokenizer, which registered them
    from tokenizers import AddedToken
    named = {}  # content: AddedToken, in the order named

    def name(value):
        if isinstance(value, list):
            for item in value:
                name(item)
        elif isinstance(value, str):
            named.setdefault(value, AddedToken(value, normalized=False))
        elif isinstance(value, dict) and isinstance(value.get("content"), str):
            named.setdefault(value["content"], AddedToken(
                value["content"], single_word=bool(value.get("single_word")),
                lstrip=bool(value.get("lstrip")), rstrip=bool(value.get("rstrip")),
                normalized=bool(value.get("normalized"))))

    # tokenizer.json's special added_tokens need nothing: the backend registered them reading it.
    for config_name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = os.path.join(folder, config_name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        for key, value in config.items():
            if key.endswith("_token") or key == "additional_special_tokens":
                name(value)  # a flag such as add_bos_token is neither str nor dict: skipped
        for value in (config.get("added_tokens_decoder") or {}).values():
            if isinstance(value, dict) and value.get("special"):
                name(value)
    backend = tokenizer.backend_tokenizer
    if backend.token_to_id("<|endoftext|>") is not None:
        name("<|endoftext|>")
    registered = {t["content"] for t in json.loads(backend.to_str())["added_tokens"]
                  if t.get("special")}
    missing = [token for content, token in named.items() if content not in registered]
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)


def cuts_at_lines(tokenizer):
    """Whether `tokenizer` gives text cut at LINE_CUT the ids of the whole: GPT-2's kind, a
    byte-level regex pre-tokenizer with nothing before it or after it that sees the whole text."""
    if not getattr(tokenizer, "is_fast", False):
        return False
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    post = spec.get("post_processor") or {"type": "ByteLevel"}
    return (spec.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space")
            and post.get("type") == "ByteLevel"  # trims offsets only, adds no ids
            # A token taking the spaces beside it, or holding a "\n", could span a cut.
            and not any(t.get("lstrip") or t.get("rstrip") or "\n" in t["content"]
                        for t in spec.get("added_tokens", [])))


def encode(text, tokenizer, tokens, in_pieces):
    """Appends the ids of `text` (str) under `tokenizer` to the array('H') `tokens`, encoding it
    in pieces cut at LINE_CUT if `in_pieces` (cuts_at_lines(tokenizer))."""
    def append(ids):
        try:
            tokens.extend(ids)
        except OverflowError:
            raise ValueError("its ids reach %d, past a token file's uint16" % max(ids)) from None

    if not in_pieces:
        # The whole text at once (memory grows with it); no BOS or EOS of the tokenizer's own,
        # as in pieces: --eot-id is the separator.
        append(tokenizer.encode(text, add_special_tokens=False))
        return
    backend = tokenizer.backend_tokenizer
    # tokenizer.encode lifts tokenizer.json's truncation and padding; the backend would apply them.
    backend.no_truncation()
    backend.no_padding()
    pieces, start = [], 0
    while start < len(text):
        end = start + PIECE_CHARS
        cut = LINE_CUT.search(text, end) if end < len(text) else None
        end = cut.end() if cut else len(text)
        pieces.append(text[start:end])
        start = end
        if len(pieces) == BATCH_PIECES or start == len(text):
            for encoding in backend.encode_batch(pieces, add_special_tokens=False):
                append(encoding.ids)
            pieces = []


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where the names lead
        return os.path.realpath(a) == os.path.realpath(b)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+",
                        help="text files, their tokens one file after another in this order")
    parser.add_argument("--out", default="tokens.bin", help="token file to write (training part)")
    parser.add_argument("--val-out", default=None,
                        help="also write the last --val-fraction of the tokens to this file "
                             "(never shuffled: it is the tail of the text)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of the tokens in --val-out (default 0.1)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="encode with this Hugging Face model folder's tokenizer instead of "
                             "one token per byte (needs transformers: the Python peers); each "
                             "file is UTF-8 text encoded on its own, and special tokens written "
                             "in it (<|endoftext|>) map to their ids, as with from_pretrained")
    parser.add_argument("--eot-id", type=int, default=None, metavar="N",
                        help="put token id N before each file's tokens, a document separator "
                             "(llm.c puts GPT-2's <|endoftext|>, 50256, before each document); "
                             "without --tokenizer the config's vocab_size must exceed N")
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

    if args.eot_id is not None and not 0 <= args.eot_id <= 0xFFFF:
        parser.error("--eot-id %d is not a token file's uint16 (0 to 65535)" % args.eot_id)
    tokenizer = None
    if args.tokenizer is not None:
        try:
            tokenizer = load_tokenizer(args.tokenizer)
        except Exception as e:  # transformers' and tokenizers' own errors, a corrupt file's too
            parser.error("--tokenizer %s: %s" % (args.tokenizer, e))
        if args.eot_id is not None and args.eot_id >= len(tokenizer):
            parser.error("--eot-id %d is not a token of --tokenizer %s (ids 0 to %d)"
                         % (args.eot_id, args.tokenizer, len(tokenizer) - 1))

    in_pieces = tokenizer is not None and cuts_at_lines(tokenizer)
    data = array.array("H")
    for name in args.inputs:
        if os.path.getsize(name) == 0:
            parser.error("%s is empty" % name)
        if args.eot_id is not None:
            data.append(args.eot_id)
        if tokenizer is None:
            read_bytes(name, data)
            continue
        with open(name, "rb") as f:
            raw = f.read()
        # A byte order mark marks the encoding; it is not text.
        bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        try:
            text = str(memoryview(raw)[bom:], "utf-8")
        except UnicodeDecodeError as e:
            parser.error("--tokenizer reads UTF-8 text, but %s has byte 0x%02x at offset %d that "
                         "is not UTF-8 (without --tokenizer every byte is a token)"
                         % (name, raw[bom + e.start], bom + e.start))
        del raw
        if not text:
            parser.error("%s holds no text, only a byte order mark" % name)
        try:
            encode(text, tokenizer, data, in_pieces)
        except Exception as e:
            parser.error("--tokenizer %s: %s: %s" % (args.tokenizer, name, e))

    parts = [(args.out, 0, len(data))]
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
        parts = [(args.out, 0, len(data) - held), (args.val_out, len(data) - held, len(data))]
    for _, begin, end in parts:
        if end - begin > MAX_TOKENS:
            parser.error("%d tokens do not fit the header's int32 count; split the text"
                         % (end - begin))
    write_all(data, parts)


if __name__ == "__main__":
    main()
