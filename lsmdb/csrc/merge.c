/* merge.c: Merge, the k-way merge of scans and compactions.  Python twin:
 * lsmdb/merge.py's merge_newest (heapq.merge over tagged entries). */

#include "merge.h"
#include "keys.h"

/* ---- Merge: k-way merge of sorted sources -------------------------------- */

/* Merge(sources, reverse=False, keep_tombstones=False): iterate (key, value)
 * pairs in key order (descending when reverse) from sources given newest
 * first.  Each source yields chunks (keys, values): two lists of the same
 * length, keys bytes, in the scan's order; or (keys, values, tags), three,
 * whose entries go out as (key, value, tag).  For equal keys the newest
 * version wins -- of (keys, values) chunks the newest source's, of tagged
 * ones the highest sequence number's (tag >> 8; the newest source's among
 * equal ones), so sources may overlap in age -- older versions are skipped,
 * and tombstones (value None) are hidden unless keep_tombstones; with
 * untag, tagged entries go out as (key, value) too (a scan's merge by
 * sequence number).  With snapshots (sequence numbers, descending) and
 * kept (a list), a compaction's merge while snapshots live: of each key's
 * older versions (tagged), the one each snapshot reads where it is not the
 * newest -- the first not above it -- is appended to kept as (depth, key,
 * value, tag), depth 0 for the second version kept of the key, 1 for the
 * third... (lsmdb.history).  The entries are walked in place (no
 * per-entry tuple besides the pair returned).  A source is advanced only at
 * the next call after its entry went out, as a generator would; after an
 * error the iteration is over.
 *
 * pin, when given, is an object the merge holds for its readers (a scan's
 * Version): its release() is called exactly once, when the merge ends --
 * exhausted, failed, closed (close()) or freed (by its last reference or by
 * the cycle collector), started or not -- and the sources are let go at the
 * same moment.  Like a generator, a merge refuses a next() or close() while
 * a call of it runs (from another thread, or from a source or pin.release()):
 * ValueError. */

typedef struct {
    PyObject *chunk;   /* the source's current (keys, values), owned */
    PyObject *keys;    /* borrowed from chunk */
    PyObject *values;  /* borrowed from chunk */
    PyObject *tags;    /* borrowed from chunk: its third list, or NULL */
    PyObject *key;     /* keys[pos], borrowed */
    Py_ssize_t pos;
    Py_ssize_t len;
    Py_ssize_t src;    /* age: 0 = newest */
    uint64_t seq;      /* tags[pos] >> 8 (0 without tags) */
} Head;

typedef struct {
    PyObject_HEAD
    PyObject *sources;  /* tuple of the sources as given, until started */
    PyObject **iters;
    Py_ssize_t nsrc;
    Head *heap;
    Py_ssize_t nheap;
    Head pending;       /* the head whose entry went out last (pending.chunk != NULL) */
    int reverse;
    int keep_tombstones;
    int untag;          /* tagged entries go out as (key, value): a scan's merge by seq */
    int started;
    int failed;
    int running;        /* a next() of it is under way */
    PyObject *last_key;
    PyObject *pin;      /* released (pin.release()) once, when the merge ends */
    PyObject *reseek;   /* reseek(key) -> the sources from key on (seek), or NULL */
    uint64_t *snaps;    /* the live snapshots' sequence numbers, descending, or NULL */
    Py_ssize_t nsnaps;
    Py_ssize_t snap_j;  /* the first snapshot the current key's kept versions do not serve */
    Py_ssize_t depth;   /* the current key's versions kept besides the newest */
    PyObject *kept;     /* (depth, key, value, tag) of each one, appended; or NULL */
} Merge;

static inline int
head_less(const Merge *self, const Head *a, const Head *b)
{
    int c = bytes_cmp(a->key, b->key);
    if (c)
        return self->reverse ? c > 0 : c < 0;
    if (a->seq != b->seq)
        return a->seq > b->seq;
    return a->src < b->src;
}

