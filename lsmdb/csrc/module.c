/* module.c: lsmdb._speedups itself -- its functions' table, its types and
 * constants, set up at import -- and _cmp, the tests' handle on the key
 * order every file compares with (mem_order, speedups.h).
 *
 * The hot per-key and per-file steps of lsmdb, in C.  Optional: lsmdb works
 * without them (the same logic runs in Python, and the tests run both and
 * compare answers and counters).  Each file is named after the Python
 * module whose step it does:
 *
 *   filters_hashing.c xxh3_64 (the filters' key hash, for keys up to 240
 *                     bytes)
 *   filters.c         a file's filter ready to probe, by its family (the
 *                     probes are inline: filters.h, filters_bloom.h,
 *                     filters_blocked_bloom.h)
 *   filters_bloom.c   the Bloom family's parameters, bloom_add
 *   filters_blocked_bloom.c  the blocked Bloom family's parameters,
 *                     blocked_bloom_add and blocked_bloom_fill
 *   readpath_probes.c Probes: a get's range checks and filter probes, file
 *                     by file
 *   readpath.c        Getter: the whole db.get (block-cache hits, a block
 *                     read from disk and its key walk) and get_many's steps
 *   readpath_many.c   get_many's pass over the files a file at a time
 *   memtable.c        MemFilter: a Bloom filter of a memtable's keys, so that
 *                     a get skips the memtable's dict for keys it does not hold;
 *                     apply_columns: a batch into a memtable
 *   cache.c           Admission (which blocks read from disk a full block
 *                     cache takes in) and Cache (the block cache's books)
 *   sstable_reader.c  map_file, Mapping and a data block read for the getter
 *   compression.c     PieceCompressor: a data block stored in pieces against
 *                     its file's dictionary
 *   block.c           block_entry, block_keys_hold, block_value_of, block_lists,
 *                     entry_find, entry_lists: the
 *                     data block rule in one walk of a block's bytes, the
 *                     block cache's form of a block and a lookup in it;
 *                     data_payload, a data block's payload written
 *   merge.c           Merge: the k-way merge of scans and compactions
 *   sstable_writer.c  block_cuts: where a chunk of entries is cut into blocks;
 *                     memtable_section, a frozen memtable's data blocks
 *   logset.c          encode_ops: a one-table WAL record; encode_one: a
 *                     one-op record
 *   writepath.c       put_locked: one put's step under the database lock (its
 *                     sequence number, its WAL record, the memtable);
 *                     batch_bytes, a batch's size; Putter, db.put without a
 *                     Python frame
 *   coding.c          crc32: zlib's CRC-32, folded with PCLMULQDQ where the
 *                     CPU has it
 *
 * Each has a header of its own (block.h for block.c, ...) declaring what the
 * others use of it; base.h is what they all include first, fastpath.h the
 * layout of what Python hands over. */

#include "block.h"
#include "cache.h"
#include "changes.h"
#include "coding.h"
#include "compression.h"
#include "fastpath.h"
#include "filters.h"
#include "filters_hashing.h"
#include "keys.h"
#include "logset.h"
#include "memtable.h"
#include "merge.h"
#include "readpath.h"
#include "readpath_probes.h"
#include "sstable_format.h"
#include "sstable_reader.h"
#include "sstable_writer.h"
#include "writepath.h"

static PyObject *
speedups_cmp(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* _cmp(a, b) -> -1, 0 or 1: the key order the C code uses (for the tests). */
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_cmp(a: bytes, b: bytes)");
        return NULL;
    }
    return PyLong_FromLong(bytes_cmp(args[0], args[1]));
}

