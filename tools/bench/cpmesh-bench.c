/* cpmesh-bench.c: cpmesh bench, and what its benchmarks share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpmesh-bench.h"

const CpmeshCommand cpmesh_bench_commands[CPMESH_N_BENCH_COMMANDS] = {
  { "layout", "Shard and unshard a 256 MiB tensor against memcpy", cpmesh_bench_layout },
  { "mesh", "Collectives against memcpy, or between processes (ucx, shm) against Open MPI",
    cpmesh_bench_mesh },
  { "batch", "Prepare, enter and exit of a batch on C ranks against memcpy", cpmesh_bench_batch },
  { "thd", "THD conversion and partition on C ranks against memcpy", cpmesh_bench_thd },
  { "attention", "Causal attention forward and backward against oneDNN matmul",
    cpmesh_bench_attention },
};

const char *
cpmesh_bench_python (void)
{
  const char *python = g_getenv ("CPMESH_PYTHON");

  return python != NULL && *python != '\0' ? python : CPMESH_DEFAULT_PYTHON;
}

/* ---- one run: targets and verdict ---- */

static gboolean
test_hook (const char *name)
{
  return g_strcmp0 (g_getenv (CPMESH_BENCH_TEST_VARIABLE), name) == 0;
}

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

gboolean
cpmesh_bench_begin (CpmeshBench *bench,
                    gboolean     judged,
                    const char  *stated_for)
{
  warn_if_perturbed ();
  bench->judged = judged || test_hook ("unreachable-targets");
  bench->stated_for = stated_for;
  if (bench->check_targets && !bench->judged)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--check-targets: the targets are stated for %s, "
                   "and this run's are others", stated_for);
      return FALSE;
    }
  return TRUE;
}

void
cpmesh_bench_target (CpmeshBench *bench,
                     const char  *what,
                     double       ratio,
                     CpmeshBound  bound,
                     double       target)
{
  gboolean at_least = bound == CPMESH_AT_LEAST;
  g_autofree char *measured = NULL;
  gboolean met;

  if (test_hook ("unreachable-targets"))
    target = at_least ? 1e9 : 0.0;
  /* A ratio that is NaN meets nothing. */
  met = at_least ? ratio >= target : ratio <= target;
  measured = isnan (ratio) ? g_strdup ("n/a") : g_strdup_printf ("%.2f×", ratio);
  g_print ("target: %s: %s %s %.2f×: ", what, measured, at_least ? "≥" : "≤", target);
  if (bench->judged)
    g_print ("%s\n", met ? "met" : "missed");
  else
    g_print ("not judged (stated for %s)\n", bench->stated_for);
  bench->n_targets++;
  bench->n_missed += bench->judged && !met;
}

int
cpmesh_bench_end (CpmeshBench *bench)
{
  if (!bench->check_targets || bench->n_missed == 0)
    return 0;
  return cpmesh_fail (CPMESH_EXIT_TARGET_MISSED, "%u of %u targets missed (--check-targets)",
                      bench->n_missed, bench->n_targets);
}

G_DEFINE_QUARK (cpmesh-bench-error-quark, cpmesh_bench_error)

gboolean
cpmesh_bench_wrong (GError     **error,
                    const char  *format,
                    ...)
{
  va_list args;

  va_start (args, format);
  g_propagate_error (error, g_error_new_valist (CPMESH_BENCH_ERROR,
                                                CPMESH_BENCH_ERROR_WRONG_RESULT, format, args));
  va_end (args);
  return FALSE;
}

static gboolean
is_wrong_result (const GError *error)
{
  return g_error_matches (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_WRONG_RESULT);
}

int
cpmesh_bench_fail (GError *error)
{
  if (is_wrong_result (error))
    return cpmesh_fail (CPMESH_EXIT_FAILED, "wrong results, no speed printed: %s", error->message);
  return cpmesh_fail_error (error);
}

void
cpmesh_bench_corrupt (CpTensor *tensor)
{
  if (test_hook ("corrupt-result") && cp_tensor_get_numel (tensor) > 0)
    cp_tensor_set_value (tensor, 0, cp_tensor_get_value (tensor, 0) + 1000.0);
}

/* ---- checks ---- */

