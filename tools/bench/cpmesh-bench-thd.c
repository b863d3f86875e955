/* cpmesh-bench-thd.c: `cpmesh bench thd`
 *
 * THD conversion and per-document head-tail partition of packed rows on
 * in-process ranks, timed against memcpy of the same bytes — this rank's
 * share of input_ids, labels and position_ids — in the same run.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpmesh-bench.h"

typedef struct
{
  int ranks;
  int rows;
  int seq;
  int documents;
  int iterations;
  int warmup;
  guint seed;
} ThdConfig;

/* When each rank's conversion and copy started and ended. */
enum { CONVERT_START, CONVERT_END, COPY_START, COPY_END, N_MARKS };

typedef struct
{
  ThdConfig *config;
  CpMesh *mesh;
  CpBatch *batch;        /* this rank's own padded batch */
  double *marks[N_MARKS];
  gsize local_bytes;
} ThdRank;

static void
thd_barrier (ThdRank *rank)
{
  g_autoptr(GError) error = NULL;

  if (!cp_mesh_barrier (rank->mesh, &error))
    g_error ("bench thd: %s", error->message);
}

static CpTensor *
new_int64 (gint64 rows,
           gint64 cols)
{
  const gint64 shape[] = { rows, cols };
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT64, shape, 2, &error);

  if (tensor == NULL)
    g_error ("bench thd: %s", error->message);
  return tensor;
}

static int
compare_int64 (const void *a,
               const void *b)
{
  gint64 x = *(const gint64 *) a;
  gint64 y = *(const gint64 *) b;

  return (x > y) - (x < y);
}

/* Random document bounds of one row: cuts on multiples of 2·C, so every
 * padded length divides, each real length up to 2·C − 1 shorter. */
static void
random_row (GRand     *rand,
            ThdConfig *config,
            gint64    *real,
            gint64    *padded)
{
  gint64 grain = 2 * (gint64) config->ranks;
  gint64 units = config->seq / grain;
  g_autofree gint64 *cuts = g_new (gint64, config->documents + 1);

  cuts[0] = 0;
  cuts[config->documents] = units;
  for (int d = 1; d < config->documents; d++)
    cuts[d] = g_rand_int_range (rand, 1, (gint32) units);
  qsort (cuts + 1, config->documents - 1, sizeof (gint64), compare_int64);
  for (int d = 0; d < config->documents; d++)
    {
      padded[d] = (cuts[d + 1] - cuts[d]) * grain;
      real[d] = MAX (padded[d] - g_rand_int_range (rand, 0, (gint32) grain), 0);
    }
}

static CpBatch *
make_batch (ThdConfig *config)
{
  g_autoptr(GRand) rand = g_rand_new_with_seed (config->seed);
  CpBatch *batch = cp_batch_new ();
  g_autoptr(CpTensor) ids = new_int64 (config->rows, config->seq);
  g_autoptr(CpTensor) labels = new_int64 (config->rows, config->seq);
  g_autoptr(CpTensor) positions = new_int64 (config->rows, config->seq);
  g_autoptr(CpTensor) seq_lens = new_int64 (config->rows, config->documents);
  g_autoptr(CpTensor) seq_lens_padded = new_int64 (config->rows, config->documents);
  gint64 *id = cp_tensor_get_data (ids);
  gint64 *label = cp_tensor_get_data (labels);
  gint64 *position = cp_tensor_get_data (positions);

  for (gint64 i = 0; i < (gint64) config->rows * config->seq; i++)
    {
      id[i] = i % 32000;
      label[i] = (i + 1) % 32000;
      position[i] = i % config->seq;
    }
  for (int r = 0; r < config->rows; r++)
    random_row (rand, config,
                (gint64 *) cp_tensor_get_data (seq_lens) + (gsize) r * config->documents,
                (gint64 *) cp_tensor_get_data (seq_lens_padded) + (gsize) r * config->documents);
  cp_batch_set (batch, "input_ids", ids);
  cp_batch_set (batch, "labels", labels);
  cp_batch_set (batch, "position_ids", positions);
  cp_batch_set (batch, "seq_lens", seq_lens);
  cp_batch_set (batch, "seq_lens_padded", seq_lens_padded);
  return batch;
}

static void
convert_once (ThdRank *rank,
              int      iteration)
{
  g_autoptr(CpBatch) out = NULL;
  g_autoptr(GError) error = NULL;
  gint64 t0, t1;

  thd_barrier (rank);
  t0 = g_get_monotonic_time ();
  out = cp_batch_to_thd (rank->batch, rank->mesh, NULL, &error);
  t1 = g_get_monotonic_time ();
  if (out == NULL)
    g_error ("bench thd: %s", error->message);
  if (iteration < 0)
    return;
  rank->marks[CONVERT_START][iteration] = t0 / 1e6;
  rank->marks[CONVERT_END][iteration] = t1 / 1e6;
}

/* The baseline: copy as many bytes of the three buffers as this rank
 * receives, into a warm destination. */
static void
copy_once (ThdRank *rank,
           guint8  *destination,
           int      iteration)
{
  const char *keys[] = { "input_ids", "labels", "position_ids" };
  gsize share = rank->local_bytes / G_N_ELEMENTS (keys);
  gint64 t0, t1;

  thd_barrier (rank);
  t0 = g_get_monotonic_time ();
  for (guint k = 0; k < G_N_ELEMENTS (keys); k++)
    memcpy (destination + k * share, cp_tensor_get_data (cp_batch_get (rank->batch, keys[k])), share);
  t1 = g_get_monotonic_time ();
  if (iteration < 0)
    return;
  rank->marks[COPY_START][iteration] = t0 / 1e6;
  rank->marks[COPY_END][iteration] = t1 / 1e6;
}