static PyMethodDef speedups_functions[] = {
    {"_cmp", (PyCFunction)(void (*)(void))speedups_cmp, METH_FASTCALL,
     "_cmp($module, a, b, /)\n--\n\n"
     "-1, 0 or 1: bytes order, computed the way the C code computes it."},
    {"_fastmod", (PyCFunction)(void (*)(void))speedups_fastmod, METH_FASTCALL,
     "_fastmod($module, a, d, /)\n--\n\na % d, computed the way the filter probes compute it."},
    {"crc32", (PyCFunction)(void (*)(void))speedups_crc32, METH_FASTCALL,
     "crc32($module, data, value=0, /)\n--\n\n"
     "zlib.crc32(data, value), folded with PCLMULQDQ where present."},
    {"set_crc32_wide", (PyCFunction)speedups_set_crc32_wide, METH_O,
     "set_crc32_wide($module, wide, /)\n--\n\n"
     "Whether crc32 now folds 256-bit lanes (VPCLMULQDQ): with True where the CPU has them, "
     "as at import; False keeps the 128-bit fold."},
    {"xxh3_64", (PyCFunction)speedups_xxh3_64, METH_O,
     "xxh3_64($module, data, /)\n--\n\n"
     "xxhash.xxh3_64_intdigest(data), computed here up to 240 bytes."},
    {"encode_ops", (PyCFunction)(void (*)(void))speedups_encode_ops, METH_FASTCALL,
     "encode_ops($module, seq, table_id, keys, values, /)\n--\n\n"
     "msgpack [seq, [[table_id, key, value], ...]]."},
    {"apply_columns", (PyCFunction)(void (*)(void))speedups_apply_columns, METH_FASTCALL,
     "apply_columns($module, data, tags, filter, pending, seq, keys, values, /)\n--\n\n"
     "memtable.Memtable.apply_columns' step: keys[i] -> values[i] at seq into the memtable's "
     "dicts, filter and pending keys; (grow, expiring)."},
    {"batch_bytes", (PyCFunction)(void (*)(void))speedups_batch_bytes, METH_FASTCALL,
     "batch_bytes($module, keys, values, /)\n--\n\n"
     "The bytes of a batch's keys and values (writepath.check_batch_size's sum)."},
    {"put_locked", (PyCFunction)(void (*)(void))speedups_put_locked, METH_FASTCALL,
     "put_locked($module, versions, state, key, value, wal_limit, /)\n--\n\n"
     "lsmdb.writepath.put_locked: one put's step under the database lock."},
    {"put_one", (PyCFunction)(void (*)(void))speedups_put_one, METH_FASTCALL,
     "put_one($module, writes, state, key, value, /)\n--\n\n"
     "lsmdb.writepath.WritePath.put_one: a put in its common case, or False (nothing done)."},
    {"set_entry_seq", (PyCFunction)speedups_set_entry_seq, METH_O,
     "set_entry_seq($module, fn, /)\n--\n\n"
     "Register lsmdb.readpath.entry_seq: a handed-over block's entry's sequence number."},
    {"set_system_clock", (PyCFunction)speedups_set_system_clock, METH_O,
     "set_system_clock($module, clock, /)\n--\n\n"
     "Register lsmdb.ttl.system_now_us: reads on that clock take CLOCK_REALTIME in C."},
    {"changes_store", (PyCFunction)(void (*)(void))speedups_changes_store, METH_FASTCALL,
     "changes_store($module, buffer, offset, value, /)\n--\n\n"
     "value as a u64 at offset of the writer's CHANGES mapping, a release store."},
    {"pieces_payload", (PyCFunction)(void (*)(void))speedups_pieces_payload, METH_FASTCALL,
     "pieces_payload($module, reader, stored, /)\n--\n\n"
     "The payload of a type-3 block of reader's file, or None where it does not decompress "
     "and check (lsmdb.compression.decompress_pieces says why)."},
    {"lz4_direct", (PyCFunction)speedups_lz4_direct, METH_NOARGS,
     "lz4_direct($module, /)\n--\n\n"
     "Whether the C getter decompresses LZ4 blocks itself (the lz4 package's "
     "LZ4_decompress_safe), not through Python."},
    {"block_keys_hold", (PyCFunction)(void (*)(void))speedups_block_keys_hold, METH_FASTCALL,
     "block_keys_hold($module, prefix, total, key, after, last, version, /)\n--\n\n"
     "Whether key is among the keys of the data block payload of total bytes that begins "
     "with prefix (None: its keys run past the prefix); ValueError for keys the rule "
     "refuses."},
    {"block_value_of", (PyCFunction)(void (*)(void))speedups_block_value_of, METH_FASTCALL,
     "block_value_of($module, prefix, total, key, after, last, /)\n--\n\n"
     "Over the first bytes of a format-2 data block payload of total bytes: False when key "
     "is not among its keys, (value,) when it is (None: a tombstone), None when what decides "
     "runs past the prefix; ValueError for arrays the rule refuses."},
    {"block_entry", (PyCFunction)(void (*)(void))speedups_block_entry, METH_FASTCALL,
     "block_entry($module, payload, after, last, version=1, /)\n--\n\n"
     "The block cache's form of a data block of that format the rule accepts within those "
     "bounds: the payload, then its entries' offsets."},
    {"block_lists", (PyCFunction)(void (*)(void))speedups_block_lists, METH_FASTCALL,
     "block_lists($module, payload, after, last, version=1, /)\n--\n\n"
     "(keys, values) of a data block of that format the rule accepts within those bounds."},
    {"block_full", (PyCFunction)(void (*)(void))speedups_block_full, METH_FASTCALL,
     "block_full($module, payload, after, last, version=2, /)\n--\n\n"
     "(keys, values, tags) of a data block of format 2 or 3 the rule accepts within those "
     "bounds, expiring values as (value, expires)."},
    {"data_payload", (PyCFunction)(void (*)(void))speedups_data_payload, METH_FASTCALL,
     "data_payload($module, keys, values, tags, lo, hi, /)\n--\n\n"
     "block.encode_data_payload(keys[lo:hi], values[lo:hi], tags[lo:hi]) of format 2."},
    {"block_cuts", (PyCFunction)(void (*)(void))speedups_block_cuts, METH_FASTCALL,
     "block_cuts($module, keys, values, need, block_size, /)\n--\n\n"
     "sstable_writer.block_cuts: (cuts, bases, total) of a chunk of sorted entries."},
    {"memtable_section", (PyCFunction)(void (*)(void))speedups_memtable_section, METH_FASTCALL,
     "memtable_section($module, data, tags, block_size, kind, compress, want_hashes, sink, /)"
     "\n--\n\n"
     "sstable_writer.memtable_section: a frozen memtable's data blocks, sorted, cut, "
     "encoded and compressed mostly without the GIL, handed to sink a run at a time."},
    {"entry_lists", (PyCFunction)speedups_entry_lists, METH_O,
     "entry_lists($module, entry, /)\n--\n\n(keys, values) of a cached block (block_entry)."},
    {"entry_find", (PyCFunction)(void (*)(void))speedups_entry_find, METH_FASTCALL,
     "entry_find($module, entry, key, missing, /)\n--\n\n"
     "Key's value in a cached block (block_entry), None for a tombstone, (value, expires) "
     "for an expiring value, or missing."},
    {"map_file", (PyCFunction)(void (*)(void))speedups_map_file, METH_FASTCALL,
     "map_file($module, fd, size, /)\n--\n\n"
     "Mapping: the file mapped read-only for the C getter's block reads."},
    {"bloom_add", (PyCFunction)(void (*)(void))speedups_bloom_add, METH_FASTCALL,
     "bloom_add($module, bits, m, k, hashes, part=0, /)\n--\n\n"
     "Set the filter bits of every 64-bit hash (part 0: format 1)."},
    {"blocked_bloom_add", (PyCFunction)(void (*)(void))speedups_blocked_bloom_add, METH_FASTCALL,
     "blocked_bloom_add($module, bits, blocks, k, hashes, /)\n--\n\n"
     "Set the blocked Bloom filter bits of every 64-bit hash."},
    {"blocked_bloom_fill", (PyCFunction)(void (*)(void))speedups_blocked_bloom_fill, METH_FASTCALL,
     "blocked_bloom_fill($module, bits, blocks, k, /)\n--\n\n"
     "(bits set, mean over blocks of (the block's fill)^k) of a blocked Bloom filter."},
    {NULL, NULL, 0, NULL},
};

