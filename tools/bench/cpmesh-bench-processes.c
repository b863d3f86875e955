/* cpmesh-bench-processes.c: `cpmesh bench mesh --backend ucx|shm`
 *
 * Measures all_gather, all_reduce and all_to_all between N local
 * processes joined over the named transport, at 1 MiB and 64 MiB per
 * rank, for N = 2 and 4, in rounds: each round runs the library's ranks,
 * then Open MPI's (when mpirun and mpi4py are installed) on the same
 * sizes, then memcpy on N threads, so that all three see the same machine
 * load; every figure is then the median and range over the rounds.  Each
 * case's bound is the memcpy bandwidth of N threads divided by the copies
 * the transport makes of each byte.  Every rank's outputs are checked
 * before any figure is printed.  Then one of the processes is killed
 * with SIGKILL in the middle of collectives, once per round, and the time
 * until every survivor reports its error is measured; and ring attention
 * forward + backward over the processes is timed against the same
 * problem on as many threads of one process.
 *
 * Ranks are this same command started again with CPMESH_BENCH_ROLE set,
 * so they are fresh processes, as a launcher would start them, with
 * CPMESH_TRANSPORT naming the backend: a rank that cannot connect over
 * it, or that finds its mesh on another backend, stops the benchmark.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <gio/gio.h>

#include "cpmesh-bench.h"

#define MIB ((gsize) 1 << 20)
#define ROLE_VARIABLE "CPMESH_BENCH_ROLE"
#define RANK_TIMEOUT_MS 120000
#define FAILURE_TIMEOUT_MS 2000
#define FAILURE_MIB 4
/* How long the coordinator waits for a run of ranks before it kills them:
 * the longest is attention at S = 16384, a minute or two on two cores. */
#define RUN_LIMIT_MS 1200000

#define MAX_WORLDS 2

/* The targets. */
#define MIN_VS_MPI 1.0
#define MAX_SPREAD 1.3
#define MAX_FAILURE_S 1.0
#define MAX_ATTENTION_VS_THREADS 1.05

#define ATTENTION_RANKS 4

static CpmeshMeshPlan
plan_for (const CpmeshMeshBenchOptions *options)
{
  CpmeshMeshPlan plan = { { MIB, 64 * MIB }, { 50, 5 }, options->run.quick ? 1 : 2 };

  for (guint s = 0; s < plan.n_sizes; s++)
    if (options->reps > 0 || options->run.quick)
      plan.calls[s] = options->reps > 0 ? (guint) options->reps : 20;
  return plan;
}

static const char *
backend_name (const CpmeshMeshBenchOptions *options)
{
  return cpmesh_mesh_backend_names[options->backend];
}

static const char *
size_name (gsize size)
{
  return size >= 64 * MIB ? "64 MiB" : "1 MiB";
}

/* nccl-tests' bus bandwidth: what each rank's link would carry. */
static double
bus_factor (CpmeshColl coll,
            int        n)
{
  return (coll == CPMESH_COLL_ALL_REDUCE ? 2.0 : 1.0) * (n - 1.0) / n;
}

/* The bytes of one call's algorithm bandwidth: a gather's output, the
 * others' buffer. */
static double
algo_bytes (CpmeshColl coll,
            gsize      size,
            int        n)
{
  return (double) size * (coll == CPMESH_COLL_ALL_GATHER ? n : 1);
}

static double
busbw (CpmeshColl coll,
       gsize      size,
       int        n,
       double     seconds)
{
  return algo_bytes (coll, size, n) / seconds / 1e9 * bus_factor (coll, n);
}

/* The copies of each byte the bus bandwidth counts.  UCX's shared memory
 * moves a message through a FIFO in a segment both processes map: into
 * it and out of it, twice; its all_reduce gathers the reduced slices into
 * a scratch result and copies that into the tensor, N/(2(N−1)) more of
 * the bus bytes.  The shm backend copies once from the owner's memory,
 * and reduces straight from the peers' buffers; so does Open MPI's
 * shared memory with its single-copy (CMA) path.  Reductions read their
 * operands as a copy would and are counted as one. */
static double
copies_per_byte (int        backend,
                 CpmeshColl coll,
                 int        n)
{
  if (backend != CPMESH_MESH_BACKEND_UCX)
    return 1.0;
  return coll == CPMESH_COLL_ALL_REDUCE ? 2.0 + n / (2.0 * (n - 1.0)) : 2.0;
}

#define MPI_COPIES_PER_BYTE 1.0

/* The command line of this process, to start it again as a rank. */
static GStrv
own_command_line (GError **error)
{
  g_autofree char *text = NULL;
  gsize length = 0;
  g_autoptr(GPtrArray) words = g_ptr_array_new_with_free_func (g_free);

  if (!g_file_get_contents ("/proc/self/cmdline", &text, &length, error))
    return NULL;
  for (gsize at = 0; at < length; at += strlen (text + at) + 1)
    g_ptr_array_add (words, g_strdup (text + at));
  g_ptr_array_add (words, NULL);
  g_free (words->pdata[0]);
  words->pdata[0] = g_file_read_link ("/proc/self/exe", NULL);
  return (GStrv) g_ptr_array_free (g_steal_pointer (&words), FALSE);
}

/* ==== the rank side ==== */

static double
max_over_ranks (CpMesh  *mesh,
                double   seconds,
                GError **error)
{
  const gint64 one[] = { 1 };
  g_autoptr(CpTensor) value = cp_tensor_new_full (CP_DTYPE_FLOAT64, one, 1, seconds, NULL);

  if (!cp_mesh_all_reduce (mesh, value, CP_REDUCE_OP_MAX, error))
    return -1;
  return cp_tensor_get_value (value, 0);
}

typedef struct
{
  CpTensor *piece;      /* this rank's E elements */
  CpTensor *gathered;   /* the reused all_gather output, N·E */
  CpTensor *reduced;    /* the all_reduce operand and result, E */
  CpTensor *exchanged;  /* the last all_to_all output, E */
} Buffers;

static void
buffers_clear (Buffers *buffers)
{
  g_clear_object (&buffers->piece);
  g_clear_object (&buffers->gathered);
  g_clear_object (&buffers->reduced);
  g_clear_object (&buffers->exchanged);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Buffers, buffers_clear)

/* Zeros everywhere, as Open MPI's buffers are: sums of zeros stay
 * ordinary numbers. */
static gboolean
buffers_init (Buffers  *buffers,
              gsize     size,
              int       n,
              GError  **error)
{
  const gint64 shape[] = { (gint64) (size / 4 / (gsize) n * (gsize) n) };
  const gint64 gathered_shape[] = { shape[0] * n };

  return (buffers->piece = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 0.0, error)) != NULL &&
         (buffers->reduced = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 0.0, error)) != NULL &&
         (buffers->exchanged = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 0.0, error)) != NULL &&
         (buffers->gathered = cp_tensor_new_full (CP_DTYPE_FLOAT32, gathered_shape, 1, 0.0,
                                                  error)) != NULL;
}

