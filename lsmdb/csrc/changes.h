/* changes.h: ChangeWatch, a following reader's view of the CHANGES file
 * (changes.c), which the C getters check before each read.  Python twin:
 * lsmdb/changes.py's ChangeWatch. */

#ifndef LSMDB_CHANGES_H
#define LSMDB_CHANGES_H

#include "base.h"

#define CHANGES_SIZE 4096
#define CHANGES_SEQ_WORD 2    /* byte 16 */
#define CHANGES_EPOCH_WORD 3  /* byte 24 */

typedef struct {
    PyObject_HEAD
    PyObject *path;
    const uint64_t *words;  /* the mapping, or NULL while the file is not mapped */
    uint64_t seen_seq, seen_epoch;
} ChangeWatch;

HIDDEN_BEGIN

extern PyTypeObject ChangeWatchType;
PyObject *speedups_changes_store(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

HIDDEN_END

/* The counters of a mapped CHANGES file: seq loaded before epoch, each an
 * acquire load (changes.py says why). */
static inline void
watch_load(const uint64_t *words, uint64_t *seq, uint64_t *epoch)
{
#if defined(__GNUC__) || defined(__clang__)
    *seq = __atomic_load_n(&words[CHANGES_SEQ_WORD], __ATOMIC_ACQUIRE);
    *epoch = __atomic_load_n(&words[CHANGES_EPOCH_WORD], __ATOMIC_ACQUIRE);
#else
    *seq = ((const volatile uint64_t *)words)[CHANGES_SEQ_WORD];
    *epoch = ((const volatile uint64_t *)words)[CHANGES_EPOCH_WORD];
#endif
}

/* Whether the counters differ from the ones last caught up to (always, while
 * the file is not mapped). */
static inline int
watch_changed(const ChangeWatch *w)
{
    if (w->words == NULL)
        return 1;
    uint64_t seq, epoch;
    watch_load(w->words, &seq, &epoch);
    return seq != w->seen_seq || epoch != w->seen_epoch;
}

#endif