/* ---- the layout of what the C read path reads and counts ----------------
 *
 * The names of the slots and fields speedups.h numbers, in their order, from
 * the same macros: lsmdb compares them at import with what the Python side
 * defines (lsmdb/fastpath.py's NamedTuples, lsmdb/stats.py's counter
 * tuples), and refuses the C read path on a mismatch rather than read the
 * wrong fields or count into the wrong slots. */

static const char *const file_probe_fields[FILE_FIELDS] = {
    [FILE_READER] = "reader",
    [FILE_MIN_KEY] = "min_key",
    [FILE_MAX_KEY] = "max_key",
    [FILE_COUNTS] = "counts",
    [FILE_HASH_FN] = "hash_fn",
    [FILE_FILTER] = "filter",
    [FILE_FILTER_FAMILY] = "filter_family",
    [FILE_FILTER_DATA] = "filter_data",
    [FILE_FILTER_PARAMS] = "filter_params",
    [FILE_INDEX_KEYS] = "index_keys",
    [FILE_INDEX_OFFSETS] = "index_offsets",
    [FILE_INDEX_SIZES] = "index_sizes",
    [FILE_CACHE_BASE] = "cache_base",
    [FILE_FORMAT_VERSION] = "format_version",
    [FILE_MAX_SEQ] = "max_seq",
};