static void
sift_down(Merge *self, Py_ssize_t i)
{
    Py_ssize_t n = self->nheap;
    Head h = self->heap[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && head_less(self, &self->heap[c + 1], &self->heap[c]))
            c++;
        if (!head_less(self, &self->heap[c], &h))
            break;
        self->heap[i] = self->heap[c];
        i = c;
    }
    self->heap[i] = h;
}

static void
sift_up(Merge *self, Py_ssize_t i)
{
    Head h = self->heap[i];
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!head_less(self, &h, &self->heap[p]))
            break;
        self->heap[i] = self->heap[p];
        i = p;
    }
    self->heap[i] = h;
}

/* Point h at entry h->pos of its chunk (its sequence number too, when
 * tagged); -1 (TypeError) when the key is not bytes or a tag not an int of
 * 64 bits. */
static inline int
head_load(Head *h)
{
    h->key = PyList_GET_ITEM(h->keys, h->pos);
    if (!PyBytes_CheckExact(h->key)) {
        PyErr_SetString(PyExc_TypeError, "merge keys must be bytes");
        return -1;
    }
    if (h->tags != NULL) {
        PyObject *t = PyList_GET_ITEM(h->tags, h->pos);
        unsigned long long tag = PyLong_Check(t) ? PyLong_AsUnsignedLongLong(t) : 0;
        if (!PyLong_Check(t) || (tag == (unsigned long long)-1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "merge tags must be ints of 64 bits");
            return -1;
        }
        h->seq = tag >> 8;
    }
    return 0;
}

/* Move h to its source's next non-empty chunk: 1 done, 0 exhausted, -1 error. */
static int
next_chunk(Merge *self, Head *h)
{
    Py_CLEAR(h->chunk);
    for (;;) {
        PyObject *chunk = PyIter_Next(self->iters[h->src]);
        if (chunk == NULL)
            return PyErr_Occurred() ? -1 : 0;
        Py_ssize_t parts = PyTuple_CheckExact(chunk) ? PyTuple_GET_SIZE(chunk) : 0;
        if ((parts != 2 && parts != 3)
            || !PyList_CheckExact(PyTuple_GET_ITEM(chunk, 0))
            || !PyList_CheckExact(PyTuple_GET_ITEM(chunk, 1))
            || PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 0))
                   != PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 1))
            || (parts == 3 && (!PyList_CheckExact(PyTuple_GET_ITEM(chunk, 2))
                               || PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 2))
                                      != PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 0))))) {
            Py_DECREF(chunk);
            PyErr_SetString(PyExc_TypeError, "a merge source must yield (keys, values) or "
                                             "(keys, values, tags) lists of one length");
            return -1;
        }
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(chunk, 0)) == 0) {
            Py_DECREF(chunk);
            continue;
        }
        h->chunk = chunk;
        h->keys = PyTuple_GET_ITEM(chunk, 0);
        h->values = PyTuple_GET_ITEM(chunk, 1);
        h->tags = parts == 3 ? PyTuple_GET_ITEM(chunk, 2) : NULL;
        h->pos = 0;
        h->len = PyList_GET_SIZE(h->keys);
        return head_load(h) < 0 ? -1 : 1;
    }
}

/* The next entry of h's source: 1 done, 0 exhausted, -1 error. */
static int
head_advance(Merge *self, Head *h)
{
    /* The lists may have been changed by someone holding them: re-check. */
    if (++h->pos < h->len && h->pos < PyList_GET_SIZE(h->keys)
        && h->pos < PyList_GET_SIZE(h->values)
        && (h->tags == NULL || h->pos < PyList_GET_SIZE(h->tags)))
        return head_load(h) < 0 ? -1 : 1;
    return next_chunk(self, h);
}

