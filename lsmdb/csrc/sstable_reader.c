/* sstable_reader.c: an SSTable's data blocks read for the C getter -- the
 * file mapped read-only (map_file, Mapping) with its SIGBUS guard, and a
 * block copied out of the mapping or read with one pread, its checksum
 * verified (read_block_buf).  Python twin: lsmdb/sstable_reader.py's
 * SSTableReader (map_file, _read_raw, _verify). */

#include "sstable_reader.h"
#include "block.h"
#include "coding.h"
#include "sstable_format.h"

static PyObject *str_fd, *str_mapped, *str_dict, *str_scratch;
static int pieces_whole(PyObject *reader, const unsigned char *stored, size_t n,
                        unsigned char **out, size_t *outn);
static PyObject *decompressor;  /* lsmdb.compression.decompress_for_c, once imported */

#ifndef _WIN32
#include <dlfcn.h>
/* LZ4_decompress_safe of the lz4 package's own extension (lz4.block._block,
 * which exports liblz4's API), found once: an LZ4 block is then decompressed
 * here, without a call into Python.  NULL when it cannot be found (the
 * package built otherwise): decompress_for_c serves every kind. */
typedef int (*lz4_safe_fn)(const char *src, char *dst, int compressed, int capacity);
typedef int (*lz4_partial_fn)(const char *src, char *dst, int compressed, int want,
                              int capacity);
static lz4_safe_fn lz4_safe;
static lz4_partial_fn lz4_partial;  /* LZ4_decompress_safe_partial, or NULL */
typedef int (*lz4_dict_fn)(const char *src, char *dst, int compressed, int capacity,
                           const char *dict, int dict_size);
static lz4_dict_fn lz4_dict;  /* LZ4_decompress_safe_usingDict, or NULL */
static Lz4Api lz4_api;
static int lz4_api_found;
static int lz4_looked;

