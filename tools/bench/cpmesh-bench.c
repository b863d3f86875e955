/* cpmesh-bench.c: cpmesh bench, and what its benchmarks share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpmesh-bench.h"

static const CpmeshCommand bench_commands[] = {
  { "layout", "Shard and unshard a 256 MiB tensor against memcpy", cpmesh_bench_layout },
  { "mesh", "In-process all_gather and all_reduce against memcpy", cpmesh_bench_mesh },
  { "batch", "Prepare, enter and exit of a batch on 4 ranks against memcpy", cpmesh_bench_batch },
  { "thd", "THD conversion and partition on 4 ranks against memcpy", cpmesh_bench_thd },
  { "attention", "Causal attention forward and backward against oneDNN matmul", cpmesh_bench_attention },
};

/* meson test fills every malloc'd block with a byte pattern, which turns
 * large allocations into memsets and distorts every figure. */
static void
warn_if_perturbed (void)
{
  const char *perturb = g_getenv ("MALLOC_PERTURB_");

  if (perturb != NULL && *perturb != '\0' && strcmp (perturb, "0") != 0)
    fprintf (stderr, "%s: warning: MALLOC_PERTURB_=%s distorts allocation costs; "
             "run through `meson test --benchmark` or unset it\n", g_get_prgname (), perturb);
}

int
cpmesh_bench (int    argc,
              char **argv)
{
  warn_if_perturbed ();
  return cpmesh_dispatch ("Measure libcpmesh's data movement against memcpy of the same bytes "
                          "in the same run. Figures vary on shared machines: compare ratios, "
                          "and repeat runs that look off.",
                          bench_commands, G_N_ELEMENTS (bench_commands), argc, argv);
}

void
cpmesh_bench_rows_init (CpmeshBenchRow *rows,
                        gsize           n_rows)
{
  for (gsize i = 0; i < n_rows; i++)
    rows[i].seconds = g_array_new (FALSE, FALSE, sizeof (double));
}

void
cpmesh_bench_rows_clear (CpmeshBenchRow *rows,
                         gsize           n_rows)
{
  for (gsize i = 0; i < n_rows; i++)
    g_clear_pointer (&rows[i].seconds, g_array_unref);
}

void
cpmesh_bench_record (CpmeshBenchRow *row,
                     double          seconds)
{
  g_array_append_val (row->seconds, seconds);
}

static int
compare_doubles (gconstpointer a,
                 gconstpointer b)
{
  double x = *(const double *) a;
  double y = *(const double *) b;

  return (x > y) - (x < y);
}

double
cpmesh_bench_median (double *values,
                     gsize   n)
{
  if (n == 0)
    return 0.0;
  qsort (values, n, sizeof (double), compare_doubles);
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

/* Best and median throughput in GB/s (10^9 bytes per second). */
static void
row_throughput (const CpmeshBenchRow *row,
                double               *best,
                double               *median)
{
  g_autoptr(GArray) sorted = g_array_copy (row->seconds);
  double *seconds = (double *) (gpointer) sorted->data;

  *best = *median = 0.0;
  if (sorted->len == 0)
    return;
  *median = row->bytes / 1e9 / cpmesh_bench_median (seconds, sorted->len);
  *best = row->bytes / 1e9 / seconds[0];
}

static const CpmeshBenchRow *
find_row (const CpmeshBenchRow *rows,
          gsize                 n_rows,
          const char           *name)
{
  for (gsize i = 0; i < n_rows; i++)
    if (g_str_equal (rows[i].name, name))
      return &rows[i];
  g_assert_not_reached ();
}

/* Prints one row; returns FALSE when it misses its target. */
static gboolean
report_row (const CpmeshBenchRow *row,
            const CpmeshBenchRow *rows,
            gsize                 n_rows,
            gboolean              judge_target)
{
  double best, median, base_best, base_median, ratio;

  row_throughput (row, &best, &median);
  g_print ("%-34s %9.1f %9.2f %9.2f", row->name, row->bytes / (1 << 20), best, median);
  if (row->baseline == NULL)
    {
      g_print ("  (baseline)\n");
      return TRUE;
    }
  row_throughput (find_row (rows, n_rows, row->baseline), &base_best, &base_median);
  ratio = base_best > 0.0 ? best / base_best : 0.0;
  g_print ("  %5.2f× %s", ratio, row->baseline);
  if (!judge_target || row->target <= 0.0)
    {
      g_print ("\n");
      return TRUE;
    }
  g_print (", target ≥ %.2f: %s\n", row->target, ratio >= row->target ? "met" : "MISSED");
  return ratio >= row->target;
}

gboolean
cpmesh_bench_report (CpmeshBenchRow *rows,
                     gsize           n_rows,
                     gboolean        judge_targets)
{
  gboolean met = TRUE;

  g_print ("%-34s %9s %9s %9s  %s\n", "operation", "MiB/pass", "best GB/s", "med GB/s",
           "best ratio against");
  for (gsize i = 0; i < n_rows; i++)
    met &= report_row (&rows[i], rows, n_rows, judge_targets);
  if (!judge_targets)
    g_print ("(targets are judged at the default sizes only: smaller buffers fit in caches, "
             "and copies then trade write-backs between passes)\n");
  return met;
}