/* Let go of the pin: pin.release(), once.  -1 with an exception set if it raised. */
static int
merge_unpin(Merge *self)
{
    PyObject *pin = self->pin;
    if (pin == NULL)
        return 0;
    self->pin = NULL;
    PyObject *r = PyObject_CallMethod(pin, "release", NULL);
    Py_DECREF(pin);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Let go of the sources' iterators and their current chunks (the given
 * sources tuple, the pin and reseek stay). */
static void
merge_drop_heads(Merge *self)
{
    for (Py_ssize_t i = 0; i < self->nheap; i++)
        Py_CLEAR(self->heap[i].chunk);
    self->nheap = 0;
    Py_CLEAR(self->pending.chunk);
    if (self->iters) {
        for (Py_ssize_t i = 0; i < self->nsrc; i++)
            Py_CLEAR(self->iters[i]);
    }
}

/* Let go of the sources and their chunks: the merge is over (next() answers the end). */
static void
merge_drop_sources(Merge *self)
{
    merge_drop_heads(self);
    Py_CLEAR(self->sources);
    Py_CLEAR(self->reseek);
    self->failed = 1;
}

/* The end (exhausted, failed or closed): the sources and their chunks go, then the pin. */
static int
merge_end(Merge *self)
{
    merge_drop_sources(self);
    return merge_unpin(self);
}

/* The end by an error: as merge_end, the error that ends the merge the one raised. */
static void
merge_fail(Merge *self)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (merge_end(self) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    PyErr_Restore(type, value, tb);
}

static int
merge_start(Merge *self)
{
    Py_ssize_t n = PyTuple_GET_SIZE(self->sources);
    self->iters = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    self->heap = PyMem_Calloc(n ? n : 1, sizeof(Head));
    if (self->iters == NULL || self->heap == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->nsrc = n;
    self->started = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        self->iters[i] = PyObject_GetIter(PyTuple_GET_ITEM(self->sources, i));
        if (self->iters[i] == NULL)
            return -1;
    }
    Py_CLEAR(self->sources);
    for (Py_ssize_t i = 0; i < n; i++) {
        Head h = {0};
        h.src = i;
        int r = next_chunk(self, &h);
        if (r < 0) {
            Py_XDECREF(h.chunk);
            return -1;
        }
        if (r) {
            self->heap[self->nheap++] = h;
            sift_up(self, self->nheap - 1);
        }
    }
    return 0;
}

static PyObject *
merge_step(Merge *self)
{
    if (self->failed)
        return NULL;
    if (!self->started) {
        if (self->sources == NULL) {
            PyErr_SetString(PyExc_TypeError, "Merge is not initialised");
            return NULL;
        }
        if (merge_start(self) < 0) {
            merge_fail(self);
            return NULL;
        }
    }
    for (;;) {
        if (self->pending.chunk != NULL) {
            Head h = self->pending;
            self->pending.chunk = NULL;
            int r = head_advance(self, &h);
            if (r < 0) {
                Py_XDECREF(h.chunk);
                merge_fail(self);
                return NULL;
            }
            if (r) {
                self->heap[self->nheap++] = h;
                sift_up(self, self->nheap - 1);
            }
        }
        if (self->nheap == 0) {
            merge_end(self);  /* an error from pin.release() is raised here */
            return NULL;
        }
        Head top = self->heap[0];
        self->heap[0] = self->heap[--self->nheap];
        if (self->nheap)
            sift_down(self, 0);
        self->pending = top;  /* advanced at the next call */
        PyObject *key = top.key;
        if (self->last_key != NULL && bytes_cmp(key, self->last_key) == 0) {
            /* an older version of a key already decided: kept for a snapshot? */
            if (self->kept != NULL && top.tags != NULL && self->snap_j < self->nsnaps
                && self->snaps[self->snap_j] >= top.seq) {
                PyObject *item = Py_BuildValue("(nOOO)", self->depth++, key,
                                               PyList_GET_ITEM(top.values, top.pos),
                                               PyList_GET_ITEM(top.tags, top.pos));
                if (item == NULL || PyList_Append(self->kept, item) < 0) {
                    Py_XDECREF(item);
                    merge_fail(self);
                    return NULL;
                }
                Py_DECREF(item);
                while (self->snap_j < self->nsnaps && self->snaps[self->snap_j] >= top.seq)
                    self->snap_j++;
            }
            continue;
        }
        Py_INCREF(key);
        Py_XSETREF(self->last_key, key);
        if (self->kept != NULL) {  /* the snapshots that read the newest version */
            self->snap_j = 0;
            self->depth = 0;
            while (self->snap_j < self->nsnaps && self->snaps[self->snap_j] >= top.seq)
                self->snap_j++;
        }
        PyObject *value = PyList_GET_ITEM(top.values, top.pos);
        if (value == Py_None && !self->keep_tombstones)
            continue;
        if (top.tags != NULL && !self->untag)
            return PyTuple_Pack(3, key, value, PyList_GET_ITEM(top.tags, top.pos));
        return PyTuple_Pack(2, key, value);
    }
}

