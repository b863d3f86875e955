/* cp-test-fault-rank.c: one rank of a UCX mesh (or, with
 * CPMESH_TRANSPORT=shm, an shm mesh) that may suffer a fault
 *
 * Usage: cp-test-fault-rank SCENARIO
 *
 * Linked with the fault-injection variant of the library.  Arms the
 * fault CP_TEST_FAULT describes, if any:
 *
 *   "KIND STEP RANK OPERATION [DELAY_MS]"  KIND one of drop, delay,
 *                                          truncate, kill; STEP one of
 *                                          descriptor, data, hello,
 *                                          result
 *   "alloc RANK"                           rank RANK's all_reduce cannot
 *                                          allocate its scratch
 *
 * then joins the mesh the environment describes and plays SCENARIO:
 *
 *   all-reduce  a barrier (operation 1), then an all_reduce (operation 2)
 *               of a tensor of its own, timed: "RESULT DOMAIN CODE MS
 *               INTACT", DOMAIN "-" and CODE 0 for success (the sum
 *               checked), else the error's domain and code, with its
 *               message on the next line ("MESSAGE …"); INTACT 1 when
 *               the tensor is as it was before the call.  A rank that
 *               failed keeps its mesh CP_TEST_LINGER_MS more (0 unless
 *               set), as a program that does not give up at once would.
 *               Then it destroys the mesh: "CLOSED MS".
 *   join        joins, then a barrier
 *   broken      the scenario of cp-test-broken.h, with CP_TEST_CALL the
 *               call the fault may strike and CP_TEST_CALL_TIMEOUT_MS its
 *               timeout: prints the report and "READY", then keeps its
 *               mesh until its stdin ends, so that no peer loses it
 *               before every rank is done
 *   after-failure  an all_gather, which the armed fault may make fail,
 *               then CP_TEST_CALLS more (each checked), all with the
 *               timeout CP_TEST_CALL_TIMEOUT_MS: "AFTER OK SUCCEEDED WRONG
 *               FIRST_WRONG SLOWEST_MS", then the first later error
 *               ("MESSAGE …"), "READY", and it waits for its stdin to end
 *   many        CP_TEST_CALLS all_gathers, each checked, starting the
 *               collective sequence at CP_TEST_SEQUENCE_ORIGIN (0 unless
 *               set): "MANY CALLS WRONG FIRST_WRONG MS"
 *
 * A rank that cannot join reports "ERROR CODE MESSAGE" and exits 3.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp-fault-private.h"
#include "cp-test-broken.h"
#include "cp-test-util.h"

static const char *kinds[] = { "none", "drop", "delay", "truncate", "kill" };
static const char *steps[] = { "descriptor", "data", "hello", "result" };

static int
index_of (const char * const *names,
          guint               n,
          const char         *name)
{
  for (guint i = 0; i < n; i++)
    if (g_str_equal (names[i], name))
      return (int) i;
  g_error ("unknown name \"%s\" in CP_TEST_FAULT", name);
}

/* Returns the rank whose all_reduce cannot allocate, or -1. */
static int
arm_fault (const char *description)
{
  g_auto(GStrv) words = g_strsplit (description, " ", -1);
  guint n = g_strv_length (words);
  CpFault fault = { 0 };

  if (n == 2 && g_str_equal (words[0], "alloc"))
    return atoi (words[1]);
  g_assert_cmpuint (n, >=, 4);
  fault.kind = (CpFaultKind) index_of (kinds, G_N_ELEMENTS (kinds), words[0]);
  fault.step = (CpFaultStep) index_of (steps, G_N_ELEMENTS (steps), words[1]);
  /* A hello is the rendezvous's, whichever backends the rank offers;
   * any other step strikes the backend the mesh connects with. */
  if (fault.step == CP_FAULT_STEP_HELLO)
    fault.backend = "bootstrap";
  else
    fault.backend = g_getenv ("CPMESH_TRANSPORT") != NULL ? g_getenv ("CPMESH_TRANSPORT") : "ucx";
  fault.rank = atoi (words[2]);
  fault.operation = (guint) atoi (words[3]);
  fault.delay_ms = n > 4 ? (guint) atoi (words[4]) : 0;
  _cp_fault_arm (&fault);
  return -1;
}

static CpTensor *
rank_tensor (int rank)
{
  const gint64 shape[] = { 1000 };

  return cp_test_tensor_pattern (CP_DTYPE_FLOAT64, shape, 1, (guint) rank);
}

static void
assert_sum (CpTensor *tensor,
            int       world_size)
{
  g_autoptr(CpTensor) expected = rank_tensor (0);

  for (int r = 1; r < world_size; r++)
    {
      g_autoptr(CpTensor) other = rank_tensor (r);

      for (gint64 i = 0; i < cp_tensor_get_numel (expected); i++)
        cp_tensor_set_value (expected, i, cp_tensor_get_value (expected, i) + cp_tensor_get_value (other, i));
    }
  g_assert_true (cp_tensor_equal (tensor, expected));
}

