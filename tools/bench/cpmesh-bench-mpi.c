/* cpmesh-bench-mpi.c: Open MPI's figures for `cpmesh bench mesh` over
 * processes, measured in the same run
 *
 * A small mpi4py program, kept here as a string so that it goes wherever
 * the cpmesh program goes, does Allgather, Allreduce (SUM, in place) and
 * Alltoall on numpy float32 buffers of the sizes the library's ranks use,
 * timed as they are timed: two warm-up calls, a barrier, N calls, and the
 * slowest rank's seconds per call.  It checks every rank's results with
 * the same patterns as the library's ranks before it reports any time.
 * Nothing is installed: without mpirun or mpi4py the benchmark says what
 * is missing and goes on without these figures.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cpmesh-bench.h"

const char * const cpmesh_coll_names[CPMESH_N_COLLS] = { "all_gather", "all_reduce", "all_to_all" };

/* argv: the test switch, then SIZE:CALLS per size.  The patterns are
 * cpmesh_bench_pattern and the reduce operand of cpmesh-bench.c. */
static const char mpi_script[] =
  "import sys, time\n"
  "import numpy as np\n"
  "from mpi4py import MPI\n"
  "comm = MPI.COMM_WORLD\n"
  "rank, n = comm.Get_rank(), comm.Get_size()\n"
  "corrupt = sys.argv[1] == 'corrupt-result'\n"
  "def pattern(first, count):\n"
  "    i = np.arange(first, first + count, dtype=np.uint64)\n"
  "    return ((i * np.uint64(2654435761)) % np.uint64(16777213)).astype(np.float32)\n"
  "def operand(count, r):\n"
  "    return ((np.arange(count, dtype=np.int64) % 13 + 1) * (r % 4 + 1)).astype(np.float32)\n"
  "def timed(call, calls):\n"
  "    call(); call()\n"
  "    comm.Barrier()\n"
  "    t = MPI.Wtime()\n"
  "    for _ in range(calls):\n"
  "        call()\n"
  "    return comm.allreduce((MPI.Wtime() - t) / calls, op=MPI.MAX)\n"
  "def check(what, got, want):\n"
  "    if corrupt:\n"
  "        got = got.copy(); got[0] += 1000\n"
  "    bad = np.flatnonzero(got != want)\n"
  "    if bad.size:\n"
  "        e = int(bad[0])\n"
  "        return 'Open MPI %s on rank %d: element %d is %g, not %g' % (what, rank, e, got[e], want[e])\n"
  "    return ''\n"
  "results = []\n"
  "for arg in sys.argv[2:]:\n"
  "    size, calls = (int(x) for x in arg.split(':'))\n"
  "    count = size // 4 // n * n\n"
  "    piece = np.zeros(count, dtype=np.float32)\n"
  "    gathered = np.zeros(n * count, dtype=np.float32)\n"
  "    reduced = np.zeros(count, dtype=np.float32)\n"
  "    exchanged = np.zeros(count, dtype=np.float32)\n"
  "    times = [timed(lambda: comm.Allgather(piece, gathered), calls),\n"
  "             timed(lambda: comm.Allreduce(MPI.IN_PLACE, reduced, op=MPI.SUM), calls),\n"
  "             timed(lambda: comm.Alltoall(piece, exchanged), calls)]\n"
  "    piece[:] = pattern(rank * count, count)\n"
  "    comm.Allgather(piece, gathered)\n"
  "    reduced[:] = operand(count, rank)\n"
  "    comm.Allreduce(MPI.IN_PLACE, reduced, op=MPI.SUM)\n"
  "    comm.Alltoall(piece, exchanged)\n"
  "    part = count // n\n"
  "    want_exchanged = np.concatenate([pattern(j * count + rank * part, part) for j in range(n)])\n"
  "    want_reduced = sum(operand(count, r).astype(np.float64) for r in range(n)).astype(np.float32)\n"
  "    wrong = check('Allgather', gathered, pattern(0, n * count)) or \\\n"
  "            check('Allreduce SUM', reduced, want_reduced) or \\\n"
  "            check('Alltoall', exchanged, want_exchanged)\n"
  "    if comm.allreduce(1 if wrong else 0, op=MPI.MAX):\n"
  "        if wrong:\n"
  "            print('WRONG ' + wrong, flush=True)\n"
  "        sys.exit(1)\n"
  "    results += [(name, size, t) for name, t in zip(('all_gather', 'all_reduce', 'all_to_all'), times)]\n"
  "if rank == 0:\n"
  "    for name, size, t in results:\n"
  "        print('RESULT %s %d %.9f' % (name, size, t))\n";

static char *
find_mpirun (void)
{
  return g_find_program_in_path ("mpirun");
}

static gboolean
python_imports (const char  *modules,
                char       **output)
{
  g_autofree char *code = g_strdup_printf ("import %s; from mpi4py import MPI; "
                                           "print(MPI.Get_library_version().splitlines()[0])",
                                           modules);
  const char *argv[] = { cpmesh_bench_python (), "-c", code, NULL };
  int status = 1;

  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL,
                     output, NULL, &status, NULL) || status != 0)
    return FALSE;
  g_strstrip (*output);
  return TRUE;
}