static void
find_lz4(void)
{
    lz4_looked = 1;
    PyObject *mod = PyImport_ImportModule("lz4.block._block");
    if (mod == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (file == NULL || !PyUnicode_Check(file)) {
        Py_XDECREF(file);
        PyErr_Clear();
        return;
    }
    const char *path = PyUnicode_AsUTF8(file);
    void *lib = path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (path == NULL)
        PyErr_Clear();
    Py_DECREF(file);
    if (lib != NULL) {  /* the module stays loaded */
        lz4_safe = (lz4_safe_fn)dlsym(lib, "LZ4_decompress_safe");
        lz4_partial = (lz4_partial_fn)dlsym(lib, "LZ4_decompress_safe_partial");
        lz4_dict = (lz4_dict_fn)dlsym(lib, "LZ4_decompress_safe_usingDict");
        lz4_api.create = (void *(*)(void))dlsym(lib, "LZ4_createStream");
        lz4_api.release = (int (*)(void *))dlsym(lib, "LZ4_freeStream");
        lz4_api.reset = (void (*)(void *))dlsym(lib, "LZ4_resetStream");
        lz4_api.compress = (int (*)(void *, const char *, char *, int, int, int))dlsym(
            lib, "LZ4_compress_fast_continue");
        lz4_api.bound = (int (*)(int))dlsym(lib, "LZ4_compressBound");
        lz4_api.load_dict = (int (*)(void *, const char *, int))dlsym(lib, "LZ4_loadDict");
        lz4_api.sizeof_state = (int (*)(void))dlsym(lib, "LZ4_sizeofState");
        lz4_api_found = lz4_api.create && lz4_api.release && lz4_api.reset
                        && lz4_api.compress && lz4_api.bound;
    }
}
#endif

/* What lz4.block.compress calls in liblz4, as find_lz4 found it (under the
 * GIL, the first time), or NULL where it is not to be had. */
const Lz4Api *
lz4_compressor(void)
{
#ifndef _WIN32
    if (!lz4_looked)
        find_lz4();
    return lz4_api_found ? &lz4_api : NULL;
#else
    return NULL;
#endif
}

/* The names reader_fd and mapped_read look up, interned (at import): 0, or
 * -1 with an exception set. */
int
sstable_reader_init(void)
{
    str_fd = PyUnicode_InternFromString("fd");
    str_mapped = PyUnicode_InternFromString("mapped");
    str_dict = PyUnicode_InternFromString("compression_dict");
    str_scratch = PyUnicode_InternFromString("_dict_scratch");
    return str_fd == NULL || str_mapped == NULL || str_dict == NULL || str_scratch == NULL ? -1
                                                                                         : 0;
}

/* ---- a file mapped for block reads ------------------------------------- */

/* A whole SSTable mapped read-only (map_file): the C getter copies a block
 * out of it instead of a pread, a memory copy instead of a system call.
 * Unmapped when freed; a read copying out of it holds a reference. */
typedef struct {
    PyObject_HEAD
    unsigned char *addr;
    size_t len;
} Mapping;

static void
Mapping_dealloc(Mapping *self)
{
#ifndef _WIN32
    if (self->addr != NULL)
        munmap(self->addr, self->len);
#endif
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Mapping_getbuffer(Mapping *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->addr, (Py_ssize_t)self->len, 1, flags);
}

static PyObject *
Mapping_size(Mapping *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(self->len);
}

static PyBufferProcs Mapping_as_buffer = {(getbufferproc)Mapping_getbuffer, NULL};

static PyGetSetDef Mapping_getset[] = {
    {"size", (getter)Mapping_size, NULL, "bytes mapped", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.Mapping",
    .tp_basicsize = sizeof(Mapping),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A file mapped read-only by map_file (read-only buffer).",
    .tp_dealloc = (destructor)Mapping_dealloc,
    .tp_as_buffer = &Mapping_as_buffer,
    .tp_getset = Mapping_getset,
};

#ifndef _WIN32
/* A page of a mapping that cannot be read (the file cut short under it, a
 * device error) raises SIGBUS at the access.  guarded_copy points bus_env
 * at its jump buffer for the length of its copy; the handler jumps back
 * there, and the copy reports failure instead of the process ending.  A
 * SIGBUS anywhere else, or one sent (kill) rather than raised by a fault,
 * goes to the handler there was before (or ends the process, as it would
 * have).  The handler runs with SA_NODEFER, so jumping
 * out of it leaves SIGBUS unblocked, and sigsetjmp need not save the signal
 * mask (which would be a system call per copy).  bus_env is initial-exec
 * TLS: read in a signal handler, it must not need an allocation. */
static __thread sigjmp_buf *volatile bus_env __attribute__((tls_model("initial-exec")));
static struct sigaction prev_bus;
static int bus_handler_installed;

static void
on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    sigjmp_buf *env = bus_env;
    if (env != NULL && (info == NULL || info->si_code > 0)) {  /* a fault, not a signal sent */
        bus_env = NULL;
        siglongjmp(*env, 1);
    }
    if (prev_bus.sa_flags & SA_SIGINFO) {
        if (prev_bus.sa_sigaction != NULL) {
            prev_bus.sa_sigaction(sig, info, uctx);
            return;
        }
    }
    else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN) {
        prev_bus.sa_handler(sig);
        return;
    }
    /* no handler before ours: the default action.  A fault runs again on
     * return and ends the process; a signal sent is sent again. */
    sigaction(SIGBUS, &prev_bus, NULL);
    if (info == NULL || info->si_code <= 0)
        raise(sig);
}

static int
install_bus_handler(void)
{
    if (bus_handler_installed)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (sigaction(SIGBUS, &sa, &prev_bus) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    bus_handler_installed = 1;
    return 0;
}

/* memcpy(dst, src, n) from a mapping: 0, or -1 when a page of it raised
 * SIGBUS (dst then holds part of the bytes).  Needs no GIL. */
static int
guarded_copy(unsigned char *dst, const unsigned char *src, size_t n)
{
    sigjmp_buf env;
    if (sigsetjmp(env, 0))
        return -1;
    bus_env = &env;
    __asm__ __volatile__("" ::: "memory");  /* the copy stays between the two stores */
    memcpy(dst, src, n);
    __asm__ __volatile__("" ::: "memory");
    bus_env = NULL;
    return 0;
}
#endif

PyObject *
speedups_map_file(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* map_file(fd, size) -> Mapping: the first size bytes of the open file fd,
     * mapped read-only and shared, advised for random reads. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "map_file(fd, size)");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX || size <= 0) {
        PyErr_SetString(PyExc_ValueError, "map_file needs an open descriptor and a size > 0");
        return NULL;
    }
