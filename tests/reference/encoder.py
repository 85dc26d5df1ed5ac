"""A numpy reference of a sentence-transformers encoder (BERT: all-MiniLM-L6-v2; MPNet:
all-mpnet-base-v2), written from the models' definitions independently of the Rust
embedder, to check it: the same weights and tokenizer files, float64 arithmetic, mean
pooling, unit length.

    python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install numpy safetensors tokenizers
    /tmp/refvenv/bin/python tests/reference/encoder.py MINILM_DIR > tests/reference/minilm.json
    /tmp/refvenv/bin/python tests/reference/encoder.py MPNET_DIR > tests/reference/mpnet.json

writes the reference vectors of TEXTS; `runtime/tests/it/local_model.rs` compares the Rust
embedder's vectors with them (cosine >= 0.999 each).
"""

import json
import math
import pathlib
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

# Short and long, plain and odd: punctuation, numbers, casing, accents, a text past the
# model's 256-token reading length (it is truncated there, as sentence-transformers does).
TEXTS = [
    "The deploy runner moved from eu-1 to eu-2 last Tuesday.",
    "we bought a sedan for the team",
    "The user now prefers CSV exports over XLSX.",
    "Melanie painted a sunrise over the lake in 2022!",
    "ERROR: connection refused (errno 111) at 10.0.0.7:5432",
    "Café déjà vu — naïve façade.",
    "a",
    "What did Caroline research for her adoption plans?",
    " ".join(f"token{i} of a long tool output" for i in range(120)),
]


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    # The exact (erf) GELU of BERT's "gelu".
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def mpnet_bucket(relative, num_buckets=32, max_distance=128):
    # MPNet's relative position bucket (T5's, both directions), on one distance
    # `relative` = key position - query position.
    n = -relative
    half = num_buckets // 2
    bucket = half if n < 0 else 0
    n = abs(n)
    exact = half // 2
    if n < exact:
        return bucket + n
    large = exact + int(
        np.float32(np.log(np.float32(n / exact)) / np.float32(math.log(max_distance / exact)))
        * (half - exact)
    )
    return bucket + min(large, half - 1)


def encode(weights, config, ids):
    g = lambda name: weights[name].astype(np.float64)
    mpnet = config.get("model_type") == "mpnet"
    eps = config["layer_norm_eps"]
    heads = config["num_attention_heads"]
    n = len(ids)
    # MPNet numbers positions from the padding id + 1 and has no token types.
    first = config["pad_token_id"] + 1 if mpnet else 0
    x = g("embeddings.word_embeddings.weight")[ids] + g(
        "embeddings.position_embeddings.weight"
    )[first : first + n]
    if not mpnet:
        x = x + g("embeddings.token_type_embeddings.weight")[0]
    x = layer_norm(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"), eps)
    d = x.shape[1] // heads
    bias = 0.0
    if mpnet:
        table = g("encoder.relative_attention_bias.weight")  # [bucket, head]
        buckets = config.get("relative_attention_num_buckets", 32)
        index = np.array([[mpnet_bucket(j - i, buckets) for j in range(n)] for i in range(n)])
        bias = table[index].transpose(2, 0, 1)  # [head, query, key]
    if mpnet:
        qkv_names = ("attention.attn.q", "attention.attn.k", "attention.attn.v")
        out_name, norm1 = "attention.attn.o", "attention.LayerNorm"
    else:
        qkv_names = ("attention.self.query", "attention.self.key", "attention.self.value")
        out_name, norm1 = "attention.output.dense", "attention.output.LayerNorm"
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        lin = lambda h, name: h @ g(p + name + ".weight").T + g(p + name + ".bias")
        split = lambda h: h.reshape(n, heads, d).transpose(1, 0, 2)
        q, k, v = (split(lin(x, m)) for m in qkv_names)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = scores / scores.sum(-1, keepdims=True)
        ctx = (attn @ v).transpose(1, 0, 2).reshape(n, heads * d)
        x = layer_norm(
            lin(ctx, out_name) + x,
            g(p + norm1 + ".weight"),
            g(p + norm1 + ".bias"),
            eps,
        )
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(
            lin(h, "output.dense") + x,
            g(p + "output.LayerNorm.weight"),
            g(p + "output.LayerNorm.bias"),
            eps,
        )
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def main():
    model = pathlib.Path(sys.argv[1])
    config = json.loads((model / "config.json").read_text())
    max_len = json.loads((model / "sentence_bert_config.json").read_text())["max_seq_length"]
    weights = load_file(str(model / "model.safetensors"))
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len)
    out = []
    for text in TEXTS:
        ids = tokenizer.encode(text).ids
        vec = encode(weights, config, np.array(ids))
        out.append({"text": text, "tokens": len(ids), "vector": [round(float(v), 7) for v in vec]})
    json.dump({"model": model.name, "max_seq_length": max_len, "texts": out}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
