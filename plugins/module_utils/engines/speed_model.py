# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speed probe's model: a llama-architecture GGUF with Q4_0 weights, written from a seed in pure Python.

Large enough that prompt processing and generation take measurable time on one core (4 layers, 384 wide, about
4 MB of Q4_0, the quantization real models ship in), small enough to write on the node in well under a second:
the quantized blocks are seeded random bytes with a small fixed scale, so no quantizer is needed. The text such a
model writes is noise; llama-bench only times it. Same seed, same bytes: :data:`SHA256` is the file's digest
(a unit test writes it and compares, and reads it back with the ``gguf`` package).

Does I/O only in :func:`write` (the file it is given).
"""

from __future__ import annotations

import hashlib
import os
import random
import struct

N_EMBD = 384
N_HEAD = 6
N_LAYER = 4
N_FF = 1024
N_CTX = 512
SEED = 21
# sha256 of write()'s output; the unit test keeps it in step with the layout below.
SHA256 = "689016b0d0c29a9ba2cfa589ab1d312f6447cf495b49ec9c99fcd90c832894bf"

_ALIGNMENT = 32
_F32, _Q4_0 = 0, 2
_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = 4, 5, 6, 7, 8, 9
_Q4_0_BLOCK = 32  # weights per block: a float16 scale and 16 bytes of 4-bit values
_SCALE = struct.pack("<e", 0.004)


def vocabulary():
    """<unk>, <s>, </s> and the 256 byte tokens SentencePiece falls back to: what llama's tokenizer needs to load."""
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE
    return tokens, [0.0] * len(tokens), types


def _string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(kind, value):
    if kind == _STRING:
        return _string(value)
    return struct.pack({_UINT32: "<I", _INT32: "<i", _FLOAT32: "<f", _BOOL: "<?"}[kind], value)


def _kv(key, kind, value):
    return _string(key) + struct.pack("<I", kind) + _value(kind, value)


def _array(key, kind, values):
    return (_string(key) + struct.pack("<IIQ", _ARRAY, kind, len(values))
            + b"".join(_value(kind, value) for value in values))


def tensors():
    """(name, dims innermost first, type) of every tensor, in file order."""
    n_vocab = len(vocabulary()[0])
    out = [("token_embd.weight", (N_EMBD, n_vocab), _Q4_0)]
    for i in range(N_LAYER):
        out += [
            ("blk.%d.attn_norm.weight" % i, (N_EMBD,), _F32),
            ("blk.%d.attn_q.weight" % i, (N_EMBD, N_EMBD), _Q4_0),
            ("blk.%d.attn_k.weight" % i, (N_EMBD, N_EMBD), _Q4_0),
            ("blk.%d.attn_v.weight" % i, (N_EMBD, N_EMBD), _Q4_0),
            ("blk.%d.attn_output.weight" % i, (N_EMBD, N_EMBD), _Q4_0),
            ("blk.%d.ffn_norm.weight" % i, (N_EMBD,), _F32),
            ("blk.%d.ffn_gate.weight" % i, (N_EMBD, N_FF), _Q4_0),
            ("blk.%d.ffn_up.weight" % i, (N_EMBD, N_FF), _Q4_0),
            ("blk.%d.ffn_down.weight" % i, (N_FF, N_EMBD), _Q4_0),
        ]
    out += [("output_norm.weight", (N_EMBD,), _F32), ("output.weight", (N_EMBD, n_vocab), _Q4_0)]
    return out


def _size(dims, kind):
    count = 1
    for dim in dims:
        count *= dim
    return count * 4 if kind == _F32 else count // _Q4_0_BLOCK * (2 + _Q4_0_BLOCK // 2)


def _data(dims, kind, rng):
    if kind == _F32:
        return struct.pack("<f", 1.0) * dims[0]
    blocks = _size(dims, kind) // (2 + _Q4_0_BLOCK // 2)
    nibbles = rng.randbytes(blocks * _Q4_0_BLOCK // 2)
    return b"".join(_SCALE + nibbles[i * 16:(i + 1) * 16] for i in range(blocks))


def _pad(length):
    return b"\0" * ((-length) % _ALIGNMENT)


def content():
    """The whole file, as bytes."""
    tokens, scores, types = vocabulary()
    metadata = [
        _kv("general.architecture", _STRING, "llama"),
        _kv("general.name", _STRING, "llmgw-speed-probe"),
        _kv("general.file_type", _UINT32, 2),  # MOSTLY_Q4_0
        _kv("llama.context_length", _UINT32, N_CTX),
        _kv("llama.embedding_length", _UINT32, N_EMBD),
        _kv("llama.block_count", _UINT32, N_LAYER),
        _kv("llama.feed_forward_length", _UINT32, N_FF),
        _kv("llama.attention.head_count", _UINT32, N_HEAD),
        _kv("llama.attention.head_count_kv", _UINT32, N_HEAD),
        _kv("llama.rope.dimension_count", _UINT32, N_EMBD // N_HEAD),
        _kv("llama.attention.layer_norm_rms_epsilon", _FLOAT32, 1e-5),
        _kv("llama.vocab_size", _UINT32, len(tokens)),
        _kv("tokenizer.ggml.model", _STRING, "llama"),
        _array("tokenizer.ggml.tokens", _STRING, tokens),
        _array("tokenizer.ggml.scores", _FLOAT32, scores),
        _array("tokenizer.ggml.token_type", _INT32, types),
        _kv("tokenizer.ggml.bos_token_id", _UINT32, 1),
        _kv("tokenizer.ggml.eos_token_id", _UINT32, 2),
        _kv("tokenizer.ggml.unknown_token_id", _UINT32, 0),
        _kv("tokenizer.ggml.add_bos_token", _BOOL, True),
    ]
    rng = random.Random(SEED)
    infos, blobs, offset = [], [], 0
    for name, dims, kind in tensors():
        blob = _data(dims, kind, rng)
        infos.append(_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                     + struct.pack("<IQ", kind, offset))
        blobs.append(blob + _pad(len(blob)))
        offset += len(blobs[-1])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(metadata)) + b"".join(metadata) + b"".join(infos)
    return head + _pad(len(head)) + b"".join(blobs)


def is_current(path):
    """Whether ``path`` holds this model, byte for byte."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest() == SHA256


def write(path):
    """Write the model to ``path`` unless it is there already; True when it was written."""
    if is_current(path):
        return False
    data = content()
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    return True
