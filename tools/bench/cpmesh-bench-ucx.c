/* cpmesh-bench-ucx.c: `cpmesh bench mesh --backend ucx`
 *
 * Measures all_gather and all_reduce between C local processes over UCX
 * (loopback) at 1 MiB and 64 MiB per rank, checks every rank's outputs,
 * and ucx_perftest's tag_bw and ucp_put_bw between two processes at the
 * same sizes in the same run, and prints algorithm and bus bandwidth next
 * to the better perftest figure.  Then it kills one rank in the middle of
 * all_gathers and reports how long the others took to fail.
 *
 * Ranks are this same command started again with CPMESH_BENCH_ROLE set,
 * so they are fresh processes, as a launcher would start them.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>

#include "cpmesh-bench.h"

#define MIB ((gsize) 1 << 20)
#define ROLE_VARIABLE "CPMESH_BENCH_ROLE"
#define FAILURE_TIMEOUT_MS 2000

#define MAX_SIZES 2

/* The per-rank sizes measured and the timed calls at each: 1 MiB and
 * 64 MiB, or 1 MiB alone with --quick. */
typedef struct
{
  gsize sizes[MAX_SIZES];
  guint iterations[MAX_SIZES];
  guint n_sizes;
} Plan;

static Plan
plan_for (const CpmeshMeshBenchOptions *options)
{
  Plan plan = { { MIB, 64 * MIB }, { 200, 10 }, options->run.quick ? 1 : 2 };

  for (guint s = 0; s < plan.n_sizes; s++)
    if (options->reps > 0 || options->run.quick)
      plan.iterations[s] = options->reps > 0 ? (guint) options->reps : 20;
  return plan;
}

/* ---- helpers ---- */

static const char *
size_name (gsize size)
{
  return size >= 64 * MIB ? "64 MiB" : "1 MiB";
}

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

/* ---- the rank side ---- */

static double
max_over_ranks (CpMesh *mesh,
                double  seconds)
{
  const gint64 one[] = { 1 };
  g_autoptr(CpTensor) value = cp_tensor_new_full (CP_DTYPE_FLOAT64, one, 1, seconds, NULL);

  if (!cp_mesh_all_reduce (mesh, value, CP_REDUCE_OP_MAX, NULL))
    return -1;
  return cp_tensor_get_value (value, 0);
}

typedef struct
{
  CpTensor *piece;      /* this rank's S bytes */
  CpTensor *gathered;   /* the reused all_gather output, N·S bytes */
} Buffers;

typedef gboolean (*CallFunc) (CpMesh   *mesh,
                              Buffers  *buffers,
                              GError  **error);

static gboolean
call_all_gather (CpMesh   *mesh,
                 Buffers  *buffers,
                 GError  **error)
{
  return cp_mesh_all_gather_into (mesh, buffers->piece, 0, buffers->gathered, error);
}

static gboolean
call_all_reduce (CpMesh   *mesh,
                 Buffers  *buffers,
                 GError  **error)
{
  return cp_mesh_all_reduce (mesh, buffers->piece, CP_REDUCE_OP_SUM, error);
}

/* Seconds per call after two warm-up calls, the slowest rank's. */
static double
time_calls (CpMesh    *mesh,
            CallFunc   call,
            Buffers   *buffers,
            guint      iterations,
            GError   **error)
{
  gint64 started = 0;

  for (guint i = 0; i < iterations + 2; i++)
    {
      if (i == 2 && !cp_mesh_barrier (mesh, error))
        return -1;
      if (i == 2)
        started = g_get_monotonic_time ();
      if (!call (mesh, buffers, error))
        return -1;
    }
  return max_over_ranks (mesh, (g_get_monotonic_time () - started) / 1e6 / iterations);
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
  if (!call_all_gather (mesh, buffers, error))
    return FALSE;
  cpmesh_bench_fill_reduce_operand (buffers->piece, rank);
  return call_all_reduce (mesh, buffers, error) &&
         cpmesh_bench_check_gathered (buffers->gathered, 0, n, rank, error) &&
         cpmesh_bench_check_reduced (buffers->piece, n, rank, error);
}

static gboolean
time_size (CpMesh   *mesh,
           gsize     size,
           guint     iterations,
           double   *gather,
           double   *reduce,
           GError  **error)
{
  const gint64 shape[] = { (gint64) (size / 4) };
  const gint64 gathered_shape[] = { shape[0] * cp_mesh_get_world_size (mesh) };
  g_autoptr(CpTensor) piece = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, error);
  g_autoptr(CpTensor) gathered = piece ? cp_tensor_new (CP_DTYPE_FLOAT32, gathered_shape, 1, error) : NULL;
  Buffers buffers = { piece, gathered };

  if (gathered == NULL)
    return FALSE;
  *gather = time_calls (mesh, call_all_gather, &buffers, iterations, error);
  *reduce = *gather < 0 ? -1 : time_calls (mesh, call_all_reduce, &buffers, iterations, error);
  return *reduce >= 0 && cpmesh_bench_agree (mesh, check_calls (mesh, &buffers, error), error);
}

