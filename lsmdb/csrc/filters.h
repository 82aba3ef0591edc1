/* filters.h: a file's filter as the C read path probes it, and the one
 * dispatch on its family.  Python twin: lsmdb/filters/__init__.py (the
 * families, ProbeSpec) -- what Python hands over for a file is its
 * FileProbe's filter_family, filter_data and filter_params (the filter's
 * probe_spec()).
 *
 * A family is an id (the first byte of its filter blocks, docs/FORMAT.md §5),
 * its parameters' meaning and its probe.  Adding one is a header of its own
 * (as filters_bloom.h), its case in the three switches below and in
 * filter_probe_init (filters.c), and its name in FILTER_FAMILY_NAMES; the
 * module exports which families it probes (FILTER_FAMILIES), and lsmdb takes
 * the Python read path for a table with a filter of any other family, so
 * that both paths count the same. */

#ifndef LSMDB_FILTERS_H
#define LSMDB_FILTERS_H

#include "base.h"
#include "filters_bloom.h"
#include "filters_blocked_bloom.h"

/* Family ids, as lsmdb/filters names them.  DO NOT CHANGE: on disk (but for
 * FILTER_NONE, which is in memory only: no filter, every probe "maybe"). */
#define FILTER_NONE 0
#define FILTER_BLOOM_WHOLE 1
#define FILTER_BLOOM_PARTITIONED 2
#define FILTER_BLOCKED_BLOOM 3

/* The families this module probes, by id (module.c exports them). */
#define FILTER_FAMILY_NAMES {[FILTER_BLOOM_WHOLE] = "bloom", \
                             [FILTER_BLOOM_PARTITIONED] = "bloom", \
                             [FILTER_BLOCKED_BLOOM] = "blocked_bloom"}
#define FILTER_FAMILY_SLOTS 4

/* A file's filter, ready to probe. */
typedef struct {
    int family;          /* FILTER_*: which probe */
    int have_data;       /* data holds a buffer (released by filter_probe_clear) */
    Py_buffer data;      /* what the probe reads */
    union {              /* the family's parameters */
        BloomParams bloom;
        BlockedParams blocked;
    } u;
} FilterProbe;

/* Whether f has anything to probe (else every key "maybe", nothing counted). */
static inline int
filter_present(const FilterProbe *f)
{
    return f->family != FILTER_NONE;
}

/* 0 when no key of 64-bit hash h was added to f; 1: maybe. */
static inline int
filter_maybe(const FilterProbe *f, uint64_t h)
{
    const unsigned char *data = (const unsigned char *)f->data.buf;
    switch (f->family) {
    case FILTER_BLOOM_PARTITIONED:
        return bloom_part_maybe(&f->u.bloom, data, h);
    case FILTER_BLOOM_WHOLE:
        return bloom_whole_maybe(&f->u.bloom, data, h);
    case FILTER_BLOCKED_BLOOM:
        return blocked_maybe(&f->u.blocked, data, h);
    default:
        return 1;
    }
}

/* Start loading what filter_maybe(f, h) reads first -- everything it may
 * read when `all` (the filters outgrow the L2 cache: a key that passes the
 * first probes finds the rest on its way). */
PREFETCH_HELPER
filter_prefetch(const FilterProbe *f, uint64_t h, int all)
{
    const unsigned char *data = (const unsigned char *)f->data.buf;
    switch (f->family) {
    case FILTER_BLOOM_PARTITIONED:
        bloom_part_prefetch(&f->u.bloom, data, h, all ? f->u.bloom.k : 2);
        break;
    case FILTER_BLOOM_WHOLE:
        bloom_whole_prefetch(&f->u.bloom, data, h);
        break;
    case FILTER_BLOCKED_BLOOM:
        blocked_prefetch(&f->u.blocked, data, h);
        break;
    default:
        break;
    }
}

/* The bytes f keeps in memory (what a table's filters add up to, against the
 * L2 cache). */
static inline uint64_t
filter_bytes(const FilterProbe *f)
{
    return f->have_data ? (uint64_t)f->data.len : 0;
}

HIDDEN_BEGIN

/* filters.c */
int filter_probe_init(FilterProbe *f, PyObject *family, PyObject *data, PyObject *params);
void filter_probe_clear(FilterProbe *f);
PyObject *filter_families(void);

/* The 64-bit key hashes an add function takes, as native unsigned words. */
typedef struct {
    const unsigned char *words;  /* count words, native order, maybe unaligned */
    Py_ssize_t count;
    Py_buffer view;              /* held when the hashes were a buffer of words */
    int have_view;
    unsigned char *copy;         /* else: the words copied from a sequence of ints */
} HashWords;

int hash_words_get(PyObject *hashes, HashWords *w);
void hash_words_release(HashWords *w);

HIDDEN_END

#endif
