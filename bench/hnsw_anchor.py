#!/usr/bin/env python3
"""The physical anchor of W1's global search (Q2): an in-memory HNSW index (faiss's
IndexHNSWFlat, inner product over the unit vectors, so cosine) over the same 100,000 x 384
vectors, asked the same 1,000 queries one at a time on one thread, as the W1 example asks
shadowbrain's vector index.

For each efSearch it prints p50 / p99 latency and recall@10 against W1's exact ground
truth, then one JSON line with the smallest efSearch that reaches recall@10 >= 0.99.

    python3 -m venv /tmp/w1venv && /tmp/w1venv/bin/pip install numpy faiss-cpu
    /tmp/w1venv/bin/python ../shared/bench/gen_w1.py /tmp/w1-data
    /tmp/w1venv/bin/python bench/hnsw_anchor.py /tmp/w1-data
"""
import json
import sys
import time

import faiss
import numpy as np

DIM = 384


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "/tmp/w1-data"
    m = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    faiss.omp_set_num_threads(1)
    emb = np.fromfile(f"{data}/emb.f32", dtype="<f4").reshape(-1, DIM)
    q2 = np.fromfile(f"{data}/q2.f32", dtype="<f4").reshape(-1, DIM)
    gt = np.fromfile(f"{data}/q2_gt.i64", dtype="<i8").reshape(-1, 10)

    index = faiss.IndexHNSWFlat(DIM, m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 200
    t0 = time.perf_counter()
    index.add(emb)
    build_s = time.perf_counter() - t0
    print(f"hnsw: M={m} efConstruction=200 built in {build_s:.1f} s", file=sys.stderr)

    chosen = None
    for ef in (16, 24, 32, 48, 64, 96, 128, 192, 256):
        index.hnsw.efSearch = ef
        lat = []
        hits = 0
        for i in range(len(q2)):
            q = q2[i : i + 1]
            t = time.perf_counter()
            _, ids = index.search(q, 10)
            lat.append((time.perf_counter() - t) * 1000.0)
            hits += len(set(ids[0].tolist()) & set(gt[i].tolist()))
        lat.sort()
        p50 = lat[len(lat) // 2]
        p99 = lat[int(round((len(lat) - 1) * 0.99))]
        recall = hits / (10 * len(q2))
        print(
            f"hnsw: efSearch {ef}: p50 {p50:.3f} ms p99 {p99:.3f} ms recall@10 {recall:.4f}",
            file=sys.stderr,
        )
        if recall >= 0.99 and chosen is None:
            chosen = {"ef_search": ef, "q2_p50_ms": p50, "q2_p99_ms": p99, "q2_recall_at_10": recall}
            break
    print(json.dumps({"system": "faiss-hnsw", "m": m, "build_s": build_s, **(chosen or {})}))


if __name__ == "__main__":
    main()
