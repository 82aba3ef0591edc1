/* writepath.c: put_one, a put in its common case whole -- its checks, the
 * database lock, then put_locked: the next sequence number, the WAL record
 * appended, the memtable applied -- in one C call instead of some ten Python
 * frames.  Python twins: lsmdb/writepath.py's WritePath.put_one,
 * WritePath.put and put_locked, with lsmdb/logset.py's LogSet.append,
 * lsmdb/wal.py's LogWriter.add_record and lsmdb/memtable.py's
 * Memtable.apply in line; step for step the same reads and writes of the
 * same attributes, so that either leaves the same objects and the same
 * bytes on disk (tests/test_writepath.py compares them).  What is not its
 * case (a stall, frozen memtables piling up, a failed log, ...) goes to
 * WritePath.write_columns, as in the twin.
 *
 * The record is encoded straight into the segment's shared memory mapping
 * (LogWriter._map); where the mapping is short, LogWriter.reserve grows the
 * segment, as in the twin, so that whatever wraps the allocation (the
 * I/O-fault tests) sees the C path's too.  A record that does not fit in what is left
 * of the WAL block and an expiring value go to the Python methods that
 * handle them; a memtable with live snapshots has their undo maps kept in C
 * as Memtable._remember keeps them. */

#include "writepath.h"
#include "coding.h"
#include "logset.h"
#include "memtable.h"

static PyObject *compaction_module;  /* lsmdb.compaction, imported at the first stall check */
static PyObject *s_changes, *s_log, *s_closed, *s_read_only, *s_dropped, *s_failed, *s_last_seq, *s_writer,
    *s_live, *s_map, *s_reserve, *s_size, *s_seeds, *s_max_seq, *s_min_seq, *s_promoted,
    *s_promote_segments, *s_mem, *s_undos, *s_data, *s_filter, *s_size_bytes, *s_pending,
    *s_tags, *s_options, *s_memtable_size_bytes, *s_closed_bytes, *s_id, *s_add_record,
    *s_l0_stall_files, *s_l0_slowdown_files, *s_stall, *s_version, *s_l0, *s_imms, *s_versions,
    *s_lock, *s_wal_limit, *s_acquire, *s_release, *s_write_columns, *s_flush_full,
    *s_flush_wal_pinners, *s_sync_default, *s_default_time_to_live;

int
writepath_init(void)
{
#define INTERN(var, name) \
    if ((var = PyUnicode_InternFromString(name)) == NULL) \
        return -1;
    INTERN(s_log, "log")
    INTERN(s_closed, "closed")
    INTERN(s_read_only, "read_only")
    INTERN(s_dropped, "dropped")
    INTERN(s_failed, "failed")
    INTERN(s_changes, "changes")
    INTERN(s_last_seq, "last_seq")
    INTERN(s_writer, "writer")
    INTERN(s_live, "live")
    INTERN(s_map, "_map")
    INTERN(s_reserve, "reserve")
    INTERN(s_size, "size")
    INTERN(s_seeds, "_seeds")
    INTERN(s_max_seq, "max_seq")
    INTERN(s_min_seq, "min_seq")
    INTERN(s_promoted, "promoted")
    INTERN(s_promote_segments, "promote_segments")
    INTERN(s_mem, "mem")
    INTERN(s_undos, "undos")
    INTERN(s_data, "data")
    INTERN(s_filter, "filter")
    INTERN(s_size_bytes, "size_bytes")
    INTERN(s_pending, "_pending")
    INTERN(s_tags, "tags")
    INTERN(s_options, "options")
    INTERN(s_memtable_size_bytes, "memtable_size_bytes")
    INTERN(s_closed_bytes, "_closed_bytes")
    INTERN(s_id, "id")
    INTERN(s_add_record, "add_record")
    INTERN(s_l0_stall_files, "L0_STALL_FILES")
    INTERN(s_l0_slowdown_files, "L0_SLOWDOWN_FILES")
    INTERN(s_stall, "stall")
    INTERN(s_version, "version")
    INTERN(s_l0, "l0")
    INTERN(s_imms, "imms")
    INTERN(s_versions, "versions")
    INTERN(s_lock, "lock")
    INTERN(s_wal_limit, "wal_limit")
    INTERN(s_acquire, "acquire")
    INTERN(s_release, "release")
    INTERN(s_write_columns, "write_columns")
    INTERN(s_flush_full, "_flush_full")
    INTERN(s_flush_wal_pinners, "_flush_wal_pinners")
    INTERN(s_sync_default, "sync_default")
    INTERN(s_default_time_to_live, "default_time_to_live")
#undef INTERN
    return 0;
}