static int
merge_busy(Merge *self)
{
    if (!self->running)
        return 0;
    PyErr_SetString(PyExc_ValueError, "Merge already executing");
    return 1;
}

static PyObject *
Merge_next(Merge *self)
{
    if (merge_busy(self))
        return NULL;
    self->running = 1;
    PyObject *item = merge_step(self);
    self->running = 0;
    return item;
}

/* seek(key): the next entry is then the first at or after key (at or before
 * it when reverse) within the merge's bounds and view: reseek(key) gives the
 * sources from there, and the merge starts again over them, its pin kept.
 * Refused (ValueError) once the merge has ended, or while a call of it runs;
 * if reseek raises, the merge goes on as it was. */
static PyObject *
Merge_seek(Merge *self, PyObject *key)
{
    if (merge_busy(self))
        return NULL;
    if (self->failed) {
        PyErr_SetString(PyExc_ValueError, "the scan is over: it cannot seek");
        return NULL;
    }
    if (self->reseek == NULL) {
        PyErr_SetString(PyExc_TypeError, "this merge cannot seek (no reseek given)");
        return NULL;
    }
    self->running = 1;
    PyObject *fresh = PyObject_CallOneArg(self->reseek, key);
    PyObject *sources = fresh != NULL ? PySequence_Tuple(fresh) : NULL;
    Py_XDECREF(fresh);
    if (sources == NULL) {
        self->running = 0;
        return NULL;
    }
    merge_drop_heads(self);
    PyMem_Free(self->iters);
    PyMem_Free(self->heap);
    self->iters = NULL;
    self->heap = NULL;
    self->nsrc = 0;
    Py_XSETREF(self->sources, sources);
    Py_CLEAR(self->last_key);
    self->started = 0;
    self->running = 0;
    Py_RETURN_NONE;
}

