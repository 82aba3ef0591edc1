/* merge.h: Merge, the k-way merge of scans and compactions (merge.c).
 * Python twin: lsmdb/merge.py's merge_newest. */

#ifndef LSMDB_MERGE_H
#define LSMDB_MERGE_H

#include "base.h"

HIDDEN_BEGIN

extern PyTypeObject MergeType;

HIDDEN_END

#endif