gboolean
cpmesh_mpi_available (char **version,
                      char **why)
{
  g_autofree char *mpirun = find_mpirun ();
  g_autofree char *output = NULL;

  *version = *why = NULL;
  if (mpirun == NULL)
    *why = g_strdup ("mpirun is not on PATH (Debian: openmpi-bin)");
  else if (!python_imports ("numpy, mpi4py", &output))
    *why = g_strdup_printf ("%s cannot import mpi4py and numpy (Debian: python3-mpi4py, "
                            "python3-numpy; or set CPMESH_PYTHON)", cpmesh_bench_python ());
  else
    *version = g_steal_pointer (&output);
  return *version != NULL;
}

/* mpirun refuses root without being told, and more processes than cores
 * without --oversubscribe. */
static GPtrArray *
mpirun_argv (int n_ranks)
{
  GPtrArray *argv = g_ptr_array_new_with_free_func (g_free);

  g_ptr_array_add (argv, find_mpirun ());
  if (geteuid () == 0)
    g_ptr_array_add (argv, g_strdup ("--allow-run-as-root"));
  if ((guint) n_ranks > g_get_num_processors ())
    g_ptr_array_add (argv, g_strdup ("--oversubscribe"));
  g_ptr_array_add (argv, g_strdup ("-np"));
  g_ptr_array_add (argv, g_strdup_printf ("%d", n_ranks));
  g_ptr_array_add (argv, g_strdup (cpmesh_bench_python ()));
  return argv;
}

char *
cpmesh_mpi_describe (int n_ranks)
{
  g_autoptr(GPtrArray) argv = mpirun_argv (n_ranks);

  g_ptr_array_add (argv, NULL);
  return g_strjoinv (" ", (char **) argv->pdata);
}

static gboolean
parse_results (const char            *output,
               const CpmeshMeshPlan  *plan,
               CpmeshMeshRound       *round,
               GError               **error)
{
  g_auto(GStrv) lines = g_strsplit (output, "\n", -1);
  guint found = 0;

  for (guint i = 0; lines[i] != NULL; i++)
    {
      char name[32];
      guint64 size;
      double seconds;

      if (g_str_has_prefix (lines[i], "WRONG "))
        return cpmesh_bench_wrong (error, "%s", lines[i] + strlen ("WRONG "));
      if (sscanf (lines[i], "RESULT %31s %" G_GUINT64_FORMAT " %lf", name, &size, &seconds) != 3)
        continue;
      for (int c = 0; c < CPMESH_N_COLLS; c++)
        for (guint s = 0; s < plan->n_sizes; s++)
          if (g_str_equal (name, cpmesh_coll_names[c]) && size == plan->sizes[s])
            {
              round->seconds[c][s] = seconds;
              found++;
            }
    }
  if (found == CPMESH_N_COLLS * plan->n_sizes)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "Open MPI's ranks reported %u of %u "
               "timings", found, CPMESH_N_COLLS * plan->n_sizes);
  return FALSE;
}

gboolean
cpmesh_mpi_measure (int                    n_ranks,
                    const CpmeshMeshPlan  *plan,
                    CpmeshMeshRound       *round,
                    GError               **error)
{
  g_autoptr(GPtrArray) argv = mpirun_argv (n_ranks);
  g_autofree char *output = NULL;
  g_autofree char *errors = NULL;
  const char *test = g_getenv (CPMESH_BENCH_TEST_VARIABLE);
  g_autoptr(GError) failure = NULL;
  int status = 1;

  g_ptr_array_add (argv, g_strdup ("-c"));
  g_ptr_array_add (argv, g_strdup (mpi_script));
  g_ptr_array_add (argv, g_strdup (test != NULL && *test != '\0' ? test : "-"));
  for (guint s = 0; s < plan->n_sizes; s++)
    g_ptr_array_add (argv, g_strdup_printf ("%" G_GSIZE_FORMAT ":%u", plan->sizes[s],
                                            plan->calls[s]));
  g_ptr_array_add (argv, NULL);
  if (!g_spawn_sync (NULL, (char **) argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &output,
                     &errors, &status, error))
    return FALSE;
  if (parse_results (output, plan, round, &failure))
    return TRUE;
  if (!g_error_matches (failure, CPMESH_BENCH_ERROR, CPMESH_BENCH_ERROR_WRONG_RESULT))
    {
      g_autoptr(GError) exited = NULL;
      gsize length = strlen (g_strstrip (errors));

      g_spawn_check_wait_status (status, &exited);
      /* mpirun repeats itself: its last lines say why. */
      g_prefix_error (&failure, "%s%s%s: ", exited ? exited->message : "mpirun exited",
                      length > 0 ? ": " : "", length > 400 ? errors + length - 400 : errors);
    }
  g_propagate_error (error, g_steal_pointer (&failure));
  return FALSE;
}