void
cpmesh_bench_fill_pattern (CpTensor *tensor,
                           guint64   first)
{
  gint64 n = cp_tensor_get_numel (tensor);

  if (cp_tensor_get_dtype (tensor) == CP_DTYPE_FLOAT32)
    {
      float *data = cp_tensor_get_data (tensor);

      for (gint64 i = 0; i < n; i++)
        data[i] = (float) cpmesh_bench_pattern (first + (guint64) i);
    }
  else if (cp_tensor_get_dtype (tensor) == CP_DTYPE_INT64)
    {
      gint64 *data = cp_tensor_get_data (tensor);

      for (gint64 i = 0; i < n; i++)
        data[i] = (gint64) cpmesh_bench_pattern (first + (guint64) i);
    }
  else
    for (gint64 i = 0; i < n; i++)
      cp_tensor_set_value (tensor, i, cpmesh_bench_pattern (first + (guint64) i));
}

gint64
cpmesh_bench_head_tail_position (gint64 seq_len,
                                 int    cp_size,
                                 int    rank,
                                 gint64 local)
{
  gint64 chunk = seq_len / (2 * cp_size);

  return local < chunk ? rank * chunk + local : (2 * cp_size - 1 - rank) * chunk + local - chunk;
}

gboolean
cpmesh_bench_check_shard (CpTensor    *full,
                          CpTensor    *piece,
                          int          dim,
                          int          cp_size,
                          int          rank,
                          const char  *what,
                          GError     **error)
{
  gint64 seq_len = cp_tensor_get_dim (full, dim);
  gint64 local_len = seq_len / cp_size;
  gsize row = cp_dtype_get_size (cp_tensor_get_dtype (full));
  gint64 outer = 1;
  const guint8 *full_data = cp_tensor_get_data (full);
  const guint8 *piece_data = cp_tensor_get_data (piece);

  cpmesh_bench_corrupt (piece);
  for (int d = 0; d < dim; d++)
    outer *= cp_tensor_get_dim (full, d);
  for (guint d = (guint) dim + 1; d < cp_tensor_get_n_dims (full); d++)
    row *= (gsize) cp_tensor_get_dim (full, d);
  if (cp_tensor_get_dim (piece, dim) != local_len ||
      cp_tensor_get_numel (piece) * (gint64) cp_dtype_get_size (cp_tensor_get_dtype (piece)) !=
      outer * local_len * (gint64) row)
    return cpmesh_bench_wrong (error, "%s: rank %d holds %" G_GINT64_FORMAT " positions along "
                               "dim %d, not %" G_GINT64_FORMAT, what, rank,
                               cp_tensor_get_dim (piece, dim), dim, local_len);
  for (gint64 o = 0; o < outer; o++)
    for (gint64 j = 0; j < local_len; j++)
      {
        gint64 position = cpmesh_bench_head_tail_position (seq_len, cp_size, rank, j);

        if (memcmp (piece_data + (gsize) (o * local_len + j) * row,
                    full_data + (gsize) (o * seq_len + position) * row, row) != 0)
          return cpmesh_bench_wrong (error, "%s: rank %d's local position %" G_GINT64_FORMAT
                                     " of row %" G_GINT64_FORMAT " (dim %d) is not global "
                                     "position %" G_GINT64_FORMAT, what, rank, j, o, dim,
                                     position);
      }
  return TRUE;
}

void
cpmesh_bench_fill_gather_piece (CpTensor *piece,
                                int       rank)
{
  cpmesh_bench_fill_pattern (piece, (guint64) rank * (guint64) cp_tensor_get_numel (piece));
}

gboolean
cpmesh_bench_check_gathered (CpTensor  *gathered,
                             int        dim,
                             int        n_ranks,
                             int        rank,
                             GError   **error)
{
  gint64 outer = 1, inner = 1, local = cp_tensor_get_dim (gathered, dim) / n_ranks;
  const float *got = cp_tensor_get_data (gathered);
  gint64 piece;

  cpmesh_bench_corrupt (gathered);
  for (int d = 0; d < dim; d++)
    outer *= cp_tensor_get_dim (gathered, d);
  for (guint d = (guint) dim + 1; d < cp_tensor_get_n_dims (gathered); d++)
    inner *= cp_tensor_get_dim (gathered, d);
  piece = outer * local * inner;
  /* Element (o, j·local + s, h) is element (o, s, h) of rank j's piece. */
  for (gint64 o = 0; o < outer; o++)
    for (int j = 0; j < n_ranks; j++)
      for (gint64 e = 0; e < local * inner; e++)
        {
          gint64 at = (o * n_ranks + j) * local * inner + e;
          float want = (float) cpmesh_bench_pattern ((guint64) (j * piece + o * local * inner + e));

          if (got[at] != want)
            return cpmesh_bench_wrong (error, "all_gather on rank %d: element %" G_GINT64_FORMAT
                                       " is %g, not %g from rank %d's piece", rank, at,
                                       got[at], want, j);
        }
  return TRUE;
}

