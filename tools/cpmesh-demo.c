/* cpmesh-demo.c: cpmesh demo, the project's main job
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cpmesh-tool.h"

/* Every rank of an in-process mesh loads the same training batch (token
 * ids, labels, and the query, key, value and output-gradient tensors of one
 * attention layer), prepares it — padding the sequence to a multiple of 2·C
 * — enters the context, which shards every buffer in place, runs
 * context-parallel attention forward and backward on its local positions,
 * exits, and gathers the results back.  The gathered ids must equal the
 * padded originals bit for bit, and the gathered attention output and
 * gradients must match single-rank attention on the full sequence.
 *
 * Each stage is a function of DemoRank in a table; every rank runs the
 * table in order on its own thread and its time per stage is printed. */

typedef struct
{
  int n_ranks;
  gint64 batch;
  gint64 seq_len;
  gint64 heads;
  gint64 head_dim;
  char *rotate;
  char *backend;         /* "local" (threads) or "ucx" (this process is one rank) */
  int timeout_ms;
} DemoOptions;

/* The attention buffers, [B, H, S, D] with the sequence on axis 2. */
enum { Q, K, V, DOUT, N_QKV };
static const char *qkv_names[N_QKV] = { "q", "k", "v", "dout" };

/* What the ranks compare against, computed once before they start. */
enum { OUT, DQ, DK, DV, N_RESULTS };
static const char *result_names[N_RESULTS] = { "out", "dq", "dk", "dv" };

/* Token ids start here, so that padding zeros never pass for ids. */
#define FIRST_ID 100000

typedef struct
{
  DemoOptions *options;
  CpRotateMethod rotate;
  gint64 padded_len;
  CpLayout *layout;
  CpTensor *input_ids;           /* [B, S]: what every rank loads */
  CpTensor *labels;
  CpTensor *qkv[N_QKV];
  CpTensor *padded_ids;          /* [B, S_pad]: what gathering must give */
  CpTensor *reference[N_RESULTS];
} Demo;

typedef struct
{
  Demo *demo;
  CpMesh *mesh;
  int rank;
  CpBatch *batch;
  CpContext *context;
  CpAttention *attention;
  CpTensor *results[N_RESULTS];  /* local, then gathered */
  CpTensor *lse;
  CpTensor *gathered_ids;
  double max_error[N_RESULTS];
  double *seconds;
  int failed_stage;
  GError *error;
} DemoRank;

typedef gboolean (*DemoStageFunc) (DemoRank  *self,
                                   GError   **error);

static CpAttentionOptions *
attention_options (Demo *demo)
{
  CpAttentionOptions *options = cp_attention_options_new ();
  g_autofree gint64 *seq_lens = g_new (gint64, demo->options->batch);

  /* The padded tail is masked out by the real length, not by its values. */
  for (gint64 b = 0; b < demo->options->batch; b++)
    seq_lens[b] = demo->options->seq_len;
  cp_attention_options_set_causal (options, TRUE);
  cp_attention_options_set_rotate_method (options, demo->rotate);
  cp_attention_options_set_seq_lens (options, seq_lens, (gsize) demo->options->batch);
  return options;
}

/* Prepare pads the sequence of every registered buffer, attention inputs
 * included (extra buffers on axis 2), and returns the context. */
static gboolean
stage_prepare (DemoRank  *self,
               GError   **error)
{
  g_autoptr(CpBatchOptions) options = cp_batch_options_new ();

  cp_batch_options_set_rotate_method (options, self->demo->rotate);
  for (int i = 0; i < N_QKV; i++)
    cp_batch_options_add_extra_buffer (options, qkv_names[i], 2);
  self->context = cp_batch_prepare (self->batch, self->mesh, options, error);
  return self->context != NULL;
}

static gboolean
stage_enter (DemoRank  *self,
             GError   **error)
{
  return cp_context_enter (self->context, error);
}

