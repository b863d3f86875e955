/* cpmesh-demo.c: cpmesh demo, the project's main job
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "cpmesh-tool.h"

/* A run of the demo is a batch of buffers and a list of stages that every
 * rank runs in order on its own thread.  Each stage reads what the earlier
 * ones left in DemoRank; new work (batch preparation, attention) is a new
 * stage in the table and, where it needs one, a new buffer. */

typedef struct
{
  int n_ranks;
  gint64 batch;
  gint64 seq_len;
  gint64 hidden;
  int timeout_ms;
  const char *backend;   /* "local" or "ucx" */
} DemoOptions;

typedef struct
{
  const char *name;
  CpDType dtype;
  int seq_dim;
  CpTensor *full;        /* the original: read-only while the ranks run */
} DemoBuffer;

enum { HIDDEN_STATES, INPUT_IDS, N_BUFFERS };

/* Token ids start here, so that a piece of zeros never passes for ids. */
#define FIRST_ID 100000

typedef struct
{
  DemoOptions *options;
  DemoBuffer buffers[N_BUFFERS];
  CpLayout *layout;
} Demo;

typedef struct
{
  Demo *demo;
  CpMesh *mesh;
  int rank;
  CpTensor *local[N_BUFFERS];
  CpTensor *restored[N_BUFFERS];
  double *seconds;       /* per stage */
  int failed_stage;      /* -1 while every stage succeeded */
  GError *error;
} DemoRank;

typedef gboolean (*DemoStageFunc) (DemoRank  *self,
                                   GError   **error);

/* Each rank takes its own positions out of the full batch, as a data
 * loader that reads the whole batch on every rank does. */
static gboolean
stage_shard (DemoRank  *self,
             GError   **error)
{
  for (int b = 0; b < N_BUFFERS; b++)
    {
      DemoBuffer *buffer = &self->demo->buffers[b];

      self->local[b] = cp_layout_shard (self->demo->layout, buffer->full, buffer->seq_dim,
                                        self->rank, error);
      if (self->local[b] == NULL)
        return FALSE;
    }
  return TRUE;
}

/* All-gather in rank order, then undo the head-tail permutation. */
static gboolean
stage_unshard (DemoRank  *self,
               GError   **error)
{
  for (int b = 0; b < N_BUFFERS; b++)
    {
      self->restored[b] = cp_mesh_unshard (self->mesh, self->local[b],
                                           self->demo->buffers[b].seq_dim, error);
      if (self->restored[b] == NULL)
        return FALSE;
    }
  return TRUE;
}

/* The ids encode their global position, so the local piece shows whether
 * this rank holds exactly the positions the layout printed. */
static gboolean
check_local_ids (DemoRank  *self,
                 GError   **error)
{
  g_autoptr(CpTensor) positions = cp_layout_get_local_indices (self->demo->layout, self->rank);
  const gint64 *position = cp_tensor_get_data (positions);
  const gint64 *ids = cp_tensor_get_data (self->local[INPUT_IDS]);
  gint64 local_len = cp_tensor_get_numel (positions);
  gint64 seq_len = self->demo->options->seq_len;

  for (gint64 row = 0; row < self->demo->options->batch; row++)
    for (gint64 j = 0; j < local_len; j++)
      if (ids[row * local_len + j] != FIRST_ID + row * seq_len + position[j])
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                       "input_ids: local position %" G_GINT64_FORMAT " of row %" G_GINT64_FORMAT
                       " holds id %" G_GINT64_FORMAT ", not that of global position %"
                       G_GINT64_FORMAT, j, row, ids[row * local_len + j], position[j]);
          return FALSE;
        }
  return TRUE;
}

static gboolean
stage_verify (DemoRank  *self,
              GError   **error)
{
  if (!check_local_ids (self, error))
    return FALSE;
  for (int b = 0; b < N_BUFFERS; b++)
    if (!cp_tensor_equal (self->restored[b], self->demo->buffers[b].full))
      {
        g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                     "%s: the unsharded tensor differs from the original",
                     self->demo->buffers[b].name);
        return FALSE;
      }
  return TRUE;
}

static const struct
{
  const char *name;
  DemoStageFunc run;
} stages[] = {
  { "shard", stage_shard },
  { "unshard", stage_unshard },
  { "verify", stage_verify },
};

/* A rank that fails stops there; its peers' next collective then fails
 * too, with the mesh's timeout at worst.  The ranks start together, so
 * that the first collective's time is not the other threads' start-up. */
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
  for (int b = 0; b < N_BUFFERS; b++)
    {
      g_clear_object (&self->local[b]);
      g_clear_object (&self->restored[b]);
    }
  g_free (self->seconds);
  g_clear_error (&self->error);
  g_free (self);
}

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
  return self;
}

