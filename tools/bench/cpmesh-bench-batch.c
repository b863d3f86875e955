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
 * every step.  The first step is checked: while entered, every buffer of
 * every rank must hold that rank's head-tail share, as worked out here,
 * and exit must give the position ids back.
 *
 * The sequence must be a multiple of 2·C: the benchmark times the path
 * without padding, so that the bytes moved are exactly a share of the
 * batch.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>

#include "cpmesh-bench.h"

#define N_BUFFERS 4

/* The sizes the targets are stated for. */
#define DEFAULT_CP 4
#define DEFAULT_BATCH 8
#define DEFAULT_SEQ 32768
#define DEFAULT_VOCAB 64

typedef struct
{
  int cp_size;
  gint64 batch;
  gint64 seq_len;
  gint64 vocab;
  int reps;
  int warmup;
  CpmeshBench run;
} Config;

typedef struct _Bench Bench;

/* The timed regions: the phases of a step, the step, and the baseline. */
enum { PREPARE, ENTER, EXIT, STEP, COPY, N_SPANS };

typedef struct
{
  CpmeshBenchRank base;
  Bench *bench;
  CpStorage *storage[N_BUFFERS];
  guint8 *destination;        /* the baseline's, this rank's share of the batch */
} Rank;

struct _Bench
{
  Config config;
  CpmeshSpans spans[N_SPANS];
  gsize full_bytes;      /* one rank's batch */
  gsize base_rss;        /* before any batch exists */
  gsize peak_rss;        /* during the first enter */
  gboolean peak_reset;
};

static const char *names[N_BUFFERS] = { "input_ids", "labels", "position_ids", "teacher_logits" };

enum { POSITION_IDS = 2, TEACHER_LOGITS = 3 };

static CpTensor *
view_buffer (Rank     *rank,
             int       buffer,
             GError  **error)
{
  Config *config = &rank->bench->config;
  gint64 shape[] = { config->batch, config->seq_len, config->vocab };

  return cp_tensor_new_from_storage (buffer == TEACHER_LOGITS ? CP_DTYPE_FLOAT32 : CP_DTYPE_INT64,
                                     shape, buffer == TEACHER_LOGITS ? 3 : 2,
                                     rank->storage[buffer], 0, error);
}

static gsize
buffer_bytes (Config *config,
              int     buffer)
{
  gsize bytes = (gsize) config->batch * (gsize) config->seq_len * 8;

  return buffer == TEACHER_LOGITS ? bytes / 2 * (gsize) config->vocab : bytes;
}

/* Writes every page, so the batch is resident before anything is timed:
 * position ids count along each row, the rest is the check pattern. */
static gboolean
fill_buffer (Rank     *rank,
             int       buffer,
             GError  **error)
{
  g_autoptr(CpTensor) tensor = view_buffer (rank, buffer, error);

  if (tensor == NULL)
    return FALSE;
  if (buffer == POSITION_IDS)
    {
      gint64 *positions = cp_tensor_get_data (tensor);

      for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
        positions[i] = i % rank->bench->config.seq_len;
    }
  else
    cpmesh_bench_fill_pattern (tensor, (guint64) buffer << 40);
  return TRUE;
}