/* A rank whose output is wrong says so on stderr and exits 1; rank 0
 * prints RESULT lines, or WRONG when any rank's output was wrong. */
static int
run_timing_rank (CpMesh     *mesh,
                 const Plan *plan)
{
  double gather[MAX_SIZES], reduce[MAX_SIZES];
  gboolean wrong = FALSE;
  int rank = cp_mesh_get_rank (mesh);

  for (guint s = 0; s < plan->n_sizes; s++)
    {
      g_autoptr(GError) error = NULL;

      if (time_size (mesh, plan->sizes[s], plan->iterations[s], &gather[s], &reduce[s], &error))
        continue;
      wrong = g_error_matches (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_WRONG_RESULT);
      if (!wrong && !g_error_matches (error, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_PEER_WRONG))
        {
          g_printerr ("rank %d: %s\n", rank, error->message);
          return 1;
        }
      if (wrong)
        g_printerr ("rank %d: wrong results: %s\n", rank, error->message);
      if (rank == 0)
        printf ("WRONG\n");
      return wrong ? 1 : 0;
    }
  for (guint s = 0; s < plan->n_sizes && rank == 0; s++)
    printf ("RESULT %" G_GSIZE_FORMAT " %.9f %.9f\n", plan->sizes[s], gather[s], reduce[s]);
  return 0;
}

/* All-gathers until one fails; reports how long the failing call took. */
static int
run_failure_rank (CpMesh *mesh)
{
  return cp_harness_gather_until_failure (mesh) ? 0 : 1;
}

static int
run_rank (const char *role,
          const Plan *plan)
{
  CpMesh *mesh = cp_harness_join_from_env ();
  int status;

  if (mesh == NULL)
    return 1;
  if (g_str_equal (role, "failure"))
    return run_failure_rank (mesh);
  status = run_timing_rank (mesh, plan);
  g_object_unref (mesh);
  return status;
}

/* ---- the coordinating side ---- */

/* The ranks of one run, this program started again with @role. */
static CpHarnessRank **
spawn_ranks (const CpmeshMeshBenchOptions  *options,
             const char                    *role,
             GError                       **error)
{
  g_auto(GStrv) argv = own_command_line (error);
  g_autofree char *token = g_uuid_string_random ();
  guint16 port = cp_harness_free_port ();
  CpHarnessWorld world = {
    .size = options->n_ranks, .master_port = port, .rendezvous_port = port, .token = token,
    .timeout_ms = g_str_equal (role, "failure") ? FAILURE_TIMEOUT_MS : 120000,
  };
  CpHarnessRank **ranks = g_new0 (CpHarnessRank *, options->n_ranks);

  for (int r = 0; argv != NULL && r < options->n_ranks; r++)
    {
      g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);

      g_subprocess_launcher_setenv (launcher, ROLE_VARIABLE, role, TRUE);
      g_subprocess_launcher_unsetenv (launcher, "CPMESH_MESH_DIMS");
      ranks[r] = cp_harness_rank_spawn (launcher, &world, r, NULL, (const char * const *) argv, error);
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

/* Waits for the ranks to end, killing them first unless @ok, and frees
 * them; fails naming the first rank that did not exit 0. */
static gboolean
finish_ranks (CpHarnessRank  **ranks,
              int              n,
              gboolean         ok,
              GError         **error)
{
  for (int r = 0; r < n; r++)
    if (ranks[r] != NULL && !ok)
      g_subprocess_force_exit (ranks[r]->process);
  cp_harness_run_until (ranks, n, cp_harness_all_done, 0);
  for (int r = 0; r < n; r++)
    {
      int status = ranks[r] != NULL ? cp_harness_exit_status (ranks[r]->process) : 0;
      const char *why = status != 0 ? cp_harness_rank_find_line (ranks[r], "ERROR") : NULL;

      if (ok && status != 0)
        g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "rank %d exited with status %d%s%s", r, status,
                     why ? ": " : "", why ? why : "");
      ok &= status == 0;
      g_clear_pointer (&ranks[r], cp_harness_rank_free);
    }
  g_free (ranks);
  return ok;
}

typedef struct
{
  double gather[MAX_SIZES];
  double reduce[MAX_SIZES];
} MeshFigures;