static gboolean
call (CpMesh      *mesh,
      CpmeshColl   coll,
      Buffers     *buffers,
      GError     **error)
{
  switch (coll)
    {
    case CPMESH_COLL_ALL_GATHER:
      return cp_mesh_all_gather_into (mesh, buffers->piece, 0, buffers->gathered, error);
    case CPMESH_COLL_ALL_REDUCE:
      return cp_mesh_all_reduce (mesh, buffers->reduced, CP_REDUCE_OP_SUM, error);
    case CPMESH_COLL_ALL_TO_ALL:
      /* Into an output reused from call to call, as Open MPI's is. */
      return cp_mesh_all_to_all_into (mesh, buffers->piece, 0, buffers->exchanged, error);
    default:
      g_assert_not_reached ();
    }
}

/* Seconds per call after two warm-up calls, the slowest rank's. */
static double
time_calls (CpMesh      *mesh,
            CpmeshColl   coll,
            Buffers     *buffers,
            guint        calls,
            GError     **error)
{
  double started = 0;

  for (guint i = 0; i < calls + 2; i++)
    {
      if (i == 2 && !cp_mesh_barrier (mesh, error))
        return -1;
      if (i == 2)
        started = cpmesh_now_seconds ();
      if (!call (mesh, coll, buffers, error))
        return -1;
    }
  return max_over_ranks (mesh, (cpmesh_now_seconds () - started) / calls, error);
}

/* Piece j of the all_to_all output is rank j's piece of this rank. */
static gboolean
check_exchanged (CpTensor  *exchanged,
                 int        n,
                 int        rank,
                 GError   **error)
{
  const float *got = cp_tensor_get_data (exchanged);
  gint64 count = cp_tensor_get_numel (exchanged), part = count / n;

  cpmesh_bench_corrupt (exchanged);
  for (int j = 0; j < n; j++)
    for (gint64 e = 0; e < part; e++)
      {
        float want = (float) cpmesh_bench_pattern ((guint64) (j * count + rank * part + e));

        if (got[j * part + e] != want)
          return cpmesh_bench_wrong (error, "all_to_all on rank %d: element %" G_GINT64_FORMAT
                                     " is %g, not %g from rank %d's piece", rank, j * part + e,
                                     got[j * part + e], want, j);
      }
  return TRUE;
}

/* Once more after the timed calls, on operands whose results are known:
 * the figures only count if these are right. */
static gboolean
check_calls (CpMesh   *mesh,
             Buffers  *buffers,
             GError  **error)
{
  int rank = cp_mesh_get_rank (mesh), n = cp_mesh_get_world_size (mesh);

  cpmesh_bench_fill_gather_piece (buffers->piece, rank);
  cpmesh_bench_fill_reduce_operand (buffers->reduced, rank);
  for (int c = 0; c < CPMESH_N_COLLS; c++)
    if (!call (mesh, c, buffers, error))
      return FALSE;
  return cpmesh_bench_check_gathered (buffers->gathered, 0, n, rank, error) &&
         cpmesh_bench_check_reduced (buffers->reduced, n, rank, error) &&
         check_exchanged (buffers->exchanged, n, rank, error);
}

static gboolean
time_size (CpMesh   *mesh,
           gsize     size,
           guint     calls,
           double   *seconds,
           GError  **error)
{
  g_auto(Buffers) buffers = { NULL };

  if (!buffers_init (&buffers, size, cp_mesh_get_world_size (mesh), error))
    return FALSE;
  for (int c = 0; c < CPMESH_N_COLLS; c++)
    if ((seconds[c] = time_calls (mesh, c, &buffers, calls, error)) < 0)
      return FALSE;
  return cpmesh_bench_agree (mesh, check_calls (mesh, &buffers, error), error);
}

/* A rank whose output is wrong says so on stderr and exits 1; rank 0
 * prints RESULT lines, or WRONG when any rank's output was wrong. */
static int
run_timing_rank (CpMesh               *mesh,
                 const CpmeshMeshPlan *plan)
{
  double seconds[CPMESH_MESH_MAX_SIZES][CPMESH_N_COLLS];
  int rank = cp_mesh_get_rank (mesh);

  for (guint s = 0; s < plan->n_sizes; s++)
    {
      g_autoptr(GError) error = NULL;
      gboolean wrong;

      if (time_size (mesh, plan->sizes[s], plan->calls[s], seconds[s], &error))
        continue;
      wrong = g_error_matches (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_WRONG_RESULT);
      if (!wrong && !g_error_matches (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_PEER_WRONG))
        {
          cp_harness_report ("ERROR %d %s", error->code, error->message);
          return 1;
        }
      if (wrong)
        g_printerr ("rank %d: wrong results: %s\n", rank, error->message);
      if (rank == 0)
        cp_harness_report ("WRONG");
      return wrong ? 1 : 0;
    }
  for (guint s = 0; s < plan->n_sizes && rank == 0; s++)
    for (int c = 0; c < CPMESH_N_COLLS; c++)
      cp_harness_report ("RESULT %s %" G_GSIZE_FORMAT " %.9f", cpmesh_coll_names[c],
                         plan->sizes[s], seconds[s][c]);
  return 0;
}

/* Collectives, one kind after another, until one fails: "READY" after the
 * first of each kind, then "FAILED CODE AT MESSAGE", AT the monotonic
 * clock's microseconds when the call returned, which the coordinator
 * compares with the moment of its kill; then "CLOSED MS", the teardown. */
static int
run_failure_rank (CpMesh *mesh)
{
  g_auto(Buffers) buffers = { NULL };
  g_autoptr(GError) error = NULL;
  gint64 closing;

  if (!buffers_init (&buffers, FAILURE_MIB * MIB, cp_mesh_get_world_size (mesh), &error))
    {
      cp_harness_report ("ERROR %d %s", error->code, error->message);
      return 1;
    }
  for (guint i = 0; call (mesh, i % CPMESH_N_COLLS, &buffers, &error); i++)
    if (i == CPMESH_N_COLLS - 1)
      cp_harness_report ("READY");
  cp_harness_report ("FAILED %d %" G_GINT64_FORMAT " %s", error->code, g_get_monotonic_time (),
                     error->message);
  closing = g_get_monotonic_time ();
  g_object_unref (mesh);
  cp_harness_report ("CLOSED %" G_GINT64_FORMAT, (g_get_monotonic_time () - closing) / 1000);
  return 0;
}

/* The K/V bytes per ring step the library's debug log reports for each
 * ring it runs ("… 0 K/V bytes copied per step" when it reads peers' K/V
 * in place, "… passed N K/V bytes per step" when shards travel): the
 * largest, or -1 before any report. */
