"""Build hook for the optional C speedups; everything else is in pyproject.toml.

``lsmdb._speedups`` (the C files in lsmdb/csrc/, one per concept, named after
the Python module whose step each does, each with its header) runs the hot per-key and per-file
steps: a point read's range checks, filter probes and block read, get_many,
the scan/compaction merge, checksums, key hashes, WAL batch encoding,
a single put's step under the lock and filter building.  It is optional: when no C compiler is at hand the build goes
on without it and lsmdb uses the same logic in Python.
"""

import glob

from setuptools import Extension, setup

CSRC = "lsmdb/csrc/"
SOURCES = ["module.c", "filters.c", "filters_bloom.c", "filters_blocked_bloom.c",
           "filters_hashing.c", "readpath_probes.c",
           "cache.c", "memtable.c", "readpath.c", "readpath_many.c", "sstable_reader.c", "block.c",
           "merge.c", "logset.c", "coding.c", "writepath.c",
           "sstable_writer.c", "changes.c", "compression.c"]
HEADERS = sorted(glob.glob(CSRC + "*.h"))

setup(ext_modules=[Extension("lsmdb._speedups", [CSRC + name for name in SOURCES],
                             depends=HEADERS, optional=True, extra_compile_args=["-O2"])])