/* Element i of a buffer holds i (offset for ids): a known pattern that
 * arange writes without an element loop here. */
static CpTensor *
new_pattern (CpDType        dtype,
             const gint64  *shape,
             guint          n_dims,
             gint64         first,
             GError       **error)
{
  guint64 numel = 1;
  g_autoptr(CpTensor) flat = NULL;

  for (guint d = 0; d < n_dims; d++)
    if (!g_uint64_checked_mul (&numel, numel, (guint64) shape[d]) ||
        numel > (guint64) (G_MAXINT64 - first))
      {
        g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                     "a %s buffer of this shape has more elements than fit in 64 bits",
                     cp_dtype_get_name (dtype));
        return NULL;
      }
  flat = cp_tensor_new_arange (dtype, first, first + (gint64) numel, 1, error);
  if (flat == NULL)
    return NULL;
  return cp_tensor_new_from_storage (dtype, shape, n_dims, cp_tensor_get_storage (flat),
                                     cp_tensor_get_storage_offset (flat), error);
}

static gboolean
demo_init (Demo     *demo,
           GError  **error)
{
  DemoOptions *options = demo->options;
  gint64 hidden_shape[] = { options->batch, options->seq_len, options->hidden };
  gint64 ids_shape[] = { options->batch, options->seq_len };

  demo->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, options->seq_len, options->n_ranks, error);
  if (demo->layout == NULL)
    return FALSE;
  demo->buffers[HIDDEN_STATES] = (DemoBuffer) { "hidden_states", CP_DTYPE_FLOAT32, 1, NULL };
  demo->buffers[INPUT_IDS] = (DemoBuffer) { "input_ids", CP_DTYPE_INT64, 1, NULL };
  demo->buffers[HIDDEN_STATES].full = new_pattern (CP_DTYPE_FLOAT32, hidden_shape, 3, 0, error);
  if (demo->buffers[HIDDEN_STATES].full == NULL)
    return FALSE;
  demo->buffers[INPUT_IDS].full = new_pattern (CP_DTYPE_INT64, ids_shape, 2, FIRST_ID, error);
  return demo->buffers[INPUT_IDS].full != NULL;
}

static void
demo_clear (Demo *demo)
{
  for (int b = 0; b < N_BUFFERS; b++)
    g_clear_object (&demo->buffers[b].full);
  g_clear_pointer (&demo->layout, cp_layout_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Demo, demo_clear)

static void
print_plan (Demo *demo)
{
  g_autoptr(CpLayout) contiguous = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, demo->options->seq_len,
                                                  demo->options->n_ranks, NULL);

  g_print ("cpmesh demo: %d ranks %s, head-tail layout\n", demo->options->n_ranks,
           g_str_equal (demo->options->backend, "ucx") ? "in processes of their own, over UCX"
                                                       : "on threads of one process");
  g_print ("batch:\n");
  for (int b = 0; b < N_BUFFERS; b++)
    {
      g_autofree char *description = cp_tensor_describe (demo->buffers[b].full);

      g_print ("  %-14s %s, sequence dim %d\n", demo->buffers[b].name, description,
               demo->buffers[b].seq_dim);
    }
  g_print ("layout: %" G_GINT64_FORMAT " positions, causal-cost imbalance %.2f "
           "(contiguous would be %.2f)\n", demo->options->seq_len,
           cp_layout_get_imbalance (demo->layout), cp_layout_get_imbalance (contiguous));
  for (int r = 0; r < demo->options->n_ranks; r++)
    {
      g_autofree char *positions = cpmesh_format_positions (demo->layout, r);

      g_print ("  rank %d: %s\n", r, positions);
    }
}

static void
print_rank (DemoRank *rank)
{
  g_print ("%4d", rank->rank);
  for (gsize s = 0; s < G_N_ELEMENTS (stages); s++)
    if (rank->failed_stage < 0 || (int) s < rank->failed_stage)
      g_print ("  %10.3f", rank->seconds[s] * 1e3);
    else
      g_print ("  %10s", "-");
  if (rank->failed_stage < 0)
    g_print ("  ok\n");
  else
    g_print ("  FAILED in %s: %s\n", stages[rank->failed_stage].name, rank->error->message);
}

/* Prints the per-rank table and the verdict; returns whether all passed. */
static gboolean
print_results (GPtrArray *ranks)
{
  guint failed = 0;

  g_print ("rank");
  for (gsize s = 0; s < G_N_ELEMENTS (stages); s++)
    g_print ("  %7s ms", stages[s].name);
  g_print ("\n");
  for (guint r = 0; r < ranks->len; r++)
    {
      DemoRank *rank = g_ptr_array_index (ranks, r);

      print_rank (rank);
      failed += rank->failed_stage >= 0;
    }
  if (failed > 0)
    g_print ("FAIL: %u of %u ranks failed\n", failed, ranks->len);
  else
    g_print ("PASS: all %u ranks sharded %d buffers and gathered them back bit-exactly\n",
             ranks->len, N_BUFFERS);
  return failed == 0;
}

