/* cpmesh-bench-layout.c: cpmesh bench layout
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cpmesh-bench.h"

#define SEQ_DIM 1

/* The sizes the targets are stated for: [4, 16384, 1024] float32 over 4
 * ranks; --quick makes it [4, 1024, 1024]. */
#define DEFAULT_CP 4
#define DEFAULT_SEQ 16384
#define QUICK_SEQ 1024

typedef struct
{
  int cp_size;
  gint64 seq_len;
  int reps;
  CpmeshBench run;
} LayoutBenchOptions;

/* Everything the passes touch is allocated and warmed before timing. */
typedef struct
{
  CpmeshBenchRow *rows;
  gsize n_rows;
  CpLayout *layout;
  CpTensor *full;
  CpTensor **pieces;      /* cp_size reused shard outputs */
  CpTensor *restored;     /* the reused unshard output */
  CpTensor *copy;         /* the memcpy baseline's destination */
  gsize nbytes;
} LayoutBench;

typedef gboolean (*PassFunc) (LayoutBench  *bench,
                              GError      **error);

static gboolean
pass_memcpy (LayoutBench  *bench,
             GError      **error)
{
  memcpy (cp_tensor_get_data (bench->copy), cp_tensor_get_data (bench->full), bench->nbytes);
  return TRUE;
}

/* Every rank's piece through the allocating API, all alive at once as on
 * a real mesh, then released. */
static gboolean
pass_shard (LayoutBench  *bench,
            GError      **error)
{
  int n = cp_layout_get_cp_size (bench->layout);
  g_autofree CpTensor **pieces = g_new0 (CpTensor *, n);
  gboolean ok = TRUE;

  for (int r = 0; r < n && ok; r++)
    ok = (pieces[r] = cp_layout_shard (bench->layout, bench->full, SEQ_DIM, r, error)) != NULL;
  for (int r = 0; r < n; r++)
    g_clear_object (&pieces[r]);
  return ok;
}

static gboolean
pass_shard_into (LayoutBench  *bench,
                 GError      **error)
{
  for (int r = 0; r < cp_layout_get_cp_size (bench->layout); r++)
    if (!cp_layout_shard_into (bench->layout, bench->full, SEQ_DIM, r, bench->pieces[r], error))
      return FALSE;
  return TRUE;
}

static CpTensor *
unshard_pieces (LayoutBench  *bench,
                GError      **error)
{
  return cp_layout_unshard_pieces (bench->layout, bench->pieces,
                                   cp_layout_get_cp_size (bench->layout), SEQ_DIM, error);
}

static gboolean
pass_unshard (LayoutBench  *bench,
              GError      **error)
{
  g_autoptr(CpTensor) out = unshard_pieces (bench, error);

  return out != NULL;
}

static gboolean
pass_unshard_into (LayoutBench  *bench,
                   GError      **error)
{
  return cp_layout_unshard_pieces_into (bench->layout, bench->pieces,
                                        cp_layout_get_cp_size (bench->layout),
                                        SEQ_DIM, bench->restored, error);
}

static const PassFunc passes[] = {
  pass_memcpy, pass_shard, pass_shard_into, pass_unshard, pass_unshard_into,
};

static void
layout_bench_clear (LayoutBench *bench)
{
  cpmesh_bench_rows_clear (bench->rows, bench->n_rows);
  for (int r = 0; bench->pieces != NULL && r < cp_layout_get_cp_size (bench->layout); r++)
    g_clear_object (&bench->pieces[r]);
  g_clear_pointer (&bench->pieces, g_free);
  g_clear_object (&bench->restored);
  g_clear_object (&bench->full);
  g_clear_object (&bench->copy);
  g_clear_pointer (&bench->layout, cp_layout_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (LayoutBench, layout_bench_clear)

/* Float32 [4, S, 1024]: 256 MiB for S = 16384, 16 MiB for S = 1024.  Its
 * elements differ, so that the check finds any of them out of place. */
static gboolean
layout_bench_init (LayoutBench         *bench,
                   LayoutBenchOptions  *options,
                   GError             **error)
{
  gint64 shape[] = { 4, options->seq_len, 1024 };
  int n = options->cp_size;

  bench->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, shape[SEQ_DIM], n, error);
  if (bench->layout == NULL)
    return FALSE;
  bench->full = cp_tensor_new (CP_DTYPE_FLOAT32, shape, G_N_ELEMENTS (shape), error);
  if (bench->full == NULL)
    return FALSE;
  cpmesh_bench_fill_pattern (bench->full, 0);
  bench->nbytes = cp_tensor_get_nbytes (bench->full);
  bench->pieces = g_new0 (CpTensor *, n);
  for (int r = 0; r < n; r++)
    if ((bench->pieces[r] = cp_layout_shard (bench->layout, bench->full, SEQ_DIM, r, error)) == NULL)
      return FALSE;
  /* The baseline writes into memory of the same kind the library
   * allocates, so that both pay the same for pages and TLB misses. */
  bench->copy = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, G_N_ELEMENTS (shape), 0.0, error);
  bench->restored = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, G_N_ELEMENTS (shape), 0.0, error);
  return bench->copy != NULL && bench->restored != NULL;
}

/* Rounds interleave the operations, so that drift on a shared machine
 * hits all of them alike; round 0 warms caches and the block pool. */