#ifdef _WIN32
    PyErr_SetString(PyExc_OSError, "map_file: not on Windows");
    return NULL;
#else
    if (install_bus_handler() < 0)
        return NULL;
    void *addr;
    Py_BEGIN_ALLOW_THREADS
    addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, (int)fd, 0);
    Py_END_ALLOW_THREADS
    if (addr == MAP_FAILED)
        return PyErr_SetFromErrno(PyExc_OSError);
#ifdef MADV_RANDOM
    (void)madvise(addr, (size_t)size, MADV_RANDOM);  /* a get reads one block: no read-around */
#endif
    Mapping *m = PyObject_New(Mapping, &MappingType);
    if (m == NULL) {
        munmap(addr, (size_t)size);
        return NULL;
    }
    m->addr = addr;
    m->len = (size_t)size;
    return (PyObject *)m;
#endif
}

/* Copy total bytes at offset out of reader's mapping (reader.mapped) into
 * buf, the GIL released: 0; 1 when the reader has no mapping (the caller
 * reads with pread); 2 when the mapping ends before those bytes or a page of
 * it could not be read (the caller lets Python read them again, and raise);
 * -1 on error. */
static int
mapped_read(PyObject *reader, unsigned char *buf, uint64_t offset, size_t total)
{
#ifdef _WIN32
    (void)reader; (void)buf; (void)offset; (void)total;
    return 1;
#else
    PyObject *mp = PyObject_GetAttr(reader, str_mapped);
    if (mp == NULL)
        return -1;
    if (!Py_IS_TYPE(mp, &MappingType)) {
        Py_DECREF(mp);
        return 1;
    }
    Mapping *m = (Mapping *)mp;
    if (offset > m->len || total > m->len - offset) {
        Py_DECREF(mp);
        return 2;
    }
    int bad;
    Py_BEGIN_ALLOW_THREADS  /* a page not in the page cache waits for the device */
    bad = guarded_copy(buf, m->addr + offset, total);
    Py_END_ALLOW_THREADS
    Py_DECREF(mp);  /* the reader may have dropped it meanwhile: unmapped here then */
    return bad ? 2 : 0;
#endif
}

/* The reader's file descriptor: 0 and *fd; 1 when it has none (closed, or
 * in memory: the caller lets Python serve); -1 on error. */
static int
reader_fd(PyObject *reader, int *fd)
{
    PyObject *a = PyObject_GetAttr(reader, str_fd);
    if (a == NULL)
        return -1;
    long v = PyLong_CheckExact(a) ? PyLong_AsLong(a) : -1;
    Py_DECREF(a);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (v < 0 || v > INT_MAX)
        return 1;
    *fd = (int)v;
    return 0;
}

/* ---- type 3: LZ4 in pieces against the file's dictionary ------------------ */

/* A varint (LEB128, at most 32 bits) at *pp: 0, *out and *pp past it; -1
 * where it runs past end or is too long. */
static int
read_varint(const unsigned char **pp, const unsigned char *end, size_t *out)
{
    size_t n = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (*pp >= end)
            return -1;
        unsigned char b = *(*pp)++;
        n |= (size_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = n;
            return 0;
        }
    }
    return -1;
}

/* The table of the type-3 block stored[0:n] (lsmdb/compression.py's
 * piece_table): 0 and *t; -1 where it does not add up (the pieces' sizes
 * not filling the block, a size of 0, the entries they begin with not
 * increasing, a payload of no bytes). */
int
pieces_table(const unsigned char *stored, size_t n, Pieces *t)
{
    const unsigned char *q = stored + 4, *end = stored + n;
    size_t count, size, first, prev = 0, total = 0;
    if (n < 6 || (t->plen = rd32(stored)) == 0 || t->plen > INT_MAX)
        return -1;
    if (read_varint(&q, end, &count) < 0 || count < 2 || count > n)
        return -1;
    t->count = count;
    t->sizes = q;
    for (size_t k = 0; k < count; k++) {
        if (read_varint(&q, end, &size) < 0 || size == 0 || size > INT_MAX)
            return -1;
        total += size;
    }
    t->firsts = q;
    for (size_t k = 2; k < count; k++) {
        if (read_varint(&q, end, &first) < 0 || first <= prev)
            return -1;
        prev = first;
    }
    if (total != (size_t)(end - q))
        return -1;
    t->data = q;
    return 0;
}

