"""A measured false-positive rate beside its prediction: fields for a row and their format."""

from __future__ import annotations

from typing import Any

from .common import fmt_pct, wilson_interval

OUTSIDE_NOTE = "! = the predicted FPR lies outside the measured 99% interval"


def fpr_fields(false_positives: int, probes: int, predicted: float) -> dict[str, Any]:
    """Measured rate, its 99 % Wilson interval, the prediction, and whether it lies inside."""
    lo, hi = wilson_interval(false_positives, probes)
    return {
        "false_positives": false_positives,
        "filter_probes": probes,
        "measured_fpr": false_positives / probes if probes else None,
        "ci99_low": lo,
        "ci99_high": hi,
        "predicted_fpr": predicted,
        "predicted_in_ci99": lo <= predicted <= hi,
    }


def fmt_ci(row: dict[str, Any]) -> str:
    return f"[{fmt_pct(row['ci99_low'])}, {fmt_pct(row['ci99_high'])}]"


def fmt_predicted(row: dict[str, Any]) -> str:
    """The prediction, with "!" when it falls outside the measured 99 % interval."""
    return fmt_pct(row["predicted_fpr"]) + ("" if row["predicted_in_ci99"] else " !")

