"""Write a tiny llama-architecture GGUF (random weights, byte-fallback SentencePiece vocabulary) that llama-server
loads and completes with. The text it writes is noise; what matters is that the engine loads, serves and answers.

Random weights alone would let it sample a lone byte token such as <0xC0>, which llama-server cannot put into
JSON (it answers 400 "invalid UTF-8 byte"), or </s>, which ends a completion early. So one lane of the residual
stream is held constant (every token embedding carries STEER in it, no layer writes to it) and the output rows
of every token that is not printable ASCII point against that lane: their logits sit about 16 below the rest,
and the model only ever writes printable ASCII.

    .venv/bin/python tests/lab/engine/tiny_model.py OUT.gguf [--seed N] [--quantize q4_0]

About 400 KiB: 2 layers, 64 wide, 4 heads, 259 + 32 tokens, all F32. Deterministic for a given seed.
``--quantize q4_0`` stores every matrix as Q4_0 (about 70 KiB): quantized weights are what go through llama.cpp's
repacking and AMX kernels, which an F32 model never reaches. ``roles/engine/files/llmgw-probe-q4_0.gguf`` is this
script's output with ``--seed 0 --quantize q4_0`` (tests/e2e/test_engine_checks.py regenerates it and compares).
"""

import argparse
import sys

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_LAYER = 2
N_FF = 128
N_CTX = 512
STEER = 1.0
WORDS = ("▁", "▁the", "▁a", "▁and", "▁of", "▁to", "▁in", "▁is", "▁it", "▁that", "▁hello", "▁world", "▁node",
         "▁fleet", "▁model", "▁token", "e", "t", "a", "o", "i", "n", "s", "r", "h", "l", "d", "c", "u", "m", ".", ",")


def vocabulary():
    """<unk>, <s>, </s>, the 256 byte tokens SentencePiece falls back to, then a few word pieces."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += list(WORDS)
    types += [gguf.TokenType.NORMAL] * len(WORDS)
    scores = [0.0] * 259 + [-float(i) for i in range(len(WORDS))]
    return tokens, scores, types


def printable(token):
    if token.startswith("<0x") and len(token) == 6:
        return 0x20 <= int(token[3:5], 16) <= 0x7E
    return not token.startswith("<")


QUANTIZE = {"f32": None, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def write(path, seed=0, quantize="f32"):
    rng = np.random.default_rng(seed)
    quant = QUANTIZE[quantize]
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("llmgw-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if quant is not None else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def tensor(name, *shape, ones=False, steer=None):
        data = np.ones(shape, np.float32) if ones else (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if steer is not None:
            steer(data)
        if quant is not None and data.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, data)

    def hold_lane(data):  # embeddings carry the lane
        data[:, 0] = STEER

    def leave_lane(data):  # layer outputs (rows are output features) never write to it
        data[0, :] = 0.0

    def only_printable(data):
        for token_id, token in enumerate(tokens):
            data[token_id, 0] = 0.0 if printable(token) else -2.0

    n_embd_kv = N_EMBD // N_HEAD * N_HEAD_KV
    tensor("token_embd.weight", n_vocab, N_EMBD, steer=hold_lane)
    for i in range(N_LAYER):
        tensor("blk.%d.attn_norm.weight" % i, N_EMBD, ones=True)
        tensor("blk.%d.attn_q.weight" % i, N_EMBD, N_EMBD)
        tensor("blk.%d.attn_k.weight" % i, n_embd_kv, N_EMBD)
        tensor("blk.%d.attn_v.weight" % i, n_embd_kv, N_EMBD)
        tensor("blk.%d.attn_output.weight" % i, N_EMBD, N_EMBD, steer=leave_lane)
        tensor("blk.%d.ffn_norm.weight" % i, N_EMBD, ones=True)
        tensor("blk.%d.ffn_gate.weight" % i, N_FF, N_EMBD)
        tensor("blk.%d.ffn_up.weight" % i, N_FF, N_EMBD)
        tensor("blk.%d.ffn_down.weight" % i, N_EMBD, N_FF, steer=leave_lane)
    tensor("output_norm.weight", N_EMBD, ones=True)
    tensor("output.weight", n_vocab, N_EMBD, steer=only_printable)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantize", choices=sorted(QUANTIZE), default="f32")
    options = parser.parse_args(argv)
    print(write(options.out, options.seed, options.quantize))


if __name__ == "__main__":
    sys.exit(main())
