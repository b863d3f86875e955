/* cpmesh-bench-batch.c: `cpmesh bench batch`
 *
 * Prepare + enter + exit of a context-parallel batch on in-process ranks,
 * timed against memcpy of the bytes the operation must move, in the same
 * run, and the peak resident memory during enter against what it must
 * hold: the full batch plus this rank's local copy, for every rank.
 *
 * Every rank owns its full batch, as every process of a real job does.
 * Each timed step views that batch through new tensor objects (no copy):
 * enter leaves the original memory untouched, so the same bytes serve
 * every step.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>

#include "cpmesh-bench.h"

#define N_BUFFERS 4

typedef struct
{
  int ranks;
  int rows;
  int seq;
  int vocab;
  int iterations;
  int warmup;
} Config;

typedef struct _Bench Bench;

/* What each rank records, one per iteration: the phase durations, and
 * when its step and its copy started and ended, from which the group's
 * wall-clock time follows (ranks sharing cores need not overlap). */
enum { PREPARE, ENTER, EXIT, STEP_START, STEP_END, COPY_START, COPY_END, N_SERIES };

typedef struct
{
  Bench *bench;
  CpMesh *mesh;
  CpStorage *storage[N_BUFFERS];
  double *series[N_SERIES];
} Rank;

struct _Bench
{
  Config config;
  Rank *rank;
  gsize full_bytes;      /* one rank's batch */
  gsize base_rss;        /* before any batch exists */
  gsize peak_rss;        /* during the first enter */
  gboolean peak_reset;
};

static const char *names[N_BUFFERS] = { "input_ids", "labels", "position_ids", "teacher_logits" };

static void
barrier (Rank *rank)
{
  g_autoptr(GError) error = NULL;

  if (!cp_mesh_barrier (rank->mesh, &error))
    g_error ("bench batch: %s", error->message);
}

static void
buffer_shape (Config *config,
              int     buffer,
              gint64 *shape,
              guint  *n_dims)
{
  shape[0] = config->rows;
  shape[1] = config->seq;
  shape[2] = config->vocab;
  *n_dims = buffer == 3 ? 3 : 2;
}

static CpDType
buffer_dtype (int buffer)
{
  return buffer == 3 ? CP_DTYPE_FLOAT32 : CP_DTYPE_INT64;
}

static gsize
buffer_bytes (Config *config,
              int     buffer)
{
  gsize bytes = (gsize) config->rows * (gsize) config->seq * 8;

  return buffer == 3 ? bytes / 2 * (gsize) config->vocab : bytes;
}

/* Fills every page, so the batch is resident before anything is timed. */
static void
fill_storage (CpStorage *storage,
              int        buffer,
              Config    *config)
{
  gsize bytes = cp_storage_get_size (storage);

  if (buffer == 2)
    {
      gint64 *positions = cp_storage_get_data (storage);

      for (gsize i = 0; i < bytes / 8; i++)
        positions[i] = (gint64) (i % (gsize) config->seq);
    }
  else
    memset (cp_storage_get_data (storage), 0x11 * (buffer + 1), bytes);
}

static CpBatch *
view_batch (Rank *rank)
{
  CpBatch *batch = cp_batch_new ();

  for (int b = 0; b < N_BUFFERS; b++)
    {
      gint64 shape[3];
      guint n_dims;
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) tensor = NULL;

      buffer_shape (&rank->bench->config, b, shape, &n_dims);
      tensor = cp_tensor_new_from_storage (buffer_dtype (b), shape, n_dims, rank->storage[b], 0, &error);
      if (tensor == NULL)
        g_error ("bench batch: %s", error->message);
      cp_batch_set (batch, names[b], tensor);
    }
  cp_batch_set_seq_dim (batch, "teacher_logits", 1);
  return batch;
}

static void
check (gboolean  ok,
       GError   *error)
{
  if (!ok)
    g_error ("bench batch: %s", error->message);
}

/* A field of /proc/self/status, in bytes. */
static gsize
status_bytes (const char *field)
{
  g_autofree char *status = NULL;
  const char *line;

  if (!g_file_get_contents ("/proc/self/status", &status, NULL, NULL) ||
      (line = strstr (status, field)) == NULL)
    return 0;
  return (gsize) g_ascii_strtoull (line + strlen (field) + 1, NULL, 10) * 1024;
}

/* Writing 5 to clear_refs resets VmHWM to the current resident size. */
static gboolean
reset_peak (void)
{
  FILE *file = fopen ("/proc/self/clear_refs", "w");
  gboolean ok;

  if (file == NULL)
    return FALSE;
  ok = fputs ("5", file) >= 0;
  return fclose (file) == 0 && ok;
}

/* Every rank is entered: rank 0 reads the high-water mark before any
 * rank exits. */
static void
measure_peak (Rank *rank)
{
  barrier (rank);
  if (cp_mesh_get_rank (rank->mesh) == 0)
    rank->bench->peak_rss = status_bytes ("VmHWM:");
  barrier (rank);
}

