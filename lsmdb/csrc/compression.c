/* compression.c: PieceCompressor, a data block payload stored as type 3 --
 * cut into pieces where lsmdb/compression.py's cut_pieces cuts it, each
 * piece compressed with LZ4 against the file's dictionary.  Python twin:
 * lsmdb/compression.py's compress_pieces (what lz4.block.compress(piece,
 * store_size=False, dict=dictionary) writes: a stream reset, the dictionary
 * loaded, LZ4_compress_fast_continue).  Loading a dictionary hashes all of
 * it, so the C side loads it once per file and copies the loaded stream for
 * each piece: the same bytes, without the dictionary's cost per piece. */

#include "compression.h"
#include "block.h"
#include "sstable_format.h"
#include "sstable_reader.h"


typedef struct {
    PyObject_HEAD
    PyObject *dict;          /* bytes: the dictionary (the loaded stream points into it) */
    const Lz4Api *lz4;
    unsigned char *loaded;   /* an LZ4 stream with the dictionary loaded */
    unsigned char *work;     /* a copy of it, per piece */
    size_t state_size;
} PieceCompressor;

static void
PieceCompressor_dealloc(PieceCompressor *self)
{
    PyMem_Free(self->loaded);
    PyMem_Free(self->work);
    Py_XDECREF(self->dict);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
PieceCompressor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *dict;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "PieceCompressor(dictionary)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!:PieceCompressor", &PyBytes_Type, &dict))
        return NULL;
    Py_ssize_t dlen = PyBytes_GET_SIZE(dict);
    if (dlen < 1 || dlen > MAX_DICT) {
        PyErr_SetString(PyExc_ValueError, "a dictionary is 1 to 65536 bytes");
        return NULL;
    }
    const Lz4Api *lz4 = lz4_compressor();
    if (lz4 == NULL || lz4->load_dict == NULL || lz4->sizeof_state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the lz4 package's library exports no LZ4_loadDict");
        return NULL;
    }
    int size = lz4->sizeof_state();
    if (size <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "LZ4_sizeofState");
        return NULL;
    }
    PieceCompressor *self = (PieceCompressor *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->dict = Py_NewRef(dict);
    self->lz4 = lz4;
    self->state_size = (size_t)size;
    self->loaded = PyMem_Malloc(self->state_size);  /* aligned as malloc aligns */
    self->work = PyMem_Malloc(self->state_size);
    if (self->loaded == NULL || self->work == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    memset(self->loaded, 0, self->state_size);
    lz4->reset(self->loaded);
    lz4->load_dict(self->loaded, PyBytes_AS_STRING(dict), (int)dlen);
    return (PyObject *)self;
}

static size_t
put_varint(unsigned char *p, size_t n)
{
    size_t k = 0;
    while (n >= 0x80) {
        p[k++] = (unsigned char)(n & 0x7F) | 0x80;
        n >>= 7;
    }
    p[k++] = (unsigned char)n;
    return k;
}

static PyObject *
PieceCompressor_compress(PieceCompressor *self, PyObject *arg)
{
    /* compress(payload) -> (type, stored): compression.compress_pieces of
     * payload cut by cut_pieces, against this dictionary -- (3, the pieces
     * and their table) where that saves at least an eighth, else (0,
     * payload).  ValueError for a payload that is not a format-2 block's. */
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "compress(payload: bytes)");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(arg);
    size_t n = (size_t)PyBytes_GET_SIZE(arg);
    if (n == 0 || n > INT_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "payload of no bytes, or too many");
        return NULL;
    }
    size_t cap = n / PIECE_BYTES + 3, pieces = 0;
    size_t *begins = PyMem_Malloc(2 * cap * sizeof(size_t));
    int bound = self->lz4->bound((int)n);
    /* the table (at most 4 + 5 per varint) then the pieces, each within its bound */
    size_t room = 4 + 5 * (2 * cap + 1) + (size_t)bound + 16 * cap;
    unsigned char *out = PyMem_Malloc(room), *packed = PyMem_Malloc((size_t)bound + 16 * cap);
    PyObject *result = NULL;
    if (begins == NULL || out == NULL || packed == NULL || bound <= 0) {
        PyErr_NoMemory();
        goto done;
    }
    size_t *firsts = begins + cap;
    if (block_piece_cuts(p, n, PIECE_BYTES, begins, firsts, cap, &pieces) < 0) {
        PyErr_SetString(PyExc_ValueError, "not a format-2 data block payload");
        goto done;
    }
    size_t at = 0, h = 0;
    size_t *sizes = PyMem_Malloc(pieces * sizeof(size_t));
    if (sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t k = 0; k < pieces; k++) {
        size_t b = begins[k], e = k + 1 < pieces ? begins[k + 1] : n;
        int pb = self->lz4->bound((int)(e - b));
        memcpy(self->work, self->loaded, self->state_size);
        int got = self->lz4->compress(self->work, (const char *)p + b, (char *)packed + at,
                                      (int)(e - b), pb, 1);
        if (got <= 0) {
            PyMem_Free(sizes);
            PyErr_SetString(PyExc_RuntimeError, "LZ4 compression failed");
            goto done;
        }
        sizes[k] = (size_t)got;
        at += (size_t)got;
    }
    for (int j = 0; j < 4; j++)
        out[h++] = (unsigned char)(n >> (8 * j));
    h += put_varint(out + h, pieces);
    for (size_t k = 0; k < pieces; k++)
        h += put_varint(out + h, sizes[k]);
    for (size_t k = 2; k < pieces; k++)
        h += put_varint(out + h, firsts[k - 1]);
    PyMem_Free(sizes);
    if (h + at > n - n / 8) {  /* saves less than an eighth: stored as it is */
        result = Py_BuildValue("iO", COMPRESSION_NONE, arg);
        goto done;
    }
    memcpy(out + h, packed, at);
    result = Py_BuildValue("iy#", COMPRESSION_LZ4_PIECES, (const char *)out, (Py_ssize_t)(h + at));
done:
    PyMem_Free(begins);
    PyMem_Free(out);
    PyMem_Free(packed);
    return result;
}

static PyMethodDef PieceCompressor_methods[] = {
    {"compress", (PyCFunction)PieceCompressor_compress, METH_O,
     "compress(payload) -> (type, stored): the payload in pieces against the dictionary"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PieceCompressorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lsmdb._speedups.PieceCompressor",
    .tp_basicsize = sizeof(PieceCompressor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PieceCompressor(dictionary): type-3 data blocks against one file's dictionary.",
    .tp_new = PieceCompressor_new,
    .tp_dealloc = (destructor)PieceCompressor_dealloc,
    .tp_methods = PieceCompressor_methods,
};
