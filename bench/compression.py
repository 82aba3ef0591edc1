"""Block compression: bytes on disk and read rates, lsmdb's three kinds and the peers.

    python -m bench.compression [--keys N] [--json PATH]

Every store gets the same N JSON records of 150-300 bytes with realistic
fields (names, e-mails, cities, numbers, tags, a few words of text: neither
one repeated byte nor random bytes), keyed ``b"user:%010d" % 2i``, loaded in
one random order through batches of 10,000, then compacted in full
(lsmdb's ``compact()``, LevelDB's and RocksDB's ``compact_range()``) and
closed.  Bytes on disk are every file of the store's directory once closed
(its SSTables alone in a second column).

Then each lsmdb database is opened again (its defaults, so a block cache of
the default size) and times gets of present keys (a random sample of them)
and of absent keys between present ones, the three databases taking turns
slice by slice (:func:`bench.common.time_gets_interleaved`); a kind's rate is
the median of its slices and its ratio to ``none`` the median of the
per-slice ratios.  The answers are checked: every present key must return
its record, every absent key nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import lsmdb

from .common import (
    Progress,
    describe_machine,
    fmt_rate,
    fmt_ratio,
    machine_info,
    median_ratio,
    print_section,
    time_gets_interleaved,
    write_json,
)
from .stores import FILTER_BITS_PER_KEY, batches

KINDS = ("none", "lz4", "zstd")
FIRST = ["Ana", "Bruno", "Chen", "Dara", "Emeka", "Fatima", "Giulia", "Hiro", "Ines", "Jonas",
         "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq"]
LAST = ["Silva", "Kowalski", "Nguyen", "Okafor", "Haddad", "Rossi", "Tanaka", "Moreau", "Berg",
        "Costa", "Mensah", "Ivanova", "Garcia", "Sato", "Novak", "Fischer", "Lund", "Diaz"]
CITIES = [("Lisbon", "PT"), ("Oslo", "NO"), ("Kyoto", "JP"), ("Quito", "EC"), ("Accra", "GH"),
          ("Perth", "AU"), ("Lima", "PE"), ("Riga", "LV"), ("Porto", "PT"), ("Lagos", "NG"),
          ("Hanoi", "VN"), ("Lyon", "FR"), ("Graz", "AT"), ("Cork", "IE"), ("Pune", "IN")]
TAGS = ["new", "vip", "churn-risk", "beta", "eu", "us", "mobile", "desktop", "trial", "annual",
        "referral", "support", "newsletter", "premium"]
WORDS = ("likes hiking coffee jazz chess travel books cooking running photography gardening "
         "music film design cycling climbing painting yoga swimming tennis").split()
DOMAINS = ["example.org", "mail.example.com", "inbox.example.net", "post.example.io"]


def record(i: int, rng: random.Random) -> bytes:
    """One JSON record of 150-300 bytes."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    city, country = rng.choice(CITIES)
    rec: dict[str, Any] = {
        "id": i, "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}{rng.randrange(100)}@{rng.choice(DOMAINS)}",
        "city": city, "country": country, "age": rng.randrange(18, 90),
        "score": round(rng.uniform(0, 1000), 2), "visits": rng.randrange(10_000),
        "tags": rng.sample(TAGS, rng.randrange(1, 4)),
        "signup": f"20{rng.randrange(10, 27):02d}-{rng.randrange(1, 13):02d}-"
                  f"{rng.randrange(1, 29):02d}",
    }
    target = rng.randrange(150, 301)
    data = json.dumps(rec, separators=(",", ":"))
    if len(data) < target:
        words: list[str] = []
        while len(data) + len(" ".join(words)) + 10 < target:
            words.append(rng.choice(WORDS))
        rec["bio"] = " ".join(words)
        data = json.dumps(rec, separators=(",", ":"))
    return data[:300].encode() if len(data) > 300 else data.encode()


