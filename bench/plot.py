"""The absent-key benchmark's figure (``--plot``): the price list against the formulas.

Needs matplotlib (``pip install 'lsmdb[plot]'``), imported only when drawing.
"""

from __future__ import annotations

import math
from typing import Any


def require_matplotlib(parser: Any) -> None:
    """``--plot`` given: stop before any work if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("--plot needs matplotlib, which is not installed: pip install 'lsmdb[plot]'")


def finish_log_axes(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """Log y axis, labels, title, grid and legend: the same for both panels."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def write_plot(path: str, price: dict[str, Any]) -> None:
    """Measured vs predicted FPR, and block reads per absent get, against bits/key."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = price["rows"]
    bits = [r["bits_per_key"] for r in rows]
    fig, (ax_fpr, ax_reads) = plt.subplots(1, 2, figsize=(11, 4.5))
    curve_x = [b / 10 for b in range(1, 221)]
    curve_y = []
    for b in curve_x:
        k = max(1, round(b * math.log(2)))
        curve_y.append((1 - math.exp(-k / b)) ** k)
    ax_fpr.plot(curve_x, curve_y, color="0.6", label="predicted, optimal k: (1-e^(-k/b))^k")
    ax_fpr.scatter(bits, [r["predicted_fpr"] for r in rows], marker="x", color="C1",
                   label="predicted for the files", zorder=3)
    seen = [r for r in rows if r["false_positives"]]
    ax_fpr.errorbar([r["bits_per_key"] for r in seen], [r["measured_fpr"] for r in seen],
                    yerr=[[r["measured_fpr"] - r["ci99_low"] for r in seen],
                          [r["ci99_high"] - r["measured_fpr"] for r in seen]],
                    fmt="o", color="C0", capsize=3, label="measured, 99% interval", zorder=4)
    unseen = [r for r in rows if not r["false_positives"]]
    if unseen:
        ax_fpr.scatter([r["bits_per_key"] for r in unseen], [r["ci99_high"] for r in unseen],
                       marker="v", color="C0", zorder=4,
                       label="no false positive seen: 99% upper bound")
    finish_log_axes(ax_fpr, "filter bits per key", "false-positive rate", "False-positive rate")

    ax_reads.plot(bits, [r["predicted_block_reads"] / r["absent_gets"] for r in rows],
                  marker="x", color="C1", label="predicted: files x FPR")
    # A row without a single read cannot sit on a log axis: a line of text names it.
    read_rows = [r for r in rows if r["block_reads"]]
    ax_reads.plot([r["bits_per_key"] for r in read_rows],
                  [r["block_reads"] / r["absent_gets"] for r in read_rows],
                  marker="o", linestyle="none", color="C0", label="engine block_reads")
    kernel_rows = [r for r in rows if r["read_syscalls"]]
    if kernel_rows:
        ax_reads.plot([r["bits_per_key"] for r in kernel_rows],
                      [r["read_syscalls"] / r["absent_gets"] for r in kernel_rows],
                      marker="+", markersize=12, linestyle="none", color="C2",
                      label="kernel read syscalls")
    zero = [f"{r['bits_per_key']:.1f}" for r in rows if not r["block_reads"]]
    if zero:
        ax_reads.text(0.98, 0.02, f"no block read at {', '.join(zero)} bits/key",
                      transform=ax_reads.transAxes, ha="right", va="bottom", fontsize=8)
    finish_log_axes(ax_reads, "filter bits per key (0 = no filter)",
                    "data-block reads per absent get", "Block reads per absent get")
    fig.suptitle(price["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def write_peers_plot(path: str, report: dict[str, Any]) -> None:
    """bench.peers' table as grouped bars: per workload, lsmdb's rate over each
    peer's (log scale; above the line at 1, lsmdb is faster)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [e for e in report["stores"] if e["available"] and e["store"] != "lsmdb"]
    workloads = list(report["workload_titles"])
    fig, ax = plt.subplots(figsize=(11, 4.8))
    width = 0.8 / max(1, len(peers))
    for i, e in enumerate(peers):
        xs, ys = [], []
        for j, w in enumerate(workloads):
            r = e["workloads"].get(w)
            if r and r.get("lsmdb_over_store"):
                xs.append(j + (i - (len(peers) - 1) / 2) * width)
                ys.append(r["lsmdb_over_store"])
        ax.bar(xs, ys, width, label=e["label"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), [report["workload_titles"][w] for w in workloads],
                  rotation=15, fontsize=8)
    config = report["config"]
    finish_log_axes(ax, "", "lsmdb's rate / the store's (above 1: lsmdb faster)",
                    f"lsmdb against its peers, {config['keys']:,} keys "
                    f"({config['value_bytes']}-byte values)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
