/* cpmesh-bench-mesh.c: cpmesh bench mesh
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cpmesh-bench.h"

#define GATHER_DIM 1

/* The sizes the targets are stated for: 4 ranks of 64 MiB. */
#define DEFAULT_RANKS 4
#define DEFAULT_MIB 64

typedef struct _MeshRank MeshRank;

/* What every rank thread shares; the rows are written by rank 0 only. */
typedef struct
{
  CpmeshMeshBenchOptions *options;
  GPtrArray *ranks;      /* of MeshRank, by rank */
  CpmeshBenchRow *rows;
  CpTensor *all_pieces;  /* N·M MiB: the one-call memcpy baselines' source */
} MeshBench;

struct _MeshRank
{
  CpmeshBenchRank base;
  MeshBench *bench;
  CpTensor *send;       /* this rank's piece, M MiB */
  CpTensor *gathered;   /* the reused all_gather output, N·M MiB */
  CpTensor *reduced;    /* the all_reduce operand, M MiB */
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
  int n = bench->options->n_ranks;
  g_autofree const guint8 **pieces = g_new (const guint8 *, n);
  g_autofree gsize *sizes = g_new (gsize, n);

  for (int r = 0; r < n; r++)
    {
      MeshRank *peer = g_ptr_array_index (bench->ranks, r);

      pieces[r] = data_of (peer->send);
      sizes[r] = cp_tensor_get_nbytes (peer->send);
    }
  cpmesh_bench_copy_blocks (data_of (self->gathered), pieces, sizes, (guint) n);
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
  if (self->base.rank == 0)
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

static const struct
{
  int first;
  int end;
  const char *name;
} phases[] = {
  { MEMCPY_1, MEMCPY_BUFFER, "all_gather and its baselines" },
  { MEMCPY_BUFFER, N_ROWS, "all_reduce and its baseline" },
};

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
  if (record && self->base.rank == 0)
    cpmesh_bench_record (&self->bench->rows[row], cpmesh_now_seconds () - start);
  return TRUE;
}

static void
mesh_rank_free (MeshRank *self)
{
  g_clear_object (&self->send);
  g_clear_object (&self->gathered);
  g_clear_object (&self->reduced);
  g_clear_error (&self->base.error);
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
  if ((self->send = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, error)) == NULL ||
      (self->reduced = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 3, 1.0, error)) == NULL ||
      (self->gathered = cp_tensor_new_full (CP_DTYPE_FLOAT32, gathered_shape, 3, 0.0, error)) == NULL)
    return NULL;
  cpmesh_bench_fill_gather_piece (self->send, rank);
  return g_steal_pointer (&self);
}

/* A fresh operand, so that the check knows the sum. */
static gboolean
check_reduced (CpMesh    *mesh,
               MeshRank  *self,
               GError   **error)
{
  cpmesh_bench_fill_reduce_operand (self->reduced, self->base.rank);
  return cp_mesh_all_reduce (mesh, self->reduced, CP_REDUCE_OP_SUM, error) &&
         cpmesh_bench_check_reduced (self->reduced, self->bench->options->n_ranks,
                                     self->base.rank, error);
}

static gboolean
run_phase (CpMesh    *mesh,
           MeshRank  *self,
           gsize      phase,
           GError   **error)
{
  int reps = self->bench->options->reps;

  for (int round = 0; round <= reps; round++)
    {
      if (self->base.rank == 0)
        cpmesh_progress ("%s: round %d of %d (the first warms up)", phases[phase].name,
                         round + 1, reps + 1);
      for (int row = phases[phase].first; row < phases[phase].end; row++)
        if (!time_pass (mesh, self, row, round > 0, error))
          return FALSE;
    }
  return TRUE;
}

/* The figures only count if the outputs are right: the gather's is
 * checked before the next phase reuses its buffer. */
