/* cpmesh-bench.h: timing and reporting shared by the benchmarks
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cpmesh-tool.h"

G_BEGIN_DECLS

/* One measured operation: every pass moves @bytes, and its throughput is
 * compared with the row named @baseline, measured in the same run. */
typedef struct
{
  const char *name;
  const char *baseline;   /* NULL for a baseline itself */
  double bytes;
  double target;          /* the ratio it should reach; 0 when none */
  GArray *seconds;        /* one sample per timed pass */
} CpmeshBenchRow;

void      cpmesh_bench_rows_init     (CpmeshBenchRow  *rows,
                                      gsize            n_rows);
void      cpmesh_bench_rows_clear    (CpmeshBenchRow  *rows,
                                      gsize            n_rows);
void      cpmesh_bench_record        (CpmeshBenchRow  *row,
                                      double           seconds);

/* Prints a table of best and median GB/s and the ratio of each row's best
 * to its baseline's best.  Targets are stated for one configuration; with
 * @judge_targets FALSE (another size) rows show their ratio only.
 * Returns FALSE when a judged row misses its target. */
gboolean  cpmesh_bench_report        (CpmeshBenchRow  *rows,
                                      gsize            n_rows,
                                      gboolean         judge_targets);

/* The median of @n values, which it sorts in place. */
double    cpmesh_bench_median        (double          *values,
                                      gsize            n);

int       cpmesh_bench_batch         (int              argc,
                                      char           **argv);
int       cpmesh_bench_thd           (int              argc,
                                      char           **argv);
int       cpmesh_bench_attention     (int              argc,
                                      char           **argv);

G_END_DECLS