def make_items(n: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    items = [(b"user:%010d" % (2 * i), record(i, rng)) for i in range(n)]
    rng.shuffle(items)
    return items


def dir_bytes(path: str, only: tuple[str, ...] = ()) -> int:
    total = 0
    for name in os.listdir(path):
        if only and not name.endswith(only):
            continue
        full = os.path.join(path, name)
        if os.path.isfile(full):
            total += os.path.getsize(full)
    return total


def load_lsmdb(path: str, items: Sequence[tuple[bytes, bytes]], kind: str) -> None:
    db = lsmdb.open(path)
    try:
        db.alter_table("default", compression=kind)
        for chunk in batches(items):
            with db.batch() as batch:
                for key, value in chunk:
                    batch.put(key, value)
        db.wait_for_compactions()
        db.compact()
    finally:
        db.close()


def load_leveldb(path: str, items: Sequence[tuple[bytes, bytes]]) -> None:
    plyvel = importlib.import_module("plyvel")
    db = plyvel.DB(path, create_if_missing=True, bloom_filter_bits=FILTER_BITS_PER_KEY)
    try:
        for chunk in batches(items):
            with db.write_batch() as batch:
                for key, value in chunk:
                    batch.put(key, value)
        db.compact_range()
    finally:
        db.close()


def load_rocksdb(path: str, items: Sequence[tuple[bytes, bytes]]) -> None:
    rocksdict = importlib.import_module("rocksdict")
    db = rocksdict.Rdict(path)
    try:
        for chunk in batches(items):
            wb = rocksdict.WriteBatch()
            for key, value in chunk:
                wb.put(key, value)
            db.write(wb)
        db.compact_range(None, None)
    finally:
        db.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="records to load")
    parser.add_argument("--gets", type=int, default=100_000, help="gets per query set")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.keys < 1000 or args.gets < 1000:
        parser.error("--keys and --gets must be at least 1000")
    progress = Progress()
    items = make_items(args.keys)
    sizes = [len(v) for _k, v in items]
    progress(f"{len(items):,} records of {min(sizes)}-{max(sizes)} bytes "
             f"(mean {sum(sizes) / len(sizes):.0f})")
    root = tempfile.mkdtemp(prefix="lsmdb-bench-compression-")
    report: dict[str, Any] = {"keys": args.keys, "machine": machine_info(),
                              "value_bytes": [min(sizes), max(sizes)], "stores": {}}
    try:
        for kind in KINDS:
            path = os.path.join(root, f"lsmdb-{kind}")
            progress(f"loading lsmdb compression={kind}")
            load_lsmdb(path, items, kind)
            report["stores"][f"lsmdb {kind}"] = {
                "bytes": dir_bytes(path), "sstable_bytes": dir_bytes(path, (".sst",))}
        for name, loader, exts in (("LevelDB", load_leveldb, (".ldb", ".sst")),
                                   ("RocksDB", load_rocksdb, (".sst",))):
            module = "plyvel" if name == "LevelDB" else "rocksdict"
            try:
                importlib.import_module(module)
            except ImportError:
                progress(f"{name}: skipped ({module} is not installed)")
                continue
            path = os.path.join(root, name)
            progress(f"loading {name}")
            loader(path, items)
            report["stores"][name] = {"bytes": dir_bytes(path),
                                      "sstable_bytes": dir_bytes(path, exts)}
        values = dict(items)
        rng = random.Random(11)
        present = rng.sample(sorted(values), min(args.gets, len(values)))
        absent = [b"user:%010d" % (2 * rng.randrange(args.keys) + 1) for _ in range(args.gets)]
        dbs = [lsmdb.open(os.path.join(root, f"lsmdb-{kind}")) for kind in KINDS]
        try:
            for db, kind in zip(dbs, KINDS, strict=True):  # correctness first, untimed
                bad = sum(db.get(k) != values[k] for k in present[:2000])
                bad += sum(db.get(k) is not None for k in absent[:2000])
                if bad:
                    raise SystemExit(f"lsmdb {kind}: {bad} wrong answers")
            reads: dict[str, Any] = {}
            for label, keys in (("present", present), ("absent", absent)):
                progress(f"timing {label} gets")
                timings = time_gets_interleaved([db.get for db in dbs], keys)
                want = len(keys) if label == "present" else 0
                for kind, t in zip(KINDS, timings, strict=True):
                    if t.found != want:
                        raise SystemExit(f"lsmdb {kind}: found {t.found} of {label} keys")
                reads[label] = {kind: {"per_second": t.per_second,
                                       "vs_none": median_ratio(t, timings[0])}
                                for kind, t in zip(KINDS, timings, strict=True)}
            report["gets"] = reads
        finally:
            for db in dbs:
                db.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    stores = report["stores"]
    base = stores.get("LevelDB", {}).get("bytes")
    rows = [[name, f"{s['bytes'] / 1e6:.1f} MB", f"{s['sstable_bytes'] / 1e6:.1f} MB",
             fmt_ratio(s["bytes"] / base) if base else "n/a"] for name, s in stores.items()]
    print_section(f"Bytes on disk: {args.keys:,} JSON records of {min(sizes)}-{max(sizes)} "
                  "bytes, random order, compacted", ["store", "on disk", "SSTables",
                                                     "vs LevelDB"], rows,
                  [describe_machine(report["machine"])])
    print()
    rows = [[kind, fmt_rate(report["gets"]["present"][kind]["per_second"]),
             fmt_ratio(report["gets"]["present"][kind]["vs_none"]),
             fmt_rate(report["gets"]["absent"][kind]["per_second"]),
             fmt_ratio(report["gets"]["absent"][kind]["vs_none"])] for kind in KINDS]
    print_section("lsmdb gets by compression (the three taking turns slice by slice)",
                  ["compression", "present gets/s", "vs none", "absent gets/s", "vs none"],
                  rows)
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
