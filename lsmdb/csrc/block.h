/* block.h: the data block rule applied to a block's bytes in one walk, a
 * key's value found through a parsed block's offsets, and the block cache's
 * form of a block (block.c).  Python twin: lsmdb/block.py (decode_data_block,
 * cache_entry, entry_find, entry_lists), whose docstring states the rule and
 * draws the cached form. */

#ifndef LSMDB_BLOCK_H
#define LSMDB_BLOCK_H

#include "base.h"
#include "coding.h"

/* The cached form's tail (entry count and payload size, u32 each) and the
 * size of one of its offsets: block.py's CACHE_ENTRY_TAIL and
 * CACHE_ENTRY_OFFSET (module.c exports them; lsmdb checks them at import). */
#define ENTRY_TAIL 8
#define ENTRY_OFFSET 4
/* A cached block with expiries (block.py's EXPIRIES_FLAG in its count word)
 * has expires[count] u64 after its offsets; an offsets buffer keeps room for
 * them: ENTRY_SLOT bytes per entry. */
#define ENTRY_EXPIRY 8
#define EXPIRIES_FLAG 0x80000000u
#define ENTRY_SLOT (2 * ENTRY_OFFSET + ENTRY_EXPIRY)
/* The largest expiry (lsmdb.ttl.MAX_EXPIRES). */
#define MAX_EXPIRES 0x7FFFFFFFFFFFFFFFULL

/* A data block payload's bounds from its index: its keys must lie above
 * `after` (the previous block's last key; NULL for the first block) and end
 * at `last` (this block's index key; NULL: not checked); `version`, its
 * file's format (1: keys and values; 2: tags and an empty expiries list too;
 * 3: expiring values too). */
typedef struct {
    const char *after;
    Py_ssize_t after_len;
    const char *last;
    Py_ssize_t last_len;
    int version;
} BlockBounds;

/* A data block the rule accepted: its payload and its entries' offsets, as
 * the cached form lays them out (key_at[count] then value_at[count], u32
 * little-endian), in offs, and where it holds expiring values their expiries
 * (expires[count], u64 little-endian, 0 for an entry that does not expire). */
typedef struct {
    const unsigned char *payload;
    size_t plen;
    const unsigned char *offs;  /* 2 * count offsets */
    const unsigned char *exps;  /* count expiries, or NULL: none expires */
    uint64_t count;
} ParsedBlock;

/* The largest block whose offsets parse_with_stack keeps on the stack. */
#define STACK_ENTRIES 512

HIDDEN_BEGIN

/* block.c */
int64_t block_entry_count(const unsigned char *p, size_t n, int version);
int block_parse(const unsigned char *p, size_t n, const BlockBounds *bounds, unsigned char *offs,
                uint64_t count);
int block_keys_hold(const unsigned char *p, size_t n, size_t total, const BlockBounds *bounds,
                    const unsigned char *key, size_t klen, size_t *keys_end);
int block_keys_find(const unsigned char *p, size_t n, size_t total, const BlockBounds *bounds,
                    const unsigned char *key, size_t klen, size_t *keys_end, size_t *index,
                    size_t *count);
int block_piece_value(const unsigned char *p, size_t n, int header, int last, size_t count,
                      size_t held, size_t skip, const unsigned char **value, size_t *vlen);
int block_piece_cuts(const unsigned char *p, size_t n, size_t piece_bytes, size_t *begins,
                     size_t *firsts, size_t cap, size_t *pieces);
int block_pieces_check(const unsigned char *p, size_t n, const size_t *begins,
                       const size_t *firsts, size_t pieces);
int block_value_at(const unsigned char *p, size_t n, size_t total, size_t keys_end, size_t count,
                   size_t index, const unsigned char **value, size_t *vlen);
int parsed_find(const ParsedBlock *b, const unsigned char *key, size_t klen,
                const unsigned char **value, size_t *vlen, uint64_t *expires);
PyObject *parsed_entry(const ParsedBlock *b);
int parsed_seq(const ParsedBlock *b, const unsigned char *key, size_t klen, uint64_t *seq);
int entry_parsed(const unsigned char *e, size_t n, ParsedBlock *b);
PyObject *speedups_block_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_keys_hold(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_value_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_lists(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_block_full(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_entry_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *speedups_entry_lists(PyObject *module, PyObject *entry);
PyObject *speedups_data_payload(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

PyObject *expiring_value(const unsigned char *vp, size_t vlen, uint64_t expires);

/* The value a lookup found: for f 1 the bytes vp[0:vlen] -- (bytes, expires)
 * when it expires -- for f 2 (a tombstone) None.  A new reference, or NULL
 * with an exception set. */
static inline PyObject *
found_value(int f, const unsigned char *vp, size_t vlen, uint64_t expires)
{
    if (f == 2)
        return Py_NewRef(Py_None);
    if (expires)
        return expiring_value(vp, vlen, expires);
    return PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen);
}

/* A payload p[0:n] parsed into b under the rule, its offsets (and expiries)
 * in stack[0 : ENTRY_SLOT * STACK_ENTRIES] when they fit, else in a buffer
 * PyMem_Malloc'd into *heap (the caller frees it).  0; -1 for a block the
 * rule refuses (nothing set); -2 out of memory (MemoryError set). */
static inline int
parse_with_stack(const unsigned char *p, size_t n, const BlockBounds *bounds, ParsedBlock *b,
                 unsigned char *stack, unsigned char **heap)
{
    *heap = NULL;
    int64_t count = block_entry_count(p, n, bounds->version);
    if (count < 0)
        return -1;
    unsigned char *offs = stack;
    if (count > STACK_ENTRIES) {
        offs = *heap = PyMem_Malloc((size_t)count * ENTRY_SLOT);
        if (offs == NULL) {
            PyErr_NoMemory();
            return -2;
        }
    }
    int r = block_parse(p, n, bounds, offs, (uint64_t)count);
    if (r < 0) {
        PyMem_Free(*heap);
        *heap = NULL;
        return -1;
    }
    b->payload = p;
    b->plen = n;
    b->offs = offs;
    b->exps = r == 1 ? offs + 2 * ENTRY_OFFSET * (size_t)count : NULL;
    b->count = (uint64_t)count;
    return 0;
}

#endif