static const char *const level_fields[LEVEL_FIELDS] = {
    [LEVEL_MAX_KEYS] = "max_keys",
    [LEVEL_FILES] = "files",
};

static const char *const fast_path_fields[FAST_FIELDS] = {
    [FAST_DATA] = "data",
    [FAST_IMM_DATAS] = "imm_datas",
    [FAST_L0] = "l0",
    [FAST_DEEPER] = "deeper",
    [FAST_PROBES] = "probes",
    [FAST_FILES] = "files",
    [FAST_FILTERS] = "filters",
    [FAST_CACHE] = "cache",
    [FAST_SHADOW] = "shadow",
    [FAST_VERSION] = "version",
    [FAST_NOW_US] = "now_us",
    [FAST_SEQ_OVERLAP] = "seq_overlap",
    [FAST_BOUND] = "bound",
};

static const char *const file_counter_names[FILE_COUNTER_SLOTS] = {
    [RANGE_SKIPS] = "range_skips",
    [FILTER_NEGATIVES] = "filter_negatives",
    [TRUE_POSITIVES] = "true_positives",
    [FALSE_POSITIVES] = "false_positives",
    [FALSE_NEGATIVES] = "false_negatives",
    [BLOCK_READS] = "block_reads",
    [BLOCK_CACHE_HITS] = "block_cache_hits",
};

static const char *const table_counter_names[TABLE_COUNTER_SLOTS] = {
    [GETS] = "gets",
    [GETS_ABSENT] = "gets_absent",
    [WRITE_STALLS] = "write_stalls",
    [WRITE_STALL_US] = "write_stall_us",
    [WRITE_SLOWDOWNS] = "write_slowdowns",
    [WRITE_SLOWDOWN_US] = "write_slowdown_us",
};

/* names[0:n] as a tuple of str; SystemError for a slot no macro named (two
 * macros of one group with the same number leave one). */
