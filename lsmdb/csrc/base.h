/* base.h: what every C file of lsmdb._speedups includes first -- Python's
 * and the C library's headers, the prefetch macros, and the markers that
 * keep the extension's internal declarations out of the dynamic linker's
 * table. */

#ifndef LSMDB_BASE_H
#define LSMDB_BASE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#ifndef _WIN32
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

/* A function whose only effect is PREFETCH has none the compiler counts: it
 * may drop every call of one it does not inline.  Such helpers are
 * PREFETCH_HELPER, always inlined. */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#define PREFETCH_HELPER static inline __attribute__((always_inline)) void
#else
#define PREFETCH(p) ((void)(p))
#define PREFETCH_HELPER static inline void
#endif

/* A helper of a hot path that must not cost a call there, though another
 * file calls it through an out-of-line twin. */
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE __attribute__((always_inline))
#else
#define ALWAYS_INLINE
#endif

/* A function the hot loop calls rarely (after a filter's "maybe"): kept out of
 * line, so that the loop stays small. */
#if defined(__GNUC__) || defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* Declarations between HIDDEN_BEGIN and HIDDEN_END are internal to the
 * extension: hidden from the dynamic linker, so that a call from one file
 * into another is a direct call, as a call within one file is.  The
 * module's one export is PyInit__speedups, which PyMODINIT_FUNC makes
 * visible. */
#if defined(__GNUC__) || defined(__clang__)
#define HIDDEN_BEGIN _Pragma("GCC visibility push(hidden)")
#define HIDDEN_END _Pragma("GCC visibility pop")
#else
#define HIDDEN_BEGIN
#define HIDDEN_END
#endif

#endif
