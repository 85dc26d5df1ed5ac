"""The Python package's benchmark (docs/python.md, "Speed"): embedded record and recall
from Python against their anchors measured in the same run on the same data.

- Recall: the same queries through ``Memory.recall`` (the route's work without the router,
  the answer's objects made from the runtime's structs) and through the Rust facade (``SessionHandle::recall_with``, the
  native module's ``_facade_recall``), alternating query by query; session scope, the
  ``--records`` records spread over ``--sessions`` sessions.
- Record: batches of 1,000 events through ``Memory.record`` and through the Rust facade's
  ``record_batch``, alternating batch by batch (the rate: events over the batches' time).
- Anchor: Chroma's ``PersistentClient`` (the embedded store Python users pick), given the
  same records with the same vectors (the runtime's embedder's), add and query timed here.

Run with scripts/bench-python (a release build into a throwaway virtualenv with Chroma).
Prints a summary, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import shadowbrain

WORDS = (
    "deploy runner cache database region cluster token rotate backup restore queue worker "
    "latency invoice customer refund ticket escalate outage alert metric dashboard config "
    "secret schema migration index shard replica leader follower lease snapshot archive "
    "agent session memory recall policy budget plan goal step tool result error retry"
).split()


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        f"{' '.join(rng.choice(WORDS) for _ in range(12))} #{i}" for i in range(n)
    ]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--no-chroma", action="store_true", help="skip the Chroma anchor")
    args = parser.parse_args()

    corpus = texts(args.records, 7)
    queries = [" ".join(t.split()[:4]) for t in texts(args.queries, 11)]
    work = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    config = work / "shadowbrain.toml"
    config.write_text('[embedder]\nkind = "hash"\n')
    out: dict[str, object] = {
        "records": args.records,
        "sessions": args.sessions,
        "queries": args.queries,
        "k": args.k,
        "embedder": "hash",
        "python": platform.python_version(),
    }

    memory = shadowbrain.Memory(work / "data", config=config)
    native = memory._transport._native  # type: ignore[attr-defined]

    # Record: batches of 1,000 events, from Python and through the Rust facade (the
    # anchor) alternately, in a random order each time, so both write into a store of the
    # same size meanwhile; each into sessions of its own, taken in turn.
    batch_s: list[float] = []
    facade_ns: list[int] = []
    turns = random.Random(3)
    for n, i in enumerate(range(0, len(corpus), 1000)):
        chunk = corpus[i : i + 1000]

        def from_python() -> None:
            events = [{"kind": "observation", "text": t} for t in chunk]
            t0 = time.perf_counter()
            memory.record(f"s{n % args.sessions}", events)
            batch_s.append(time.perf_counter() - t0)

        def through_facade() -> None:
            facade_ns.extend(
                native._facade_record("default", f"f{n % args.sessions}", chunk, 1000)
            )

        ways = [from_python, through_facade]
        turns.shuffle(ways)
        for way in ways:
            way()
    total = sum(batch_s)
    facade_rate = len(corpus) / (sum(facade_ns) / 1e9)
    out["record"] = {
        "events_per_s": args.records / total,
        "batch_1000_p50_ms": pct(batch_s, 0.5) * 1e3,
        "batch_1000_p99_ms": pct(batch_s, 0.99) * 1e3,
        "facade_events_per_s": facade_rate,
        "facade_batch_1000_p50_ms": pct([n / 1e6 for n in facade_ns], 0.5),
    }
    print(
        f"record: {args.records / total:,.0f} events/s from Python, {facade_rate:,.0f} "
        "through the Rust facade (batches of 1,000)"
    )

    # Recall is measured once the writes are absorbed: indexes built, background work done.
    t0 = time.perf_counter()
    native._settle()
    out["record"]["settle_s"] = time.perf_counter() - t0
    print(f"settled in {time.perf_counter() - t0:.1f} s")

    # Warm both paths, then alternate query by query.
    for j, q in enumerate(queries[:50]):
        memory.recall(f"s{j % args.sessions}", q, k=args.k)
        native._facade_recall("default", f"s{j % args.sessions}", q, args.k, 1)
    py_us: list[float] = []
    rust_us: list[float] = []
    # Where the difference goes: the native call alone (bytes in, bytes out) by the
    # direct path `Memory.recall` takes, and by the server's router.
    direct_us: list[float] = []
    routed_us: list[float] = []
    order = random.Random(5)
    for j, q in enumerate(queries):
        session = f"s{j % args.sessions}"
        body = json.dumps(
            {"query": q, "k": args.k, "scope": "session", "include_knowledge": True}
        ).encode()

        def python() -> None:
            t0 = time.perf_counter_ns()
            recall = memory.recall(session, q, k=args.k)
            _ = [m.id for m in recall.memories]
            py_us.append((time.perf_counter_ns() - t0) / 1e3)

        def facade() -> None:
            rust_us.append(native._facade_recall("default", session, q, args.k, 1)[0] / 1e3)

        def direct() -> None:
            t0 = time.perf_counter_ns()
            native.recall("default", session, q, args.k, "session", None, True)
            direct_us.append((time.perf_counter_ns() - t0) / 1e3)

        def routed() -> None:
            t0 = time.perf_counter_ns()
            native.request("default", "POST", f"/v1/sessions/{session}/recall", body)
            routed_us.append((time.perf_counter_ns() - t0) / 1e3)

        # In a random order each time: whichever goes first meets colder caches.
        paths = [python, facade, direct, routed]
        order.shuffle(paths)
        for path in paths:
            path()
    out["recall"] = r = {
        "python_p50_us": pct(py_us, 0.5),
        "python_p99_us": pct(py_us, 0.99),
        "facade_p50_us": pct(rust_us, 0.5),
        "facade_p99_us": pct(rust_us, 0.99),
        "python_minus_facade_p50_us": pct(py_us, 0.5) - pct(rust_us, 0.5),
        "python_mean_us": statistics.fmean(py_us),
        "native_direct_p50_us": pct(direct_us, 0.5),
        "native_routed_p50_us": pct(routed_us, 0.5),
        # Paired by query (the same query, session and moment), steadier than a
        # difference of medians: what each layer adds.
        "paired_python_minus_direct_p50_us": pct([p - d for p, d in zip(py_us, direct_us)], 0.5),
        "paired_direct_minus_facade_p50_us": pct([d - f for d, f in zip(direct_us, rust_us)], 0.5),
        "paired_routed_minus_direct_p50_us": pct([r - d for r, d in zip(routed_us, direct_us)], 0.5),
        "paired_python_minus_facade_p50_us": pct([p - f for p, f in zip(py_us, rust_us)], 0.5),
    }
    print(
        f"recall p50: Python {pct(py_us, 0.5):.0f} µs, Rust facade {pct(rust_us, 0.5):.0f} µs "
        f"(+{pct(py_us, 0.5) - pct(rust_us, 0.5):.0f} µs); the native call alone "
        f"{pct(direct_us, 0.5):.0f} µs direct, {pct(routed_us, 0.5):.0f} µs through the router"
    )
    print(
        "paired by query (p50): Python over the facade "
        f"+{r['paired_python_minus_facade_p50_us']:.0f} µs = the Python layer "
        f"+{r['paired_python_minus_direct_p50_us']:.0f} µs + the native call "
        f"+{r['paired_direct_minus_facade_p50_us']:.0f} µs; the router would add "
        f"+{r['paired_routed_minus_direct_p50_us']:.0f} µs"
    )

    if not args.no_chroma:
        import chromadb

        vectors: list[list[float]] = []
        for i in range(0, len(corpus), 1000):
            vectors.extend(native._embed(corpus[i : i + 1000]))
        query_vectors = native._embed(queries)
        client = chromadb.PersistentClient(path=str(work / "chroma"))
        collection = client.create_collection("bench", embedding_function=None)
        started = time.perf_counter()
        for i in range(0, len(corpus), 1000):
            collection.add(
                ids=[str(j) for j in range(i, min(i + 1000, len(corpus)))],
                embeddings=vectors[i : i + 1000],
                documents=corpus[i : i + 1000],
            )
        add_total = time.perf_counter() - started
        for v in query_vectors[:50]:
            collection.query(query_embeddings=[v], n_results=args.k)
        chroma_us: list[float] = []
        for v in query_vectors:
            t0 = time.perf_counter_ns()
            collection.query(query_embeddings=[v], n_results=args.k)
            chroma_us.append((time.perf_counter_ns() - t0) / 1e3)
        out["chroma"] = {
            "version": chromadb.__version__,
            "add_per_s": args.records / add_total,
            "query_p50_us": pct(chroma_us, 0.5),
            "query_p99_us": pct(chroma_us, 0.99),
        }
        print(
            f"chroma {chromadb.__version__}: add {args.records / add_total:,.0f}/s, "
            f"query p50 {pct(chroma_us, 0.5):.0f} µs"
        )

    memory.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