/* The figures rank 0 reported once every rank is done. */
static gboolean
read_results (CpHarnessRank  *rank0,
              const Plan     *plan,
              MeshFigures    *figures,
              GError        **error)
{
  guint found = 0;
  gboolean wrong = cp_harness_rank_find_line (rank0, "WRONG") != NULL;

  for (guint i = 0; i < rank0->lines->len; i++)
    {
      const char *line = g_ptr_array_index (rank0->lines, i);
      guint64 size = 0;
      double gather = 0, reduce = 0;

      for (guint s = 0; s < plan->n_sizes; s++)
        if (sscanf (line, "RESULT %" G_GUINT64_FORMAT " %lf %lf", &size, &gather, &reduce) == 3 &&
            size == plan->sizes[s])
          {
            figures->gather[s] = gather;
            figures->reduce[s] = reduce;
            found++;
          }
    }
  if (found == plan->n_sizes && !wrong)
    return TRUE;
  if (wrong)
    return cpmesh_bench_wrong (error, "the outputs of the collectives over UCX differ from "
                               "what the ranks sent (each such rank said where, above)");
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "the ranks did not report their timings");
  return FALSE;
}

static gboolean
measure_mesh (const CpmeshMeshBenchOptions  *options,
              const Plan                    *plan,
              MeshFigures                   *figures,
              GError                       **error)
{
  int n = options->n_ranks;
  CpHarnessRank **ranks = spawn_ranks (options, "timing", error);
  gboolean ok = all_spawned (ranks, n) && cp_harness_run_until (ranks, n, cp_harness_all_done, 0) &&
                read_results (ranks[0], plan, figures, error);

  return finish_ranks (ranks, n, ok, ok ? error : NULL) && ok;
}

/* ---- ucx_perftest ---- */

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
  double tag[MAX_SIZES];
  double put[MAX_SIZES];
} PerftestFigures;

static gboolean
measure_perftest (const Plan       *plan,
                  PerftestFigures  *figures,
                  GError          **error)
{
  g_autofree char *perftest = g_find_program_in_path ("ucx_perftest");

  if (perftest == NULL)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND,
                   "ucx_perftest is not installed (Debian: apt-get install ucx-utils); "
                   "pass --no-perftest to skip the baseline");
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

/* ---- failure detection ---- */

static gboolean
measure_failure (const CpmeshMeshBenchOptions  *options,
                 GError                       **error)
{
  int n = options->n_ranks;
  CpHarnessRank **ranks = spawn_ranks (options, "failure", error);
  gboolean ok = all_spawned (ranks, n) && cp_harness_run_until (ranks, n, cp_harness_all_ready, 0) &&
                cp_harness_all_said (ranks, n, "READY") && !cp_harness_any_done (ranks, n);
  gint64 killed = g_get_monotonic_time ();

  if (ok)
    g_subprocess_send_signal (ranks[n - 1]->process, SIGKILL);
  printf ("\nfailure detection (rank %d killed with SIGKILL during 4 MiB all_gathers, "
          "CPMESH_TIMEOUT_MS=%d):\n", n - 1, FAILURE_TIMEOUT_MS);
  for (int r = 0; ok && r < n - 1; r++)
    {
      const char *failed, *closed;

      cp_harness_run_until (&ranks[r], 1, cp_harness_all_closed, 0);
      failed = cp_harness_rank_find_line (ranks[r], "FAILED");
      closed = cp_harness_rank_find_line (ranks[r], "CLOSED");
      if (failed != NULL && closed != NULL)
        printf ("  rank %d: %s (%.0f ms after the kill); teardown %s ms\n", r, failed,
                (g_get_monotonic_time () - killed) / 1e3, closed + strlen ("CLOSED "));
    }
  if (!ok && error != NULL && *error == NULL)
    g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "the failure-detection ranks did not start");
  /* The killed rank's status is its signal: only the start counts. */
  finish_ranks (ranks, n, ok, NULL);
  return ok;
}

/* ---- report ---- */

