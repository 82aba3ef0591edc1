#!/usr/bin/env python3
"""Write tests/data/release1_db: a database as the release before SSTable format 2 wrote it.

Run it with that release's lsmdb on the path (a checkout of it, built), not
with the current one; tests/test_format2.py opens the directory with the
current code and checks every key against :func:`expected`:

    git worktree add /tmp/lsmdb-r1 <commit of that release> --detach
    (cd /tmp/lsmdb-r1 && python setup.py build_ext --inplace -q)
    PYTHONPATH=/tmp/lsmdb-r1 python tools/make_release1_db.py tests/data/release1_db

It holds format-1 SSTables in a size-tiered and a leveled table (one with a
0.001 fp chance, one with a keyed filter), tombstones, and WAL records no
SSTable holds yet.  The contents are a pure function of :func:`ops`.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Iterator
from typing import Any

TABLES: dict[str, dict[str, Any]] = {
    "default": {},
    "events": {"compaction": "leveled", "bloom_filter_fp_chance": 0.001},
    "sessions": {"bloom_filter_hash": "keyed"},
}


def ops() -> Iterator[tuple[str, str, bytes, bytes | None]]:
    """("put"|"delete"|"flush", table, key, value) in order, seeded."""
    rng = random.Random(20261203)
    for step in range(3000):
        table = rng.choice(list(TABLES))
        key = b"%s:%05d" % (table.encode(), rng.randrange(800))
        if rng.random() < 0.15:
            yield "delete", table, key, None
        else:
            yield "put", table, key, b"v%d-" % step + bytes(rng.randrange(1, 60))
        if step % 800 == 799 and step < 2500:
            yield "flush", table, b"", None


def expected() -> dict[str, dict[bytes, bytes]]:
    """What every table holds after :func:`ops`."""
    model: dict[str, dict[bytes, bytes]] = {t: {} for t in TABLES}
    for op, table, key, value in ops():
        if op == "put":
            assert value is not None
            model[table][key] = value
        elif op == "delete":
            model[table].pop(key, None)
    return model


def main(dest: str) -> int:
    import lsmdb
    if os.path.exists(dest):
        shutil.rmtree(dest)
    db = lsmdb.open(dest, auto_compaction=False)
    for name, options in TABLES.items():
        if name != "default":
            db.create_table(name, **options)
    for op, table, key, value in ops():
        t = db.table(table)
        if op == "put":
            t.put(key, value)
        elif op == "delete":
            t.delete(key)
        else:
            db.flush()
    db.sync()
    db.close()
    print(f"wrote {dest} with lsmdb from {os.path.dirname(lsmdb.__file__)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/release1_db"))