/* ---- attributes at their slots ---------------------------------------------
 *
 * A put reads and writes some 35 attributes of lsmdb's objects; through
 * PyObject_GetAttr each costs a type lookup and a descriptor or dict lookup.
 * Where an object's type keeps the attribute in a __slots__ slot (a member
 * descriptor, as lsmdb's write-path classes do), a SlotRef remembers the
 * slot's offset for that type and the C put reads and writes it there --
 * what the member descriptor itself would do.  Any other type (a subclass
 * with other descriptors, a test's stand-in) takes PyObject_GetAttr and
 * PyObject_SetAttr, so the answers are the same either way.
 *
 * A SlotRef holds its type (so the type, and its address, stay its own) and
 * the type's version tag when it resolved: a change to the type or to a
 * base (a class attribute set or deleted, a descriptor patched in) changes
 * or invalidates the tag, and the next access resolves again.  A type
 * without a valid tag is not cached at all: every access takes getattr. */

typedef struct {
    PyTypeObject *type;     /* the type the offset is for, held (NULL: none yet) */
    unsigned int version;   /* its tp_version_tag when resolved */
    Py_ssize_t offset;      /* the slot's offset in an instance; -1: not a plain slot */
} SlotRef;

/* Whether ref's offset may serve an instance of type. */
static inline int
slot_current(const SlotRef *ref, PyTypeObject *type)
{
    return type == ref->type && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)
           && type->tp_version_tag == ref->version;
}

static void
slot_resolve(SlotRef *ref, PyTypeObject *type, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(type, name);  /* borrowed; assigns a version tag */
    Py_INCREF(type);
    Py_XSETREF(ref->type, type);
    ref->version = type->tp_version_tag;
    ref->offset = -1;
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return;  /* no tag to notice a change by: getattr each time */
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            ref->offset = m->offset;
    }
}

/* obj.name, a new reference (NULL with an exception set). */
static inline PyObject *
get_attr(PyObject *obj, PyObject *name, SlotRef *ref)
{
    if (!slot_current(ref, Py_TYPE(obj)))
        slot_resolve(ref, Py_TYPE(obj), name);
    if (ref->offset >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + ref->offset);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);  /* unset (AttributeError) or not a slot */
}

/* obj.name = value: 0, or -1 with an exception set. */
static inline int
set_attr(PyObject *obj, PyObject *name, SlotRef *ref, PyObject *value)
{
    if (!slot_current(ref, Py_TYPE(obj)))
        slot_resolve(ref, Py_TYPE(obj), name);
    if (ref->offset >= 0) {
        PyObject **slot = (PyObject **)((char *)obj + ref->offset);
        Py_XSETREF(*slot, Py_NewRef(value));
        return 0;
    }
    return PyObject_SetAttr(obj, name, value);
}

/* One SlotRef per (class, attribute) the put touches. */
#define REF(var) static SlotRef var
REF(r_versions_log); REF(r_versions_closed); REF(r_versions_read_only);
REF(r_versions_last_seq); REF(r_versions_lock);
REF(r_state_dropped); REF(r_state_id); REF(r_state_mem); REF(r_state_options);
REF(r_state_imms); REF(r_state_version); REF(r_version_l0);
REF(r_log_writer); REF(r_log_live); REF(r_log_failed); REF(r_log_promoted);
REF(r_log_closed_bytes); REF(r_log_changes);
REF(r_writer_size); REF(r_writer_seeds); REF(r_writer_map);
REF(r_seg_max_seq); REF(r_seg_min_seq);
REF(r_mem_undos); REF(r_mem_data); REF(r_mem_filter); REF(r_mem_size_bytes);
REF(r_mem_pending); REF(r_mem_tags); REF(r_mem_min_seq); REF(r_mem_max_seq);
REF(r_options_memtable_size_bytes);
REF(r_writes_stall); REF(r_writes_versions); REF(r_writes_wal_limit);
REF(r_writes_sync_default); REF(r_options_default_time_to_live);
#undef REF