static void
play_all_reduce (CpMesh *mesh,
                 int     alloc_rank)
{
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) tensor = rank_tensor (rank);
  g_autoptr(CpTensor) before = cp_tensor_copy (tensor, NULL);
  g_autoptr(GError) error = NULL;
  gint64 started;
  gboolean ok;

  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  if (rank == alloc_rank)
    _cp_fault_fail_allocation (0);
  started = g_get_monotonic_time ();
  ok = cp_mesh_all_reduce (mesh, tensor, CP_REDUCE_OP_SUM, &error);
  printf ("RESULT %s %d %" G_GINT64_FORMAT " %d\n", ok ? "-" : g_quark_to_string (error->domain),
          ok ? 0 : error->code, (g_get_monotonic_time () - started) / 1000, cp_tensor_equal (tensor, before));
  if (ok)
    assert_sum (tensor, cp_mesh_get_world_size (mesh));
  else
    printf ("MESSAGE %s\n", error->message);
  fflush (stdout);
  if (!ok && g_getenv ("CP_TEST_LINGER_MS") != NULL)
    g_usleep ((gulong) atoi (g_getenv ("CP_TEST_LINGER_MS")) * G_TIME_SPAN_MILLISECOND);
  started = g_get_monotonic_time ();
  g_object_unref (mesh);
  printf ("CLOSED %" G_GINT64_FORMAT "\n", (g_get_monotonic_time () - started) / 1000);
}

static guint
setting (const char *name,
         guint       fallback)
{
  const char *value = g_getenv (name);

  return value != NULL ? (guint) g_ascii_strtoull (value, NULL, 10) : fallback;
}

/* Keeps the mesh until the test has every rank's report. */
static void
wait_for_release (void)
{
  char line[16];

  printf ("READY\n");
  fflush (stdout);
  while (fgets (line, sizeof line, stdin) != NULL)
    ;
}

static void
play_broken (CpMesh *mesh)
{
  int call = cp_test_call_from_name (g_getenv ("CP_TEST_CALL"));
  CpTestReport report = { 0 };

  g_assert_cmpint (call, >=, 0);
  cp_test_report_play (mesh, call, setting ("CP_TEST_CALL_TIMEOUT_MS", 200), &report);
  cp_test_report_print (&report);
  wait_for_release ();
  cp_test_report_clear (&report);
}

typedef struct
{
  guint succeeded;
  guint wrong;
  guint first_wrong;   /* the index of the first call with wrong data, or 0 */
  gint64 slowest_ms;
  GError *first_error;
} Tally;

/* Runs all_gathers @from … @to − 1, each with the data of its index. */
static void
tally_gathers (CpMesh *mesh,
               guint   from,
               guint   to,
               Tally  *tally)
{
  for (guint i = from; i < to; i++)
    {
      CpTestOutcome outcome = { 0 };

      cp_test_call_run (mesh, CP_TEST_CALL_ALL_GATHER, i, &outcome);
      tally->succeeded += outcome.ok;
      if (outcome.ok && !outcome.correct && tally->wrong++ == 0)
        tally->first_wrong = i;
      tally->slowest_ms = MAX (tally->slowest_ms, (outcome.ended_us - outcome.started_us) / 1000);
      if (tally->first_error == NULL)
        tally->first_error = g_steal_pointer (&outcome.error);
      g_clear_error (&outcome.error);
    }
}

static void
play_after_failure (CpMesh *mesh)
{
  guint calls = setting ("CP_TEST_CALLS", 70000);
  g_autoptr(GError) error = NULL;
  CpTestOutcome struck = { 0 };
  Tally later = { 0 };

  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  cp_mesh_set_timeout_ms (mesh, setting ("CP_TEST_CALL_TIMEOUT_MS", 200));
  cp_test_call_run (mesh, CP_TEST_CALL_ALL_GATHER, 0, &struck);
  tally_gathers (mesh, 1, 1 + calls, &later);
  printf ("AFTER %d %u %u %u %" G_GINT64_FORMAT "\n", struck.ok, later.succeeded, later.wrong,
          later.first_wrong, later.slowest_ms);
  printf ("MESSAGE %s\n", later.first_error ? later.first_error->message : "");
  wait_for_release ();
  g_clear_error (&struck.error);
  g_clear_error (&later.first_error);
}

static void
play_many (CpMesh *mesh)
{
  guint calls = setting ("CP_TEST_CALLS", 70000);
  gint64 started = g_get_monotonic_time ();
  Tally tally = { 0 };

  tally_gathers (mesh, 0, calls, &tally);
  g_assert_no_error (tally.first_error);
  printf ("MANY %u %u %u %" G_GINT64_FORMAT "\n", tally.succeeded, tally.wrong, tally.first_wrong,
          (g_get_monotonic_time () - started) / 1000);
}

int
main (int   argc,
      char *argv[])
{
  const char *scenario = argc > 1 ? argv[1] : "join";
  const char *fault = g_getenv ("CP_TEST_FAULT");
  int alloc_rank = fault != NULL ? arm_fault (fault) : -1;
  g_autoptr(GError) error = NULL;
  CpMesh *mesh;

  /* One line at a time, so that a report survives an abnormal exit. */
  setvbuf (stdout, NULL, _IOLBF, 0);
  _cp_fault_set_sequence_origin (setting ("CP_TEST_SEQUENCE_ORIGIN", 0));
  mesh = cp_harness_join_from_env ();
  if (mesh == NULL)
    return 3;
  if (g_str_equal (scenario, "all-reduce"))
    {
      play_all_reduce (mesh, alloc_rank);
      return 0;
    }
  if (g_str_equal (scenario, "broken"))
    play_broken (mesh);
  else if (g_str_equal (scenario, "after-failure"))
    play_after_failure (mesh);
  else if (g_str_equal (scenario, "many"))
    play_many (mesh);
  if (!g_str_equal (scenario, "join"))
    {
      g_object_unref (mesh);
      return 0;
    }
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  g_object_unref (mesh);
  return 0;
}