static gboolean
stage_attention (DemoRank  *self,
                 GError   **error)
{
  g_autoptr(CpAttentionOptions) options = attention_options (self->demo);
  CpTensor *qkv[N_QKV];

  for (int i = 0; i < N_QKV; i++)
    qkv[i] = cp_batch_get (self->batch, qkv_names[i]);
  self->attention = cp_attention_new (self->mesh, options, error);
  return self->attention != NULL &&
         cp_attention_forward (self->attention, qkv[Q], qkv[K], qkv[V],
                               &self->results[OUT], &self->lse, error) &&
         cp_attention_backward (self->attention, qkv[DOUT], qkv[Q], qkv[K], qkv[V],
                                self->results[OUT], self->lse, &self->results[DQ],
                                &self->results[DK], &self->results[DV], error);
}

static gboolean
stage_exit (DemoRank  *self,
            GError   **error)
{
  return cp_context_exit (self->context, error);
}

/* Exit restores position ids only: the ids stay local, as in training. */
static gboolean
stage_gather (DemoRank  *self,
              GError   **error)
{
  self->gathered_ids = cp_mesh_unshard (self->mesh, cp_batch_get (self->batch, "input_ids"),
                                        1, error);
  if (self->gathered_ids == NULL)
    return FALSE;
  for (int i = 0; i < N_RESULTS; i++)
    {
      CpTensor *full = cp_mesh_unshard (self->mesh, self->results[i], 2, error);

      if (full == NULL)
        return FALSE;
      g_object_unref (self->results[i]);
      self->results[i] = full;
    }
  return TRUE;
}

static double
max_abs_difference (CpTensor *a,
                    CpTensor *b)
{
  const float *x = cp_tensor_get_data (a);
  const float *y = cp_tensor_get_data (b);
  double worst = 0.0;

  for (gint64 i = 0; i < cp_tensor_get_numel (a); i++)
    worst = MAX (worst, fabs ((double) x[i] - (double) y[i]));
  return worst;
}

/* float32 through the same blocked kernel on 1 and C ranks: only the
 * order of the partial sums differs. */
#define TOLERANCE 1e-4

static gboolean
stage_verify (DemoRank  *self,
              GError   **error)
{
  if (!cp_tensor_equal (self->gathered_ids, self->demo->padded_ids))
    {
      g_set_error_literal (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                           "input_ids: the gathered ids differ from the padded batch");
      return FALSE;
    }
  for (int i = 0; i < N_RESULTS; i++)
    {
      self->max_error[i] = max_abs_difference (self->results[i], self->demo->reference[i]);
      if (!(self->max_error[i] <= TOLERANCE))
        {
          g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_FAILED,
                       "%s differs from single-rank attention by %.3g (tolerance %.0e)",
                       result_names[i], self->max_error[i], TOLERANCE);
          return FALSE;
        }
    }
  return TRUE;
}

static const struct
{
  const char *name;
  DemoStageFunc run;
} stages[] = {
  { "prepare", stage_prepare },
  { "enter", stage_enter },
  { "attention", stage_attention },
  { "exit", stage_exit },
  { "gather", stage_gather },
  { "verify", stage_verify },
};

/* A rank that fails stops there; its peers' next collective then fails
 * too, within the mesh's timeout.  The ranks start together, so that the
 * first collective's time is not the other threads' start-up. */
static void
rank_main (CpMesh   *mesh,
           gpointer  data)
{
  DemoRank *self = data;

  if (!cp_mesh_barrier (mesh, &self->error))
    {
      self->failed_stage = 0;
      return;
    }
  for (gsize s = 0; s < G_N_ELEMENTS (stages); s++)
    {
      double start = cpmesh_now_seconds ();

      if (!stages[s].run (self, &self->error))
        {
          self->failed_stage = (int) s;
          return;
        }
      self->seconds[s] = cpmesh_now_seconds () - start;
    }
}

static void
demo_rank_free (DemoRank *self)
{
  for (int i = 0; i < N_RESULTS; i++)
    g_clear_object (&self->results[i]);
  g_clear_object (&self->lse);
  g_clear_object (&self->gathered_ids);
  g_clear_object (&self->attention);
  g_clear_object (&self->context);
  g_clear_object (&self->batch);
  g_free (self->seconds);
  g_clear_error (&self->error);
  g_free (self);
}