/* One prepare + enter + exit; the first one (@iteration < 0 and
 * @measure) reads the peak resident size while entered. */
static void
run_step (Rank     *rank,
          int       iteration,
          gboolean  measure)
{
  g_autoptr(CpBatch) batch = view_batch (rank);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GError) error = NULL;
  gint64 t0, t1, t2, t3;

  barrier (rank);
  t0 = g_get_monotonic_time ();
  context = cp_batch_prepare (batch, rank->mesh, NULL, &error);
  check (context != NULL, error);
  t1 = g_get_monotonic_time ();
  check (cp_context_enter (context, &error), error);
  t2 = g_get_monotonic_time ();
  if (measure)
    measure_peak (rank);
  check (cp_context_exit (context, &error), error);
  t3 = g_get_monotonic_time ();
  if (iteration < 0)
    return;
  rank->series[PREPARE][iteration] = (t1 - t0) / 1e6;
  rank->series[ENTER][iteration] = (t2 - t1) / 1e6;
  rank->series[EXIT][iteration] = (t3 - t2) / 1e6;
  rank->series[STEP_START][iteration] = t0 / 1e6;
  rank->series[STEP_END][iteration] = t3 / 1e6;
}

/* The baseline: copy this rank's share of every buffer — the bytes enter
 * moves — into a warm destination. */
static void
run_copy (Rank    *rank,
          guint8  *destination,
          int      iteration)
{
  int c = rank->bench->config.ranks;
  gint64 t0, t1;
  gsize offset = 0;

  barrier (rank);
  t0 = g_get_monotonic_time ();
  for (int b = 0; b < N_BUFFERS; b++)
    {
      gsize share = cp_storage_get_size (rank->storage[b]) / (gsize) c;

      memcpy (destination + offset, cp_storage_get_data (rank->storage[b]), share);
      offset += share;
    }
  t1 = g_get_monotonic_time ();
  if (iteration < 0)
    return;
  rank->series[COPY_START][iteration] = t0 / 1e6;
  rank->series[COPY_END][iteration] = t1 / 1e6;
}

static gpointer
rank_main (gpointer data)
{
  Rank *rank = data;
  Bench *bench = rank->bench;
  Config *config = &bench->config;
  g_autofree guint8 *destination = NULL;

  for (int b = 0; b < N_BUFFERS; b++)
    {
      g_autoptr(GError) error = NULL;

      rank->storage[b] = cp_storage_new (buffer_bytes (config, b), &error);
      check (rank->storage[b] != NULL, error);
      fill_storage (rank->storage[b], b, config);
    }
  barrier (rank);                          /* every batch resident */
  if (cp_mesh_get_rank (rank->mesh) == 0)
    bench->peak_reset = reset_peak ();
  run_step (rank, -1, TRUE);

  destination = g_malloc (bench->full_bytes / (gsize) config->ranks);
  memset (destination, 0, bench->full_bytes / (gsize) config->ranks);
  /* Interleaved, so that both see the same machine load. */
  for (int i = -config->warmup; i < config->iterations; i++)
    {
      run_step (rank, i, FALSE);
      run_copy (rank, destination, i);
    }
  return NULL;
}

/* The median over iterations of the slowest rank's duration. */
static double
median_of_max (Bench *bench,
               int    series)
{
  int n = bench->config.iterations;
  g_autofree double *worst = g_new0 (double, n);

  for (int i = 0; i < n; i++)
    for (int r = 0; r < bench->config.ranks; r++)
      worst[i] = MAX (worst[i], bench->rank[r].series[series][i]);
  return cpmesh_bench_median (worst, n);
}

/* The median over iterations of the group's wall-clock time: from the
 * first rank's start to the last rank's end. */
static double
median_of_span (Bench *bench,
                int    start,
                int    end)
{
  int n = bench->config.iterations;
  g_autofree double *span = g_new0 (double, n);

  for (int i = 0; i < n; i++)
    {
      double first = G_MAXDOUBLE, last = 0.0;

      for (int r = 0; r < bench->config.ranks; r++)
        {
          first = MIN (first, bench->rank[r].series[start][i]);
          last = MAX (last, bench->rank[r].series[end][i]);
        }
      span[i] = last - first;
    }
  return cpmesh_bench_median (span, n);
}