/* Piece p of table t (p < t->count): its LZ4 bytes *src[0:*len]. */
void
pieces_piece(const Pieces *t, size_t p, const unsigned char **src, size_t *len)
{
    const unsigned char *q = t->sizes, *at = t->data;
    size_t size = 0;
    for (size_t k = 0; k <= p; k++) {
        at += size;
        (void)read_varint(&q, t->data, &size);  /* pieces_table read them */
    }
    *src = at;
    *len = size;
}

/* The piece of table t holding entry `index`'s value (1 or more), the
 * entry it begins with, *first, and the entry the next begins with, *next
 * (SIZE_MAX for the last piece). */
size_t
pieces_holding(const Pieces *t, size_t index, size_t *first, size_t *next)
{
    const unsigned char *q = t->firsts;
    size_t p = 1, f = 0, k, v = 0;
    *next = SIZE_MAX;
    for (k = 2; k < t->count; k++) {
        (void)read_varint(&q, t->data, &v);  /* pieces_table read them */
        if (v > index) {
            *next = v;
            break;
        }
        p = k;
        f = v;
    }
    *first = f;
    return p;
}

/* The least room after a file's dictionary in its scratch buffer. */
#define DICT_ROOM 4096

/* reader's dictionary for its type-3 blocks, in its scratch buffer
 * (reader._dict_scratch, a bytearray made the first time: the dictionary's
 * length as a size_t, the dictionary, then room for `need` bytes or
 * DICT_ROOM, grown when a read needs more).  A piece decompressed into the
 * room right after the dictionary has it as the stream's prefix, which LZ4
 * decodes at the speed of a block of its own; against a dictionary
 * elsewhere it copies each match out of the dictionary apart.  Used under
 * the GIL only, which makes the room one read's at a time.  1 and *d
 * (d->holder a new reference: dict_release it); 0 where the file has no
 * dictionary; -1 on error. */
int
reader_dictionary(PyObject *reader, size_t need, Dict *d)
{
    const Py_ssize_t head = (Py_ssize_t)sizeof(size_t);
    if (need < DICT_ROOM)
        need = DICT_ROOM;
    if (need > PY_SSIZE_T_MAX / 2)
        return 0;
    PyObject *ba = PyObject_GetAttr(reader, str_scratch);
    if (ba == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        PyObject *dict = PyObject_GetAttr(reader, str_dict);
        if (dict == NULL)
            return -1;
        if (!PyBytes_CheckExact(dict) || PyBytes_GET_SIZE(dict) == 0) {
            Py_DECREF(dict);
            return 0;
        }
        size_t dlen = (size_t)PyBytes_GET_SIZE(dict);
        ba = PyByteArray_FromStringAndSize(NULL, head + (Py_ssize_t)(dlen + need));
        if (ba != NULL) {
            memcpy(PyByteArray_AS_STRING(ba), &dlen, sizeof dlen);
            memcpy(PyByteArray_AS_STRING(ba) + head, PyBytes_AS_STRING(dict), dlen);
        }
        Py_DECREF(dict);
        if (ba == NULL || PyObject_SetAttr(reader, str_scratch, ba) < 0) {
            Py_XDECREF(ba);
            return -1;
        }
    }
    size_t dlen = 0;
    Py_ssize_t size = PyByteArray_CheckExact(ba) ? PyByteArray_GET_SIZE(ba) : 0;
    if (size > head)
        memcpy(&dlen, PyByteArray_AS_STRING(ba), sizeof dlen);
    if (dlen == 0 || dlen >= (size_t)(size - head)) {  /* not what this function made */
        Py_DECREF(ba);
        return 0;
    }
    if ((size_t)(size - head) - dlen < need
        && PyByteArray_Resize(ba, head + (Py_ssize_t)(dlen + need)) < 0) {  /* keeps its bytes */
        Py_DECREF(ba);
        return -1;
    }
    d->holder = ba;
    d->dict = (unsigned char *)PyByteArray_AS_STRING(ba) + head;
    d->dlen = dlen;
    d->room = d->dict + d->dlen;
    d->rlen = (size_t)(PyByteArray_GET_SIZE(ba) - head) - d->dlen;
    return 1;
}

void
dict_release(Dict *d)
{
    Py_CLEAR(d->holder);
}