static void
load_copy (CpBatch    *batch,
           const char *key,
           CpTensor   *source)
{
  g_autoptr(CpTensor) copy = cp_tensor_copy (source, NULL);

  g_assert (copy != NULL);
  cp_batch_set (batch, key, copy);
}

/* Every rank loads its own copy of the whole batch, as every process of a
 * real job reads the same batch from its data loader. */
static DemoRank *
demo_rank_new (Demo   *demo,
               CpMesh *mesh)
{
  DemoRank *self = g_new0 (DemoRank, 1);

  self->demo = demo;
  self->mesh = mesh;
  self->rank = cp_mesh_get_rank (mesh);
  self->seconds = g_new0 (double, G_N_ELEMENTS (stages));
  self->failed_stage = -1;
  self->batch = cp_batch_new ();
  load_copy (self->batch, "input_ids", demo->input_ids);
  load_copy (self->batch, "labels", demo->labels);
  for (int i = 0; i < N_QKV; i++)
    load_copy (self->batch, qkv_names[i], demo->qkv[i]);
  return self;
}

/* Values in [-1, 1) from a fixed linear congruential sequence: the same
 * inputs on every run and every machine. */
static CpTensor *
new_random (const gint64 *shape,
            guint         n_dims,
            guint32       seed,
            GError      **error)
{
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_FLOAT32, shape, n_dims, error);
  float *data;

  if (tensor == NULL)
    return NULL;
  data = cp_tensor_get_data (tensor);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    {
      seed = seed * 1664525u + 1013904223u;
      data[i] = (float) (seed >> 8) / (float) (1 << 23) - 1.0f;
    }
  return tensor;
}

/* A [B, S] int64 view of first, first + 1, … */
static CpTensor *
new_sequence_ids (const gint64  *shape,
                  gint64         first,
                  GError       **error)
{
  g_autoptr(CpTensor) flat = cp_tensor_new_arange (CP_DTYPE_INT64, first,
                                                   first + shape[0] * shape[1], 1, error);

  if (flat == NULL)
    return NULL;
  return cp_tensor_new_from_storage (CP_DTYPE_INT64, shape, 2, cp_tensor_get_storage (flat), 0,
                                     error);
}

static gboolean
make_batch (Demo     *demo,
            GError  **error)
{
  DemoOptions *o = demo->options;
  gint64 ids_shape[] = { o->batch, o->seq_len };
  gint64 qkv_shape[] = { o->batch, o->heads, o->seq_len, o->head_dim };

  demo->input_ids = new_sequence_ids (ids_shape, FIRST_ID, error);
  if (demo->input_ids == NULL)
    return FALSE;
  demo->labels = new_sequence_ids (ids_shape, 1, error);
  if (demo->labels == NULL)
    return FALSE;
  for (int i = 0; i < N_QKV; i++)
    if ((demo->qkv[i] = new_random (qkv_shape, 4, 17u + (guint32) i, error)) == NULL)
      return FALSE;
  return TRUE;
}

/* Single-rank attention on the full sequence, padded as prepare pads it. */
static gboolean
compute_reference (Demo     *demo,
                   GError  **error)
{
  g_autoptr(GList) meshes = cp_harness_local_group ("cp", 1, (guint) demo->options->timeout_ms, error);
  g_autoptr(CpAttentionOptions) options = attention_options (demo);
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) lse = NULL;
  CpTensor *padded[N_QKV] = { NULL };
  gboolean ok = FALSE;

  if (meshes == NULL)
    return FALSE;
  attention = cp_attention_new (meshes->data, options, error);
  for (int i = 0; attention != NULL && i < N_QKV; i++)
    if ((padded[i] = cpmesh_pad_sequence (demo->qkv[i], 2, demo->padded_len, 0.0, error)) == NULL)
      goto out;
  ok = attention != NULL &&
       cp_attention_forward (attention, padded[Q], padded[K], padded[V],
                             &demo->reference[OUT], &lse, error) &&
       cp_attention_backward (attention, padded[DOUT], padded[Q], padded[K], padded[V],
                              demo->reference[OUT], lse, &demo->reference[DQ],
                              &demo->reference[DK], &demo->reference[DV], error);