static double
reduce_operand (gint64 i,
                int    rank)
{
  return (double) (i % 13 + 1) * (rank % 4 + 1);
}

void
cpmesh_bench_fill_reduce_operand (CpTensor *operand,
                                  int       rank)
{
  float *data = cp_tensor_get_data (operand);

  for (gint64 i = 0; i < cp_tensor_get_numel (operand); i++)
    data[i] = (float) reduce_operand (i, rank);
}

gboolean
cpmesh_bench_check_reduced (CpTensor  *sum,
                            int        n_ranks,
                            int        rank,
                            GError   **error)
{
  const float *got = cp_tensor_get_data (sum);

  cpmesh_bench_corrupt (sum);
  for (gint64 i = 0; i < cp_tensor_get_numel (sum); i++)
    {
      double want = 0;

      for (int r = 0; r < n_ranks; r++)
        want += reduce_operand (i, r);
      if (got[i] != want)
        return cpmesh_bench_wrong (error, "all_reduce SUM on rank %d: element %" G_GINT64_FORMAT
                                   " is %g, not %g", rank, i, got[i], want);
    }
  return TRUE;
}

/* ---- timing ---- */

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

void
cpmesh_spans_init (CpmeshSpans *spans,
                   int          n_ranks,
                   int          n_reps)
{
  spans->n_ranks = n_ranks;
  spans->n_reps = n_reps;
  spans->start = g_new0 (double, (gsize) n_ranks * (gsize) n_reps);
  spans->end = g_new0 (double, (gsize) n_ranks * (gsize) n_reps);
}

void
cpmesh_spans_clear (CpmeshSpans *spans)
{
  g_clear_pointer (&spans->start, g_free);
  g_clear_pointer (&spans->end, g_free);
}

void
cpmesh_spans_record (CpmeshSpans *spans,
                     int          rank,
                     int          rep,
                     double       start,
                     double       end)
{
  if (rep < 0)
    return;
  spans->start[rank * spans->n_reps + rep] = start;
  spans->end[rank * spans->n_reps + rep] = end;
}

static double
median_over_reps (const CpmeshSpans *spans,
                  gboolean           group)
{
  g_autofree double *times = g_new0 (double, spans->n_reps);

  for (int i = 0; i < spans->n_reps; i++)
    {
      double first = G_MAXDOUBLE, last = 0.0, slowest = 0.0;

      for (int r = 0; r < spans->n_ranks; r++)
        {
          double start = spans->start[r * spans->n_reps + i];
          double end = spans->end[r * spans->n_reps + i];

          first = MIN (first, start);
          last = MAX (last, end);
          slowest = MAX (slowest, end - start);
        }
      times[i] = group ? last - first : slowest;
    }
  return cpmesh_bench_median (times, (gsize) spans->n_reps);
}

double
cpmesh_spans_median_group (const CpmeshSpans *spans)
{
  return median_over_reps (spans, TRUE);
}

double
cpmesh_spans_median_slowest (const CpmeshSpans *spans)
{
  return median_over_reps (spans, FALSE);
}

void
cpmesh_bench_copy_blocks (guint8        *destination,
                          const guint8 **blocks,
                          const gsize   *sizes,
                          guint          n)
{
  for (guint i = 0; i < n; i++)
    {
      memcpy (destination, blocks[i], sizes[i]);
      destination += sizes[i];
    }
}

/* ---- ranks on threads ---- */

/* Bench ranks wait long: a rank of a big benchmark may take minutes. */
#define RANK_TIMEOUT_MS 600000

/* The benchmarks' error quark, whose first use is an unlocked write, is
 * made on this thread before any rank starts; the harness does the same
 * for the library's types. */
static void
init_before_ranks (void)
{
  (void) CPMESH_BENCH_ERROR;
}

static void
rank_main (CpMesh   *mesh,
           gpointer  data)
{
  CpmeshBenchRank *rank = data;

  rank->func (rank, &rank->error);
}

gboolean
cpmesh_bench_run_ranks (int                   n_ranks,
                        CpmeshBenchRankFunc   func,
                        gpointer             *ranks,
                        GError              **error)
{
  GList *meshes = cp_harness_local_group ("cp", n_ranks, RANK_TIMEOUT_MS, error);
  GError *first = NULL;
  int r = 0;

  if (meshes == NULL)
    return FALSE;
  init_before_ranks ();
  for (GList *l = meshes; l != NULL; l = l->next, r++)
    {
      CpmeshBenchRank *rank = ranks[r];

      rank->mesh = l->data;
      rank->rank = r;
      rank->func = func;
    }
  cp_harness_run_threads (meshes, rank_main, ranks, 0, NULL);
  g_list_free_full (meshes, g_object_unref);
  for (r = 0; r < n_ranks; r++)
    {
      CpmeshBenchRank *rank = ranks[r];

      rank->mesh = NULL;
      if (rank->error != NULL && (first == NULL || (is_wrong_result (rank->error) &&
                                                    !is_wrong_result (first))))
        first = rank->error;
    }
  if (first != NULL)
    g_propagate_error (error, g_error_copy (first));
  return first == NULL;
}