/* Piece src[0:len] decompressed against d's dictionary into d's room, to at
 * most `limit` bytes: its bytes (at least 1), or -1 where it does not
 * decompress within them or lz4 is not at hand. */
Py_ssize_t
pieces_decode(const unsigned char *src, size_t len, const Dict *d, size_t limit)
{
#ifndef _WIN32
    if (!lz4_looked)
        find_lz4();
    if (limit > d->rlen)
        limit = d->rlen;
    if (lz4_dict == NULL || len > INT_MAX || limit == 0 || limit > INT_MAX)
        return -1;
    int r = lz4_dict((const char *)src, (char *)d->room, (int)len, (int)limit,
                     (const char *)d->dict, (int)d->dlen);
    return r > 0 ? (Py_ssize_t)r : -1;
#else
    (void)src; (void)len; (void)d; (void)limit;
    return -1;
#endif
}

/* The payload of the type-3 block stored[0:n] of reader's file, every piece
 * decompressed against its dictionary and the pieces checked to begin where
 * the table says (lsmdb/compression.py's decompress_pieces): 0, *out (a new
 * PyMem_RawMalloc'd buffer) and *outn; 2 where any of that fails (Python
 * reads it again and raises); -1 on error. */
static int
pieces_whole(PyObject *reader, const unsigned char *stored, size_t n, unsigned char **out,
             size_t *outn)
{
    Pieces t;
    Dict dict;
    if (pieces_table(stored, n, &t) < 0)
        return 2;
    int r = reader_dictionary(reader, t.plen, &dict);
    if (r <= 0)
        return r < 0 ? -1 : 2;
    unsigned char *buf = PyMem_RawMalloc(t.plen);
    size_t *begins = PyMem_RawMalloc(2 * t.count * sizeof(size_t));
    if (buf == NULL || begins == NULL) {
        PyMem_RawFree(buf);
        PyMem_RawFree(begins);
        dict_release(&dict);
        PyErr_NoMemory();
        return -1;
    }
    size_t *firsts = begins + t.count, at = 0;
    const unsigned char *q = t.firsts;
    firsts[0] = 0;
    for (size_t k = 2; k < t.count; k++)
        (void)read_varint(&q, t.data, &firsts[k - 1]);
    r = 0;
    for (size_t k = 0; k < t.count && r == 0; k++) {
        const unsigned char *src;
        size_t len;
        pieces_piece(&t, k, &src, &len);
        begins[k] = at;
        Py_ssize_t got = at < t.plen ? pieces_decode(src, len, &dict, t.plen - at) : -1;
        if (got < 0) {
            r = 2;
        } else {
            memcpy(buf + at, dict.room, (size_t)got);
            at += (size_t)got;
        }
    }
    if (r == 0 && (at != t.plen || block_pieces_check(buf, at, begins, firsts, t.count) < 0))
        r = 2;
    PyMem_RawFree(begins);
    dict_release(&dict);
    if (r != 0) {
        PyMem_RawFree(buf);
        return r;
    }
    *out = buf;
    *outn = at;
    return 0;
}

PyObject *
speedups_pieces_payload(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* pieces_payload(reader, stored) -> the payload of the type-3 block
     * stored (bytes-like) of reader's file, every piece decompressed against
     * its dictionary (in its scratch buffer) and the pieces checked to begin
     * where the table says: lsmdb.compression.decompress_pieces, or None
     * where that refuses the block (it then says why). */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pieces_payload(reader, stored)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    unsigned char *out = NULL;
    size_t outn = 0;
    int r = pieces_whole(args[0], (const unsigned char *)view.buf, (size_t)view.len, &out,
                         &outn);
    PyBuffer_Release(&view);
    if (r < 0)
        return NULL;
    if (r != 0)
        Py_RETURN_NONE;
    PyObject *payload = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)outn);
    PyMem_RawFree(out);
    return payload;
}

/* The payload of the compressed block stored[0:n] of type `kind`: an LZ4
 * block by the lz4 package's LZ4_decompress_safe (find_lz4), anything else
 * through lsmdb.compression.decompress_for_c (the lz4 and zstandard
 * packages, as the Python read path decompresses): 0, *out a new PyMem_RawMalloc'd buffer
 * and *outn its bytes; 2 for a block that does not decompress (Python reads
 * it again and raises); -1 on error. */
