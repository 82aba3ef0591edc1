"""What the C read path reads and counts, checked against the Python definitions.

The C getter and probes (lsmdb/csrc/) count into the counter slots of
:mod:`lsmdb.stats`.  They number those slots with macros
(lsmdb/csrc/speedups.h), and the module exports their names in slot order
(``_speedups.FILE_COUNTERS``, ``TABLE_COUNTERS``).  At import the two are
compared: on a mismatch -- an extension built from other sources than this
Python, which would count into the wrong slots -- the C read path is
refused with a warning, and reads take the Python path (same answers,
slower); ``LAYOUT_ERRORS`` says why.
"""

from __future__ import annotations

import logging
from types import ModuleType

from .stats import c_counter_errors

try:
    from . import _speedups
except ImportError:  # pragma: no cover - built without a C compiler
    _speedups = None  # type: ignore[assignment]

log = logging.getLogger("lsmdb")


def layout_errors(module: ModuleType | None) -> list[str]:
    """What in ``module`` (lsmdb._speedups, or None: not built) does not match
    the Python definitions; [] when it all does."""
    if module is None:
        return []
    file_slots = getattr(module, "FILE_COUNTERS", None)
    table_slots = getattr(module, "TABLE_COUNTERS", None)
    if file_slots is None or table_slots is None:
        return ["it exports no counter slots"]
    return c_counter_errors(file_slots, table_slots)


#: Why the C read path is refused ([] when it is in use, or not built).
LAYOUT_ERRORS = layout_errors(_speedups)
#: Whether the C getter and probes may serve reads.
C_READ_PATH = _speedups is not None and not LAYOUT_ERRORS
if LAYOUT_ERRORS:
    log.warning("lsmdb._speedups does not match this lsmdb (%s): reads take the Python "
                "path; rebuild the extension (pip install .)", "; ".join(LAYOUT_ERRORS))