static void
print_perftest (const Plan            *plan,
                const PerftestFigures *perftest)
{
  printf ("\nucx_perftest, 2 processes (server and client), same sizes:\n  %-12s", "");
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

static void
print_line (const char *name,
            gsize       size,
            double      seconds,
            double      bus_factor,
            double      algo_bytes,
            double      best)
{
  double algbw = algo_bytes / seconds / 1e9;
  double busbw = algbw * bus_factor;

  printf ("  %-10s %-7s %9.3f ms %8.2f GB/s %8.2f GB/s", name, size_name (size), seconds * 1e3, algbw, busbw);
  if (best > 0)
    printf ("   %.2fx", busbw / best);
  printf ("\n");
}

/* The target: all_gather's bus bandwidth at 64 MiB, against the better
 * ucx_perftest figure at that size; without both, nothing to judge. */
static double
target_ratio (const CpmeshMeshBenchOptions *options,
              const Plan                   *plan,
              const MeshFigures            *mesh,
              const PerftestFigures        *perftest)
{
  int n = options->n_ranks;
  guint last = plan->n_sizes - 1;

  if (perftest == NULL || plan->sizes[last] != 64 * MIB)
    return NAN;
  return (double) plan->sizes[last] * n / mesh->gather[last] / 1e9 * (n - 1.0) / n /
         MAX (perftest->tag[last], perftest->put[last]);
}

static void
print_mesh (CpmeshMeshBenchOptions *options,
            const Plan             *plan,
            const MeshFigures      *mesh,
            const PerftestFigures  *perftest)
{
  int n = options->n_ranks;

  printf ("\nmesh over UCX, %d processes (per-rank size; bus bandwidth as in nccl-tests):\n", n);
  printf ("  %-10s %-7s %12s %13s %13s   %s\n", "collective", "size", "time", "algbw", "busbw",
          perftest ? "busbw / best perftest" : "");
  for (guint s = 0; s < plan->n_sizes; s++)
    {
      gsize size = plan->sizes[s];
      double best = perftest ? MAX (perftest->tag[s], perftest->put[s]) : 0;

      print_line ("all_gather", size, mesh->gather[s], (n - 1.0) / n, (double) size * n, best);
      print_line ("all_reduce", size, mesh->reduce[s], 2.0 * (n - 1.0) / n, (double) size, best);
    }
  printf ("\n");
  cpmesh_bench_target (&options->run, "all_gather busbw at 64 MiB against the better "
                       "ucx_perftest figure", target_ratio (options, plan, mesh, perftest),
                       CPMESH_AT_LEAST, 0.7);
}

/* The options only this backend takes or limits. */
static gboolean
check_options (CpmeshMeshBenchOptions *options,
               CpmeshOption           *entries)
{
  if (!CP_HAS_UCX)
    cpmesh_fail (CPMESH_EXIT_USAGE, "--backend ucx: this libcpmesh was built without UCX");
  else if (cpmesh_option_given (entries, "mib"))
    cpmesh_fail (CPMESH_EXIT_USAGE, "--mib goes with --backend local: over UCX the sizes are "
                 "1 MiB and 64 MiB per rank");
  else if (options->n_ranks < 2 || options->n_ranks > 64)
    cpmesh_fail (CPMESH_EXIT_USAGE, "--cp %d: over UCX use 2 to 64 processes", options->n_ranks);
  else
    {
      options->skip_perftest |= options->run.quick;
      options->skip_failure |= options->run.quick;
      return cpmesh_bench_begin (&options->run, !options->run.quick && !options->skip_perftest,
                                 "the default sizes, against ucx_perftest");
    }
  return FALSE;
}

/* Runs `cpmesh bench mesh --backend ucx`; with CPMESH_BENCH_ROLE set, this
 * process is one of its ranks. */
int
cpmesh_bench_mesh_ucx (CpmeshMeshBenchOptions *options,
                       CpmeshOption           *entries)
{
  const char *role = g_getenv (ROLE_VARIABLE);
  Plan plan = plan_for (options);
  PerftestFigures perftest;
  MeshFigures mesh;
  g_autoptr(GError) error = NULL;

  if (role != NULL)
    return run_rank (role, &plan);
  if (!check_options (options, entries))
    return CPMESH_EXIT_USAGE;
  if (!options->skip_perftest && !measure_perftest (&plan, &perftest, &error))
    return cpmesh_bench_fail (error);
  cpmesh_progress ("all_gather and all_reduce on %d processes", options->n_ranks);
  if (!measure_mesh (options, &plan, &mesh, &error))
    return cpmesh_bench_fail (error);
  printf ("cpmesh bench mesh --backend ucx: %d processes on this host, UCX_TLS=%s, UCX_NET_DEVICES=%s\n",
          options->n_ranks, g_getenv ("UCX_TLS") ? g_getenv ("UCX_TLS") : "(unset: sm,self over loopback)",
          g_getenv ("UCX_NET_DEVICES") ? g_getenv ("UCX_NET_DEVICES") : "(unset)");
  printf ("every rank's all_gather and all_reduce output checked\n");
  if (!options->skip_perftest)
    print_perftest (&plan, &perftest);
  print_mesh (options, &plan, &mesh, options->skip_perftest ? NULL : &perftest);
  fflush (stdout);
  if (!options->skip_failure)
    {
      cpmesh_progress ("failure detection: killing rank %d", options->n_ranks - 1);
      if (!measure_failure (options, &error))
        return cpmesh_bench_fail (error);
    }
  return cpmesh_bench_end (&options->run);
}