static int
decompress_block(PyObject *reader, int kind, const unsigned char *stored, size_t n,
                 unsigned char **out, size_t *outn)
{
#ifndef _WIN32
    if (!lz4_looked)
        find_lz4();
    if (kind == COMPRESSION_LZ4_PIECES)
        return pieces_whole(reader, stored, n, out, outn);
    if (kind == COMPRESSION_LZ4 && lz4_safe != NULL) {
        /* stored: the payload's length, u32 little-endian, then the LZ4 block */
        if (n < 4)
            return 2;
        uint32_t size = rd32(stored);
        if (size == 0 || size > INT_MAX || n - 4 > INT_MAX)
            return 2;
        *out = PyMem_RawMalloc(size);
        if (*out == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        int got = lz4_safe((const char *)stored + 4, (char *)*out, (int)(n - 4), (int)size);
        if (got < 0 || (uint32_t)got != size) {  /* Python reads it again and says why */
            PyMem_RawFree(*out);
            *out = NULL;
            return 2;
        }
        *outn = size;
        return 0;
    }
#endif
    if (decompressor == NULL) {
        PyObject *mod = PyImport_ImportModule("lsmdb.compression");
        if (mod == NULL)
            return -1;
        decompressor = PyObject_GetAttrString(mod, "decompress_for_c");
        Py_DECREF(mod);
        if (decompressor == NULL)
            return -1;
    }
    PyObject *arg = PyBytes_FromStringAndSize((const char *)stored, (Py_ssize_t)n);
    if (arg == NULL)
        return -1;
    PyObject *payload = PyObject_CallFunction(decompressor, "iN", kind, arg);
    if (payload == NULL)
        return -1;
    if (!PyBytes_Check(payload)) {  /* None: it does not decompress */
        Py_DECREF(payload);
        return 2;
    }
    size_t len = (size_t)PyBytes_GET_SIZE(payload);
    *out = PyMem_RawMalloc(len ? len : 1);
    if (*out == NULL) {
        Py_DECREF(payload);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*out, PyBytes_AS_STRING(payload), len);
    *outn = len;
    Py_DECREF(payload);
    return 0;
}

/* Data block i of file entry e (of reader) as stored, read with one copy
 * out of the reader's mapping, or where it has none one pread (the GIL
 * released either way, as os.pread does), its checksum verified: 0 and *buf
 * (the stored bytes and the trailer after them; PyMem_RawMalloc'd: the
 * caller frees it), *size (the stored bytes, without the trailer) and *kind
 * (how they are stored: the type byte of a format-2 block, COMPRESSION_NONE
 * in a format-1 file); 2 when Python must read it (an entry without block
 * offsets, the reader closed or in memory, a mapping that ends short or
 * faulted, a short read, a checksum mismatch: it reads again and raises what
 * it should); -1 on error.  Nothing is counted. */
int
read_stored_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp, size_t *sizep,
                int *kindp)
{
#ifdef _WIN32
    (void)e; (void)reader; (void)i; (void)bufp; (void)sizep; (void)kindp;
    return 2;
#else
    if (e->boff == NULL || i >= e->nidx)  /* an entry without block offsets */
        return 2;
    int fd;
    int r = reader_fd(reader, &fd);  /* now: the reader may have been closed */
    if (r != 0)
        return r < 0 ? -1 : 2;
    uint64_t offset = e->boff[i], size = e->bsize[i];
    size_t trailer = e->format >= 2 ? DATA_TRAILER_V2_SIZE : BLOCK_TRAILER_SIZE;
    if (size > (uint64_t)PY_SSIZE_T_MAX - trailer || offset > (uint64_t)INT64_MAX)
        return 2;
    size_t total = (size_t)size + trailer;
    unsigned char *buf = PyMem_RawMalloc(total);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ssize_t got = (ssize_t)total;
    r = mapped_read(reader, buf, offset, total);
    if (r < 0 || r == 2) {  /* 2: the mapping ends short or faulted: Python reads again */
        PyMem_RawFree(buf);
        return r;
    }
    if (r == 1) {  /* no mapping */
        Py_BEGIN_ALLOW_THREADS
        got = pread(fd, buf, total, (off_t)offset);
        Py_END_ALLOW_THREADS
    }
    if (got < 0 || (size_t)got != total || crc32_update(0, buf, total) != CRC32_RESIDUE) {
        PyMem_RawFree(buf);
        return 2;
    }
    *bufp = buf;
    *sizep = (size_t)size;
    *kindp = e->format >= 2 ? buf[size] : COMPRESSION_NONE;
    return 0;
#endif
}

