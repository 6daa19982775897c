#!/usr/bin/env python3
"""Make a small Hugging Face GPT-2 folder that works offline: a byte-level BPE tokenizer trained
here on the given text, and a GPT2LMHeadModel with random weights whose config is GPT-2's own
(GPT2Config's defaults, GPT-2 small) with the sizes scaled down.

The folder holds what `save_pretrained` writes for both, so
`AutoTokenizer.from_pretrained(DIR)` and `GPT2LMHeadModel.from_pretrained(DIR)` load it without
the Hub, and mixtrain starts a run from it with `[model] from_pretrained = "DIR"`:

  config.json, model.safetensors              the model (safetensors: what mixtrain reads)
  tokenizer.json, vocab.json, merges.txt,     the tokenizer, GPT-2's kind: byte-level BPE with
  tokenizer_config.json, special_tokens_map.json   <|endoftext|> as bos, eos and unk

Needs transformers (and the tokenizers it brings): run with the Python peers,
~/.cache/mixtrain/peers/bin/python (bash cmake/setup-debian.sh --tests makes it).

Usage:
  make_tiny_gpt2.py /usr/share/common-licenses/GPL-3 --out data/tiny-gpt2
      [--vocab-size 512] [--n-layer 2] [--n-head 2] [--n-embd 64] [--n-positions 64] [--seed 0]
"""
import argparse
import json
import os
import sys

END_OF_TEXT = "<|endoftext|>"


def train_tokenizer(files, vocab_size):
    """GPT-2's kind of tokenizer, trained on `files`: byte-level BPE, no prefix space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Every byte is in the initial alphabet, so any text encodes (no unknown token needed).
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(files, trainer)
    return tok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", nargs="+", help="text files to train the tokenizer on")
    parser.add_argument("--out", required=True, help="the folder to write (new or empty)")
    parser.add_argument("--vocab-size", type=int, default=512,
                        help="tokens of the BPE vocabulary and rows of wte (default 512)")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-positions", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the random weights")
    args = parser.parse_args()
    if os.path.isdir(args.out) and os.listdir(args.out):
        parser.error("%s exists and is not empty: give a new folder" % args.out)
    if not 257 <= args.vocab_size <= 65536:
        parser.error("--vocab-size %d: give 257 to 65536 (every byte, <|endoftext|>, and ids "
                     "that fit a token file's uint16)" % args.vocab_size)

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tok = train_tokenizer(args.text, args.vocab_size)
    if tok.get_vocab_size() != args.vocab_size:
        sys.exit("error: the text yields only %d BPE tokens, fewer than --vocab-size %d: give "
                 "more text or a smaller --vocab-size" % (tok.get_vocab_size(), args.vocab_size))
    tokenizer = GPT2TokenizerFast(tokenizer_object=tok, bos_token=END_OF_TEXT,
                                  eos_token=END_OF_TEXT, unk_token=END_OF_TEXT,
                                  model_max_length=args.n_positions)
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)

    # GPT-2 small's config (GPT2Config's defaults) with five sizes changed: everything else
    # (gelu_new, layer_norm_epsilon, tied embeddings, dropout 0.1) is the real model's.
    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=args.vocab_size, n_positions=args.n_positions,
                        n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                        bos_token_id=eos, eos_token_id=eos)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    print(json.dumps({"folder": args.out, "vocab_size": args.vocab_size,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "files": sorted(os.listdir(args.out))}))


if __name__ == "__main__":
    main()