gboolean
cpmesh_bench_agree (CpMesh   *mesh,
                    gboolean  ok,
                    GError  **error)
{
  const gint64 one[] = { 1 };
  g_autoptr(CpTensor) failed = cp_tensor_new_full (CP_DTYPE_FLOAT64, one, 1, ok ? 0.0 : 1.0, NULL);

  if (!cp_mesh_all_reduce (mesh, failed, CP_REDUCE_OP_MAX, ok ? error : NULL) || !ok)
    return FALSE;
  if (cp_tensor_get_value (failed, 0) == 0.0)
    return TRUE;
  g_set_error (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_PEER_WRONG,
               "rank %d: another rank's check failed", cp_mesh_get_rank (mesh));
  return FALSE;
}

gboolean
cpmesh_bench_timed_copy (CpmeshBenchRank  *rank,
                         guint8           *destination,
                         const guint8    **blocks,
                         const gsize      *sizes,
                         guint             n,
                         CpmeshSpans      *spans,
                         int               rep,
                         GError          **error)
{
  double start;

  if (!cp_mesh_barrier (rank->mesh, error))
    return FALSE;
  start = cpmesh_now_seconds ();
  cpmesh_bench_copy_blocks (destination, blocks, sizes, n);
  cpmesh_spans_record (spans, rank->rank, rep, start, cpmesh_now_seconds ());
  return TRUE;
}

/* Rank 0's progress through many short repetitions: the first, then
 * one line every few seconds at most. */
#define PROGRESS_EVERY_S 5.0

gboolean
cpmesh_bench_interleave (CpmeshBenchRank     *rank,
                         const char          *what,
                         int                  warmup,
                         int                  reps,
                         CpmeshBenchRepFunc   measured,
                         CpmeshBenchRepFunc   baseline,
                         GError             **error)
{
  double reported = 0.0;

  for (int i = -warmup; i < reps; i++)
    {
      if (rank->rank == 0 && (i == -warmup || cpmesh_now_seconds () - reported >= PROGRESS_EVERY_S))
        {
          reported = cpmesh_now_seconds ();
          cpmesh_progress ("%s: %d of %d", what, i + warmup + 1, warmup + reps);
        }
      if (!measured (rank, i, error) || !baseline (rank, i, error))
        return FALSE;
    }
  return TRUE;
}

/* ---- rows against a baseline ---- */

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

/* The ratio of @row's best throughput to its baseline's. */
static double
row_ratio (const CpmeshBenchRow *row,
           const CpmeshBenchRow *rows,
           gsize                 n_rows)
{
  double best, median, base_best, base_median;

  row_throughput (row, &best, &median);
  row_throughput (find_row (rows, n_rows, row->baseline), &base_best, &base_median);
  return base_best > 0.0 ? best / base_best : 0.0;
}

static void
print_row (const CpmeshBenchRow *row,
           const CpmeshBenchRow *rows,
           gsize                 n_rows)
{
  double best, median;

  row_throughput (row, &best, &median);
  g_print ("%-34s %9.1f %9.2f %9.2f", row->name, row->bytes / (1 << 20), best, median);
  if (row->baseline == NULL)
    g_print ("  (baseline)\n");
  else
    g_print ("  %5.2f× %s\n", row_ratio (row, rows, n_rows), row->baseline);
}

void
cpmesh_bench_report (CpmeshBench    *bench,
                     CpmeshBenchRow *rows,
                     gsize           n_rows)
{
  g_print ("%-34s %9s %9s %9s  %s\n", "operation", "MiB/pass", "best GB/s", "med GB/s",
           "best ratio against");
  for (gsize i = 0; i < n_rows; i++)
    print_row (&rows[i], rows, n_rows);
  for (gsize i = 0; i < n_rows; i++)
    if (rows[i].target > 0.0)
      {
        g_autofree char *what = g_strdup_printf ("%s against %s", rows[i].name, rows[i].baseline);

        cpmesh_bench_target (bench, what, row_ratio (&rows[i], rows, n_rows), CPMESH_AT_LEAST,
                             rows[i].target);
      }
}
