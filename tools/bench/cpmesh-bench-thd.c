/* cpmesh-bench-thd.c: `cpmesh bench thd`
 *
 * THD conversion and per-document head-tail partition of packed rows on
 * in-process ranks, timed against memcpy of the same bytes — this rank's
 * share of input_ids, labels and position_ids — in the same run.  The
 * first conversion is checked: every rank must hold, document by
 * document, the tokens that head-tail gives it, as worked out here.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdlib.h>
#include <string.h>

#include "cpmesh-bench.h"

/* The sizes the target is stated for. */
#define DEFAULT_CP 4
#define DEFAULT_BATCH 8
#define DEFAULT_SEQ 131072
#define DEFAULT_DOCUMENTS 64

typedef struct
{
  int cp_size;
  gint64 batch;
  gint64 seq_len;
  int documents;
  int reps;
  int warmup;
  CpmeshBench run;
} ThdConfig;

#define N_TOKEN_KEYS 3

static const char * const token_keys[N_TOKEN_KEYS] = { "input_ids", "labels", "position_ids" };

/* The timed regions. */
enum { CONVERT, COPY, N_SPANS };

typedef struct
{
  ThdConfig config;
  CpmeshSpans spans[N_SPANS];
} ThdBench;

typedef struct
{
  CpmeshBenchRank base;
  ThdBench *bench;
  CpBatch *batch;        /* this rank's own padded batch */
  gsize local_bytes;
  guint8 *destination;   /* the baseline's */
} ThdRank;

