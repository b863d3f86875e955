/* cp-layout-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-layout.h"
#include "kernels/cp-index-math.h"

G_BEGIN_DECLS

/* A fingerprint (or another 64-bit hash) in a message: its first 8
 * hexadecimal digits, the start of cp_layout_dup_fingerprint_hex().
 * Enough to tell two layouts apart at a glance; the 19 decimal digits of
 * the whole value only make a message harder to read. */
#define CP_FINGERPRINT_SHORT_FORMAT "%08" G_GINT32_MODIFIER "x"
#define CP_FINGERPRINT_SHORT(value) ((guint32) ((guint64) (value) >> 32))

/* The layout's runs are kernels/cp-index-math.h's cp_index_run; the old
 * name stays for code that has not moved to it yet. */
typedef cp_index_run CpRun;

/* The runs of @rank in local order: its local sequence is their
 * concatenation. */
const cp_index_run *_cp_layout_get_runs (CpLayout      *self,
                                         int            rank,
                                         guint         *n_runs);

/* Where rank @rank's piece starts in the rank-order concatenation of all
 * pieces (what an all-gather produces). */
gint64       _cp_layout_get_rank_offset (CpLayout      *self,
                                         int            rank);

/* The global position of the layout's first document: its runs count
 * from there. */
gint64       _cp_layout_get_first_position (CpLayout  *self);

/* cp-layout-copy.c: copies @rank's runs between a full tensor laid out
 * [outer][seq_len][step] and a local one laid out [outer][local_row][step],
 * whose piece starts at position @local_first of each row.  @to_local
 * selects the direction: sharding (full to local) or restoring (local to
 * full).  The copy is one _cp_memory_copy_runs, so either tensor may be in
 * any memory it reaches: one kernel launch on CUDA memory, one strided
 * copy of a whole run over the @outer rows elsewhere.  FALSE with an error
 * when the memory fails. */
gboolean     _cp_layout_transfer_runs   (CpLayout      *self,
                                         int            rank,
                                         CpTensor      *full,
                                         CpTensor      *local,
                                         gsize          outer,
                                         gsize          step,
                                         gint64         local_row,
                                         gint64         local_first,
                                         gboolean       to_local,
                                         GError       **error);

/* The full tensor from @gathered, every rank's piece along @dim in rank
 * order (what an all-gather of the pieces gives), in @gathered's memory. */
CpTensor    *_cp_layout_restore_gathered (CpLayout      *self,
                                          CpTensor      *gathered,
                                          guint          dim,
                                          GError       **error);

G_END_DECLS
