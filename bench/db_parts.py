"""Parts 1, 2 and 5 of the absent-key benchmark: measured in the database's tables.

1. guarantee     -- absent gets find nothing, present gets find everything.
2. price_list    -- per fp chance: what the filter costs and saves.
5. absent_share  -- gets/s with and without a filter as the share of absent
                    keys grows: where the filter stops paying.
"""

from __future__ import annotations

import random
from typing import Any

from .common import (
    SLICES,
    fmt_int,
    fmt_pct,
    fmt_rate,
    fmt_ratio,
    median_ratio,
    print_section,
    time_gets_interleaved,
)
from .filter_db import (
    GUARANTEE_FP_CHANCE,
    PRICE_LIST_FP_CHANCES,
    SEED,
    Fixture,
    filter_shape,
    run_gets,
    table_counters,
)
from .fpr import OUTSIDE_NOTE, fmt_ci, fmt_predicted, fpr_fields
from .keys import number_of, value_of

ABSENT_SHARES = (0.0, 0.5, 0.9, 0.99)
SHARE_SLICES = 10               # part 5 alternates the two tables slice by slice
RATE_NOTE = (f"get/s: the median rate of {SLICES} equal slices of the loop (a burst of load from "
             "another process moves one slice, not the result)")


# -------------------------------------------------------------- 1. guarantee
def guarantee_row(fx: Fixture, layout: str) -> dict[str, Any]:
    """Absent gets must find nothing; present gets must find their own value."""
    table = fx.tables[GUARANTEE_FP_CHANCE]
    db_table = fx.db.table(table)
    shape = filter_shape(fx.db, table)
    absent = run_gets(fx, table, fx.absent)
    false_negatives = wrong_values = 0
    for key in fx.present:
        value = db_table.get(key)
        if value is None:
            false_negatives += 1
        elif value != value_of(number_of(key)):
            wrong_values += 1
    return {
        "layout": layout, "files": shape.files, "fp_chance": GUARANTEE_FP_CHANCE,
        "bits_per_key": shape.bits_per_key,
        "absent_gets": absent.gets, "absent_found": absent.found,
        "range_skips": absent.counters["range_skips"],
        "present_gets": len(fx.present), "present_found": len(fx.present) - false_negatives,
        "false_negatives": false_negatives, "predicted_false_negatives": 0,
        "wrong_values": wrong_values,
        **fpr_fields(absent.counters["false_positives"], absent.filter_probes,
                     shape.predicted_fpr),
    }


def part_guarantee(rows: list[dict[str, Any]], queries: int,
                   notes: list[str]) -> dict[str, Any]:
    """Part 1 from its rows (before and, if it ran, after compaction) and extra notes."""
    return {
        "title": f"1. Guarantee: table with bloom_filter_fp_chance {GUARANTEE_FP_CHANCE:g}, "
                 f"{queries:,} absent keys inside every file's key range and "
                 f"{queries:,} present keys",
        "rows": rows,
        "notes": [OUTSIDE_NOTE, "false neg = present keys the get did not find (must be 0)"]
        + notes + [f"WRONG VALUES returned for {r['wrong_values']} present keys "
                   f"({r['layout']})" for r in rows if r["wrong_values"]]}


def print_guarantee(part: dict[str, Any]) -> None:
    rows = [[r["layout"], str(r["files"]), fmt_int(r["absent_gets"]), fmt_int(r["absent_found"]),
             fmt_int(r["present_gets"]), fmt_int(r["present_found"]),
             fmt_int(r["false_negatives"]), fmt_int(r["filter_probes"]),
             fmt_int(r["false_positives"]), fmt_pct(r["measured_fpr"]), fmt_ci(r),
             fmt_predicted(r)] for r in part["rows"]]
    print_section(part["title"], ["layout", "files", "absent gets", "absent found",
                                  "present gets", "present found", "false neg", "filter probes",
                                  "false pos", "measured FPR", "99% interval", "predicted FPR"],
                  rows, part["notes"])


