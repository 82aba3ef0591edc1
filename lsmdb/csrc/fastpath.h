/* fastpath.h: what the C read path reads of Python's structures and where it
 * counts -- the contract between the two sides.  Python twins:
 * lsmdb/fastpath.py (the named tuples FileProbe, Level and FastPath, read
 * here by index) and lsmdb/stats.py (the counter slots).
 *
 * module.c exports the names of these fields and slots in the order the
 * macros number them (FILE_PROBE_FIELDS, LEVEL_FIELDS, FAST_PATH_FIELDS,
 * FILE_COUNTERS, TABLE_COUNTERS); lsmdb compares them with its own at import
 * and refuses the C read path on a mismatch rather than read the wrong
 * fields or count into the wrong slots. */

#ifndef LSMDB_FASTPATH_H
#define LSMDB_FASTPATH_H

/* Slots of a file's counters (array('Q')), as stats.py's FILE_COUNTERS
 * orders them. */
#define RANGE_SKIPS 0
#define FILTER_NEGATIVES 1
#define TRUE_POSITIVES 2
#define FALSE_POSITIVES 3
#define FALSE_NEGATIVES 4
#define BLOCK_READS 5
#define BLOCK_CACHE_HITS 6
#define FILE_COUNTER_SLOTS 7

/* Slots of a table's counters (state.counts, stats.py's TABLE_COUNTERS); the
 * getter counts the first two, the write path (in Python) the stalls and
 * slowdowns. */
#define GETS 0
#define GETS_ABSENT 1
#define WRITE_STALLS 2
#define WRITE_STALL_US 3
#define WRITE_SLOWDOWNS 4
#define WRITE_SLOWDOWN_US 5
#define TABLE_COUNTER_SLOTS 6

/* FileProbe: what a point read needs of one SSTable (entry_init reads it). */
#define FILE_READER 0
#define FILE_MIN_KEY 1
#define FILE_MAX_KEY 2
#define FILE_COUNTS 3
#define FILE_HASH_FN 4
#define FILE_FILTER 5
#define FILE_FILTER_FAMILY 6
#define FILE_FILTER_DATA 7
#define FILE_FILTER_PARAMS 8
#define FILE_INDEX_KEYS 9
#define FILE_INDEX_OFFSETS 10
#define FILE_INDEX_SIZES 11
#define FILE_CACHE_BASE 12
#define FILE_FORMAT_VERSION 13
#define FILE_MAX_SEQ 14
#define FILE_FIELDS 15

/* Level: one level below 0, its files' max keys and the files (Probes_init). */
#define LEVEL_MAX_KEYS 0
#define LEVEL_FILES 1
#define LEVEL_FIELDS 2

/* FastPath: a table's read state (state.fast, the item of state.fast_cell;
 * getter_fast checks what the getter reads of it). */
#define FAST_DATA 0
#define FAST_IMM_DATAS 1
#define FAST_L0 2
#define FAST_DEEPER 3
#define FAST_PROBES 4
#define FAST_FILES 5
#define FAST_FILTERS 6
#define FAST_CACHE 7
#define FAST_SHADOW 8
#define FAST_VERSION 9
#define FAST_NOW_US 10
#define FAST_SEQ_OVERLAP 11
#define FAST_BOUND 12
#define FAST_FIELDS 13

#endif