static void
count_ring_bytes (const char     *domain,
                  GLogLevelFlags  level,
                  const char     *message,
                  gpointer        user_data)
{
  gint64 *largest = user_data;
  const char *passed = strstr (message, " passed ");
  gint64 bytes = -1;

  if (!g_str_has_prefix (message, "attention: "))
    return;
  if (strstr (message, "in place: 0 K/V bytes copied per step") != NULL)
    bytes = 0;
  else if (passed != NULL)
    bytes = g_ascii_strtoll (passed + strlen (" passed "), NULL, 10);
  *largest = MAX (*largest, bytes);
}

static int
run_attention_rank (CpMesh                       *mesh,
                    const CpmeshMeshBenchOptions *options)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *digest = NULL;
  double seconds;
  gint64 ring_bytes = -1;

  g_log_set_handler ("Cp", G_LOG_LEVEL_DEBUG, count_ring_bytes, &ring_bytes);
  if (!cpmesh_bench_attention_rank (mesh, options->attention_seq, TRUE, &seconds, &digest,
                                    &error))
    {
      cp_harness_report ("ERROR %d %s", error->code, error->message);
      return 1;
    }
  cp_harness_report ("DIGEST %s", digest);
  cp_harness_report ("RINGBYTES %" G_GINT64_FORMAT, ring_bytes);
  if (cp_mesh_get_rank (mesh) == 0)
    cp_harness_report ("ATTENTION %.9f", seconds);
  return 0;
}

/* A mesh on another backend than the one asked for would measure that
 * one under this one's name. */
static gboolean
is_on_backend (CpMesh *mesh)
{
  const char *wanted = g_getenv ("CPMESH_TRANSPORT");

  if (g_strcmp0 (cp_mesh_get_backend (mesh), wanted) == 0)
    return TRUE;
  cp_harness_report ("ERROR %d the mesh connected over %s, not %s", CP_MESH_ERROR_UNSUPPORTED,
                     cp_mesh_get_backend (mesh), wanted);
  return FALSE;
}

static int
run_rank (const char                   *role,
          const CpmeshMeshBenchOptions *options)
{
  CpMesh *mesh = cp_harness_join_from_env ();
  CpmeshMeshPlan plan = plan_for (options);
  int status;

  if (mesh == NULL)
    return 1;
  if (!is_on_backend (mesh))
    status = 1;
  else if (g_str_equal (role, "failure"))
    return run_failure_rank (mesh);
  else if (g_str_equal (role, "attention"))
    status = run_attention_rank (mesh, options);
  else
    status = run_timing_rank (mesh, &plan);
  g_object_unref (mesh);
  return status;
}

/* ==== the coordinating side ==== */

/* @n ranks of one run, this program started again with @role, over the
 * backend the options name. */
static CpHarnessRank **
spawn_ranks (const CpmeshMeshBenchOptions  *options,
             const char                    *role,
             int                            n,
             GError                       **error)
{
  g_auto(GStrv) argv = own_command_line (error);
  g_autofree char *token = g_uuid_string_random ();
  g_autofree char *transport = g_strdup_printf ("CPMESH_TRANSPORT=%s", backend_name (options));
  const char *settings[] = { transport, NULL };
  guint16 port = cp_harness_free_port ();
  CpHarnessWorld world = {
    .size = n, .master_port = port, .rendezvous_port = port, .token = token,
    .timeout_ms = g_str_equal (role, "failure") ? FAILURE_TIMEOUT_MS : RANK_TIMEOUT_MS,
  };
  CpHarnessRank **ranks = g_new0 (CpHarnessRank *, n);

  for (int r = 0; argv != NULL && r < n; r++)
    {
      g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);

      g_subprocess_launcher_setenv (launcher, ROLE_VARIABLE, role, TRUE);
      g_subprocess_launcher_unsetenv (launcher, "CPMESH_MESH_DIMS");
      ranks[r] = cp_harness_rank_spawn (launcher, &world, r, settings, (const char * const *) argv, error);
      if (ranks[r] == NULL)
        break;
    }
  return ranks;
}

static gboolean
all_spawned (CpHarnessRank **ranks,
             int             n)
{
  for (int r = 0; r < n; r++)
    if (ranks[r] == NULL)
      return FALSE;
  return TRUE;
}

/* A rank that could not run over the backend asked for: the library does
 * not have it, cannot use it here, or connected over another. */
static gboolean
backend_refused (const CpmeshMeshBenchOptions  *options,
                 CpHarnessRank                 *rank,
                 GError                       **error)
{
  const char *line = cp_harness_rank_find_line (rank, "ERROR ");
  int code = -1, at = 0;

  if (line == NULL || sscanf (line, "ERROR %d %n", &code, &at) != 1 || at == 0 ||
      code != CP_MESH_ERROR_UNSUPPORTED)
    return FALSE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "--backend %s: the ranks cannot "
               "run over %s, and the benchmark measures no other: %s", backend_name (options),
               backend_name (options), line + at);
  return TRUE;
}

/* Waits for the ranks to end, killing them first unless @ok, and frees
 * them; fails naming the first rank that did not exit 0. */
static gboolean
finish_ranks (const CpmeshMeshBenchOptions  *options,
              CpHarnessRank                **ranks,
              int                            n,
              gboolean                       ok,
              GError                       **error)
{
  for (int r = 0; r < n; r++)
    if (ranks[r] != NULL && !ok)
      g_subprocess_force_exit (ranks[r]->process);
  cp_harness_run_until (ranks, n, cp_harness_all_done, 0);
  for (int r = 0; r < n; r++)
    {
      int status = ranks[r] != NULL ? cp_harness_exit_status (ranks[r]->process) : 0;

      if (ok && status != 0 && !backend_refused (options, ranks[r], error))
        {
          const char *why = cp_harness_rank_find_line (ranks[r], "ERROR");

          g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "rank %d of %d exited with status "
                       "%d%s%s", r, n, status, why ? ": " : "", why ? why : "");
        }
      ok &= status == 0;
      g_clear_pointer (&ranks[r], cp_harness_rank_free);
    }
  g_free (ranks);
  return ok;
}

/* ---- one round of the library's collectives ---- */

typedef struct
{
  const CpmeshMeshPlan *plan;
  CpmeshMeshRound *round;
  gboolean wrong;
  guint found;
} TimingRead;

static void
read_timing_lines (CpHarnessRank *rank0,
                   TimingRead    *read)
{
  read->wrong = cp_harness_rank_find_line (rank0, "WRONG") != NULL;
  for (guint i = 0; i < rank0->lines->len; i++)
    {
      const char *line = g_ptr_array_index (rank0->lines, i);
      char name[32];
      guint64 size = 0;
      double seconds = 0;

      if (sscanf (line, "RESULT %31s %" G_GUINT64_FORMAT " %lf", name, &size, &seconds) != 3)
        continue;
      for (int c = 0; c < CPMESH_N_COLLS; c++)
        for (guint s = 0; s < read->plan->n_sizes; s++)
          if (g_str_equal (name, cpmesh_coll_names[c]) && size == read->plan->sizes[s])
            {
              read->round->seconds[c][s] = seconds;
              read->found++;
            }
    }
}

