/* cpmesh-bench-mesh.c: cpmesh bench mesh
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cpmesh-bench.h"

#define GATHER_DIM 1

typedef struct
{
  int n_ranks;
  int mib;
  int reps;
  gboolean quick;
} MeshBenchOptions;

typedef struct _MeshRank MeshRank;

/* What every rank thread shares; the rows are written by rank 0 only. */
typedef struct
{
  MeshBenchOptions *options;
  GPtrArray *ranks;      /* of MeshRank, by rank */
  CpmeshBenchRow *rows;
  CpTensor *all_pieces;  /* N·M MiB: the one-call memcpy baselines' source */
} MeshBench;

struct _MeshRank
{
  MeshBench *bench;
  int rank;
  CpTensor *send;       /* this rank's piece, M MiB */
  CpTensor *gathered;   /* the reused all_gather output, N·M MiB */
  CpTensor *reduced;    /* the all_reduce operand, M MiB */
  GError *error;
};

typedef gboolean (*RankPassFunc) (CpMesh    *mesh,
                                  MeshRank  *self,
                                  GError   **error);

static guint8 *
data_of (CpTensor *tensor)
{
  return cp_tensor_get_data (tensor);
}

/* The bytes an all_gather moves into this rank, copied by hand from the
 * peers' buffers, one memcpy per piece. */
static gboolean
pass_memcpy_pieces (CpMesh    *mesh,
                    MeshRank  *self,
                    GError   **error)
{
  MeshBench *bench = self->bench;
  gsize piece = cp_tensor_get_nbytes (self->send);

  for (int r = 0; r < bench->options->n_ranks; r++)
    {
      MeshRank *peer = g_ptr_array_index (bench->ranks, r);

      memcpy (data_of (self->gathered) + (gsize) r * piece, data_of (peer->send), piece);
    }
  return TRUE;
}

/* The same bytes in one memcpy call, which lets glibc pick its fastest
 * path for large copies. */
static void
copy_whole (MeshRank *self)
{
  memcpy (data_of (self->gathered), data_of (self->bench->all_pieces),
          cp_tensor_get_nbytes (self->gathered));
}

static gboolean
pass_memcpy_one_thread (CpMesh    *mesh,
                        MeshRank  *self,
                        GError   **error)
{
  if (self->rank == 0)
    copy_whole (self);
  return TRUE;
}

static gboolean
pass_memcpy_all_threads (CpMesh    *mesh,
                         MeshRank  *self,
                         GError   **error)
{
  copy_whole (self);
  return TRUE;
}

static gboolean
pass_all_gather (CpMesh    *mesh,
                 MeshRank  *self,
                 GError   **error)
{
  g_autoptr(CpTensor) out = cp_mesh_all_gather (mesh, self->send, GATHER_DIM, error);

  return out != NULL;
}

static gboolean
pass_all_gather_into (CpMesh    *mesh,
                      MeshRank  *self,
                      GError   **error)
{
  return cp_mesh_all_gather_into (mesh, self->send, GATHER_DIM, self->gathered, error);
}

static gboolean
pass_memcpy_buffer (CpMesh    *mesh,
                    MeshRank  *self,
                    GError   **error)
{
  memcpy (data_of (self->gathered), data_of (self->reduced), cp_tensor_get_nbytes (self->reduced));
  return TRUE;
}

static gboolean
pass_all_reduce (CpMesh    *mesh,
                 MeshRank  *self,
                 GError   **error)
{
  return cp_mesh_all_reduce (mesh, self->reduced, CP_REDUCE_OP_SUM, error);
}

/* Rows, in the order rank threads run them.  All-reduce comes in its own
 * phase after the gathers: its scratch blocks would otherwise push the
 * gathers' outputs out of the library's block cache. */
enum { MEMCPY_1, MEMCPY_PIECES, MEMCPY_N, GATHER, GATHER_INTO, MEMCPY_BUFFER, REDUCE, N_ROWS };

static const RankPassFunc passes[N_ROWS] = {
  pass_memcpy_one_thread, pass_memcpy_pieces, pass_memcpy_all_threads, pass_all_gather,
  pass_all_gather_into, pass_memcpy_buffer, pass_all_reduce,
};

static const struct { int first; int end; } phases[] = { { MEMCPY_1, MEMCPY_BUFFER },
                                                         { MEMCPY_BUFFER, N_ROWS } };

/* Times one pass between two barriers, so the figure is the wall time of
 * the slowest rank. */