static CpTensor *
new_int64 (gint64   rows,
           gint64   cols,
           GError **error)
{
  const gint64 shape[] = { rows, cols };

  return cp_tensor_new (CP_DTYPE_INT64, shape, 2, error);
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
  gint64 grain = 2 * (gint64) config->cp_size;
  gint64 units = config->seq_len / grain;
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

/* Every rank makes the same batch from the same seed: ids and labels are
 * the check pattern, position ids count along each row. */
static CpBatch *
make_batch (ThdConfig  *config,
            GError    **error)
{
  g_autoptr(GRand) rand = g_rand_new_with_seed (1);
  g_autoptr(CpBatch) batch = cp_batch_new ();
  CpTensor *tokens[N_TOKEN_KEYS] = { NULL };
  g_autoptr(CpTensor) seq_lens = new_int64 (config->batch, config->documents, error);
  g_autoptr(CpTensor) seq_lens_padded = seq_lens ? new_int64 (config->batch, config->documents, error) : NULL;
  gboolean ok = seq_lens_padded != NULL;

  for (int k = 0; ok && k < N_TOKEN_KEYS; k++)
    ok = (tokens[k] = new_int64 (config->batch, config->seq_len, error)) != NULL;
  if (ok)
    {
      gint64 *position = cp_tensor_get_data (tokens[2]);

      cpmesh_bench_fill_pattern (tokens[0], 0);
      cpmesh_bench_fill_pattern (tokens[1], G_GUINT64_CONSTANT (1) << 40);
      for (gint64 i = 0; i < config->batch * config->seq_len; i++)
        position[i] = i % config->seq_len;
      for (gint64 r = 0; r < config->batch; r++)
        random_row (rand, config,
                    (gint64 *) cp_tensor_get_data (seq_lens) + r * config->documents,
                    (gint64 *) cp_tensor_get_data (seq_lens_padded) + r * config->documents);
      for (int k = 0; k < N_TOKEN_KEYS; k++)
        cp_batch_set (batch, token_keys[k], tokens[k]);
      cp_batch_set (batch, "seq_lens", seq_lens);
      cp_batch_set (batch, "seq_lens_padded", seq_lens_padded);
    }
  for (int k = 0; k < N_TOKEN_KEYS; k++)
    g_clear_object (&tokens[k]);
  return ok ? g_steal_pointer (&batch) : NULL;
}

/* The tokens of one key that head-tail gives this rank: of every document
 * of padded length P starting at flat token s, chunks r and 2·C−1−r of
 * P/(2·C) tokens each. */
static gboolean
check_tokens (ThdRank     *rank,
              const char  *key,
              CpTensor    *local,
              GError     **error)
{
  ThdConfig *config = &rank->bench->config;
  const gint64 *padded = cp_tensor_get_data (cp_batch_get (rank->batch, "seq_lens_padded"));
  const gint64 *want = cp_tensor_get_data (cp_batch_get (rank->batch, key));
  const gint64 *got = cp_tensor_get_data (local);
  gint64 n = cp_tensor_get_numel (local), at = 0, start = 0;
  int c = config->cp_size, r = rank->base.rank;

  cpmesh_bench_corrupt (local);
  for (gint64 d = 0; d < config->batch * config->documents; start += padded[d], d++)
    for (int part = 0; part < 2; part++)
      {
        gint64 chunk = padded[d] / (2 * c);
        gint64 first = start + (part == 0 ? r : 2 * c - 1 - r) * chunk;

        for (gint64 t = 0; t < chunk; t++, at++)
          if (at >= n || got[at] != want[first + t])
            return cpmesh_bench_wrong (error, "%s: rank %d's token %" G_GINT64_FORMAT " is not "
                                       "token %" G_GINT64_FORMAT " of the packed rows (document %"
                                       G_GINT64_FORMAT " of row %" G_GINT64_FORMAT ")", key, r,
                                       at, first + t, d % config->documents, d / config->documents);
      }
  if (at != n)
    return cpmesh_bench_wrong (error, "%s: rank %d holds %" G_GINT64_FORMAT " tokens, not %"
                               G_GINT64_FORMAT, key, r, n, at);
  return TRUE;
}

static gboolean
check_converted (ThdRank  *rank,
                 CpBatch  *out,
                 GError  **error)
{
  for (int k = 0; k < N_TOKEN_KEYS; k++)
    if (!check_tokens (rank, token_keys[k], cp_batch_get (out, token_keys[k]), error))
      return FALSE;
  return TRUE;
}

/* One conversion; the first, @checked, is not timed. */
static gboolean
convert_once (ThdRank  *rank,
              int       rep,
              gboolean  checked,
              GError  **error)
{
  CpMesh *mesh = rank->base.mesh;
  g_autoptr(CpBatch) out = NULL;
  double t0;

  if (!cp_mesh_barrier (mesh, error))
    return FALSE;
  t0 = cpmesh_now_seconds ();
  if ((out = cp_batch_to_thd (rank->batch, mesh, NULL, error)) == NULL)
    return FALSE;
  if (checked)
    return cpmesh_bench_agree (mesh, check_converted (rank, out, error), error);
  cpmesh_spans_record (&rank->bench->spans[CONVERT], rank->base.rank, rep, t0,
                       cpmesh_now_seconds ());
  return TRUE;
}

static gboolean
timed_conversion (gpointer   rank,
                  int        rep,
                  GError   **error)
{
  return convert_once (rank, rep, FALSE, error);
}

/* The baseline: copy as many bytes of the three buffers as this rank
 * receives, into a warm destination. */
static gboolean
copy_once (gpointer   data,
           int        rep,
           GError   **error)
{
  ThdRank *rank = data;
  const guint8 *blocks[N_TOKEN_KEYS];
  gsize sizes[N_TOKEN_KEYS];

  for (int k = 0; k < N_TOKEN_KEYS; k++)
    {
      blocks[k] = cp_tensor_get_data (cp_batch_get (rank->batch, token_keys[k]));
      sizes[k] = rank->local_bytes / N_TOKEN_KEYS;
    }
  return cpmesh_bench_timed_copy (&rank->base, rank->destination, blocks, sizes, N_TOKEN_KEYS,
                                  &rank->bench->spans[COPY], rep, error);
}

static gboolean
run_rank (gpointer   data,
          GError   **error)
{
  ThdRank *rank = data;
  ThdConfig *config = &rank->bench->config;

  if ((rank->batch = make_batch (config, error)) == NULL)
    return FALSE;
  rank->local_bytes = N_TOKEN_KEYS * (gsize) config->batch * (gsize) config->seq_len * 8 /
                      (gsize) config->cp_size;
  rank->destination = g_malloc0 (rank->local_bytes);
  if (rank->base.rank == 0)
    cpmesh_progress ("the first conversion, checked");
  return convert_once (rank, -1, TRUE, error) &&
         cpmesh_bench_interleave (&rank->base, "conversions", config->warmup, config->reps,
                                  timed_conversion, copy_once, error);
}

static void
rank_free (ThdRank *rank)
{
  g_clear_object (&rank->batch);
  g_free (rank->destination);
  g_clear_error (&rank->base.error);
  g_free (rank);
}

static void
thd_report (ThdBench *bench,
            gsize     local_bytes)
{
  ThdConfig *config = &bench->config;
  double convert = cpmesh_spans_median_group (&bench->spans[CONVERT]);
  double copy = cpmesh_spans_median_group (&bench->spans[COPY]);

  g_print ("bench thd: %d in-process ranks; input_ids, labels, position_ids [%" G_GINT64_FORMAT
           ", %" G_GINT64_FORMAT "] int64, %d documents per row of random lengths\n",
           config->cp_size, config->batch, config->seq_len, config->documents);
  g_print ("  every rank's tokens of every document checked\n");
  g_print ("  bytes moved per rank: %.2f MiB (this rank's share of the three buffers)\n",
           local_bytes / (1024.0 * 1024.0));
  g_print ("  THD conversion + partition, all ranks: %.3f ms (median of %d)\n", convert * 1e3,
           config->reps);
  g_print ("  memcpy of the same bytes, same threads, all ranks: %.3f ms\n", copy * 1e3);
  cpmesh_bench_target (&config->run, "THD conversion + partition against memcpy of the same bytes",
                       convert / copy, CPMESH_AT_MOST, 2.0);
}

static gboolean
parse_thd_config (int         argc,
                  char      **argv,
                  ThdConfig  *config)
{
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&config->cp_size, ", one thread each (default 4)"),
    CPMESH_OPTION_BATCH (&config->batch, " (default 8)"),
    CPMESH_OPTION_SEQ (&config->seq_len, " of a row, a multiple of 2·C (default 131072, 16384 "
                       "with --quick)"),
    { "documents", 'd', CPMESH_VALUE_INT, &config->documents, "Documents per row (default 64)",
      "N", 1, 1 << 20, NULL, FALSE },
    CPMESH_OPTION_REPS (&config->reps, " (default 20, 5 with --quick)"),
    CPMESH_OPTION_WARMUP (&config->warmup, " (default 3, 1 with --quick)"),
    CPMESH_OPTION_QUICK (&config->run.quick, ": rows of 16384"),
    CPMESH_OPTION_CHECK_TARGETS (&config->run.check_targets),
    CPMESH_OPTION_END
  };

  if (!cpmesh_parse_options ("Time THD conversion and per-document head-tail partition of "
                             "packed rows on C in-process ranks against memcpy of this rank's "
                             "share of input_ids, labels and position_ids. Every rank's tokens "
                             "are checked before any figure is printed.",
                             entries, NULL, &argc, &argv))
    return FALSE;
  if (config->run.quick && !cpmesh_option_given (entries, "seq"))
    config->seq_len = 16384;
  if (config->run.quick && !cpmesh_option_given (entries, "reps"))
    config->reps = 5;
  if (config->run.quick && !cpmesh_option_given (entries, "warmup"))
    config->warmup = 1;
  if (!cpmesh_check_divisible ("--seq", config->seq_len, config->cp_size))
    return FALSE;
  if (config->seq_len < 2 * (gint64) config->cp_size * config->documents)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--seq %" G_GINT64_FORMAT " has no room for --documents %d "
                   "of at least 2·C = %d positions each", config->seq_len, config->documents,
                   2 * config->cp_size);
      return FALSE;
    }
  return cpmesh_bench_begin (&config->run, config->cp_size == DEFAULT_CP &&
                             config->batch == DEFAULT_BATCH && config->seq_len == DEFAULT_SEQ &&
                             config->documents == DEFAULT_DOCUMENTS, "the default sizes");
}