/* Data block i of file entry e (of reader) read and verified as
 * read_stored_buf reads it, then decompressed as its type byte says: 0 and
 * *buf (the payload, and for a block stored as it is its trailer after it;
 * PyMem_RawMalloc'd: the caller frees it) and *size (the payload's bytes); 2
 * when Python must read it (as read_stored_buf, or a block that does not
 * decompress: it reads again and raises what it should); -1 on error.
 * Nothing is counted. */
int
read_block_buf(Entry *e, PyObject *reader, Py_ssize_t i, unsigned char **bufp, size_t *sizep)
{
    unsigned char *buf;
    size_t size;
    int kind;
    int r = read_stored_buf(e, reader, i, &buf, &size, &kind);
    if (r != 0)
        return r;
    return stored_payload(reader, buf, size, kind, bufp, sizep);
}

/* The payload of a block read_stored_buf read (buf[0:size], stored as
 * `kind`; buf is taken: freed, or handed back as the payload): 0 and
 * *bufp, *sizep (PyMem_RawFree it); 2 for a block that does not
 * decompress; -1 on error. */
int
stored_payload(PyObject *reader, unsigned char *buf, size_t size, int kind, unsigned char **bufp,
               size_t *sizep)
{
    int r;
    if (kind != COMPRESSION_NONE) {
        unsigned char *payload;
        size_t plen;
        r = decompress_block(reader, kind, buf, size, &payload, &plen);
        PyMem_RawFree(buf);
        if (r != 0)
            return r;
        buf = payload;
        size = plen;
    }
    *bufp = buf;
    *sizep = size;
    return 0;
}

/* The first bytes of the payload of the LZ4 block stored[0:n] (type
 * COMPRESSION_LZ4: the payload's length, u32 little-endian, then one LZ4
 * block), decompressed at least as far as `want` bytes (the lz4 package's
 * LZ4_decompress_safe_partial: the rest of the block is not decoded) into
 * out, which has room for the whole payload: 0, *got the bytes of out now
 * decoded (fewer than want only at the payload's end) and *plen the
 * payload's length (a want of the whole payload decodes it whole, as
 * read_block_buf does, its length checked); 1 where no partial decompression is to be had (the
 * caller decompresses the whole block); 2 for a block that does not
 * decompress or whose payload does not fit `room`. */
int
lz4_payload_prefix(const unsigned char *stored, size_t n, size_t want, unsigned char *out,
                   size_t room, size_t *got, size_t *plen)
{
#ifndef _WIN32
    if (!lz4_looked)
        find_lz4();
    if (lz4_partial == NULL)
        return 1;
    if (n < 4)
        return 2;
    uint32_t size = rd32(stored);
    if (size == 0 || size > INT_MAX || size > room || n - 4 > INT_MAX)
        return 2;
    if (want >= size && lz4_safe != NULL) {  /* the whole payload: its length checked */
        int r = lz4_safe((const char *)stored + 4, (char *)out, (int)(n - 4), (int)size);
        if (r < 0 || (size_t)r != size)
            return 2;
        *got = *plen = size;
        return 0;
    }
    if (want > size)
        want = size;
    int r = lz4_partial((const char *)stored + 4, (char *)out, (int)(n - 4), (int)want,
                        (int)size);
    if (r < 0 || (size_t)r > size || ((size_t)r < want))
        return 2;
    *got = (size_t)r;
    *plen = size;
    return 0;
#else
    (void)stored; (void)n; (void)want; (void)out; (void)room; (void)got; (void)plen;
    return 1;
#endif
}

PyObject *
speedups_lz4_direct(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(arg))
{
    /* lz4_direct() -> whether the C getter decompresses LZ4 blocks itself
     * (the lz4 package's LZ4_decompress_safe found) rather than through Python. */
#ifndef _WIN32
    if (!lz4_looked)
        find_lz4();
    return PyBool_FromLong(lz4_safe != NULL);
#else
    Py_RETURN_FALSE;
#endif
}