static gboolean
parse_config (int     *argc,
              char  ***argv,
              Config  *config)
{
  GOptionEntry entries[] = {
    { "ranks", 'r', 0, G_OPTION_ARG_INT, &config->ranks, "In-process ranks (default 4)", "C" },
    { "rows", 'b', 0, G_OPTION_ARG_INT, &config->rows, "Batch rows (default 8)", "B" },
    { "seq", 's', 0, G_OPTION_ARG_INT, &config->seq, "Sequence length (default 32768)", "S" },
    { "vocab", 'v', 0, G_OPTION_ARG_INT, &config->vocab, "teacher_logits last dimension (default 64)", "V" },
    { "iterations", 'n', 0, G_OPTION_ARG_INT, &config->iterations, "Timed steps (default 20)", "N" },
    { "warmup", 'w', 0, G_OPTION_ARG_INT, &config->warmup, "Untimed steps first (default 3)", "N" },
    { NULL }
  };
  g_autoptr(GOptionContext) context = g_option_context_new ("- prepare, enter and exit a CP batch");
  g_autoptr(GError) error = NULL;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, argc, argv, &error))
    {
      fprintf (stderr, "bench batch: %s\n", error->message);
      return FALSE;
    }
  if (config->ranks < 1 || config->rows < 1 || config->seq < 1 || config->vocab < 1 ||
      config->iterations < 1 || config->warmup < 0)
    {
      fprintf (stderr, "bench batch: every size must be positive\n");
      return FALSE;
    }
  return TRUE;
}

static void
report (Bench *bench)
{
  Config *c = &bench->config;
  double step = median_of_span (bench, STEP_START, STEP_END);
  double copy = median_of_span (bench, COPY_START, COPY_END);
  double mib = 1024.0 * 1024.0;
  gsize local = bench->full_bytes / (gsize) c->ranks;
  gsize budget = (gsize) c->ranks * (bench->full_bytes + local);

  printf ("bench batch: %d in-process ranks; input_ids, labels, position_ids [%d, %d] int64, "
          "teacher_logits [%d, %d, %d] float32\n", c->ranks, c->rows, c->seq, c->rows, c->seq, c->vocab);
  printf ("  bytes moved per rank: %.2f MiB (enter copies the local pieces; prepare pads nothing "
          "and exit restores position ids without copying)\n", local / mib);
  printf ("  prepare + enter + exit, all ranks: %.3f ms (median of %d; slowest rank's prepare %.3f, "
          "enter %.3f, exit %.3f)\n", step * 1e3, c->iterations,
          median_of_max (bench, PREPARE) * 1e3, median_of_max (bench, ENTER) * 1e3,
          median_of_max (bench, EXIT) * 1e3);
  printf ("  memcpy of the same bytes, same threads, all ranks: %.3f ms\n", copy * 1e3);
  printf ("  ratio: %.2f x memcpy (target <= 1.5)\n", step / copy);
  printf ("  peak RSS during enter: %.1f MiB above the start%s\n",
          (bench->peak_rss - bench->base_rss) / mib,
          bench->peak_reset ? "" : " (the peak counter could not be reset; this includes setup)");
  printf ("  full batch + local copy, every rank: %.1f MiB (%.1f + %.1f per rank)\n",
          budget / mib, bench->full_bytes / mib, local / mib);
  printf ("  ratio: %.3f (target <= 1.1)\n",
          (double) (bench->peak_rss - bench->base_rss) / (double) budget);
}

/* Every rank on its own thread; each allocates and fills its own batch. */
static void
run_ranks (Bench *bench,
           GList *meshes)
{
  g_autofree GThread **threads = g_new0 (GThread *, bench->config.ranks);
  int i = 0;

  for (GList *l = meshes; l != NULL; l = l->next, i++)
    {
      Rank *rank = &bench->rank[i];

      rank->bench = bench;
      rank->mesh = l->data;
      for (int k = 0; k < N_SERIES; k++)
        rank->series[k] = g_new0 (double, bench->config.iterations);
      threads[i] = g_thread_new ("bench-rank", rank_main, rank);
    }
  for (i = 0; i < bench->config.ranks; i++)
    g_thread_join (threads[i]);
}

int
cpmesh_bench_batch (int    argc,
                    char **argv)
{
  Bench bench = { .config = { 4, 8, 32768, 64, 20, 3 } };
  const char *dim_names[] = { "cp", NULL };
  g_autoptr(GError) error = NULL;
  GList *meshes;

  if (!parse_config (&argc, &argv, &bench.config))
    return 2;
  meshes = cp_mesh_new_local_group (dim_names, &bench.config.ranks, 1, &error);
  if (meshes == NULL)
    {
      fprintf (stderr, "bench batch: %s\n", error->message);
      return 1;
    }
  for (int b = 0; b < N_BUFFERS; b++)
    bench.full_bytes += buffer_bytes (&bench.config, b);
  bench.rank = g_new0 (Rank, bench.config.ranks);
  bench.base_rss = status_bytes ("VmRSS:");
  run_ranks (&bench, meshes);
  report (&bench);
  for (int i = 0; i < bench.config.ranks; i++)
    {
      for (int b = 0; b < N_BUFFERS; b++)
        cp_storage_unref (bench.rank[i].storage[b]);
      for (int k = 0; k < N_SERIES; k++)
        g_free (bench.rank[i].series[k]);
    }
  g_free (bench.rank);
  g_list_free_full (meshes, g_object_unref);
  return 0;
}