static gboolean
measure_ours (const CpmeshMeshBenchOptions  *options,
              int                            n,
              const CpmeshMeshPlan          *plan,
              CpmeshMeshRound               *round,
              GError                       **error)
{
  g_autoptr(GError) failure = NULL;
  CpHarnessRank **ranks = spawn_ranks (options, "timing", n, &failure);
  TimingRead read = { plan, round, FALSE, 0 };
  gboolean ok = all_spawned (ranks, n) &&
                cp_harness_run_until (ranks, n, cp_harness_all_done, RUN_LIMIT_MS);

  if (ok)
    read_timing_lines (ranks[0], &read);
  /* A wrong result is the verdict, whatever the ranks' exit statuses. */
  if (!finish_ranks (options, ranks, n, ok, failure ? NULL : &failure) && !read.wrong)
    {
      g_propagate_error (error, failure ? g_steal_pointer (&failure) :
                         g_error_new (G_IO_ERROR, G_IO_ERROR_TIMED_OUT, "the ranks did not end "
                                      "within %d s", RUN_LIMIT_MS / 1000));
      return FALSE;
    }
  if (read.wrong)
    return cpmesh_bench_wrong (error, "the outputs of the collectives over %s differ from what "
                               "the ranks sent (each such rank said where, above)",
                               backend_name (options));
  if (read.found == CPMESH_N_COLLS * plan->n_sizes)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "the ranks reported %u of %u timings",
               read.found, CPMESH_N_COLLS * plan->n_sizes);
  return FALSE;
}

/* ---- memcpy on N threads ---- */

typedef struct
{
  gsize size;
  guint calls;
  pthread_barrier_t *start;
  double started, ended;
} CopyThread;

static gpointer
copy_thread (gpointer data)
{
  CopyThread *self = data;
  g_autofree guint8 *from = g_malloc (self->size);
  g_autofree guint8 *to = g_malloc (self->size);

  memset (from, 1, self->size);
  memcpy (to, from, self->size);
  pthread_barrier_wait (self->start);
  self->started = cpmesh_now_seconds ();
  for (guint i = 0; i < self->calls; i++)
    memcpy (to, from, self->size);
  self->ended = cpmesh_now_seconds ();
  return NULL;
}

/* The GB/s of each of @n threads copying @size bytes @calls times at
 * once, as N ranks' copies would: the bytes of one thread over the
 * group's time. */
static double
memcpy_per_thread (int    n,
                   gsize  size,
                   guint  calls)
{
  g_autofree CopyThread *threads = g_new0 (CopyThread, n);
  g_autofree GThread **handles = g_new0 (GThread *, n);
  pthread_barrier_t start;
  double first = G_MAXDOUBLE, last = 0;

  pthread_barrier_init (&start, NULL, (unsigned) n);
  for (int t = 0; t < n; t++)
    {
      threads[t] = (CopyThread) { size, calls, &start, 0, 0 };
      handles[t] = g_thread_new ("memcpy", copy_thread, &threads[t]);
    }
  for (int t = 0; t < n; t++)
    {
      g_thread_join (handles[t]);
      first = MIN (first, threads[t].started);
      last = MAX (last, threads[t].ended);
    }
  pthread_barrier_destroy (&start);
  return (double) size * calls / (last - first) / 1e9;
}

/* ---- the rounds ---- */

/* Everything measured with N processes, round by round. */
typedef struct
{
  int n;
  int n_rounds;
  CpmeshMeshRound *ours;
  CpmeshMeshRound *mpi;                       /* NULL without Open MPI */
  double (*memcpy_gbps)[CPMESH_MESH_MAX_SIZES];  /* per thread, by round */
} World;

static void
world_clear (World *world)
{
  g_clear_pointer (&world->ours, g_free);
  g_clear_pointer (&world->mpi, g_free);
  g_clear_pointer (&world->memcpy_gbps, g_free);
}

static gboolean
measure_world (const CpmeshMeshBenchOptions  *options,
               const CpmeshMeshPlan          *plan,
               gboolean                       with_mpi,
               World                         *world,
               GError                       **error)
{
  int n = world->n;

  world->ours = g_new0 (CpmeshMeshRound, options->rounds);
  world->mpi = with_mpi ? g_new0 (CpmeshMeshRound, options->rounds) : NULL;
  world->memcpy_gbps = g_malloc0_n (options->rounds, sizeof *world->memcpy_gbps);
  world->n_rounds = options->rounds;
  for (int r = 0; r < options->rounds; r++)
    {
      cpmesh_progress ("%d processes, round %d of %d: libcpmesh over %s", n, r + 1,
                       options->rounds, backend_name (options));
      if (!measure_ours (options, n, plan, &world->ours[r], error))
        return FALSE;
      if (with_mpi)
        cpmesh_progress ("%d processes, round %d of %d: Open MPI", n, r + 1, options->rounds);
      if (with_mpi && !cpmesh_mpi_measure (n, plan, &world->mpi[r], error))
        return FALSE;
      cpmesh_progress ("%d processes, round %d of %d: memcpy on %d threads", n, r + 1,
                       options->rounds, n);
      for (guint s = 0; s < plan->n_sizes; s++)
        world->memcpy_gbps[r][s] = memcpy_per_thread (n, plan->sizes[s], plan->calls[s]);
    }
  return TRUE;
}

/* ---- figures ---- */

typedef struct
{
  double median, min, max;
} Spread;

static Spread
spread_of (const double *values,
           int           n)
{
  g_autofree double *sorted = g_memdup2 (values, sizeof (double) * (gsize) n);
  Spread spread;

  spread.median = cpmesh_bench_median (sorted, (gsize) n);
  spread.min = sorted[0];
  spread.max = sorted[n - 1];
  return spread;
}

static double
spread_ratio (Spread spread)
{
  return spread.min > 0 ? spread.max / spread.min : NAN;
}

/* "median [min–max]" with @digits decimals. */
static char *
spread_text (Spread spread,
             int    digits)
{
  return g_strdup_printf ("%.*f [%.*f–%.*f]", digits, spread.median, digits, spread.min, digits,
                          spread.max);
}

/* The figures of one case (N, collective, size) over the rounds. */
typedef struct
{
  Spread ours;       /* busbw, GB/s */
  Spread mpi;
  Spread vs_mpi;     /* ours / Open MPI, round by round */
  Spread memcpy_gbps;
  double ms;         /* our median time per call */
  double bound;      /* busbw at our copies per byte */
  double of_bound;   /* ours / bound, round by round */
} Case;