# ------------------------------------------------------------- 2. price list
def part_price_list(fx: Fixture) -> dict[str, Any]:
    """Per fp chance: what the filter costs in memory and saves in block reads."""
    rows = []
    for fp in PRICE_LIST_FP_CHANCES:
        table = fx.tables[fp]
        shape = filter_shape(fx.db, table)
        absent = run_gets(fx, table, fx.absent)
        present = run_gets(fx, table, fx.present)
        reads = absent.counters["block_reads"]
        rows.append({
            "fp_chance": fp, "files": shape.files, "bits_per_key": shape.bits_per_key,
            "filter_hashes": shape.filter_hashes, "filter_bytes": shape.filter_bytes,
            "absent_gets": absent.gets, "absent_found": absent.found,
            "range_skips": absent.counters["range_skips"], "block_reads": reads,
            "read_syscalls": absent.read_syscalls,
            "block_cache_hits": absent.counters["block_cache_hits"],
            "predicted_block_reads": absent.gets * shape.files * shape.predicted_fpr,
            **fpr_fields(absent.counters["false_positives"], absent.filter_probes,
                         shape.predicted_fpr),
            "absent_gets_per_s": absent.per_second,
            "present_gets": present.gets, "present_found": present.found,
            "present_block_reads": present.counters["block_reads"],
            "present_gets_per_s": present.per_second,
        })
        fx.progress(f"price list: fp {fp:g} done "
                    f"({absent.seconds + present.seconds:.1f}s of gets)")
    baseline = rows[0]["block_reads"]
    for row in rows:
        row["reads_skipped"] = 1 - row["block_reads"] / baseline if baseline else None
    notes = [OUTSIDE_NOTE,
             ("block reads: data blocks the engine read for the absent gets (its block_reads "
              "counter); kernel reads: read system calls the kernel counted meanwhile (syscr)."),
             ("predicted reads: absent gets x files x predicted FPR; skipped: block reads saved "
              "against the fp 1.0 row"),
             RATE_NOTE]
    if not fx.syscalls.available:
        notes.append(f"kernel reads unavailable: {fx.syscalls.unavailable_reason}")
    else:
        off = [r["fp_chance"] for r in rows if r["read_syscalls"] != r["block_reads"]]
        notes.append("kernel reads equal the engine's block reads in every row" if not off else
                     f"kernel reads differ from block reads at fp {', '.join(map(str, off))}")
    notes += wrong_answer_notes(rows, fx)
    return {"title": f"2. Price list: {len(fx.absent):,} absent gets (inside every file's key "
                     f"range) and {len(fx.present):,} present gets per row, "
                     f"{fx.sstables} SSTables", "rows": rows, "notes": notes}


def wrong_answer_notes(rows: list[dict[str, Any]], fx: Fixture) -> list[str]:
    notes = []
    for r in rows:
        if r["absent_found"] or r["present_found"] != len(fx.present):
            notes.append(f"WRONG ANSWERS at fp {r['fp_chance']:g}: {r['absent_found']} absent keys "
                         f"found, {r['present_found']} of {len(fx.present)} present keys found")
    return notes


def print_price_list(part: dict[str, Any]) -> None:
    rows = [[f"{r['fp_chance']:g}", f"{r['bits_per_key']:.2f}",
             ",".join(map(str, r["filter_hashes"])), fmt_int(r["filter_bytes"]),
             fmt_int(r["block_reads"]), fmt_int(r["read_syscalls"]),
             f"{r['predicted_block_reads']:,.0f}", fmt_pct(r["reads_skipped"]),
             fmt_pct(r["measured_fpr"]), fmt_ci(r), fmt_predicted(r),
             fmt_rate(r["absent_gets_per_s"]), fmt_rate(r["present_gets_per_s"])]
            for r in part["rows"]]
    print_section(part["title"], ["fp chance", "bits/key", "k", "filter bytes", "block reads",
                                  "kernel reads", "predicted reads", "skipped", "measured FPR",
                                  "99% interval", "predicted FPR", "absent get/s",
                                  "present get/s"], rows, part["notes"])


# ----------------------------------------------------------- 5. absent share
def predicted_reads_per_get(share: float, files: int, fpr: float) -> float:
    """Block reads per get: an absent key pays fpr in every file; a present key one read
    plus fpr in each of the (files - 1) / 2 newer files it passes on average."""
    return share * files * fpr + (1 - share) * (1 + (files - 1) / 2 * fpr)