out:
  for (int i = 0; i < N_QKV; i++)
    g_clear_object (&padded[i]);
  g_list_free_full (g_steal_pointer (&meshes), g_object_unref);
  return ok;
}

static gboolean
demo_init (Demo     *demo,
           GError  **error)
{
  gint64 divisor = 2 * (gint64) demo->options->n_ranks;

  demo->padded_len = (demo->options->seq_len + divisor - 1) / divisor * divisor;
  demo->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, demo->padded_len,
                                demo->options->n_ranks, error);
  if (demo->layout == NULL || !make_batch (demo, error))
    return FALSE;
  demo->padded_ids = cpmesh_pad_sequence (demo->input_ids, 1, demo->padded_len, 0.0, error);
  return demo->padded_ids != NULL && compute_reference (demo, error);
}

static void
demo_clear (Demo *demo)
{
  g_clear_object (&demo->input_ids);
  g_clear_object (&demo->labels);
  g_clear_object (&demo->padded_ids);
  for (int i = 0; i < N_QKV; i++)
    g_clear_object (&demo->qkv[i]);
  for (int i = 0; i < N_RESULTS; i++)
    g_clear_object (&demo->reference[i]);
  g_clear_pointer (&demo->layout, cp_layout_unref);
  g_clear_pointer (&demo->options->rotate, g_free);
  g_clear_pointer (&demo->options->backend, g_free);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Demo, demo_clear)

static void
print_plan (Demo *demo)
{
  DemoOptions *o = demo->options;
  g_autoptr(CpLayout) contiguous = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, demo->padded_len,
                                                  o->n_ranks, NULL);

  if (g_str_equal (o->backend, "local"))
    g_print ("cpmesh demo: %d ranks on threads of one process, head-tail layout, %s rotation\n", o->n_ranks,
             o->rotate);
  else
    g_print ("cpmesh demo: %d ranks in processes of their own, over %s, head-tail layout, %s rotation\n",
             o->n_ranks, g_str_equal (o->backend, "ucx") ? "UCX" : o->backend, o->rotate);
  g_print ("batch: input_ids and labels int64[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]; "
           "q, k, v, dout float32[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
           ", %" G_GINT64_FORMAT "]\n", o->batch, o->seq_len, o->batch, o->heads, o->seq_len,
           o->head_dim);
  g_print ("layout: %" G_GINT64_FORMAT " positions padded to %" G_GINT64_FORMAT
           ", causal-cost imbalance %.2f (contiguous would be %.2f)\n", o->seq_len,
           demo->padded_len, cp_layout_get_imbalance (demo->layout),
           cp_layout_get_imbalance (contiguous));
  for (int r = 0; r < o->n_ranks; r++)
    {
      g_autofree char *positions = cpmesh_format_positions (demo->layout, r);

      g_print ("  rank %d: %s\n", r, positions);
    }
}

static void
print_rank (GString  *out,
            DemoRank *rank)
{
  g_string_append_printf (out, "%4d", rank->rank);
  for (gsize s = 0; s < G_N_ELEMENTS (stages); s++)
    if (rank->failed_stage < 0 || (int) s < rank->failed_stage)
      g_string_append_printf (out, "  %9.3f", rank->seconds[s] * 1e3);
    else
      g_string_append_printf (out, "  %9s", "-");
  if (rank->failed_stage < 0)
    g_string_append_printf (out, "  ok\n");
  else
    g_string_append_printf (out, "  FAILED in %s: %s\n", stages[rank->failed_stage].name, rank->error->message);
}

static void
print_errors (GString   *out,
              GPtrArray *ranks)
{
  double worst[N_RESULTS] = { 0 };

  for (guint r = 0; r < ranks->len; r++)
    for (int i = 0; i < N_RESULTS; i++)
      worst[i] = MAX (worst[i], ((DemoRank *) g_ptr_array_index (ranks, r))->max_error[i]);
  g_string_append_printf (out, "max |error| against single-rank attention on the full sequence:");
  for (int i = 0; i < N_RESULTS; i++)
    g_string_append_printf (out, " %s %.2e%s", result_names[i], worst[i], i + 1 < N_RESULTS ? "," : "\n");
}