static PyObject *
names_tuple(const char *what, const char *const *names, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = names[i] ? PyUnicode_FromString(names[i]) : NULL;
        if (s == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_SystemError, "%s: slot %zd has no name", what, i);
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* Add names[0:n] to mod as the tuple `what`. */
static int
add_names(PyObject *mod, const char *what, const char *const *names, Py_ssize_t n)
{
    PyObject *t = names_tuple(what, names, n);
    if (t == NULL)
        return -1;
    if (PyModule_AddObject(mod, what, t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

/* Add obj (a new reference, or NULL with an exception set) to mod as `name`. */
static int
add_new(PyObject *mod, const char *name, PyObject *obj)
{
    if (obj == NULL)
        return -1;
    if (PyModule_AddObject(mod, name, obj) < 0) {
        Py_DECREF(obj);
        return -1;
    }
    return 0;
}

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "lsmdb._speedups",
    "Optional C speedups for lsmdb's read path, merges and filter building "
    "(see lsmdb/csrc/).", -1, speedups_functions,
};

static int
add_type(PyObject *mod, const char *name, PyTypeObject *type)
{
    Py_INCREF(type);
    if (PyModule_AddObject(mod, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&ProbesType) < 0 || PyType_Ready(&GetterType) < 0
        || PyType_Ready(&MergeType) < 0 || PyType_Ready(&MemFilterType) < 0
        || PyType_Ready(&MappingType) < 0 || PyType_Ready(&AdmissionType) < 0
        || PyType_Ready(&CacheType) < 0 || PyType_Ready(&ContainsType) < 0
        || PyType_Ready(&PutterType) < 0 || PyType_Ready(&ChangeWatchType) < 0
        || PyType_Ready(&PieceCompressorType) < 0)
        return NULL;
    if (sstable_reader_init() < 0)
        return NULL;
    coding_init();
    if (hashing_init() < 0)
        return NULL;
    readpath_probes_init();
    if (writepath_init() < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&speedups_module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "FILTER_PREFETCH_BYTES", (long)prefetch_all_bytes) < 0
        || add_type(mod, "Probes", &ProbesType) < 0 || add_type(mod, "Getter", &GetterType) < 0
        || add_type(mod, "Merge", &MergeType) < 0
        || add_type(mod, "MemFilter", &MemFilterType) < 0
        || add_type(mod, "Mapping", &MappingType) < 0
        || add_type(mod, "Admission", &AdmissionType) < 0
        || add_type(mod, "Cache", &CacheType) < 0
        || add_type(mod, "Contains", &ContainsType) < 0
        || add_type(mod, "Putter", &PutterType) < 0
        || add_type(mod, "ChangeWatch", &ChangeWatchType) < 0
        || add_type(mod, "PieceCompressor", &PieceCompressorType) < 0
        || PyModule_AddIntConstant(mod, "CRC32_CLMUL", have_clmul) < 0
        || PyModule_AddIntConstant(mod, "CRC32_VPCLMUL", have_vclmul) < 0
        || add_names(mod, "FILE_PROBE_FIELDS", file_probe_fields, FILE_FIELDS) < 0
        || add_names(mod, "LEVEL_FIELDS", level_fields, LEVEL_FIELDS) < 0
        || add_names(mod, "FAST_PATH_FIELDS", fast_path_fields, FAST_FIELDS) < 0
        || add_names(mod, "FILE_COUNTERS", file_counter_names, FILE_COUNTER_SLOTS) < 0
        || add_names(mod, "TABLE_COUNTERS", table_counter_names, TABLE_COUNTER_SLOTS) < 0
        || add_new(mod, "FILTER_FAMILIES", filter_families()) < 0
        || add_new(mod, "CONSTANTS", Py_BuildValue(
               "{sisisKsisisKsK}", "BLOCK_TRAILER_SIZE", BLOCK_TRAILER_SIZE,
               "DATA_TRAILER_V2_SIZE", DATA_TRAILER_V2_SIZE,
               "CRC32_RESIDUE", (unsigned long long)CRC32_RESIDUE,
               "CACHE_ENTRY_TAIL", ENTRY_TAIL, "CACHE_ENTRY_OFFSET", ENTRY_OFFSET,
               "ADMISSION_BITS_PER_KEY", (unsigned long long)ADMISSION_BITS_PER_KEY,
               "ADMISSION_MAX_BITS", (unsigned long long)ADMISSION_MAX_BITS)) < 0
        || add_new(mod, "COMPRESSION_CONSTANTS", Py_BuildValue(
               "{sisisi}", "PIECE_BYTES", PIECE_BYTES, "MAX_DICT", MAX_DICT,
               "LZ4_PIECES", COMPRESSION_LZ4_PIECES)) < 0
        || add_new(mod, "WRITE_PATH_CONSTANTS", Py_BuildValue(
               "{sisisisisisisLsisisisisLsisL}", "BLOCK_SIZE_BYTES", WAL_BLOCK_SIZE_BYTES,
               "FRAGMENT_HEADER_SIZE", WAL_FRAGMENT_HEADER_SIZE, "FULL", WAL_FULL,
               "ENTRY_OVERHEAD_BYTES", MEM_ENTRY_OVERHEAD_BYTES,
               "EXPIRING_OVERHEAD_BYTES", MEM_EXPIRING_OVERHEAD_BYTES,
               "KIND_VALUE", MEM_KIND_VALUE, "MAX_SEQ", (long long)WRITE_MAX_SEQ,
               "PUT_FULL", PUT_FULL, "PUT_WAL_OVER", PUT_WAL_OVER,
               "PUT_DECLINED", PUT_DECLINED, "MAX_FROZEN_MEMTABLES", MAX_FROZEN_MEMTABLES,
               "MAX_BATCH_SIZE_BYTES", MAX_BATCH_SIZE_BYTES,
               "MAX_KEY_SIZE_BYTES", MAX_KEY_SIZE_BYTES,
               "MAX_VALUE_SIZE_BYTES", MAX_VALUE_SIZE_BYTES)) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
