"""Child process for tests/test_compaction.py::test_sigkill_during_writes_and_compactions.

Usage: python crash_child_compaction.py DB_PATH SEED ROUND

Writes forever (until the parent SIGKILLs it) to two tables with tiny
memtables -- one size-tiered, one leveled -- with ``sync=True``, so
flushes and background compactions run all the time.  Before each write it
prints ``W <json ops>`` and after the write returned ``A``, each line
flushed at once: the parent knows every acknowledged write and the one write
that may have been in flight when it was killed.  Every value is unique.
"""

from __future__ import annotations

import json
import random
import sys

import lsmdb

TABLES = {"st": "size_tiered", "lv": "leveled"}
KEYS = 300


def main() -> None:
    path, seed, round_no = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    db = lsmdb.open(path, sync=True)
    for name, strategy in TABLES.items():
        if name not in db.tables():
            db.create_table(name, compaction=strategy, memtable_size_bytes=4096,
                            block_size_bytes=256, target_file_size_bytes=65536)
    out = sys.stdout
    out.write("READY\n")
    out.flush()
    n = 0
    while True:
        n += 1
        ops = []
        for _ in range(rng.choice([1, 1, 1, 3])):
            table = rng.choice(sorted(TABLES))
            key = b"key-%04d" % rng.randrange(KEYS)
            if rng.random() < 0.25:
                ops.append([table, key.hex(), None])
            else:
                value = b"r%d-n%d-" % (round_no, n) + b"v" * rng.choice([0, 10, 100, 400])
                ops.append([table, key.hex(), value.hex()])
        out.write("W " + json.dumps(ops) + "\n")
        out.flush()
        if len(ops) == 1:
            table, key, value = ops[0]
            t = db.table(table)
            if value is None:
                t.delete(bytes.fromhex(key))
            else:
                t.put(bytes.fromhex(key), bytes.fromhex(value))
        else:
            with db.batch() as b:
                for table, key, value in ops:
                    if value is None:
                        b.delete(bytes.fromhex(key), table=table)
                    else:
                        b.put(bytes.fromhex(key), bytes.fromhex(value), table=table)
        out.write("A\n")
        out.flush()
        if n % 150 == 0:
            db.compact(rng.choice(sorted(TABLES)))


if __name__ == "__main__":
    main()