static int
run_ranks (Demo *demo)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cpmesh_local_group (demo->options->n_ranks, (guint) demo->options->timeout_ms,
                                      &error);
  g_autoptr(GPtrArray) ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) demo_rank_free);
  gboolean passed;

  if (meshes == NULL)
    return cpmesh_fail_error (error);
  for (GList *l = meshes; l != NULL; l = l->next)
    g_ptr_array_add (ranks, demo_rank_new (demo, l->data));
  cpmesh_run_ranks (meshes, rank_main, ranks->pdata);
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
  DemoRank *rank = demo_rank_new (demo, mesh);
  gboolean passed;

  rank_main (mesh, rank);
  print_rank (rank);
  passed = rank->failed_stage < 0;
  if (passed)
    g_print ("PASS: rank %d of %d sharded %d buffers and gathered them back bit-exactly\n",
             rank->rank, demo->options->n_ranks, N_BUFFERS);
  demo_rank_free (rank);
  return passed ? 0 : CPMESH_EXIT_FAILED;
}

static int
run_ucx (Demo *demo)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_from_env (&error);

  if (mesh == NULL)
    return cpmesh_fail_error (g_steal_pointer (&error));
  cp_mesh_set_timeout_ms (mesh, (guint) demo->options->timeout_ms);
  demo->options->n_ranks = cp_mesh_get_world_size (mesh);
  if (!demo_init (demo, &error))
    return cpmesh_fail_error (g_steal_pointer (&error));
  if (cp_mesh_get_rank (mesh) == 0)
    print_plan (demo);
  return run_process_rank (demo, mesh);
}

static gboolean
check_options (DemoOptions *options,
               const char  *backend)
{
  if (backend != NULL)
    options->backend = backend;
  if (options->n_ranks < 1 || options->batch < 1 || options->seq_len < 1 ||
      options->hidden < 1 || options->timeout_ms < 1)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--ranks, --batch, --seq, --hidden and --timeout-ms "
                   "must be positive");
      return FALSE;
    }
  if (!g_str_equal (options->backend, "local") && !g_str_equal (options->backend, "ucx"))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--backend %s: use local or ucx", options->backend);
      return FALSE;
    }
  if (g_str_equal (options->backend, "ucx") && !CP_HAS_UCX)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--backend ucx: this libcpmesh was built without UCX");
      return FALSE;
    }
  return TRUE;
}

int
cpmesh_demo (int    argc,
             char **argv)
{
  DemoOptions options = { .n_ranks = 4, .batch = 2, .seq_len = 4096, .hidden = 64,
                          .timeout_ms = 10000, .backend = "local" };
  g_autofree char *backend = NULL;
  const GOptionEntry entries[] = {
    { "ranks", 'n', 0, G_OPTION_ARG_INT, &options.n_ranks, "Ranks, one thread each (default 4)", "N" },
    { "batch", 'b', 0, G_OPTION_ARG_INT64, &options.batch, "Sequences in the batch (default 2)", "B" },
    { "seq", 's', 0, G_OPTION_ARG_INT64, &options.seq_len,
      "Sequence length, a multiple of 2·N (default 4096)", "S" },
    { "hidden", 'H', 0, G_OPTION_ARG_INT64, &options.hidden, "Hidden size (default 64)", "H" },
    { "timeout-ms", 0, 0, G_OPTION_ARG_INT, &options.timeout_ms,
      "How long a rank waits for its peers (default 10000)", "MS" },
    { "backend", 0, 0, G_OPTION_ARG_STRING, &backend,
      "local (threads, the default) or ucx (this process is one rank: run it under "
      "cpmesh launch -n N, mpirun or srun; --ranks is then the launcher's)", "NAME" },
    G_OPTION_ENTRY_NULL
  };
  g_auto(Demo) demo = { &options };
  g_autoptr(GError) error = NULL;

  if (!cpmesh_parse_options ("Run ranks as threads of one process: every rank shards a batch "
                             "(float32 hidden states and int64 token ids) with the head-tail "
                             "layout, all-gathers it back with cp_mesh_unshard and checks it "
                             "bit-exactly against the original. Exits 0 only when every rank "
                             "passes.", entries, argc, argv) ||
      !check_options (&options, backend))
    return CPMESH_EXIT_USAGE;
  if (g_str_equal (options.backend, "ucx"))
    return run_ucx (&demo);
  if (!demo_init (&demo, &error))
    return cpmesh_fail_error (error);
  print_plan (&demo);
  return run_ranks (&demo);
}
