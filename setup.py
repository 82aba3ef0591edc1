"""Build hook for the optional C speedups; everything else is in pyproject.toml.

``lsmdb._speedups`` (lsmdb/_speedups.c) runs the hot per-key and per-file
steps: a point read's range checks, filter probes and block read, get_many,
the scan/compaction merge, checksums, key hashes, WAL batch encoding and
filter building.  It is optional: when no C compiler is at hand the build goes
on without it and lsmdb uses the same logic in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("lsmdb._speedups", ["lsmdb/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"])])