static Case
case_of (const CpmeshMeshBenchOptions *options,
         const World                  *world,
         const CpmeshMeshPlan         *plan,
         CpmeshColl                    coll,
         guint                         s)
{
  int rounds = world->n_rounds;
  g_autofree double *ours = g_new (double, rounds);
  g_autofree double *mpi = g_new (double, rounds);
  g_autofree double *ratio = g_new (double, rounds);
  g_autofree double *copy = g_new (double, rounds);
  g_autofree double *ms = g_new (double, rounds);
  g_autofree double *of_bound = g_new (double, rounds);
  double copies = copies_per_byte (options->backend, coll, world->n);
  Case c = { { 0 } };

  for (int r = 0; r < rounds; r++)
    {
      ours[r] = busbw (coll, plan->sizes[s], world->n, world->ours[r].seconds[coll][s]);
      mpi[r] = world->mpi ? busbw (coll, plan->sizes[s], world->n, world->mpi[r].seconds[coll][s]) : NAN;
      ratio[r] = ours[r] / mpi[r];
      copy[r] = world->memcpy_gbps[r][s];
      ms[r] = world->ours[r].seconds[coll][s] * 1e3;
      of_bound[r] = ours[r] / (copy[r] / copies);
    }
  c.ours = spread_of (ours, rounds);
  c.memcpy_gbps = spread_of (copy, rounds);
  c.ms = cpmesh_bench_median (ms, (gsize) rounds);
  c.bound = c.memcpy_gbps.median / copies;
  c.of_bound = cpmesh_bench_median (of_bound, (gsize) rounds);
  if (world->mpi != NULL)
    {
      c.mpi = spread_of (mpi, rounds);
      c.vs_mpi = spread_of (ratio, rounds);
    }
  else
    c.mpi = c.vs_mpi = (Spread) { NAN, NAN, NAN };
  return c;
}

/* Table cells hold "–": printf pads bytes, not characters. */
static char *
cell (char *text,
      int   width)
{
  glong length = g_utf8_strlen (text, -1);
  char *padded = g_strdup_printf ("%s%*s", text, length < width ? (int) (width - length) : 0, "");

  g_free (text);
  return padded;
}

#define SPREAD_WIDTH 20

static void
print_case (const CpmeshMeshBenchOptions *options,
            int                           n,
            CpmeshColl                    coll,
            gsize                         size,
            const Case                   *c)
{
  gboolean mpi = !isnan (c->mpi.median);
  g_autofree char *ours = cell (spread_text (c->ours, 2), SPREAD_WIDTH);
  g_autofree char *theirs = cell (mpi ? spread_text (c->mpi, 2) : g_strdup ("-"), SPREAD_WIDTH);
  g_autofree char *vs = cell (mpi ? spread_text (c->vs_mpi, 2) : g_strdup ("-"), SPREAD_WIDTH);
  g_autofree char *theirs_spread = mpi ? g_strdup_printf ("%.2f", spread_ratio (c->mpi)) : g_strdup ("-");

  printf ("| %d | %-10s | %6s | %7.3f | %s | %7.2f | %s | %7s | %s | %6.2f | %6.2f | %5.2f | %10.2f |\n",
          n, cpmesh_coll_names[coll], size_name (size), c->ms, ours, spread_ratio (c->ours), theirs,
          theirs_spread, vs, c->memcpy_gbps.median, copies_per_byte (options->backend, coll, n),
          c->bound, c->of_bound);
}

static void
print_worlds (const CpmeshMeshBenchOptions *options,
              const CpmeshMeshPlan         *plan,
              const World                  *worlds,
              int                           n_worlds,
              Case                        (*cases)[CPMESH_N_COLLS][CPMESH_MESH_MAX_SIZES])
{
  printf ("\nbus bandwidth in GB/s (10⁹ B/s) as in nccl-tests: all_gather and all_to_all "
          "algbw·(N−1)/N, all_reduce algbw·2(N−1)/N, algbw = bytes of a rank's output "
          "(all_gather) or buffer / time per call; median [min–max] over %d rounds, each the "
          "slowest rank's time per call of %u (1 MiB) or %u (64 MiB) calls after a barrier\n",
          options->rounds, plan->calls[0], plan->n_sizes > 1 ? plan->calls[1] : plan->calls[0]);
  printf ("bound: memcpy GB/s of each of N threads copying at once (measured in every round) / "
          "copies per byte of %s, and ours/bound taken round by round; Open MPI's single-copy "
          "shared memory would be bounded by memcpy / %.0f\n\n", backend_name (options),
          MPI_COPIES_PER_BYTE);
  printf ("| N | collective |   size | ms/call | %-20s | max/min | %-20s | max/min | %-20s | memcpy | copies | bound | ours/bound |\n",
          "busbw", "Open MPI busbw", "ours / Open MPI");
  printf ("|---|------------|--------|---------|----------------------|---------|----------------------|---------|----------------------|--------|--------|-------|------------|\n");
  for (int w = 0; w < n_worlds; w++)
    for (guint s = 0; s < plan->n_sizes; s++)
      for (int coll = 0; coll < CPMESH_N_COLLS; coll++)
        {
          cases[w][coll][s] = case_of (options, &worlds[w], plan, coll, s);
          print_case (options, worlds[w].n, coll, plan->sizes[s], &cases[w][coll][s]);
        }
}

static void
judge_worlds (CpmeshMeshBenchOptions *options,
              const CpmeshMeshPlan   *plan,
              const World            *worlds,
              int                     n_worlds,
              Case                  (*cases)[CPMESH_N_COLLS][CPMESH_MESH_MAX_SIZES])
{
  for (int w = 0; w < n_worlds; w++)
    for (guint s = 0; s < plan->n_sizes; s++)
      for (int coll = 0; coll < CPMESH_N_COLLS; coll++)
        {
          g_autofree char *what = g_strdup_printf ("N=%d %s %s: busbw against Open MPI's, median "
                                                   "of the rounds", worlds[w].n,
                                                   cpmesh_coll_names[coll], size_name (plan->sizes[s]));
          g_autofree char *steady = g_strdup_printf ("N=%d %s %s: busbw max/min over the rounds",
                                                     worlds[w].n, cpmesh_coll_names[coll],
                                                     size_name (plan->sizes[s]));

          cpmesh_bench_target (&options->run, what, cases[w][coll][s].vs_mpi.median,
                               CPMESH_AT_LEAST, MIN_VS_MPI);
          cpmesh_bench_target (&options->run, steady, spread_ratio (cases[w][coll][s].ours),
                               CPMESH_AT_MOST, MAX_SPREAD);
        }
}

/* ---- ucx_perftest (over UCX only) ---- */

/* MB/s (2^20 bytes) from the "Final:" line of the client's report. */
static double
parse_perftest (const char *report)
{
  const char *final = strstr (report, "Final:");
  double values[6] = { 0 };

  if (final == NULL ||
      sscanf (final, "Final: %lf %lf %lf %lf %lf %lf", &values[0], &values[1], &values[2], &values[3],
              &values[4], &values[5]) != 6)
    return -1;
  return values[4];
}

