#!/usr/bin/env python3
"""How far one-bit codes can carry W1's global search (Q2): the best case of a
binary-quantized index (arroy's BinaryQuantizedCosine keeps one sign bit per dimension)
whose candidates are rescored with the full vectors.

Each of the 1,000 queries takes the exact top-N of all 100,000 records by sign agreement
(Hamming), rescores those N by cosine on the float vectors, and keeps ten; it prints
recall@10 against W1's exact ground truth for each N. A real index finds its top-N only
approximately, so these figures bound it from above: they say how many candidates a
rescoring step would need at least. `--center` subtracts the mean vector before taking
signs (it makes no difference on W1).

    /tmp/w1venv/bin/python bench/bq_bound.py /tmp/w1-data [--center]
"""
import json
import sys

import numpy as np


def main():
    data = sys.argv[1]
    center = "--center" in sys.argv[2:]
    dim = 384
    emb = np.fromfile(f"{data}/emb.f32", dtype=np.float32).reshape(-1, dim)
    queries = np.fromfile(f"{data}/q2.f32", dtype=np.float32).reshape(-1, dim)
    truth = np.fromfile(f"{data}/q2_gt.i64", dtype=np.int64).reshape(len(queries), -1)[:, :10]
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    unit_q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    mean = emb.mean(axis=0) if center else 0.0
    # Signs as +-1, so a dot product is dim - 2 * Hamming distance: the same order.
    signs = np.where(emb - mean > 0, 1.0, -1.0).astype(np.float32)
    signs_q = np.where(queries - mean > 0, 1.0, -1.0).astype(np.float32)
    agreement = signs_q @ signs.T
    rows = []
    for n in (10, 20, 50, 100, 200, 400, 800):
        hits = 0
        for i in range(len(queries)):
            candidates = np.argpartition(-agreement[i], n)[:n]
            exact = unit[candidates] @ unit_q[i]
            top = candidates[np.argsort(-exact)[:10]]
            hits += len(set(top.tolist()) & set(truth[i].tolist()))
        recall = hits / (10 * len(queries))
        rows.append({"candidates": n, "recall_at_10": round(recall, 4)})
        print(f"bq: top {n} by sign agreement, rescored: recall@10 {recall:.4f}", file=sys.stderr)
    print(json.dumps({"system": "binary-quantized bound", "center": center, "rows": rows}))


if __name__ == "__main__":
    main()
