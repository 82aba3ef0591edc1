/* readpath.h: Getter, a table's point read in C (readpath.c), get_many's
 * (readpath_many.c), and the steps the two share.  Python twin:
 * lsmdb/readpath.py. */

#ifndef LSMDB_READPATH_H
#define LSMDB_READPATH_H

#include "base.h"
#include "block.h"
#include "cache.h"
#include "fastpath.h"
#include "memtable.h"
#include "readpath_probes.h"

/* A table's point read in C, db.get itself (readpath.c). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *db;           /* the database (its close empties the cell) */
    PyObject *cell;         /* state.fast_cell: [state.fast], or [None] once the database closed */
    Py_buffer counts;       /* state.counts: gets, gets_absent */
    int have_counts;
    PyObject *missing;      /* the MISSING sentinel */
    PyObject *lookup_block; /* (reader, key[, block]) -> value/None/MISSING: SSTableReader.lookup */
    PyObject *slow_get;     /* the Python getter: anything unusual goes there */
    Cache *cache;           /* the block cache (its entries: block_entry bytes), or NULL */
    Py_ssize_t max_key;
} Getter;

HIDDEN_BEGIN

extern PyTypeObject GetterType;
extern PyTypeObject ContainsType;

/* readpath.c */
Py_ssize_t bisect_index(const Entry *e, PyObject *key);
int index_words_init(Entry *e);
int cached_block_for(Getter *self, const Entry *e, PyObject *key, PyObject **block,
                     Py_ssize_t *block_index);
int cached_answer(Entry *e, PyObject *entry, PyObject *key, PyObject **value);
int offer_block(Getter *self, const Entry *e, Py_ssize_t i, const unsigned char *p, size_t size,
                int false_positive);
int disk_probe(Getter *self, Entry *e, PyObject *key, Py_ssize_t i, PyObject **value);
int mem_lookup(PyObject *fast, PyObject *key, uint64_t h, int have_h, PyObject **value);

/* readpath_many.c */
PyObject *Getter_many(Getter *self, PyObject *keys);

HIDDEN_END

/* The state's fast tuple when the C path can serve: 1 and *fast (a new
 * reference); 0 when the Python getter must (closed database: its close
 * puts None in the cell; no C probes: shadow mode).  The tuple is taken out
 * of the state's cell, a list that TableState.publish and DB.close write:
 * the attribute lookups of db._closed and state.fast it replaced took
 * 13-20% of an absent get (paired, 2,000,000 and 200,000 keys). */
static inline int
getter_fast(Getter *self, PyObject **fast)
{
    PyObject *cell = self->cell;
    if (PyList_GET_SIZE(cell) != 1)
        return 0;
    PyObject *f = PyList_GET_ITEM(cell, 0);  /* borrowed: no other thread runs until the incref */
    if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != FAST_FIELDS  /* a FastPath */
        || !PyObject_TypeCheck(PyTuple_GET_ITEM(f, FAST_PROBES), &ProbesType)
        || !PyDict_CheckExact(PyTuple_GET_ITEM(f, FAST_DATA))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, FAST_IMM_DATAS))
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(f, FAST_FILTERS))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, FAST_FILTERS))
               != PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, FAST_IMM_DATAS)) + 1)
        return 0;
    *fast = Py_NewRef(f);
    return 1;
}

/* Make key the probes' held key with h as its fast hash (the probes' fast
 * hash being this module's xxh3_64), so that the files' probes reuse it. */
static inline void
probes_hold(Probes *self, PyObject *key, uint64_t h)
{
    if (self->last_key != key) {
        Py_INCREF(key);
        Py_XSETREF(self->last_key, key);
        self->have_keyed = 0;
    }
    self->last_fast = h;
    self->have_fast = 1;
}

/* A get's key hashed once, up front, for the memtable filters and then the
 * files' filters: 1 and *h, or 0 for a key too long to hash inline (its
 * memtable lookups then go straight to the dicts). */
static inline int
getter_hash(Probes *probes, PyObject *key, uint64_t *h)
{
    if (PyBytes_GET_SIZE(key) > XXH3_NATIVE_MAX)
        return 0;
    *h = xxh3_64_of_short(key);
    if (probes->native_hash)
        probes_hold(probes, key, *h);
    return 1;
}

/* After a "maybe" from file e: answer from the block cache when it holds
 * the block.  1: found, *value set (a new reference; None for a
 * tombstone); 0: a false positive (counted); 2: not answerable here (block
 * not cached, no cache, an odd cache entry): the caller asks the Python
 * lookup_block, passing it *block_index when that is >= 0 (the block that
 * can hold key, which the cache does not hold, or there is no cache); -1:
 * error. */
static inline int
cached_lookup(Getter *self, Entry *e, PyObject *key, PyObject **value, Py_ssize_t *block_index)
{
    PyObject *block;
    int r = cached_block_for(self, e, key, &block, block_index);
    if (r <= 0)
        return r < 0 ? -1 : 2;
    int found = cached_answer(e, block, key, value);
    Py_DECREF(block);
    return found;
}

#endif