static void
print_header (GString *out)
{
  g_string_append (out, "rank");
  for (gsize s = 0; s < G_N_ELEMENTS (stages); s++)
    g_string_append_printf (out, "  %9s", stages[s].name);
  g_string_append_printf (out, "  (ms)\n");
}

/* Prints the per-rank table and the verdict; returns whether all passed. */
static gboolean
print_results (GPtrArray *ranks)
{
  g_autoptr(GString) out = g_string_new (NULL);
  guint failed = 0;

  print_header (out);
  for (guint r = 0; r < ranks->len; r++)
    {
      DemoRank *rank = g_ptr_array_index (ranks, r);

      print_rank (out, rank);
      failed += rank->failed_stage >= 0;
    }
  if (failed > 0)
    {
      g_string_append_printf (out, "FAIL: %u of %u ranks failed\n", failed, ranks->len);
      g_print ("%s", out->str);
      return FALSE;
    }
  print_errors (out, ranks);
  g_string_append_printf (out, "PASS: all %u ranks ran attention on their shards, matched "
                          "single-rank attention within %.0e and gathered the batch back "
                          "bit-exactly\n", ranks->len, TOLERANCE);
  g_print ("%s", out->str);
  return TRUE;
}

static int
run_ranks (Demo *demo)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_harness_local_group ("cp", demo->options->n_ranks, (guint) demo->options->timeout_ms,
                                          &error);
  g_autoptr(GPtrArray) ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) demo_rank_free);
  gboolean passed;

  if (meshes == NULL)
    return cpmesh_fail_error (error);
  for (GList *l = meshes; l != NULL; l = l->next)
    g_ptr_array_add (ranks, demo_rank_new (demo, l->data));
  cp_harness_run_threads (meshes, rank_main, ranks->pdata, 0, NULL);
  passed = print_results (ranks);
  g_list_free_full (meshes, g_object_unref);
  return passed ? 0 : CPMESH_EXIT_FAILED;
}

/* --backend ucx: this process is one rank of a mesh that cpmesh launch,
 * mpirun or srun started; it prints its own row and verdict. */
static int
run_process_rank (Demo   *demo,
                  CpMesh *mesh)
{
  g_autoptr(GPtrArray) ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) demo_rank_free);
  DemoRank *rank = demo_rank_new (demo, mesh);
  g_autoptr(GString) out = g_string_new (NULL);
  gboolean passed;

  g_ptr_array_add (ranks, rank);
  rank_main (mesh, rank);
  print_header (out);
  print_rank (out, rank);
  passed = rank->failed_stage < 0;
  if (passed)
    {
      print_errors (out, ranks);
      g_string_append_printf (out, "PASS: rank %d of %d matched single-rank attention within "
                              "%.0e and gathered the batch back bit-exactly\n", rank->rank,
                              demo->options->n_ranks, TOLERANCE);
    }
  /* One write: under a launcher each rank's report stays in one piece. */
  g_print ("%s", out->str);
  return passed ? 0 : CPMESH_EXIT_FAILED;
}

static int
run_ucx (Demo *demo)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  /* --backend ucx asks for UCX, which on one host is not the default
   * chain's pick; CPMESH_TRANSPORT may still name another. */
  if (g_getenv ("CPMESH_TRANSPORT") == NULL)
    g_setenv ("CPMESH_TRANSPORT", "ucx", FALSE);
  mesh = cp_mesh_new_from_env (&error);
  if (mesh == NULL)
    return cpmesh_fail_error (error);
  /* What the plan names: the transport the mesh runs on. */
  g_free (demo->options->backend);
  demo->options->backend = g_strdup (cp_mesh_get_backend (mesh));
  cp_mesh_set_timeout_ms (mesh, (guint) demo->options->timeout_ms);
  demo->options->n_ranks = cp_mesh_get_world_size (mesh);
  if (!demo_init (demo, &error))
    return cpmesh_fail_error (error);
  if (cp_mesh_get_rank (mesh) == 0)
    print_plan (demo);
  return run_process_rank (demo, mesh);
}

/* The values of --rotate; "ring" is alltoall's other name. */
static const char * const rotate_names[] = { "allgather", "alltoall", "ring", NULL };