static gboolean
run_rank (gpointer   data,
          GError   **error)
{
  MeshRank *self = data;
  CpMesh *mesh = self->base.mesh;
  int n = self->bench->options->n_ranks;

  return run_phase (mesh, self, 0, error) &&
         cpmesh_bench_agree (mesh, cpmesh_bench_check_gathered (self->gathered, GATHER_DIM, n,
                                                                self->base.rank, error), error) &&
         run_phase (mesh, self, 1, error) &&
         check_reduced (mesh, self, error);
}

static void
print_setup (CpmeshMeshBenchOptions *options)
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
set_row_bytes (CpmeshBenchRow         *rows,
               CpmeshMeshBenchOptions *options)
{
  double piece = (double) options->mib * (1 << 20);
  double n = options->n_ranks;

  rows[MEMCPY_1].bytes = n * piece;
  rows[MEMCPY_PIECES].bytes = rows[MEMCPY_N].bytes = rows[GATHER].bytes = rows[GATHER_INTO].bytes = n * n * piece;
  rows[MEMCPY_BUFFER].bytes = rows[REDUCE].bytes = n * piece;
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

static int
run_local (CpmeshMeshBenchOptions *options,
           CpmeshOption           *entries)
{
  CpmeshBenchRow rows[N_ROWS] = {
    [MEMCPY_1] = { "memcpy, 1 thread", NULL, 0, 0 },
    [MEMCPY_PIECES] = { "memcpy per piece, N threads", NULL, 0, 0 },
    [MEMCPY_N] = { "memcpy, N threads", NULL, 0, 0 },
    [GATHER] = { "all_gather (allocating)", "memcpy, N threads", 0, 0.7 },
    [GATHER_INTO] = { "all_gather_into (reused output)", "memcpy, N threads", 0, 0.7 },
    [MEMCPY_BUFFER] = { "memcpy of the buffer, N threads", NULL, 0, 0 },
    [REDUCE] = { "all_reduce SUM", "memcpy of the buffer, N threads", 0, 0 },
  };
  g_auto(MeshBench) bench = { options, NULL, rows, NULL };
  g_autoptr(GError) error = NULL;

  static const char * const process_options[] = { "no-perftest", "no-failure", "no-mpi",
                                                   "no-attention", "rounds", "attention-seq" };

  for (gsize i = 0; i < G_N_ELEMENTS (process_options); i++)
    if (cpmesh_option_given (entries, process_options[i]))
      return cpmesh_fail (CPMESH_EXIT_USAGE, "--%s goes with --backend ucx or shm",
                          process_options[i]);
  if (options->mib == 0)
    options->mib = options->run.quick ? 4 : DEFAULT_MIB;
  if (options->reps == 0)
    options->reps = options->run.quick ? 3 : 7;
  if (!cpmesh_bench_begin (&options->run, options->n_ranks == DEFAULT_RANKS &&
                           options->mib == DEFAULT_MIB, "--cp 4 --mib 64"))
    return CPMESH_EXIT_USAGE;
  cpmesh_bench_rows_init (rows, N_ROWS);
  cpmesh_progress ("making %d ranks' buffers", options->n_ranks);
  if (!mesh_bench_init (&bench, &error) ||
      !cpmesh_bench_run_ranks (options->n_ranks, run_rank, bench.ranks->pdata, &error))
    return cpmesh_bench_fail (error);
  print_setup (options);
  set_row_bytes (rows, options);
  g_print ("every rank's all_gather and all_reduce output checked\n");
  cpmesh_bench_report (&options->run, rows, N_ROWS);
  return cpmesh_bench_end (&options->run);
}

const char * const cpmesh_mesh_backend_names[] = { "local", "ucx", "shm", NULL };

int
cpmesh_bench_mesh (int    argc,
                   char **argv)
{
  CpmeshMeshBenchOptions options = { .n_ranks = DEFAULT_RANKS, .rounds = CPMESH_MESH_DEFAULT_ROUNDS };
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&options.n_ranks, ": threads (default 4), or processes (default: 2, "
                      "then 4)"),
    { "mib", 'm', CPMESH_VALUE_INT, &options.mib, "Mebibytes per rank of the in-process "
      "run (default 64, 4 with --quick); over processes the sizes are 1 and 64 MiB", "M", 1, 1 << 16, NULL, FALSE },
    CPMESH_OPTION_REPS (&options.reps, " (default 7, 3 with --quick; over processes the calls "
                        "timed in each round: 50 at 1 MiB and 5 at 64 MiB, 20 with --quick)"),
    CPMESH_OPTION_QUICK (&options.run.quick, ": 4 MiB per rank; over processes 1 MiB only, "
                         "attention at S = 1024, no ucx_perftest"),
    /* The program's --backend, and shm. */
    { "backend", 0, CPMESH_VALUE_CHOICE, &options.backend, "Where the ranks run: local, threads "
      "of this process, or ucx, processes over UCX (default local); or shm, processes over the "
      "intra-host shared-memory transport, which this libcpmesh must have", "NAME", 0, 0,
      cpmesh_mesh_backend_names, FALSE },
    { "rounds", 0, CPMESH_VALUE_INT, &options.rounds, "Over processes: rounds of every case, "
      "of Open MPI's alternating with the library's, of failure runs and of attention runs; "
      "figures are their median and range (default 5)", "R", 1, 1000, NULL, FALSE },
    { "no-mpi", 0, CPMESH_VALUE_FLAG, &options.skip_mpi,
      "Over processes: do not measure Open MPI (mpirun, mpi4py) alongside", NULL, 0, 0, NULL, FALSE },
    { "no-perftest", 0, CPMESH_VALUE_FLAG, &options.skip_perftest,
      "Over UCX: skip the ucx_perftest reference", NULL, 0, 0, NULL, FALSE },
    { "no-failure", 0, CPMESH_VALUE_FLAG, &options.skip_failure,
      "Over processes: skip the failure-detection runs", NULL, 0, 0, NULL, FALSE },
    { "no-attention", 0, CPMESH_VALUE_FLAG, &options.skip_attention,
      "Over processes: skip ring attention over processes against threads", NULL, 0, 0, NULL,
      FALSE },
    { "attention-seq", 0, CPMESH_VALUE_INT64, &options.attention_seq, "Over processes: the "
      "sequence length of the attention runs, a multiple of 2·C (default 16384, 1024 with "
      "--quick)", "S", 1, 1 << 22, NULL, FALSE },
    CPMESH_OPTION_CHECK_TARGETS (&options.run.check_targets),
    CPMESH_OPTION_END
  };

  if (!cpmesh_parse_options ("Time all_gather of M MiB per rank over C in-process ranks "
                             "against memcpy of the same bytes by the same threads, and "
                             "all_reduce against memcpy of its buffer; or, with --backend ucx "
                             "or shm, all_gather, all_reduce and all_to_all between 2 and 4 "
                             "processes of this host over that transport at 1 MiB and 64 MiB "
                             "per rank, in rounds alternating with Open MPI's figures for the "
                             "same calls (when mpirun and mpi4py are installed) and memcpy on "
                             "as many threads, which bounds them; then how fast the survivors "
                             "of a killed rank report their error, and ring attention over 4 "
                             "processes against 4 threads. Every rank's outputs are checked "
                             "before any figure is printed.",
                             entries, NULL, &argc, &argv))
    return CPMESH_EXIT_USAGE;
  if (options.attention_seq == 0)
    options.attention_seq = options.run.quick ? CPMESH_MESH_QUICK_ATTENTION_SEQ
                                              : CPMESH_MESH_ATTENTION_SEQ;
  if (options.backend != CPMESH_MESH_BACKEND_LOCAL)
    return cpmesh_bench_mesh_processes (&options, entries);
  return run_local (&options, entries);
}