int
cpmesh_bench_thd (int    argc,
                  char **argv)
{
  ThdBench bench = { { DEFAULT_CP, DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_DOCUMENTS, 20, 3 } };
  g_autoptr(GPtrArray) ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) rank_free);
  g_autoptr(GError) error = NULL;
  gboolean ok;

  if (!parse_thd_config (argc, argv, &bench.config))
    return CPMESH_EXIT_USAGE;
  for (int s = 0; s < N_SPANS; s++)
    cpmesh_spans_init (&bench.spans[s], bench.config.cp_size, bench.config.reps);
  for (int r = 0; r < bench.config.cp_size; r++)
    {
      ThdRank *rank = g_new0 (ThdRank, 1);

      rank->bench = &bench;
      g_ptr_array_add (ranks, rank);
    }
  cpmesh_progress ("making the packed batch of each of %d ranks", bench.config.cp_size);
  ok = cpmesh_bench_run_ranks (bench.config.cp_size, run_rank, ranks->pdata, &error);
  if (ok)
    thd_report (&bench, ((ThdRank *) g_ptr_array_index (ranks, 0))->local_bytes);
  for (int s = 0; s < N_SPANS; s++)
    cpmesh_spans_clear (&bench.spans[s]);
  return ok ? cpmesh_bench_end (&bench.config.run) : cpmesh_bench_fail (error);
}