static gboolean
time_pass (CpMesh    *mesh,
           MeshRank  *self,
           int        row,
           gboolean   record,
           GError   **error)
{
  double start;

  if (!cp_mesh_barrier (mesh, error))
    return FALSE;
  start = cpmesh_now_seconds ();
  if (!passes[row] (mesh, self, error) || !cp_mesh_barrier (mesh, error))
    return FALSE;
  if (record && self->rank == 0)
    cpmesh_bench_record (&self->bench->rows[row], cpmesh_now_seconds () - start);
  return TRUE;
}

static void
mesh_rank_free (MeshRank *self)
{
  g_clear_object (&self->send);
  g_clear_object (&self->gathered);
  g_clear_object (&self->reduced);
  g_clear_error (&self->error);
  g_free (self);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (MeshRank, mesh_rank_free)

/* Float32 [4, 64·M, 1024] is M MiB; every tensor is written once here so
 * that no pass pays for first-touch page faults. */
static MeshRank *
mesh_rank_new (MeshBench  *bench,
               int         rank,
               GError    **error)
{
  g_autoptr(MeshRank) self = g_new0 (MeshRank, 1);
  gint64 shape[] = { 4, 64 * (gint64) bench->options->mib, 1024 };
  gint64 gathered_shape[] = { shape[0], shape[1] * bench->options->n_ranks, shape[2] };

  self->bench = bench;
  self->rank = rank;
  if ((self->send = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 3, rank + 1, error)) == NULL ||
      (self->reduced = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 3, 1.0, error)) == NULL ||
      (self->gathered = cp_tensor_new_full (CP_DTYPE_FLOAT32, gathered_shape, 3, 0.0, error)) == NULL)
    return NULL;
  return g_steal_pointer (&self);
}

/* Rank j's block of every row of the gather holds j + 1. */
static gboolean
check_gathered (MeshRank  *self,
                GError   **error)
{
  CpTensor *out = self->gathered;
  gint64 block = cp_tensor_get_dim (self->send, GATHER_DIM) * cp_tensor_get_dim (out, 2);
  int n = self->bench->options->n_ranks;

  for (gint64 o = 0; o < cp_tensor_get_dim (out, 0); o++)
    for (int j = 0; j < n; j++)
      if (cp_tensor_get_value (out, (o * n + j) * block) != j + 1 ||
          cp_tensor_get_value (out, (o * n + j + 1) * block - 1) != j + 1)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_FAILED,
                       "rank %d: block %d of row %" G_GINT64_FORMAT " of the gather is wrong",
                       self->rank, j, o);
          return FALSE;
        }
  return TRUE;
}

static gboolean
run_phase (CpMesh    *mesh,
           MeshRank  *self,
           gsize      phase,
           GError   **error)
{
  for (int round = 0; round <= self->bench->options->reps; round++)
    for (int row = phases[phase].first; row < phases[phase].end; row++)
      if (!time_pass (mesh, self, row, round > 0, error))
        return FALSE;
  return TRUE;
}

/* The gathers' figures only count if their output is right; it is checked
 * before the next phase reuses the buffer. */
static void
rank_main (CpMesh   *mesh,
           gpointer  data)
{
  MeshRank *self = data;

  if (run_phase (mesh, self, 0, &self->error) && check_gathered (self, &self->error))
    run_phase (mesh, self, 1, &self->error);
}

static void
print_setup (MeshBenchOptions *options)
{
  g_print ("in-process mesh of %d ranks (threads), %d MiB float32 per rank, best of %d passes "
           "after a warm-up; each pass is timed between barriers on rank 0\n",
           options->n_ranks, options->mib, options->reps);
  g_print ("all_gather moves N·N·M = %d MiB per pass; its baseline copies as many bytes into the "
           "same warm buffers with one memcpy call per thread on the same %d threads "
           "(\"per piece\": one call per peer's piece)\n",
           options->n_ranks * options->n_ranks * options->mib, options->n_ranks);
}

static void
set_row_bytes (CpmeshBenchRow   *rows,
               MeshBenchOptions *options)
{
  double piece = (double) options->mib * (1 << 20);
  double n = options->n_ranks;

  rows[MEMCPY_1].bytes = n * piece;
  rows[MEMCPY_PIECES].bytes = rows[MEMCPY_N].bytes = rows[GATHER].bytes = rows[GATHER_INTO].bytes = n * n * piece;
  rows[MEMCPY_BUFFER].bytes = rows[REDUCE].bytes = n * piece;
}

static int
run_ranks (MeshBench *bench)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cpmesh_local_group (bench->options->n_ranks, 60000, &error);
  int status = 0;

  if (meshes == NULL)
    return cpmesh_fail_error (error);
  cpmesh_run_ranks (meshes, rank_main, bench->ranks->pdata);
  g_list_free_full (meshes, g_object_unref);
  for (guint r = 0; r < bench->ranks->len && status == 0; r++)
    {
      MeshRank *rank = g_ptr_array_index (bench->ranks, r);

      if (rank->error != NULL)
        status = cpmesh_fail_error (rank->error);
    }
  return status;
}