/* Under a launcher, a demo that runs its own threads in every process
 * would print N separate passes: the backend must be chosen. */
static gboolean
check_backend (CpmeshOption *entries,
               int           backend)
{
  g_autofree char *launcher = NULL;

  if (backend == CPMESH_BACKEND_UCX && cpmesh_option_given (entries, "cp"))
    cpmesh_fail (CPMESH_EXIT_USAGE, "--cp goes with --backend local: over UCX the launcher "
                 "sets the number of ranks");
  else if (backend == CPMESH_BACKEND_UCX && !CP_HAS_UCX)
    cpmesh_fail (CPMESH_EXIT_USAGE, "--backend ucx: this libcpmesh was built without UCX");
  else if (!cpmesh_option_given (entries, "backend") && cpmesh_launched_as_rank (&launcher))
    cpmesh_fail (CPMESH_EXIT_USAGE, "a launcher started this process as one of several ranks "
                 "(%s), but no --backend was given: add --backend ucx to run one demo over the "
                 "launcher's mesh, or --backend local to run a whole demo of threads in every "
                 "process", launcher);
  else
    return TRUE;
  return FALSE;
}

int
cpmesh_demo (int    argc,
             char **argv)
{
  DemoOptions options = { .n_ranks = 4, .batch = 1, .seq_len = 4090, .heads = 4,
                          .head_dim = 64, .timeout_ms = 60000 };
  int rotate = 0, backend = CPMESH_BACKEND_LOCAL;
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&options.n_ranks, ", one thread each (default 4)"),
    CPMESH_OPTION_BATCH (&options.batch, " (default 1)"),
    CPMESH_OPTION_SEQ (&options.seq_len, ", padded to a multiple of 2·C (default 4090)"),
    { "heads", 'H', CPMESH_VALUE_INT64, &options.heads, "Attention heads (default 4)", "H",
      1, 4096, NULL, FALSE },
    { "head-dim", 'D', CPMESH_VALUE_INT64, &options.head_dim, "Head dimension (default 64)", "D",
      1, 4096, NULL, FALSE },
    { "rotate", 0, CPMESH_VALUE_CHOICE, &rotate, "How K/V move: allgather (the default), or "
      "alltoall, also called ring: around the ring, one step at a time", "METHOD", 0, 0,
      rotate_names, FALSE },
    { "timeout-ms", 0, CPMESH_VALUE_INT, &options.timeout_ms,
      "How long a rank waits for its peers (default 60000)", "MS", 1, G_MAXINT32, NULL, FALSE },
    CPMESH_OPTION_BACKEND (&backend, "; with ucx this process is one rank of the mesh its "
                           "launcher started (default local; under a launcher of several ranks, "
                           "give it: the demo refuses to guess)"),
    CPMESH_OPTION_END
  };
  g_auto(Demo) demo = { &options };
  g_autoptr(GError) error = NULL;

  if (!cpmesh_parse_options ("Run ranks as threads of one process (or, with --backend ucx, "
                             "as processes): every rank loads the same batch, prepares it, enters the context (which shards every buffer "
                             "in place), runs causal context-parallel attention forward and "
                             "backward, exits, and gathers the results back. Checks the ids "
                             "bit-exactly and the attention output and gradients against "
                             "single-rank attention on the full sequence. Exits 0 only when "
                             "every rank passes.", entries, NULL, &argc, &argv) ||
      !check_backend (entries, backend))
    return CPMESH_EXIT_USAGE;
  demo.rotate = rotate == 0 ? CP_ROTATE_METHOD_ALLGATHER : CP_ROTATE_METHOD_ALLTOALL;
  options.rotate = g_strdup (rotate == 0 ? "allgather" : "alltoall");
  options.backend = g_strdup (cpmesh_backend_names[backend]);
  if (g_str_equal (options.backend, "ucx"))
    return run_ucx (&demo);
  cpmesh_progress ("single-rank attention on the full sequence, the reference");
  if (!demo_init (&demo, &error))
    return cpmesh_fail_error (error);
  print_plan (&demo);
  cpmesh_progress ("%d ranks", options.n_ranks);
  return run_ranks (&demo);
}
