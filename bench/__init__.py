"""Benchmarks for lsmdb; run from the repository root.

* ``python -m bench.absent_keys`` -- what the Bloom filters guarantee, cost and
  save in a real database, measured against the formulas that predict it.
* ``python -m bench.peers`` -- lsmdb against sqlite3, LevelDB, RocksDB and lmdb
  on the same keys and queries.

See bench/README.md for the columns and a recorded run.
"""