def absent_share_rows(fx: Fixture, layout: str) -> list[dict[str, Any]]:
    """Gets/s without a filter (fp 1.0) and with the default one, per absent share.

    The two tables are timed slice by slice in turn; the speedup is the
    median of the per-slice ratios, each measured under the same load.
    """
    queries = len(fx.absent)
    variants = (("no_filter", 1.0), ("filter", GUARANTEE_FP_CHANCE))
    rows = []
    for share in ABSENT_SHARES:
        n_absent = round(share * queries)
        keys = fx.absent[:n_absent] + fx.present[:queries - n_absent]
        random.Random(SEED + n_absent).shuffle(keys)
        names = [fx.tables[fp] for _label, fp in variants]
        shapes = [filter_shape(fx.db, name) for name in names]
        before = [table_counters(fx.db, name) for name in names]
        timings = time_gets_interleaved([fx.db.table(name).get for name in names], keys,
                                        SHARE_SLICES)
        row: dict[str, Any] = {"layout": layout, "files": shapes[0].files, "absent_share": share,
                               "gets": len(keys), "absent_gets": n_absent,
                               "expected_found": len(keys) - n_absent}
        for (label, fp), name, shape, start, timing in zip(variants, names, shapes, before,
                                                           timings, strict=True):
            reads = table_counters(fx.db, name)["block_reads"] - start["block_reads"]
            row[f"{label}_fp_chance"] = fp
            row[f"{label}_files"] = shape.files
            row[f"{label}_found"] = timing.found
            row[f"{label}_gets_per_s"] = timing.per_second
            row[f"{label}_block_reads_per_get"] = reads / len(keys)
            row[f"{label}_predicted_block_reads_per_get"] = predicted_reads_per_get(
                share, shape.files, shape.predicted_fpr)
        row["speedup"] = median_ratio(timings[1], timings[0])
        rows.append(row)
    fx.progress(f"absent shares ({layout}) done")
    return rows


def share_verdict(rows: list[dict[str, Any]]) -> str:
    """Where the filter stops paying: the absent shares at which it is slower than none."""
    layout = rows[0]["layout"]
    losing = [f"{r['absent_share']:.0%}" for r in rows if r["speedup"] < 1]
    if not losing:
        return (f"{layout}: the filter pays at every absent share measured "
                f"({rows[0]['absent_share']:.0%} to {rows[-1]['absent_share']:.0%})")
    return f"{layout}: the filter costs more than it saves at {', '.join(losing)} absent gets"


def part_absent_share(rows: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    verdicts = [share_verdict([r for r in rows if r["layout"] == lay]) for lay in layouts]
    wrong = [r for r in rows if r["no_filter_found"] != r["expected_found"]
             or r["filter_found"] != r["expected_found"]]
    notes = verdicts + notes + [
        ("reads/get: data blocks read per get, measured (engine counter) / predicted "
         "(absent: files x FPR; present: 1 + (files - 1)/2 x FPR)"),
        (f"get/s: median of {SHARE_SLICES} slices, the two tables taking turns slice by slice; "
         "speedup: the median of the per-slice ratios (filter / no filter)")]
    if wrong:
        notes.append(f"WRONG ANSWERS in {len(wrong)} rows: found counts differ from expected")
    return {"title": f"5. Absent share: gets/s without a filter (fp 1.0) and with fp "
                     f"{GUARANTEE_FP_CHANCE:g}, {rows[0]['gets']:,} gets per row",
            "verdicts": verdicts, "rows": rows, "notes": notes}


def print_absent_share(part: dict[str, Any]) -> None:
    rows = [[r["layout"], str(r["files"]), f"{r['absent_share']:.0%}",
             fmt_rate(r["no_filter_gets_per_s"]), fmt_rate(r["filter_gets_per_s"]),
             fmt_ratio(r["speedup"]),
             (f"{r['no_filter_block_reads_per_get']:.3f} / "
              f"{r['no_filter_predicted_block_reads_per_get']:.3f}"),
             (f"{r['filter_block_reads_per_get']:.3f} / "
              f"{r['filter_predicted_block_reads_per_get']:.3f}")] for r in part["rows"]]
    print_section(part["title"], ["layout", "files", "absent", "no filter get/s",
                                  "filter get/s", "speedup", "reads/get no filter",
                                  "reads/get filter"], rows, part["notes"])