/* obj.name's truth: 1, 0, or -1 with an exception set. */
static int
attr_true(PyObject *obj, PyObject *name, SlotRef *ref)
{
    PyObject *v = get_attr(obj, name, ref);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* obj.name as a C integer (it must be an int): 0, or -1 with an exception set. */
static int
attr_ll(PyObject *obj, PyObject *name, SlotRef *ref, long long *out)
{
    PyObject *v = get_attr(obj, name, ref);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* obj.name = v (a C integer): 0, or -1 with an exception set. */
static int
set_ll(PyObject *obj, PyObject *name, SlotRef *ref, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    int r = set_attr(obj, name, ref, o);
    Py_DECREF(o);
    return r;
}

/* o (a new reference, or NULL with an exception set) as a Py_ssize_t, o
 * dropped: 0, or -1 with an exception set. */
static int
take_ssize(PyObject *o, Py_ssize_t *out)
{
    if (o == NULL)
        return -1;
    *out = PyLong_AsSsize_t(o);
    Py_DECREF(o);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The writer's mapping (LogWriter._map) as a writable buffer of at least
 * `need` bytes, after writer.reserve(need) where it is shorter (the segment
 * grows there; an OSError, nothing stored, when the disk has no room).
 * 0 with `view` to release, or -1 with an exception set. */
static int
mapped_room(PyObject *writer, long long need, Py_buffer *view)
{
    for (int tries = 0; tries < 2; tries++) {
        PyObject *map = get_attr(writer, s_map, &r_writer_map);
        if (map == NULL)
            return -1;
        int r = map == Py_None ? 1 : PyObject_GetBuffer(map, view, PyBUF_WRITABLE);
        Py_DECREF(map);
        if (r < 0)
            return -1;
        if (r == 0) {
            if (view->len >= need)
                return 0;
            PyBuffer_Release(view);
        }
        if (tries == 0) {
            PyObject *n = PyLong_FromLongLong(need);
            if (n == NULL)
                return -1;
            PyObject *done = PyObject_CallMethodOneArg(writer, s_reserve, n);
            Py_DECREF(n);
            if (done == NULL)
                return -1;
            Py_DECREF(done);
        }
    }
    PyErr_SetString(PyExc_RuntimeError, "LogWriter.reserve left no room in the mapping");
    return -1;
}

/* LogSet.append's error path: an OSError fails the log (wal.failed = it) and
 * is raised again. */
static void
fail_log(PyObject *wal)
{
    if (!PyErr_ExceptionMatches(PyExc_OSError))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    if (set_attr(wal, s_failed, &r_log_failed, value) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    PyErr_Restore(type, value, tb);
}

/* ChangeBoard.note_seq(seq) (lsmdb/changes.py): seq stored in the CHANGES
 * mapping (wal.changes) once its record is in the log, for followers in
 * other processes.  0, or -1 with an exception set. */
static int
note_seq(PyObject *wal, long long seq)
{
    PyObject *map = get_attr(wal, s_changes, &r_log_changes);
    if (map == NULL)
        return -1;
    if (map == Py_None) {
        Py_DECREF(map);
        return 0;
    }
    Py_buffer view;
    int r = PyObject_GetBuffer(map, &view, PyBUF_WRITABLE);
    Py_DECREF(map);
    if (r < 0)
        return -1;
    if (view.len >= 24 && ((uintptr_t)view.buf & 7) == 0) {
        uint64_t *word = (uint64_t *)((char *)view.buf + 16);
#if defined(__GNUC__) || defined(__clang__)
        __atomic_store_n(word, (uint64_t)seq, __ATOMIC_RELEASE);
#else
        *(volatile uint64_t *)word = (uint64_t)seq;
#endif
    }
    PyBuffer_Release(&view);
    return 0;
}

/* LogSet.append(seq, payload of (tid, key, value), False), the record written
 * as one FULL fragment where it fits.  0, or -1 with an exception set. */
static int
log_append(PyObject *wal, long long seq, long long tid, PyObject *key, PyObject *value)
{
    PyObject *writer = NULL, *live = NULL, *failed = NULL, *seeds = NULL;
    PyObject *data = NULL;
    int rc = -1;
    if ((writer = get_attr(wal, s_writer, &r_log_writer)) == NULL
        || (live = get_attr(wal, s_live, &r_log_live)) == NULL
        || (failed = get_attr(wal, s_failed, &r_log_failed)) == NULL)
        goto done;
    if (writer == Py_None || live == Py_None || failed != Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "no WAL segment open for appends");
        goto done;
    }
    long long size;
    if (attr_ll(writer, s_size, &r_writer_size, &size) < 0)
        goto done;
    size_t n = encode_one_size((uint64_t)seq, (uint64_t)tid, key, value);
    long long left = WAL_BLOCK_SIZE_BYTES - size % WAL_BLOCK_SIZE_BYTES;
    if ((long long)n + WAL_FRAGMENT_HEADER_SIZE > left) {
        /* fragments: LogWriter.add_record cuts them */
        if ((data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n)) == NULL)
            goto done;
        encode_one((unsigned char *)PyBytes_AS_STRING(data), (uint64_t)seq, (uint64_t)tid,
                   key, value);
        PyObject *r = PyObject_CallMethodOneArg(writer, s_add_record, data);
        if (r == NULL) {
            fail_log(wal);
            goto done;
        }
        Py_DECREF(r);
    } else {
        if ((seeds = get_attr(writer, s_seeds, &r_writer_seeds)) == NULL)
            goto done;
        if (!PyTuple_CheckExact(seeds) || PyTuple_GET_SIZE(seeds) <= WAL_FULL) {
            PyErr_SetString(PyExc_TypeError, "a LogWriter's _seeds is a tuple of ints");
            goto done;
        }
        unsigned long seed = PyLong_AsUnsignedLongMask(PyTuple_GET_ITEM(seeds, WAL_FULL));
        if (seed == (unsigned long)-1 && PyErr_Occurred())
            goto done;
        Py_ssize_t total = (Py_ssize_t)n + WAL_FRAGMENT_HEADER_SIZE;
        Py_buffer view;
        if (mapped_room(writer, size + total, &view) < 0) {
            fail_log(wal);
            goto done;
        }
        unsigned char *p = (unsigned char *)view.buf + size;
        encode_one(p + WAL_FRAGMENT_HEADER_SIZE, (uint64_t)seq, (uint64_t)tid, key, value);
        put_le32(p, crc32_update((uint32_t)seed, p + WAL_FRAGMENT_HEADER_SIZE, n));
        p[4] = (unsigned char)(n & 0xFF);
        p[5] = (unsigned char)(n >> 8);
        p[6] = WAL_FULL;
        PyBuffer_Release(&view);
        if (set_ll(writer, s_size, &r_writer_size, size + total) < 0)
            goto done;
    }
    if (set_ll(live, s_max_seq, &r_seg_max_seq, seq) < 0)
        goto done;
    int has_min = attr_true(live, s_min_seq, &r_seg_min_seq);
    if (has_min < 0 || (!has_min && set_ll(live, s_min_seq, &r_seg_min_seq, seq) < 0))
        goto done;
    if (note_seq(wal, seq) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(writer);
    Py_XDECREF(live);
    Py_XDECREF(failed);
    Py_XDECREF(seeds);
    Py_XDECREF(data);
    return rc;
}

/* Memtable._remember((key,)) for the memtable mem whose `undos` (a list of
 * dicts, one per live snapshot) is not empty: each undo map that has no
 * entry for key records what mem's data holds for it (MISSING: nothing).
 * 0, or -1 with an exception set. */
static PyObject *mem_missing = NULL;

static int
mem_remember(PyObject *mem, PyObject *undos, PyObject *key)
{
    PyObject *data = NULL;
    int rc = -1;
    if (mem_missing == NULL) {
        PyObject *mod = PyImport_ImportModule("lsmdb.sstable_format");
        if (mod == NULL)
            return -1;
        mem_missing = PyObject_GetAttrString(mod, "MISSING");
        Py_DECREF(mod);
        if (mem_missing == NULL)
            return -1;
    }
    if (!PyList_CheckExact(undos)) {
        PyErr_SetString(PyExc_TypeError, "a memtable's undos is a list");
        return -1;
    }
    if ((data = get_attr(mem, s_data, &r_mem_data)) == NULL || !PyDict_CheckExact(data)) {
        if (data != NULL)
            PyErr_SetString(PyExc_TypeError, "a memtable's data is a dict");
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(undos); i++) {
        PyObject *undo = PyList_GET_ITEM(undos, i);
        if (!PyDict_CheckExact(undo)) {
            PyErr_SetString(PyExc_TypeError, "an undo map is a dict");
            goto done;
        }
        int has = PyDict_Contains(undo, key);
        if (has < 0)
            goto done;
        if (has)
            continue;
        PyObject *old = PyDict_GetItemWithError(data, key);  /* borrowed */
        if (old == NULL && PyErr_Occurred())
            goto done;
        if (PyDict_SetItem(undo, key, old != NULL ? old : mem_missing) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(data);
    return rc;
}

/* Memtable.apply(seq, key, value) for bytes or None (live snapshots'
 * undo maps kept by mem_remember first).  0, or -1 with an exception set. */
static int
mem_apply(PyObject *mem, long long seq, PyObject *key, PyObject *value)
{
    PyObject *data = NULL, *filter = NULL, *pending = NULL, *tags = NULL, *tag = NULL;
    int rc = -1;
    long long size;
    if ((data = get_attr(mem, s_data, &r_mem_data)) == NULL || !PyDict_CheckExact(data)) {
        if (data != NULL)
            PyErr_SetString(PyExc_TypeError, "a memtable's data is a dict");
        goto done;
    }
    if (attr_ll(mem, s_size_bytes, &r_mem_size_bytes, &size) < 0)
        goto done;
    PyObject *old = PyDict_GetItemWithError(data, key);  /* borrowed */
    if (old == NULL) {
        if (PyErr_Occurred())
            goto done;
        if ((filter = get_attr(mem, s_filter, &r_mem_filter)) == NULL)
            goto done;
        if (filter != Py_None) {  /* before the dict: see lsmdb/memtable.py */
            if (Py_TYPE(filter) == &MemFilterType) {
                if (mf_add((MemFilter *)filter, &key, 1) < 0)
                    goto done;
            } else {
                PyErr_SetString(PyExc_TypeError, "a memtable's filter is a MemFilter");
                goto done;
            }
        }
        size += PyBytes_GET_SIZE(key) + MEM_ENTRY_OVERHEAD_BYTES;
        if ((pending = get_attr(mem, s_pending, &r_mem_pending)) == NULL)
            goto done;
        if (!PyList_CheckExact(pending)) {
            PyErr_SetString(PyExc_TypeError, "a memtable's _pending is a list");
            goto done;
        }
        if (PyList_Append(pending, key) < 0)
            goto done;
    } else {
        long long old_size;
        if (mem_value_size(old, &old_size) < 0)
            goto done;
        size -= old_size;
    }
    uint64_t t = (uint64_t)seq << 8;  /* seq << KIND_BITS | KIND_TOMBSTONE: up to 2**64 - 1 */
    if (value != Py_None) {
        size += PyBytes_GET_SIZE(value);
        t |= MEM_KIND_VALUE;
    }
    if ((tags = get_attr(mem, s_tags, &r_mem_tags)) == NULL
        || (tag = PyLong_FromUnsignedLongLong(t)) == NULL)
        goto done;
    if (PyObject_SetItem(tags, key, tag) < 0 || PyDict_SetItem(data, key, value) < 0)
        goto done;
    if (set_ll(mem, s_size_bytes, &r_mem_size_bytes, size) < 0)
        goto done;
    PyObject *min_seq = get_attr(mem, s_min_seq, &r_mem_min_seq);
    if (min_seq == NULL)
        goto done;
    int none = min_seq == Py_None;
    Py_DECREF(min_seq);
    if (none && set_ll(mem, s_min_seq, &r_mem_min_seq, seq) < 0)
        goto done;
    long long max_seq;
    if (attr_ll(mem, s_max_seq, &r_mem_max_seq, &max_seq) < 0
        || (seq > max_seq && set_ll(mem, s_max_seq, &r_mem_max_seq, seq) < 0))
        goto done;
    rc = 0;
done:
    Py_XDECREF(data);
    Py_XDECREF(filter);
    Py_XDECREF(pending);
    Py_XDECREF(tags);
    Py_XDECREF(tag);
    return rc;
}

PyObject *
speedups_put_locked(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* put_locked(versions, state, key, value, wal_limit) -> PUT_FULL |
     * PUT_WAL_OVER bits, or PUT_DECLINED: lsmdb.writepath.put_locked. */
    if (nargs != 5 || !PyBytes_CheckExact(args[2])
        || (args[3] != Py_None && !PyBytes_CheckExact(args[3]))) {
        PyErr_SetString(PyExc_TypeError,
                        "put_locked(versions, state, key: bytes, value: bytes | None, wal_limit)");
        return NULL;
    }
    PyObject *versions = args[0], *state = args[1], *key = args[2], *value = args[3];
    if (PyBytes_GET_SIZE(key) > 0xFFFFFFFFLL
        || (value != Py_None && PyBytes_GET_SIZE(value) > 0xFFFFFFFFLL)) {
        PyErr_SetString(PyExc_ValueError, "a key or value too long for a WAL record");
        return NULL;
    }
    long long wal_limit = PyLong_AsLongLong(args[4]);
    if (wal_limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *wal = NULL, *mem = NULL, *undos = NULL, *options = NULL, *writer = NULL;
    PyObject *result = NULL;
    int t;
    if ((wal = get_attr(versions, s_log, &r_versions_log)) == NULL)
        goto done;
    if ((t = attr_true(versions, s_closed, &r_versions_closed)) != 0
        || (t = attr_true(versions, s_read_only, &r_versions_read_only)) != 0
        || (t = attr_true(state, s_dropped, &r_state_dropped)) != 0) {
        if (t > 0)
            result = PyLong_FromLong(PUT_DECLINED);
        goto done;
    }
    PyObject *failed = get_attr(wal, s_failed, &r_log_failed);
    if (failed == NULL)
        goto done;
    Py_DECREF(failed);
    if (failed != Py_None) {
        result = PyLong_FromLong(PUT_DECLINED);
        goto done;
    }
    long long seq, tid;
    if (attr_ll(versions, s_last_seq, &r_versions_last_seq, &seq) < 0
        || attr_ll(state, s_id, &r_state_id, &tid) < 0)
        goto done;
    if (tid < 0 || seq < 0 || seq >= WRITE_MAX_SEQ) {  /* not its case: the Python path's */
        result = PyLong_FromLong(PUT_DECLINED);
        goto done;
    }
    seq += 1;
    if (set_ll(versions, s_last_seq, &r_versions_last_seq, seq) < 0
        || log_append(wal, seq, tid, key, value) < 0)
        goto done;
    if ((t = attr_true(wal, s_promoted, &r_log_promoted)) < 0)
        goto done;
    if (t) {
        PyObject *r = PyObject_CallMethodNoArgs(versions, s_promote_segments);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if ((mem = get_attr(state, s_mem, &r_state_mem)) == NULL
        || (undos = get_attr(mem, s_undos, &r_mem_undos)) == NULL)
        goto done;
    if ((t = PyObject_IsTrue(undos)) < 0)
        goto done;
    if ((t && mem_remember(mem, undos, key) < 0) || mem_apply(mem, seq, key, value) < 0)
        goto done;
    long long size_bytes, limit, closed_bytes, wal_size = 0;
    if ((options = get_attr(state, s_options, &r_state_options)) == NULL
        || attr_ll(mem, s_size_bytes, &r_mem_size_bytes, &size_bytes) < 0
        || attr_ll(options, s_memtable_size_bytes, &r_options_memtable_size_bytes, &limit) < 0
        || attr_ll(wal, s_closed_bytes, &r_log_closed_bytes, &closed_bytes) < 0
        || (writer = get_attr(wal, s_writer, &r_log_writer)) == NULL
        || (writer != Py_None && attr_ll(writer, s_size, &r_writer_size, &wal_size) < 0))
        goto done;
    long out = size_bytes >= limit ? PUT_FULL : 0;
    if (closed_bytes + wal_size > wal_limit)  /* LogSet.total_bytes */
        out |= PUT_WAL_OVER;
    result = PyLong_FromLong(out);
done:
    Py_XDECREF(wal);
    Py_XDECREF(mem);
    Py_XDECREF(undos);
    Py_XDECREF(options);
    Py_XDECREF(writer);
    return result;
}

/* obj.name(*args) (at most 4), its result dropped: 0, or -1 with an exception set. */
static int
call_method(PyObject *obj, PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *stack[5] = {obj, NULL, NULL, NULL, NULL};
    for (size_t i = 0; i < nargs; i++)
        stack[i + 1] = args[i];
    PyObject *r = PyObject_VectorcallMethod(name, stack, nargs + 1, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* writes.write_columns(state, [key], [value], False): the general path. */
static int
write_columns(PyObject *writes, PyObject *state, PyObject *key, PyObject *value)
{
    PyObject *keys = PyList_New(1), *values = PyList_New(1);
    if (keys == NULL || values == NULL) {
        Py_XDECREF(keys);
        Py_XDECREF(values);
        return -1;
    }
    Py_INCREF(key);
    PyList_SET_ITEM(keys, 0, key);
    Py_INCREF(value);
    PyList_SET_ITEM(values, 0, value);
    PyObject *args[4] = {state, keys, values, Py_False};
    int r = call_method(writes, s_write_columns, args, 4);
    Py_DECREF(keys);
    Py_DECREF(values);
    return r;
}

/* put_one's common case: 1 (a put of those), 0 (not its case: nothing done),
 * -1 with an exception set. */
static int
put_case(PyObject *writes, PyObject *state, PyObject *key, PyObject *value)
{
    if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > MAX_KEY_SIZE_BYTES
        || !PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > MAX_VALUE_SIZE_BYTES)
        return 0;
    int t;
    if ((t = attr_true(state, s_dropped, &r_state_dropped)) != 0
        || (t = attr_true(writes, s_sync_default, &r_writes_sync_default)) != 0)
        return t < 0 ? -1 : 0;
    PyObject *options = get_attr(state, s_options, &r_state_options);
    if (options == NULL)
        return -1;
    t = attr_true(options, s_default_time_to_live, &r_options_default_time_to_live);
    Py_DECREF(options);
    return t < 0 ? -1 : !t;
}

PyObject *
speedups_put_one(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* put_one(writes, state, key, value) -> bool: lsmdb.writepath.WritePath.put_one,
     * its put (WritePath.put) in line. */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "put_one(writes, state, key, value)");
        return NULL;
    }
    PyObject *writes = args[0], *state = args[1], *key = args[2], *value = args[3];
    int t = put_case(writes, state, key, value);
    if (t <= 0)
        return t < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *stall = NULL, *imms = NULL, *versions = NULL, *lock = NULL, *limit = NULL;
    PyObject *done = NULL, *result = NULL;
    int slow = 0;
    if ((stall = get_attr(writes, s_stall, &r_writes_stall)) == NULL)
        goto out;
    if (stall != Py_None) {  /* level 0 at its slowdown or stall bound: the general path */
        PyObject *version = get_attr(state, s_version, &r_state_version);
        if (version == NULL)
            goto out;
        PyObject *l0 = get_attr(version, s_l0, &r_version_l0);
        Py_DECREF(version);
        if (l0 == NULL)
            goto out;
        Py_ssize_t n = PyObject_Length(l0);
        Py_DECREF(l0);
        if (n < 0)
            goto out;
        /* read at each put, as the Python twin does (tests lower it) */
        if (compaction_module == NULL
            && (compaction_module = PyImport_ImportModule("lsmdb.compaction")) == NULL)
            goto out;
        Py_ssize_t stall_files, slowdown_files;
        if (take_ssize(PyObject_GetAttr(compaction_module, s_l0_stall_files), &stall_files) < 0
            || take_ssize(PyObject_GetAttr(compaction_module, s_l0_slowdown_files),
                          &slowdown_files) < 0)
            goto out;
        slow = n >= (slowdown_files < stall_files ? slowdown_files : stall_files);
    }
    if (!slow) {
        if ((imms = get_attr(state, s_imms, &r_state_imms)) == NULL)
            goto out;
        Py_ssize_t n = PyObject_Length(imms);
        if (n < 0)
            goto out;
        slow = n >= MAX_FROZEN_MEMTABLES
               || PyBytes_GET_SIZE(key) + (value == Py_None ? 0 : PyBytes_GET_SIZE(value))
                      > MAX_BATCH_SIZE_BYTES;
    }
    if (!slow) {
        if ((versions = get_attr(writes, s_versions, &r_writes_versions)) == NULL
            || (lock = get_attr(versions, s_lock, &r_versions_lock)) == NULL
            || (limit = get_attr(writes, s_wal_limit, &r_writes_wal_limit)) == NULL)
            goto out;
        PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        PyObject *call[5] = {versions, state, key, value, limit};
        done = speedups_put_locked(NULL, call, 5);
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);  /* the lock is released whatever happened */
        r = PyObject_CallMethodNoArgs(lock, s_release);
        if (r == NULL) {
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            goto out;
        }
        Py_DECREF(r);
        PyErr_Restore(type, exc, tb);
        if (done == NULL)
            goto out;
    }
    long flags = done == NULL ? PUT_DECLINED : PyLong_AsLong(done);
    if (flags == PUT_DECLINED) {
        if (write_columns(writes, state, key, value) < 0)
            goto out;
    } else {
        if (flags & PUT_FULL) {
            PyObject *full = PyList_New(1);
            if (full == NULL)
                goto out;
            Py_INCREF(state);
            PyList_SET_ITEM(full, 0, state);
            int r = call_method(writes, s_flush_full, &full, 1);
            Py_DECREF(full);
            if (r < 0)
                goto out;
        }
        if ((flags & PUT_WAL_OVER) && call_method(writes, s_flush_wal_pinners, NULL, 0) < 0)
            goto out;
    }
    result = Py_NewRef(Py_True);
out:
    Py_XDECREF(stall);
    Py_XDECREF(imms);
    Py_XDECREF(versions);
    Py_XDECREF(lock);
    Py_XDECREF(limit);
    Py_XDECREF(done);
    return result;
}

PyObject *
speedups_batch_bytes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* batch_bytes(keys, values) -> the bytes of a batch's keys and values
     * (None: 0; an expiring (value, expires): its value's): the sum
     * lsmdb.writepath.check_batch_size compares with MAX_BATCH_SIZE_BYTES. */
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "batch_bytes(keys: list, values: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]), m = PyList_GET_SIZE(args[1]);
    PyObject **keys = PySequence_Fast_ITEMS(args[0]), **values = PySequence_Fast_ITEMS(args[1]);
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(keys[i])) {
            PyErr_SetString(PyExc_TypeError, "batch_bytes: keys are bytes");
            return NULL;
        }
        total += PyBytes_GET_SIZE(keys[i]);
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *v = values[i];
        if (v == Py_None)
            continue;
        if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 2)
            v = PyTuple_GET_ITEM(v, 0);
        if (!PyBytes_CheckExact(v)) {
            PyErr_SetString(PyExc_TypeError, "batch_bytes: values are bytes, None or expiring");
            return NULL;
        }
        total += PyBytes_GET_SIZE(v);
    }
    return PyLong_FromLongLong(total);
}

/* ---- Putter: db.put without a Python frame --------------------------------
 *
 * Putter(writes, state, slow_put): called as put(key, value) it runs put_one
 * and returns None when that did the put; anything else -- other arguments
 * (sync=, ttl=), a put that is not put_one's case -- goes to slow_put with the
 * arguments as given.  A DB keeps one as its instance attribute `put`.  Python
 * twin: DB.put in lsmdb/db.py (put_one, then the handle's put). */

typedef struct {
    PyObject_HEAD
    PyObject *writes, *state, *slow_put;
    vectorcallfunc vectorcall;
} Putter;

static PyObject *
Putter_vectorcall(Putter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL) {
        PyObject *call[4] = {self->writes, self->state, args[0], args[1]};
        PyObject *done = speedups_put_one(NULL, call, 4);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
        if (done == Py_True)
            Py_RETURN_NONE;
    }
    return PyObject_Vectorcall(self->slow_put, args, nargsf, kwnames);
}

static int
Putter_init(Putter *self, PyObject *args, PyObject *kwds)
{
    PyObject *writes, *state, *slow_put;
    static char *kwlist[] = {"writes", "state", "slow_put", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:Putter", kwlist, &writes, &state, &slow_put))
        return -1;
    if (!PyCallable_Check(slow_put)) {
        PyErr_SetString(PyExc_TypeError, "Putter: slow_put must be callable");
        return -1;
    }
    Py_XSETREF(self->writes, Py_NewRef(writes));
    Py_XSETREF(self->state, Py_NewRef(state));
    Py_XSETREF(self->slow_put, Py_NewRef(slow_put));
    self->vectorcall = (vectorcallfunc)Putter_vectorcall;
    return 0;
}

static int
Putter_traverse(Putter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->writes);
    Py_VISIT(self->state);
    Py_VISIT(self->slow_put);
    return 0;
}

static int
Putter_clear(Putter *self)
{
    Py_CLEAR(self->writes);
    Py_CLEAR(self->state);
    Py_CLEAR(self->slow_put);
    return 0;
}

static void
Putter_dealloc(Putter *self)
{
    PyObject_GC_UnTrack(self);
    Putter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Putter_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (((Putter *)self)->vectorcall == NULL) {  /* not initialised */
        PyErr_SetString(PyExc_TypeError, "Putter not initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kwargs);
}

PyTypeObject PutterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Putter",
    .tp_basicsize = sizeof(Putter),
    .tp_dealloc = (destructor)Putter_dealloc,
    .tp_vectorcall_offset = offsetof(Putter, vectorcall),
    .tp_call = Putter_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Putter_traverse,
    .tp_clear = (inquiry)Putter_clear,
    .tp_doc = "Putter(writes, state, slow_put)\n--\n\n"
              "put(key, value, sync=None, ttl=None): put_one(writes, state, key, value) for\n"
              "two positional arguments, else (or where put_one declines) slow_put(...).",
    .tp_init = (initproc)Putter_init,
    .tp_new = PyType_GenericNew,
};