static gboolean
layout_bench_run (LayoutBench     *bench,
                  CpmeshBenchRow  *rows,
                  int              reps,
                  GError         **error)
{
  for (int round = 0; round <= reps; round++)
    {
      cpmesh_progress ("round %d of %d (the first warms up)", round + 1, reps + 1);
      for (gsize i = 0; i < G_N_ELEMENTS (passes); i++)
      {
          double start = cpmesh_now_seconds ();

          if (!passes[i] (bench, error))
            return FALSE;
          if (round > 0)
            cpmesh_bench_record (&rows[i], cpmesh_now_seconds () - start);
        }
    }
  return TRUE;
}

static gboolean
check_restored (CpTensor    *restored,
                CpTensor    *original,
                const char  *what,
                GError     **error)
{
  if (cp_tensor_equal (restored, original))
    return TRUE;
  return cpmesh_bench_wrong (error, "%s did not restore the original tensor", what);
}

/* The figures only count if every piece holds its rank's positions, as
 * worked out here, and the data came back intact. */
static gboolean
layout_bench_verify (LayoutBench  *bench,
                     GError      **error)
{
  int n = cp_layout_get_cp_size (bench->layout);
  g_autoptr(CpTensor) restored = NULL;

  cpmesh_bench_corrupt (bench->pieces[n - 1]);
  for (int r = 0; r < n; r++)
    if (!cpmesh_bench_check_shard (bench->full, bench->pieces[r], SEQ_DIM, n, r,
                                   "shard_into", error))
      return FALSE;
  restored = unshard_pieces (bench, error);
  return restored != NULL &&
         check_restored (restored, bench->full, "unshard_pieces", error) &&
         check_restored (bench->restored, bench->full, "unshard_pieces_into", error);
}

static void
print_setup (LayoutBench         *bench,
             LayoutBenchOptions  *options)
{
  g_autofree char *description = cp_tensor_describe (bench->full);

  g_print ("shard and unshard of %s (%.0f MiB) along dim %d, head-tail over %d ranks, "
           "best of %d passes after a warm-up; every shard pass makes all %d pieces, "
           "every unshard pass rebuilds the whole tensor from them\n",
           description, (double) bench->nbytes / (1 << 20), SEQ_DIM, options->cp_size,
           options->reps, options->cp_size);
}

int
cpmesh_bench_layout (int    argc,
                     char **argv)
{
  LayoutBenchOptions options = { .cp_size = DEFAULT_CP, .seq_len = DEFAULT_SEQ, .reps = 7 };
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&options.cp_size, " to shard for (default 4)"),
    CPMESH_OPTION_SEQ (&options.seq_len, " of the [4, S, 1024] float32 tensor (default 16384, "
                       "1024 with --quick)"),
    CPMESH_OPTION_REPS (&options.reps, " (default 7, 3 with --quick)"),
    CPMESH_OPTION_QUICK (&options.run.quick, ": a 16 MiB tensor, 3 repetitions"),
    CPMESH_OPTION_CHECK_TARGETS (&options.run.check_targets),
    CPMESH_OPTION_END
  };
  CpmeshBenchRow rows[] = {
    { "memcpy, 1 thread", NULL, 0, 0 },
    { "shard (cp_layout_shard)", "memcpy, 1 thread", 0, 0.8 },
    { "shard_into (reused pieces)", "memcpy, 1 thread", 0, 0.8 },
    { "unshard (cp_layout_unshard_pieces)", "memcpy, 1 thread", 0, 0.8 },
    { "unshard_into (reused output)", "memcpy, 1 thread", 0, 0.8 },
  };
  g_auto(LayoutBench) bench = { rows, G_N_ELEMENTS (rows) };
  g_autoptr(GError) error = NULL;

  cpmesh_bench_rows_init (rows, G_N_ELEMENTS (rows));
  if (!cpmesh_parse_options ("Time sharding and unsharding of a float32 [4, S, 1024] tensor "
                             "(256 MiB at S = 16384) along dim 1 against memcpy of the same "
                             "bytes into a warm buffer. The library copies on one thread, as "
                             "the baseline does. Every piece and the restored tensor are "
                             "checked before any figure is printed.",
                             entries, NULL, &argc, &argv))
    return CPMESH_EXIT_USAGE;
  if (options.run.quick && !cpmesh_option_given (entries, "seq"))
    options.seq_len = QUICK_SEQ;
  if (options.run.quick && !cpmesh_option_given (entries, "reps"))
    options.reps = 3;
  if (!cpmesh_check_divisible ("--seq", options.seq_len, options.cp_size) ||
      !cpmesh_bench_begin (&options.run, options.cp_size == DEFAULT_CP &&
                           options.seq_len == DEFAULT_SEQ, "--cp 4 --seq 16384"))
    return CPMESH_EXIT_USAGE;

  cpmesh_progress ("making a [4, %" G_GINT64_FORMAT ", 1024] float32 tensor and its %d pieces",
                   options.seq_len, options.cp_size);
  if (!layout_bench_init (&bench, &options, &error))
    return cpmesh_bench_fail (error);
  print_setup (&bench, &options);
  for (gsize i = 0; i < G_N_ELEMENTS (rows); i++)
    rows[i].bytes = (double) bench.nbytes;
  if (!layout_bench_run (&bench, rows, options.reps, &error) ||
      !layout_bench_verify (&bench, &error))
    return cpmesh_bench_fail (error);
  g_print ("every piece holds its rank's positions; the round trip is bit-exact\n");
  cpmesh_bench_report (&options.run, rows, G_N_ELEMENTS (rows));
  return cpmesh_bench_end (&options.run);
}