static GSubprocess *
spawn_perftest (const char * const  *argv,
                GSubprocessFlags     flags,
                GError             **error)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (flags);

  g_subprocess_launcher_setenv (launcher, "UCX_NET_DEVICES", "lo", FALSE);
  return g_subprocess_launcher_spawnv (launcher, argv, error);
}

/* GB/s of one ucx_perftest run; the server exits after each test.  The
 * client retries while the server is still starting. */
static double
run_perftest (const char  *perftest,
              const char  *test,
              gsize        size,
              GError     **error)
{
  g_autofree char *port = g_strdup_printf ("%u", cp_harness_free_port ());
  g_autofree char *size_text = g_strdup_printf ("%" G_GSIZE_FORMAT, size);
  const char *iterations = size >= 64 * MIB ? "20" : "1000";
  const char *warmup = size >= 64 * MIB ? "3" : "50";
  const char *server_argv[] = { perftest, "-p", port, NULL };
  const char *client_argv[] = { perftest, "127.0.0.1", "-p", port, "-t", test, "-s", size_text,
                                "-n", iterations, "-w", warmup, NULL };
  g_autoptr(GSubprocess) server = spawn_perftest (server_argv, G_SUBPROCESS_FLAGS_STDOUT_SILENCE |
                                                  G_SUBPROCESS_FLAGS_STDERR_SILENCE, error);
  double mib_per_s = -1;

  for (int attempt = 0; server != NULL && attempt < 50 && mib_per_s < 0; attempt++)
    {
      g_autoptr(GSubprocess) client = NULL;
      g_autofree char *report = NULL;

      g_usleep (100 * G_TIME_SPAN_MILLISECOND);
      client = spawn_perftest (client_argv, G_SUBPROCESS_FLAGS_STDOUT_PIPE | G_SUBPROCESS_FLAGS_STDERR_MERGE, error);
      if (client == NULL || !g_subprocess_communicate_utf8 (client, NULL, NULL, &report, NULL, error))
        break;
      mib_per_s = parse_perftest (report);
    }
  if (server != NULL)
    {
      g_subprocess_force_exit (server);
      g_subprocess_wait (server, NULL, NULL);
    }
  if (mib_per_s < 0 && error != NULL && *error == NULL)
    g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "ucx_perftest %s %s gave no result", test, size_text);
  return mib_per_s < 0 ? -1 : mib_per_s * MIB / 1e9;
}

typedef struct
{
  double tag[CPMESH_MESH_MAX_SIZES];
  double put[CPMESH_MESH_MAX_SIZES];
} PerftestFigures;

static gboolean
measure_perftest (const CpmeshMeshPlan  *plan,
                  PerftestFigures       *figures,
                  GError               **error)
{
  g_autofree char *perftest = g_find_program_in_path ("ucx_perftest");

  if (perftest == NULL)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND,
                   "ucx_perftest is not installed (Debian: apt-get install ucx-utils); "
                   "pass --no-perftest to skip it");
      return FALSE;
    }
  for (guint s = 0; s < plan->n_sizes; s++)
    {
      cpmesh_progress ("ucx_perftest tag_bw and ucp_put_bw at %s", size_name (plan->sizes[s]));
      figures->tag[s] = run_perftest (perftest, "tag_bw", plan->sizes[s], error);
      if (figures->tag[s] < 0)
        return FALSE;
      figures->put[s] = run_perftest (perftest, "ucp_put_bw", plan->sizes[s], error);
      if (figures->put[s] < 0)
        return FALSE;
    }
  return TRUE;
}

static void
print_perftest (const CpmeshMeshPlan  *plan,
                const PerftestFigures *perftest)
{
  printf ("\nucx_perftest, 2 processes (server and client), same sizes, for reference:\n  %-12s", "");
  for (guint s = 0; s < plan->n_sizes; s++)
    printf (" %12s", size_name (plan->sizes[s]));
  printf ("\n  %-12s", "tag_bw");
  for (guint s = 0; s < plan->n_sizes; s++)
    printf (" %7.2f GB/s", perftest->tag[s]);
  printf ("\n  %-12s", "ucp_put_bw");
  for (guint s = 0; s < plan->n_sizes; s++)
    printf (" %7.2f GB/s", perftest->put[s]);
  printf ("\n");
}

/* ---- failure detection ---- */

typedef struct
{
  int victim;
  int n_survivors;
  double *seconds;     /* by survivor: from the kill to its error */
  int *codes;
  gint64 teardown_ms;  /* the slowest survivor's */
} FailureRun;

/* Kills @victim once every rank has run each collective, at a moment
 * that falls anywhere in a call, and reads when each survivor failed. */
static gboolean
measure_failure_once (const CpmeshMeshBenchOptions  *options,
                      int                            n,
                      FailureRun                    *run,
                      GError                       **error)
{
  CpHarnessRank **ranks = spawn_ranks (options, "failure", n, error);
  gboolean ok = all_spawned (ranks, n) &&
                cp_harness_run_until (ranks, n, cp_harness_all_ready, RUN_LIMIT_MS) &&
                cp_harness_all_said (ranks, n, "READY") && !cp_harness_any_done (ranks, n);
  gint64 killed = 0;
  int s = 0;

  if (ok)
    {
      g_usleep (g_random_int_range (0, 20000));
      killed = g_get_monotonic_time ();
      g_subprocess_send_signal (ranks[run->victim]->process, SIGKILL);
      ok = cp_harness_run_until (ranks, n, cp_harness_all_closed, 30000);
    }
  for (int r = 0; ok && r < n; r++)
    {
      const char *failed = r != run->victim ? cp_harness_rank_find_line (ranks[r], "FAILED ") : NULL;
      const char *closed = cp_harness_rank_find_line (ranks[r], "CLOSED ");
      gint64 at = 0, teardown = 0;

      if (r == run->victim)
        continue;
      if (failed == NULL || closed == NULL ||
          sscanf (failed, "FAILED %d %" G_GINT64_FORMAT, &run->codes[s], &at) != 2 ||
          sscanf (closed, "CLOSED %" G_GINT64_FORMAT, &teardown) != 1)
        ok = FALSE;
      run->seconds[s++] = (at - killed) / 1e6;
      run->teardown_ms = MAX (run->teardown_ms, teardown);
    }
  if (!ok && error != NULL && *error == NULL)
    g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "the failure run's ranks did not start, "
                 "or did not all report their failure");
  /* The killed rank's status is its signal: only what they said counts. */
  finish_ranks (options, ranks, n, ok, NULL);
  return ok;
}

static const char *
code_name (int code)
{
  GEnumClass *codes = g_type_class_ref (CP_TYPE_MESH_ERROR);
  GEnumValue *value = g_enum_get_value (codes, code);
  const char *name = value ? value->value_nick : "unknown";

  g_type_class_unref (codes);
  return name;
}

