#!/usr/bin/env python3
"""Where a shadowbrain data directory's disk goes, table by table.

    python3 bench/lmdb_footprint.py DIR      # DIR holds store/ and vectors/ (LMDB)

For each LMDB table: entries, pages (branch, leaf, overflow) and their bytes, and the
payload (keys plus values) those pages carry, so the packing overhead is visible. The
vector index's one `arroy` table is split by arroy's key mode (items, tree nodes,
metadata). Needs the `lmdb` package (`pip install lmdb`). Read-only: safe beside a
running process, which it does not block.
"""
import os
import sys

import lmdb

STORE_FAMILIES = {
    0x00: "meta", 0x01: "records", 0x02: "embeddings", 0x03: "session listing",
    0x04: "namespace listing", 0x05: "session stats", 0x06: "audit", 0x07: "queues",
    0x08: "change log", 0x09: "tombstones", 0x0a: "passages",
}
ARROY_MODES = {0: "metadata", 1: "updated", 2: "tree nodes", 3: "items"}


def table_rows(env, name):
    db = env.open_db(name.encode(), create=False)
    with env.begin(db=db) as txn:
        st = txn.stat(db)
        by = {}
        for k, v in txn.cursor():
            part = None
            if name == "arroy" and len(k) >= 3:
                part = ARROY_MODES.get(k[2], f"mode {k[2]}")
            entry = by.setdefault(part, [0, 0])
            entry[0] += 1
            entry[1] += len(k) + len(v)
    pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
    return st, pages * st["psize"], by


def report(path, label):
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=64, subdir=True)
    with env.begin() as txn:
        names = [k.decode() for k, _ in txn.cursor()]
    file_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
    print(f"{label}: data.mdb {file_bytes / 1e6:.1f} MB")
    total = 0
    for name in names:
        st, used, by = table_rows(env, name)
        total += used
        family = name.removeprefix("family-")
        title = name
        if name.startswith("family-"):
            title = f"{name} ({STORE_FAMILIES.get(int(family, 16), '?')})"
        for part, (n, payload) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            what = title if part is None else f"{title} {part}"
            print(f"  {what:40} {n:>9} entries {payload / 1e6:8.1f} MB payload")
        print(f"  {'':40} {st['leaf_pages']:>9} leaf + {st['branch_pages']} branch + "
              f"{st['overflow_pages']} overflow pages = {used / 1e6:.1f} MB")
    print(f"  pages in use {total / 1e6:.1f} MB; the rest of the file is free pages")
    env.close()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    for part in ("store", "vectors"):
        p = os.path.join(d, part)
        if os.path.exists(os.path.join(p, "data.mdb")):
            report(p, part)
    kw = os.path.join(d, "keywords")
    if os.path.isdir(kw):
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(kw) for f in fs)
        print(f"keywords: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
