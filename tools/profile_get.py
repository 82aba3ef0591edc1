"""Where an absent in-range get spends its time (3 SSTables, as after bench.peers' load).

Run from the repository root: ``python tools/profile_get.py``.  Each line is the best of five
passes over 100,000 absent keys that fall inside every file's key range.  The last line is the
floor a pure-Python read path can reach for this layout: the hash, the range checks and the
inline filter probes, without any counter, check or call.
"""
import random
import tempfile
import time

import lsmdb
from lsmdb.bloom import key_hash

n=200_000
d=tempfile.mkdtemp()
db=lsmdb.open(d, auto_compaction=False)
keys=list(range(n)); random.Random(1).shuffle(keys)
for part in range(3):
    with db.batch() as b:
        for i in keys[part*n//3:(part+1)*n//3]: b.put(b"user:%010d"%(2*i), b"x"*100)
    db.flush()
db.close(); db=lsmdb.open(d, auto_compaction=False)
rng=random.Random(2)
q=[b"user:%010d"%(2*rng.randrange(n)+1) for _ in range(100000)]
g=db.get
def rate(fn):
    best=0
    for _ in range(5):
        t0=time.perf_counter(); fn(); r=len(q)/(time.perf_counter()-t0); best=max(best,r)
    return best
def full():
    for k in q: g(k)
data=db._default_state.fast[0]
def call_only():
    f=lambda key, default=None: default
    for k in q: f(k)
def dict_only():
    for k in q: data.get(k)
probes=db._default_state.fast[2]
M=0xffffffff
def hash_probe():
    for key in q:
        h=key_hash(key); h1=h&M; h2=h>>32
        for r, lo, hi, bits, m, ks, kf, ik, base in probes:
            if key < lo or key > hi: continue
            pos=h1%m; step=h2%m
            if not bits[pos>>3] & (1<<(pos&7)): continue
            for _ in ks:
                pos+=step
                if pos>=m: pos-=m
                if not bits[pos>>3] & (1<<(pos&7)): break
def hash_only():
    for key in q: key_hash(key)
res={}
for name, fn in [("db.get (3 files)", full), ("a Python call returning default", call_only), ("memtable dict lookup", dict_only), ("xxh3_64 hash", hash_only), ("hash + 3 range checks + 3 filter probes, no counters", hash_probe)]:
    r=rate(fn); res[name]=r
    print(f"{name:<55} {r/1e3:8.0f}k/s  {1e9/r:6.0f} ns/get")