/* The victim of run @i: each rank in turn, the last first. */
static gboolean
measure_failure (CpmeshMeshBenchOptions  *options,
                 int                      n,
                 GError                 **error)
{
  int runs = options->rounds, all = 0;
  g_autofree double *every = g_new0 (double, runs * (n - 1));
  g_autofree double *last = g_new0 (double, runs);

  printf ("\nfailure: %d processes over %s; in each run one of them is killed with SIGKILL in "
          "the middle of %d MiB collectives (all_gather, all_reduce, all_to_all in turn; "
          "CPMESH_TIMEOUT_MS=%d); seconds from the kill until each survivor's call returns "
          "its error:\n", n, backend_name (options), FAILURE_MIB, FAILURE_TIMEOUT_MS);
  for (int i = 0; i < runs; i++)
    {
      g_autofree double *seconds = g_new0 (double, n - 1);
      g_autofree int *codes = g_new0 (int, n - 1);
      FailureRun run = { n - 1 - i % n, n - 1, seconds, codes, 0 };
      g_autoptr(GString) line = g_string_new (NULL);

      cpmesh_progress ("failure run %d of %d: killing rank %d", i + 1, runs, run.victim);
      if (!measure_failure_once (options, n, &run, error))
        return FALSE;
      for (int s = 0; s < n - 1; s++)
        {
          g_string_append_printf (line, "%s%.3f s (%s)", s ? ", " : "", seconds[s], code_name (codes[s]));
          every[all++] = seconds[s];
          last[i] = MAX (last[i], seconds[s]);
        }
      printf ("  run %d: rank %d killed; survivors: %s; teardown at most %" G_GINT64_FORMAT " ms\n",
              i + 1, run.victim, line->str, run.teardown_ms);
    }
  {
    Spread survivors = spread_of (every, all), slowest = spread_of (last, runs);
    g_autofree char *survivors_text = spread_text (survivors, 3);
    g_autofree char *slowest_text = spread_text (slowest, 3);

    printf ("  every survivor: %s s over %d errors; the last survivor of each run: %s s over %d runs\n\n",
            survivors_text, all, slowest_text, runs);
    cpmesh_bench_target (&options->run, "failure: seconds until every survivor's error, the worst "
                         "run, against 1 s", slowest.max / MAX_FAILURE_S, CPMESH_AT_MOST, 1.0);
  }
  return TRUE;
}

/* ---- attention over processes against threads ---- */

typedef struct
{
  double seconds;
  GPtrArray *digests;   /* by rank */
  gint64 ring_bytes;    /* K/V bytes per ring step, the most any rank's log reported; -1: none */
} AttentionRead;

static gboolean
read_attention (CpHarnessRank **ranks,
                int             n,
                gpointer        data,
                GError        **error)
{
  AttentionRead *read = data;
  const char *line = cp_harness_rank_find_line (ranks[0], "ATTENTION ");

  for (int r = 0; r < n; r++)
    {
      const char *digest = cp_harness_rank_find_line (ranks[r], "DIGEST ");
      const char *bytes = cp_harness_rank_find_line (ranks[r], "RINGBYTES ");
      gint64 reported = -1;

      g_ptr_array_add (read->digests, g_strdup (digest ? digest + strlen ("DIGEST ") : ""));
      if (bytes != NULL && sscanf (bytes, "RINGBYTES %" G_GINT64_FORMAT, &reported) == 1)
        read->ring_bytes = MAX (read->ring_bytes, reported);
    }
  if (line != NULL && sscanf (line, "ATTENTION %lf", &read->seconds) == 1)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "the attention ranks reported no time");
  return FALSE;
}

static gboolean
run_attention_processes (const CpmeshMeshBenchOptions  *options,
                         int                            n,
                         AttentionRead                 *read,
                         GError                       **error)
{
  g_autoptr(GError) failure = NULL;
  CpHarnessRank **ranks = spawn_ranks (options, "attention", n, &failure);
  gboolean ok = all_spawned (ranks, n) &&
                cp_harness_run_until (ranks, n, cp_harness_all_done, RUN_LIMIT_MS) &&
                read_attention (ranks, n, read, &failure);

  if (!finish_ranks (options, ranks, n, ok, failure ? NULL : &failure) || !ok)
    {
      g_propagate_error (error, failure ? g_steal_pointer (&failure) :
                         g_error_new (G_IO_ERROR, G_IO_ERROR_TIMED_OUT, "the attention ranks did "
                                      "not end within %d s", RUN_LIMIT_MS / 1000));
      return FALSE;
    }
  return TRUE;
}

/* The processes' outputs must be the threads' bits, rank by rank. */
static gboolean
check_digests (GPtrArray  *processes,
               GStrv       threads,
               int         n,
               GError    **error)
{
  for (int r = 0; r < n; r++)
    if (!g_str_equal (g_ptr_array_index (processes, r), threads[r]))
      return cpmesh_bench_wrong (error, "attention over processes: rank %d's outputs differ from "
                                 "those of rank %d on threads (SHA-256 %.12s…, not %.12s…)", r, r,
                                 (const char *) g_ptr_array_index (processes, r), threads[r]);
  return TRUE;
}

static gboolean
measure_attention (const CpmeshMeshBenchOptions  *options,
                   int                            n,
                   double                        *processes,
                   double                        *threads,
                   gint64                        *ring_bytes,
                   GError                       **error)
{
  *ring_bytes = -1;
  for (int r = 0; r < options->rounds; r++)
    {
      g_autoptr(GPtrArray) digests = g_ptr_array_new_with_free_func (g_free);
      AttentionRead read = { 0, digests, -1 };
      g_auto(GStrv) thread_digests = NULL;

      cpmesh_progress ("attention round %d of %d: %d processes over %s", r + 1, options->rounds,
                       n, backend_name (options));
      if (!run_attention_processes (options, n, &read, error))
        return FALSE;
      cpmesh_progress ("attention round %d of %d: %d threads", r + 1, options->rounds, n);
      if (!cpmesh_bench_attention_threads (n, options->attention_seq, &threads[r],
                                           &thread_digests, error) ||
          !check_digests (digests, thread_digests, n, error))
        return FALSE;
      processes[r] = read.seconds;
      *ring_bytes = MAX (*ring_bytes, read.ring_bytes);
    }
  return TRUE;
}

