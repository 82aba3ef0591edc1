/* readpath.h: Getter, a table's point read in C (readpath.c) and get_many's
 * (readpath_many.c), and the per-file steps the two share -- the C twin of
 * lsmdb/readpath.py, whose lookup, file_filter and file_blocks it follows step
 * by step, counting the same.
 *
 * After a file's filter says "maybe", the block that can hold the key:
 *
 *   bisect_index          the block (past the last: a false positive)
 *   cached_entry          the block cache's copy, marked as used: a hit
 *   entry_answer          the key looked up in it (TRUE/FALSE_POSITIVES)
 *   disk_block            or the block read from disk (sstable_reader.c),
 *                         checked: its checksum, then the data block rule
 *                         (block.c); BLOCK_READS, the keys looked up, the
 *                         block offered to the cache (cache_admits)
 *
 * and every value found goes through visible(), the one place that decides
 * what it answers.  A block the C path cannot serve (the reader closed or in
 * memory, a short read, a bad checksum, a block the rule refuses) goes to the
 * Python file_blocks of that file (hand_over), which reads it again and
 * raises what it should; nothing of it was counted here. */

#ifndef LSMDB_READPATH_H
#define LSMDB_READPATH_H

#include "base.h"
#include "block.h"
#include "cache.h"
#include "changes.h"
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
    PyObject *file_blocks;  /* (fast, f, keys) -> values: readpath's file_blocks of file f */
    PyObject *slow_get;     /* the Python getter: anything unusual goes there */
    Cache *cache;           /* the block cache (its entries: the cached form, bytes), or NULL */
    Py_ssize_t max_key;
    ChangeWatch *watch;     /* a following handle's (follow()), or NULL */
    PyObject *catch_up;     /* called before a read when the watch sees a change */
} Getter;

/* A following handle's check before a read (Getter.follow): catch up first
 * when the writer changed something.  0, or -1 with an exception set. */
static inline int
getter_follow(Getter *self)
{
    if (self->watch == NULL || !watch_changed(self->watch))
        return 0;
    PyObject *r = PyObject_CallNoArgs(self->catch_up);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The read bound of a read that sees every write. */
#define LATEST UINT64_MAX

/* A data block read from disk and parsed (disk_block): its bytes, and their
 * offsets on the stack when they fit (STACK_ENTRIES), else in heap. */
typedef struct {
    unsigned char *buf;   /* payload and trailer, PyMem_RawMalloc'd */
    ParsedBlock b;
    unsigned char *heap;  /* the offsets when they did not fit in stack */
    unsigned char stack[ENTRY_SLOT * STACK_ENTRIES];
} DiskBlock;

/* A block's stored bytes as read_stored_buf read them (buf NULL: none). */
typedef struct {
    unsigned char *buf;
    size_t size;
    int kind;
} Stored;

HIDDEN_BEGIN

extern PyTypeObject GetterType;
extern PyTypeObject ContainsType;

/* readpath.c */
Py_ssize_t bisect_index(const Entry *e, PyObject *key);
int index_words_init(Entry *e);
int cached_entry(Getter *self, const Entry *e, Py_ssize_t i, PyObject **entry);
int entry_answer(Getter *self, PyObject *fast, Entry *e, PyObject *entry, PyObject *key,
                 uint64_t bound, PyObject **value, uint64_t *seq);
int disk_block(Entry *e, Py_ssize_t i, DiskBlock *d);
int disk_block_stored(Entry *e, Py_ssize_t i, unsigned char *stored, size_t stored_size,
                      int kind, DiskBlock *d);
void disk_block_free(DiskBlock *d);
int parsed_answer(Getter *self, PyObject *fast, Entry *e, const ParsedBlock *b, PyObject *key,
                  uint64_t bound, PyObject **value, int *present, uint64_t *seq);
int offer_parsed(Getter *self, const Entry *e, Py_ssize_t i, const ParsedBlock *b, int found);
PyObject *hand_over(Getter *self, PyObject *fast, Py_ssize_t f, PyObject *keys);
int mem_lookup(PyObject *fast, PyObject *key, uint64_t h, int have_h, PyObject **value);
int keys_first(Getter *self, Entry *e, Py_ssize_t i, PyObject *key, int values, PyObject **value,
               Stored *st);
int get_latest_files(Getter *self, PyObject *fast, Probes *probes, PyObject *key,
                     PyObject **value);
PyObject *expiring_visible(PyObject *fast, PyObject *value);
int view_now_us(PyObject *fast, uint64_t *now);
int view_clock_is_system(PyObject *fast);
PyObject *speedups_set_system_clock(PyObject *module, PyObject *clock);
PyObject *speedups_set_entry_seq(PyObject *module, PyObject *fn);

/* readpath_many.c */
PyObject *Getter_many(Getter *self, PyObject *keys);

HIDDEN_END

/* What an entry found for a key answers a read bounded by `bound` in the
 * FastPath `fast`: value itself (a new reference, given and returned), None
 * for an expiring value past its time on the view's clock, or the missing
 * sentinel (no version visible: the read goes on), value released; NULL with
 * an exception set (the clock failed).  readpath.py's visible(). */
static inline PyObject *
visible(Getter *self, PyObject *fast, PyObject *value, uint64_t bound)
{
    (void)self;
    (void)bound;
    if (PyTuple_CheckExact(value))
        return expiring_visible(fast, value);
    return value;
}

/* The bounds the index gives block i of e (lsmdb.block's rule): above index
 * key i - 1, ending at index key i. */
static inline void
block_bounds(const Entry *e, Py_ssize_t i, BlockBounds *b)
{
    b->after = i > 0 ? e->ikeys + e->ioff[i - 1] : NULL;
    b->after_len = i > 0 ? e->ioff[i] - e->ioff[i - 1] : 0;
    b->last = e->ikeys + e->ioff[i];
    b->last_len = e->ioff[i + 1] - e->ioff[i];
    b->version = e->format;
}

/* The state's fast tuple when the C path can serve: 1 and *fast (a new
 * reference); 0 when the Python getter must (closed database: its close
 * puts None in the cell; no C probes: shadow mode, or a filter family the C
 * path does not probe).  The tuple is taken out of the state's cell, a list
 * that TableState.publish and DB.close write: the attribute lookups of
 * db._closed and state.fast it replaced took 13-20% of an absent get
 * (paired, 2,000,000 and 200,000 keys). */
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
               != PyTuple_GET_SIZE(PyTuple_GET_ITEM(f, FAST_IMM_DATAS)) + 1
        || !PyBool_Check(PyTuple_GET_ITEM(f, FAST_SEQ_OVERLAP))
        || !PyLong_CheckExact(PyTuple_GET_ITEM(f, FAST_BOUND)))
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

#endif