static CpBatch *
view_batch (Rank     *rank,
            GError  **error)
{
  g_autoptr(CpBatch) batch = cp_batch_new ();

  for (int b = 0; b < N_BUFFERS; b++)
    {
      g_autoptr(CpTensor) tensor = view_buffer (rank, b, error);

      if (tensor == NULL)
        return NULL;
      cp_batch_set (batch, names[b], tensor);
    }
  cp_batch_set_seq_dim (batch, "teacher_logits", 1);
  return g_steal_pointer (&batch);
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
static gboolean
measure_peak (Rank    *rank,
              GError **error)
{
  if (!cp_mesh_barrier (rank->base.mesh, error))
    return FALSE;
  if (rank->base.rank == 0)
    rank->bench->peak_rss = status_bytes ("VmHWM:");
  return cp_mesh_barrier (rank->base.mesh, error);
}

/* While entered, every buffer holds this rank's share of the full one. */
static gboolean
check_entered (Rank     *rank,
               CpBatch  *batch,
               GError  **error)
{
  for (int b = 0; b < N_BUFFERS; b++)
    {
      g_autoptr(CpTensor) full = view_buffer (rank, b, error);

      if (full == NULL ||
          !cpmesh_bench_check_shard (full, cp_batch_get (batch, names[b]), 1,
                                     rank->bench->config.cp_size, rank->base.rank, names[b],
                                     error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
check_exited (Rank     *rank,
              CpBatch  *batch,
              GError  **error)
{
  g_autoptr(CpTensor) positions = view_buffer (rank, POSITION_IDS, error);

  if (positions == NULL)
    return FALSE;
  if (!cp_tensor_equal (cp_batch_get (batch, "position_ids"), positions))
    return cpmesh_bench_wrong (error, "position_ids: rank %d's are not the full ones after exit",
                               rank->base.rank);
  return TRUE;
}

/* One prepare + enter + exit.  The first, @checked, measures the peak
 * resident size while entered and checks the buffers; it is not timed. */
static gboolean
run_step (Rank     *rank,
          int       rep,
          gboolean  checked,
          GError  **error)
{
  CpMesh *mesh = rank->base.mesh;
  g_autoptr(CpBatch) batch = view_batch (rank, error);
  g_autoptr(CpContext) context = NULL;
  double t0, t1, t2, t3;

  if (batch == NULL || !cp_mesh_barrier (mesh, error))
    return FALSE;
  t0 = cpmesh_now_seconds ();
  if ((context = cp_batch_prepare (batch, mesh, NULL, error)) == NULL)
    return FALSE;
  t1 = cpmesh_now_seconds ();
  if (!cp_context_enter (context, error))
    return FALSE;
  t2 = cpmesh_now_seconds ();
  if (checked && !(measure_peak (rank, error) &&
                   cpmesh_bench_agree (mesh, check_entered (rank, batch, error), error)))
    return FALSE;
  if (!cp_context_exit (context, error))
    return FALSE;
  t3 = cpmesh_now_seconds ();
  if (checked)
    return cpmesh_bench_agree (mesh, check_exited (rank, batch, error), error);
  cpmesh_spans_record (&rank->bench->spans[PREPARE], rank->base.rank, rep, t0, t1);
  cpmesh_spans_record (&rank->bench->spans[ENTER], rank->base.rank, rep, t1, t2);
  cpmesh_spans_record (&rank->bench->spans[EXIT], rank->base.rank, rep, t2, t3);
  cpmesh_spans_record (&rank->bench->spans[STEP], rank->base.rank, rep, t0, t3);
  return TRUE;
}

static gboolean
timed_step (gpointer   rank,
            int        rep,
            GError   **error)
{
  return run_step (rank, rep, FALSE, error);
}

/* The baseline: copy this rank's share of every buffer — the bytes enter
 * moves — into a warm destination. */
static gboolean
run_copy (gpointer   data,
          int        rep,
          GError   **error)
{
  Rank *rank = data;
  const guint8 *shares[N_BUFFERS];
  gsize sizes[N_BUFFERS];

  for (int b = 0; b < N_BUFFERS; b++)
    {
      shares[b] = cp_storage_get_data (rank->storage[b]);
      sizes[b] = cp_storage_get_size (rank->storage[b]) / (gsize) rank->bench->config.cp_size;
    }
  return cpmesh_bench_timed_copy (&rank->base, rank->destination, shares, sizes, N_BUFFERS,
                                  &rank->bench->spans[COPY], rep, error);
}

static gboolean
run_rank (gpointer   data,
          GError   **error)
{
  Rank *rank = data;
  Bench *bench = rank->bench;
  Config *config = &bench->config;
  gsize share = bench->full_bytes / (gsize) config->cp_size;

  for (int b = 0; b < N_BUFFERS; b++)
    if ((rank->storage[b] = cp_storage_new (buffer_bytes (config, b), error)) == NULL ||
        !fill_buffer (rank, b, error))
      return FALSE;
  if (!cp_mesh_barrier (rank->base.mesh, error))   /* every batch resident */
    return FALSE;
  if (rank->base.rank == 0)
    {
      bench->peak_reset = reset_peak ();
      cpmesh_progress ("the first step, checked");
    }
  if (!run_step (rank, -1, TRUE, error))
    return FALSE;
  rank->destination = g_malloc0 (share);
  return cpmesh_bench_interleave (&rank->base, "steps", config->warmup, config->reps,
                                  timed_step, run_copy, error);
}

static void
rank_free (Rank *rank)
{
  for (int b = 0; b < N_BUFFERS; b++)
    g_clear_pointer (&rank->storage[b], cp_storage_unref);
  g_free (rank->destination);
  g_clear_error (&rank->base.error);
  g_free (rank);
}

static void
report (Bench *bench)
{
  Config *c = &bench->config;
  double step = cpmesh_spans_median_group (&bench->spans[STEP]);
  double copy = cpmesh_spans_median_group (&bench->spans[COPY]);
  double mib = 1024.0 * 1024.0;
  gsize local = bench->full_bytes / (gsize) c->cp_size;
  gsize budget = (gsize) c->cp_size * (bench->full_bytes + local);
  double peak = (double) (bench->peak_rss - bench->base_rss);

  g_print ("bench batch: %d in-process ranks; input_ids, labels, position_ids [%" G_GINT64_FORMAT
           ", %" G_GINT64_FORMAT "] int64, teacher_logits [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
           ", %" G_GINT64_FORMAT "] float32\n", c->cp_size, c->batch, c->seq_len, c->batch,
           c->seq_len, c->vocab);
  g_print ("  every rank's buffers checked while entered, and position ids after exit\n");
  g_print ("  bytes moved per rank: %.2f MiB (enter copies the local pieces; prepare pads nothing "
           "and exit restores position ids without copying)\n", local / mib);
  g_print ("  prepare + enter + exit, all ranks: %.3f ms (median of %d; slowest rank's prepare "
           "%.3f, enter %.3f, exit %.3f)\n", step * 1e3, c->reps,
           cpmesh_spans_median_slowest (&bench->spans[PREPARE]) * 1e3,
           cpmesh_spans_median_slowest (&bench->spans[ENTER]) * 1e3,
           cpmesh_spans_median_slowest (&bench->spans[EXIT]) * 1e3);
  g_print ("  memcpy of the same bytes, same threads, all ranks: %.3f ms\n", copy * 1e3);
  g_print ("  peak RSS during enter: %.1f MiB above the start%s\n", peak / mib,
           bench->peak_reset ? "" : " (the peak counter could not be reset; this includes setup)");
  g_print ("  full batch + local copy, every rank: %.1f MiB (%.1f + %.1f per rank)\n",
           budget / mib, bench->full_bytes / mib, local / mib);
  cpmesh_bench_target (&c->run, "prepare + enter + exit against memcpy of the same bytes",
                       step / copy, CPMESH_AT_MOST, 1.5);
  cpmesh_bench_target (&c->run, "peak RSS during enter against the full batch and local copy "
                       "of every rank", peak / (double) budget, CPMESH_AT_MOST, 1.1);
}

static gboolean
parse_config (int      argc,
              char   **argv,
              Config  *config)
{
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&config->cp_size, ", one thread each (default 4)"),
    CPMESH_OPTION_BATCH (&config->batch, " (default 8)"),
    CPMESH_OPTION_SEQ (&config->seq_len, ", a multiple of 2·C (default 32768, 4096 with --quick)"),
    { "vocab", 'v', CPMESH_VALUE_INT64, &config->vocab,
      "teacher_logits' last dimension (default 64)", "V", 1, 1 << 20, NULL, FALSE },
    CPMESH_OPTION_REPS (&config->reps, " (default 20, 5 with --quick)"),
    CPMESH_OPTION_WARMUP (&config->warmup, " (default 3, 1 with --quick)"),
    CPMESH_OPTION_QUICK (&config->run.quick, ": a sequence of 4096"),
    CPMESH_OPTION_CHECK_TARGETS (&config->run.check_targets),
    CPMESH_OPTION_END
  };

  if (!cpmesh_parse_options ("Time prepare + enter + exit of a batch (input_ids, labels, "
                             "position_ids and teacher_logits) on C in-process ranks against "
                             "memcpy of the bytes enter moves, and the peak resident memory "
                             "during enter against the full batch and local copy of every rank. "
                             "The buffers are checked while entered and after exit before any "
                             "figure is printed.", entries, NULL, &argc, &argv))
    return FALSE;
  if (config->run.quick && !cpmesh_option_given (entries, "seq"))
    config->seq_len = 4096;
  if (config->run.quick && !cpmesh_option_given (entries, "reps"))
    config->reps = 5;
  if (config->run.quick && !cpmesh_option_given (entries, "warmup"))
    config->warmup = 1;
  return cpmesh_check_divisible ("--seq", config->seq_len, config->cp_size) &&
         cpmesh_bench_begin (&config->run, config->cp_size == DEFAULT_CP &&
                             config->batch == DEFAULT_BATCH && config->seq_len == DEFAULT_SEQ &&
                             config->vocab == DEFAULT_VOCAB, "the default sizes");
}

int
cpmesh_bench_batch (int    argc,
                    char **argv)
{
  Bench bench = { .config = { DEFAULT_CP, DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_VOCAB, 20, 3 } };
  g_autoptr(GPtrArray) ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) rank_free);
  g_autoptr(GError) error = NULL;
  gboolean ok;

  if (!parse_config (argc, argv, &bench.config))
    return CPMESH_EXIT_USAGE;
  for (int b = 0; b < N_BUFFERS; b++)
    bench.full_bytes += buffer_bytes (&bench.config, b);
  for (int s = 0; s < N_SPANS; s++)
    cpmesh_spans_init (&bench.spans[s], bench.config.cp_size, bench.config.reps);
  for (int r = 0; r < bench.config.cp_size; r++)
    {
      Rank *rank = g_new0 (Rank, 1);

      rank->bench = &bench;
      g_ptr_array_add (ranks, rank);
    }
  bench.base_rss = status_bytes ("VmRSS:");
  cpmesh_progress ("filling the batch of each of %d ranks", bench.config.cp_size);
  ok = cpmesh_bench_run_ranks (bench.config.cp_size, run_rank, ranks->pdata, &error);
  if (ok)
    report (&bench);
  for (int s = 0; s < N_SPANS; s++)
    cpmesh_spans_clear (&bench.spans[s]);
  return ok ? cpmesh_bench_end (&bench.config.run) : cpmesh_bench_fail (error);
}