static gboolean
mesh_bench_init (MeshBench  *bench,
                 GError    **error)
{
  gint64 shape[] = { (gint64) bench->options->n_ranks * bench->options->mib, 1 << 18 };

  bench->ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) mesh_rank_free);
  for (int r = 0; r < bench->options->n_ranks; r++)
    {
      MeshRank *rank = mesh_rank_new (bench, r, error);

      if (rank == NULL)
        return FALSE;
      g_ptr_array_add (bench->ranks, rank);
    }
  bench->all_pieces = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 2, 1.0, error);
  return bench->all_pieces != NULL;
}

static void
mesh_bench_clear (MeshBench *bench)
{
  g_clear_pointer (&bench->ranks, g_ptr_array_unref);
  g_clear_object (&bench->all_pieces);
  cpmesh_bench_rows_clear (bench->rows, N_ROWS);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (MeshBench, mesh_bench_clear)

static gboolean
check_options (MeshBenchOptions *options)
{
  if (options->quick && options->mib == 0)
    options->mib = 4;
  if (options->mib == 0)
    options->mib = 64;
  if (options->reps == 0)
    options->reps = options->quick ? 3 : 7;
  if (options->n_ranks < 1 || options->mib < 1 || options->reps < 1)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--ranks, --mib and --reps must be positive");
      return FALSE;
    }
  return TRUE;
}

/* `--backend ucx` times processes over UCX instead of threads
 * (cpmesh-bench-ucx.c), which takes the rest of the options itself. */
static gboolean
wants_ucx (int    argc,
           char **argv)
{
  for (int i = 1; i < argc; i++)
    if (g_str_equal (argv[i], "--backend=ucx") ||
        (g_str_equal (argv[i], "--backend") && i + 1 < argc && g_str_equal (argv[i + 1], "ucx")))
      return TRUE;
  return FALSE;
}

int
cpmesh_bench_mesh (int    argc,
                   char **argv)
{
  MeshBenchOptions options = { .n_ranks = 4 };
  const GOptionEntry entries[] = {
    { "ranks", 'n', 0, G_OPTION_ARG_INT, &options.n_ranks, "Ranks, one thread each (default 4)", "N" },
    { "mib", 'm', 0, G_OPTION_ARG_INT, &options.mib, "Mebibytes per rank (default 64, 4 with --quick)", "M" },
    { "reps", 'r', 0, G_OPTION_ARG_INT, &options.reps, "Timed passes per operation (default 7, 3 with --quick)", "N" },
    { "quick", 'q', 0, G_OPTION_ARG_NONE, &options.quick, "Small buffers, for a smoke run", NULL },
    G_OPTION_ENTRY_NULL
  };
  CpmeshBenchRow rows[N_ROWS] = {
    [MEMCPY_1] = { "memcpy, 1 thread", NULL, 0, 0 },
    [MEMCPY_PIECES] = { "memcpy per piece, N threads", NULL, 0, 0 },
    [MEMCPY_N] = { "memcpy, N threads", NULL, 0, 0 },
    [GATHER] = { "all_gather (allocating)", "memcpy, N threads", 0, 0.7 },
    [GATHER_INTO] = { "all_gather_into (reused output)", "memcpy, N threads", 0, 0.7 },
    [MEMCPY_BUFFER] = { "memcpy of the buffer, N threads", NULL, 0, 0 },
    [REDUCE] = { "all_reduce SUM", "memcpy of the buffer, N threads", 0, 0 },
  };
  g_auto(MeshBench) bench = { &options, NULL, rows, NULL };
  g_autoptr(GError) error = NULL;
  int status;

  if (wants_ucx (argc, argv))
    return cpmesh_bench_mesh_ucx (argc, argv);
  cpmesh_bench_rows_init (rows, N_ROWS);
  if (!cpmesh_parse_options ("Time the in-process backend's all_gather of M MiB per rank over N "
                             "ranks against memcpy of the same bytes by the same threads, and "
                             "all_reduce against memcpy of its buffer.", entries, argc, argv) ||
      !check_options (&options))
    return CPMESH_EXIT_USAGE;
  if (!mesh_bench_init (&bench, &error))
    return cpmesh_fail_error (error);

  print_setup (&options);
  set_row_bytes (rows, &options);
  if ((status = run_ranks (&bench)) == 0)
    {
      cpmesh_bench_report (rows, N_ROWS, options.n_ranks == 4 && options.mib == 64);
      g_print ("all_gather output verified\n");
    }
  return status;
}