static gpointer
thd_rank_main (gpointer data)
{
  ThdRank *rank = data;
  g_autofree guint8 *destination = g_malloc (rank->local_bytes);

  memset (destination, 0, rank->local_bytes);
  for (int i = -rank->config->warmup; i < rank->config->iterations; i++)
    {
      convert_once (rank, i);
      copy_once (rank, destination, i);
    }
  return NULL;
}

/* The median over iterations of the group's wall-clock time, from the
 * first rank's start to the last rank's end. */
static double
median_span (ThdRank *ranks,
             int      n_ranks,
             int      n,
             int      start,
             int      end)
{
  g_autofree double *span = g_new0 (double, n);

  for (int i = 0; i < n; i++)
    {
      double first = G_MAXDOUBLE, last = 0.0;

      for (int r = 0; r < n_ranks; r++)
        {
          first = MIN (first, ranks[r].marks[start][i]);
          last = MAX (last, ranks[r].marks[end][i]);
        }
      span[i] = last - first;
    }
  return cpmesh_bench_median (span, n);
}

static gboolean
parse_thd_config (int        *argc,
                  char     ***argv,
                  ThdConfig  *config)
{
  GOptionEntry entries[] = {
    { "ranks", 'r', 0, G_OPTION_ARG_INT, &config->ranks, "In-process ranks (default 4)", "C" },
    { "rows", 'b', 0, G_OPTION_ARG_INT, &config->rows, "Batch rows (default 8)", "B" },
    { "seq", 's', 0, G_OPTION_ARG_INT, &config->seq, "Row length (default 131072)", "S" },
    { "documents", 'd', 0, G_OPTION_ARG_INT, &config->documents, "Documents per row (default 64)", "N" },
    { "iterations", 'n', 0, G_OPTION_ARG_INT, &config->iterations, "Timed conversions (default 20)", "N" },
    { "warmup", 'w', 0, G_OPTION_ARG_INT, &config->warmup, "Untimed conversions first (default 3)", "N" },
    { NULL }
  };
  g_autoptr(GOptionContext) context = g_option_context_new ("- convert packed rows to THD and partition them");
  g_autoptr(GError) error = NULL;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, argc, argv, &error))
    {
      fprintf (stderr, "bench thd: %s\n", error->message);
      return FALSE;
    }
  if (config->ranks < 1 || config->rows < 1 || config->documents < 1 || config->iterations < 1 ||
      config->warmup < 0 || config->seq < 2 * config->ranks * config->documents ||
      config->seq % (2 * config->ranks) != 0)
    {
      fprintf (stderr, "bench thd: sizes must be positive and the row length a multiple of 2·C "
               "with room for every document\n");
      return FALSE;
    }
  return TRUE;
}

static void
thd_report (ThdConfig *config,
            ThdRank   *ranks)
{
  double convert = median_span (ranks, config->ranks, config->iterations, CONVERT_START, CONVERT_END);
  double copy = median_span (ranks, config->ranks, config->iterations, COPY_START, COPY_END);

  printf ("bench thd: %d in-process ranks; input_ids, labels, position_ids [%d, %d] int64, "
          "%d documents per row of random lengths\n",
          config->ranks, config->rows, config->seq, config->documents);
  printf ("  bytes moved per rank: %.2f MiB (this rank's share of the three buffers)\n",
          ranks[0].local_bytes / (1024.0 * 1024.0));
  printf ("  THD conversion + partition, all ranks: %.3f ms (median of %d)\n", convert * 1e3,
          config->iterations);
  printf ("  memcpy of the same bytes, same threads, all ranks: %.3f ms\n", copy * 1e3);
  printf ("  ratio: %.2f x memcpy (target <= 2)\n", convert / copy);
}

/* Every rank converts its own copy of the batch, on its own thread. */
static void
thd_run_ranks (ThdConfig *config,
               ThdRank   *ranks,
               GList     *meshes)
{
  g_autofree GThread **threads = g_new0 (GThread *, config->ranks);
  int i = 0;

  for (GList *l = meshes; l != NULL; l = l->next, i++)
    {
      ranks[i].config = config;
      ranks[i].mesh = l->data;
      ranks[i].batch = make_batch (config);
      ranks[i].local_bytes = 3 * (gsize) config->rows * (gsize) config->seq * 8 / (gsize) config->ranks;
      for (int k = 0; k < N_MARKS; k++)
        ranks[i].marks[k] = g_new0 (double, config->iterations);
    }
  for (i = 0; i < config->ranks; i++)
    threads[i] = g_thread_new ("bench-thd-rank", thd_rank_main, &ranks[i]);
  for (i = 0; i < config->ranks; i++)
    g_thread_join (threads[i]);
}

int
cpmesh_bench_thd (int    argc,
                  char **argv)
{
  ThdConfig config = { 4, 8, 131072, 64, 20, 3, 1 };
  const char *dim_names[] = { "cp", NULL };
  g_autoptr(GError) error = NULL;
  g_autofree ThdRank *ranks = NULL;
  GList *meshes;

  if (!parse_thd_config (&argc, &argv, &config))
    return 2;
  meshes = cp_mesh_new_local_group (dim_names, &config.ranks, 1, &error);
  if (meshes == NULL)
    {
      fprintf (stderr, "bench thd: %s\n", error->message);
      return 1;
    }
  ranks = g_new0 (ThdRank, config.ranks);
  thd_run_ranks (&config, ranks, meshes);
  thd_report (&config, ranks);
  for (int i = 0; i < config.ranks; i++)
    {
      g_object_unref (ranks[i].batch);
      for (int k = 0; k < N_MARKS; k++)
        g_free (ranks[i].marks[k]);
    }
  g_list_free_full (meshes, g_object_unref);
  return 0;
}