static PyObject *
Merge_close(Merge *self, PyObject *Py_UNUSED(ignored))
{
    if (merge_busy(self))
        return NULL;
    self->running = 1;
    int r = merge_end(self);
    self->running = 0;
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Freed (or collected in a cycle) with its pin still held: release it. */
static void
Merge_finalize(Merge *self)
{
    if (self->pin == NULL)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (merge_unpin(self) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    PyErr_Restore(type, value, tb);
}

static int
Merge_traverse(Merge *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sources);
    for (Py_ssize_t i = 0; i < self->nheap; i++)
        Py_VISIT(self->heap[i].chunk);
    Py_VISIT(self->pending.chunk);
    if (self->iters) {
        for (Py_ssize_t i = 0; i < self->nsrc; i++)
            Py_VISIT(self->iters[i]);
    }
    Py_VISIT(self->last_key);
    Py_VISIT(self->pin);
    Py_VISIT(self->reseek);
    Py_VISIT(self->kept);
    return 0;
}

/* Every reference dropped (the cycle collector's tp_clear, and the dealloc's),
 * the pin without a release: its finaliser ran first. */
static int
Merge_clear(Merge *self)
{
    merge_drop_sources(self);
    Py_CLEAR(self->last_key);
    Py_CLEAR(self->pin);
    Py_CLEAR(self->kept);
    return 0;
}

static void
Merge_dealloc(Merge *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return;  /* resurrected by its finaliser */
    PyObject_GC_UnTrack(self);
    Merge_clear(self);
    PyMem_Free(self->iters);
    PyMem_Free(self->heap);
    PyMem_Free(self->snaps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Merge_init(Merge *self, PyObject *args, PyObject *kwds)
{
    PyObject *sources, *pin = Py_None, *reseek = Py_None, *snapshots = Py_None;
    PyObject *kept = Py_None;
    int reverse = 0, keep = 0, untag = 0;
    static char *kwlist[] = {"sources", "reverse", "keep_tombstones", "pin", "reseek", "untag",
                             "snapshots", "kept", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|ppOOpOO:Merge", kwlist, &sources, &reverse,
                                     &keep, &pin, &reseek, &untag, &snapshots, &kept))
        return -1;
    if ((snapshots == Py_None) != (kept == Py_None) || (kept != Py_None && !PyList_Check(kept))) {
        PyErr_SetString(PyExc_TypeError, "snapshots and kept (a list) go together");
        return -1;
    }
    if (reseek != Py_None && !PyCallable_Check(reseek)) {
        PyErr_SetString(PyExc_TypeError, "reseek must be callable or None");
        return -1;
    }
    if (self->sources != NULL || self->started) {
        PyErr_SetString(PyExc_TypeError, "Merge cannot be initialised twice");
        return -1;
    }
    self->sources = PySequence_Tuple(sources);
    if (self->sources == NULL)
        return -1;
    if (snapshots != Py_None) {
        PyObject *seq = PySequence_Tuple(snapshots);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(seq);
        self->snaps = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
        if (self->snaps == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned long long s = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(seq, i));
            if ((s == (unsigned long long)-1 && PyErr_Occurred())
                || (i && s >= self->snaps[i - 1])) {
                Py_DECREF(seq);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "snapshots must be strictly descending");
                return -1;
            }
            self->snaps[i] = s;
        }
        Py_DECREF(seq);
        self->nsnaps = n;
        self->kept = Py_NewRef(kept);
    }
    self->reverse = reverse;
    self->keep_tombstones = keep;
    self->untag = untag;
    if (pin != Py_None) {
        Py_INCREF(pin);
        self->pin = pin;
    }
    if (reseek != Py_None)
        self->reseek = Py_NewRef(reseek);
    return 0;
}

static PyMethodDef Merge_methods[] = {
    {"close", (PyCFunction)Merge_close, METH_NOARGS,
     "close($self, /)\n--\n\nEnd the merge: let go of its sources and release its pin."},
    {"seek", (PyCFunction)Merge_seek, METH_O,
     "seek($self, key, /)\n--\n\nGo on from the first entry at or after key (at or before it "
     "when reverse), within the merge's bounds: reseek(key) gives the sources."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject MergeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Merge",
    .tp_basicsize = sizeof(Merge),
    .tp_dealloc = (destructor)Merge_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_FINALIZE,
    .tp_traverse = (traverseproc)Merge_traverse,
    .tp_clear = (inquiry)Merge_clear,
    .tp_finalize = (destructor)Merge_finalize,
    .tp_doc = "Merge(sources, reverse=False, keep_tombstones=False, pin=None, reseek=None, "
              "untag=False, snapshots=None, kept=None)\n"
              "--\n\n"
              "The newest version of each key from sorted sources of (keys, values) chunks,\n"
              "newest source first, tombstones hidden (see lsmdb.merge); pin.release() is\n"
              "called once when the merge ends (exhausted, failed, closed or freed);\n"
              "seek(key) starts it again from key over the sources reseek(key) gives.",
    .tp_methods = Merge_methods,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Merge_next,
    .tp_init = (initproc)Merge_init,
    .tp_new = PyType_GenericNew,
};