static void
print_attention (CpmeshMeshBenchOptions *options,
                 int                     n,
                 const double           *processes,
                 const double           *threads,
                 gint64                  ring_bytes)
{
  g_autofree double *ratio = g_new (double, options->rounds);
  g_autofree char *processes_text = NULL, *threads_text = NULL, *ratio_text = NULL;
  Spread spread;

  for (int r = 0; r < options->rounds; r++)
    ratio[r] = processes[r] / threads[r];
  processes_text = spread_text (spread_of (processes, options->rounds), 3);
  threads_text = spread_text (spread_of (threads, options->rounds), 3);
  spread = spread_of (ratio, options->rounds);
  ratio_text = spread_text (spread, 3);
  printf ("\nring attention forward + backward, C=%d, float32 causal, B=1 H=16 D=128 "
          "S=%" G_GINT64_FORMAT ", the slowest rank's wall time of the second of two runs, "
          "median [min–max] over %d rounds; every rank's outputs over processes are the bits of "
          "the same rank on threads:\n", n, options->attention_seq, options->rounds);
  printf ("  %d processes over %s: %s s\n  %d threads of one process: %s s\n"
          "  processes / threads: %s\n", n, backend_name (options), processes_text, n,
          threads_text, ratio_text);
  if (ring_bytes < 0)
    printf ("  K/V bytes copied per ring step: not reported (the ranks' rings said nothing)\n\n");
  else
    printf ("  K/V bytes copied per ring step over processes: %" G_GINT64_FORMAT " (the most any "
            "rank's ring reported in its debug log, forward and backward, over every round)%s\n\n",
            ring_bytes, ring_bytes == 0 ? ": every shard read where it lies" : "");
  cpmesh_bench_target (&options->run, "attention: wall time over processes against threads, "
                       "median of the rounds", spread.median, CPMESH_AT_MOST,
                       MAX_ATTENTION_VS_THREADS);
}

/* ---- the run ---- */

/* The options only this benchmark takes or limits. */
static gboolean
check_options (CpmeshMeshBenchOptions *options,
               CpmeshOption           *entries,
               gboolean                with_mpi)
{
  int attention_ranks = cpmesh_option_given (entries, "cp") ? options->n_ranks : ATTENTION_RANKS;

  if (options->backend == CPMESH_MESH_BACKEND_UCX && !CP_HAS_UCX)
    cpmesh_fail (CPMESH_EXIT_USAGE, "--backend ucx: this libcpmesh was built without UCX");
  else if (cpmesh_option_given (entries, "mib"))
    cpmesh_fail (CPMESH_EXIT_USAGE, "--mib goes with --backend local: over processes the sizes "
                 "are 1 MiB and 64 MiB per rank");
  else if (options->n_ranks < 2 || options->n_ranks > 64)
    cpmesh_fail (CPMESH_EXIT_USAGE, "--cp %d: over processes use 2 to 64", options->n_ranks);
  else if (!options->skip_attention &&
           !cpmesh_check_divisible ("--attention-seq", options->attention_seq, attention_ranks))
    return FALSE;
  else
    return cpmesh_bench_begin (&options->run, !options->run.quick && with_mpi &&
                               !cpmesh_option_given (entries, "cp") &&
                               !cpmesh_option_given (entries, "reps") &&
                               !cpmesh_option_given (entries, "attention-seq") &&
                               options->rounds >= CPMESH_MESH_DEFAULT_ROUNDS && !options->skip_failure &&
                               !options->skip_attention,
                               "the default sizes, at least 5 rounds, with Open MPI");
  return FALSE;
}

static void
print_setup (const CpmeshMeshBenchOptions *options,
             int                           n,
             const char                   *mpi_version,
             const char                   *mpi_why)
{
  printf ("cpmesh bench mesh --backend %s: processes on this host, %s\n", backend_name (options),
          options->backend == CPMESH_MESH_BACKEND_UCX ?
          (g_getenv ("UCX_TLS") ? g_getenv ("UCX_TLS") : "UCX_TLS unset (sm,self over loopback)")
          : "CPMESH_TRANSPORT=shm");
  if (options->skip_mpi)
    printf ("Open MPI: skipped (--no-mpi)\n");
  else if (mpi_version == NULL)
    printf ("Open MPI: not measured: %s; the benchmark installs nothing\n", mpi_why);
  else
    {
      g_autofree char *command = cpmesh_mpi_describe (n);

      printf ("Open MPI: %s, through mpi4py on numpy float32 buffers, in the same rounds; "
              "for %d processes: %s -c SCRIPT\n", mpi_version, n, command);
    }
  printf ("every rank's all_gather, all_reduce and all_to_all output checked%s\n",
          mpi_version != NULL && !options->skip_mpi ? ", and Open MPI's" : "");
}

/* Runs `cpmesh bench mesh --backend ucx|shm`; with CPMESH_BENCH_ROLE set,
 * this process is one of its ranks. */
int
cpmesh_bench_mesh_processes (CpmeshMeshBenchOptions *options,
                             CpmeshOption           *entries)
{
  const char *role = g_getenv (ROLE_VARIABLE);
  CpmeshMeshPlan plan = plan_for (options);
  gboolean given = cpmesh_option_given (entries, "cp");
  World worlds[MAX_WORLDS] = { { 0 } };
  int n_worlds = given ? 1 : 2;
  Case cases[MAX_WORLDS][CPMESH_N_COLLS][CPMESH_MESH_MAX_SIZES];
  int attention_ranks = given ? options->n_ranks : ATTENTION_RANKS;
  g_autofree double *attention_processes = g_new0 (double, options->rounds);
  g_autofree double *attention_threads = g_new0 (double, options->rounds);
  gint64 attention_ring_bytes = -1;
  g_autofree char *mpi_version = NULL, *mpi_why = NULL;
  gboolean with_mpi, ok = TRUE;
  PerftestFigures perftest;
  gboolean with_perftest;
  g_autoptr(GError) error = NULL;

  if (role != NULL)
    return run_rank (role, options);
  with_mpi = !options->skip_mpi && cpmesh_mpi_available (&mpi_version, &mpi_why);
  if (!check_options (options, entries, with_mpi))
    return CPMESH_EXIT_USAGE;
  with_perftest = options->backend == CPMESH_MESH_BACKEND_UCX && !options->run.quick &&
                  !options->skip_perftest;
  worlds[0].n = given ? options->n_ranks : 2;
  worlds[1].n = 4;
  for (int w = 0; ok && w < n_worlds; w++)
    ok = measure_world (options, &plan, with_mpi, &worlds[w], &error);
  ok = ok && (!with_perftest || measure_perftest (&plan, &perftest, &error));
  ok = ok && (options->skip_attention ||
              measure_attention (options, attention_ranks, attention_processes,
                                 attention_threads, &attention_ring_bytes, &error));
  if (ok)
    {
      print_setup (options, worlds[n_worlds - 1].n, mpi_version, mpi_why);
      if (with_perftest)
        print_perftest (&plan, &perftest);
      print_worlds (options, &plan, worlds, n_worlds, cases);
      if (!options->skip_attention)
        print_attention (options, attention_ranks, attention_processes, attention_threads,
                         attention_ring_bytes);
      fflush (stdout);
      /* A failure run prints as it goes: after it nothing is measured. */
      ok = options->skip_failure || measure_failure (options, attention_ranks, &error);
    }
  if (ok)
    {
      printf ("\n");
      judge_worlds (options, &plan, worlds, n_worlds, cases);
    }
  for (int w = 0; w < n_worlds; w++)
    world_clear (&worlds[w]);
  return ok ? cpmesh_bench_end (&options->run) : cpmesh_bench_fail (error);
}
