/* test-fault-ucx.c: injected faults on a two-process UCX mesh
 *
 * Each case starts two ranks of cp-test-fault-rank (linked with the
 * fault-injection variant of the library) over loopback; rank 1 suffers
 * the fault during an all_reduce or while it joins.  The survivor must
 * fail with the documented error within a bound, keep its tensor, tear
 * down in milliseconds, and no process may be left behind.
 *
 * What each fault costs (the all_reduce moves every rank's slice, then
 * the reduced slices, so every rank waits on its peer at some point):
 *
 *   kill       the peer notices the dead process: PEER_LOST within the
 *              keepalive interval (an eighth of the timeout)
 *   drop       whoever waits for the lost message: TIMED_OUT at the timeout
 *   truncate   the receiver refuses the message at once (TRANSPORT), which
 *              breaks the mesh; its peer hears of it at once and fails
 *              with the same code, naming the receiver's failure
 *   delay      within the timeout: nothing but time; past it: TIMED_OUT
 *   alloc      every rank: OUT_OF_MEMORY, before any data moves
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

#define TIMEOUT_MS 2000
#define SLACK_MS 2000
#define SUBJECT "CpMesh (ucx)"

typedef struct
{
  GQuark domain;
  int code;
  gint64 ms;
  gboolean intact;
  GError *error;
} Result;

static void
read_result (CpTestRank *rank,
             Result     *result)
{
  const char *line = cp_test_rank_find_line (rank, "RESULT ");
  const char *message = cp_test_rank_find_line (rank, "MESSAGE ");
  char domain[64];
  int intact = 0;

  for (guint i = 0; line == NULL && i < rank->lines->len; i++)
    g_test_message ("the rank reported: %s", (const char *) g_ptr_array_index (rank->lines, i));
  g_assert_nonnull (line);
  g_assert_cmpint (sscanf (line, "RESULT %63s %d %" G_GINT64_FORMAT " %d", domain, &result->code,
                           &result->ms, &intact), ==, 4);
  result->intact = intact;
  result->domain = g_str_equal (domain, "-") ? 0 : g_quark_from_string (domain);
  if (result->domain != 0)
    {
      g_assert_nonnull (message);
      result->error = g_error_new_literal (result->domain, result->code, message + strlen ("MESSAGE "));
    }
  g_test_message ("%s", message ? message : line);
  g_test_message ("%s; %s", line, cp_test_rank_find_line (rank, "CLOSED") ?: "not closed");
}

/* Rank @r failed with (@domain, @code) within @bound_ms, its tensor
 * intact, tore down within a second and exited normally; the case is
 * recorded. */
static void
assert_failed (CpTestRank *rank,
               GQuark      domain,
               int         code,
               gint64      bound_ms,
               const char *what)
{
  Result result = { 0 };
  const char *closed;

  read_result (rank, &result);
  CP_TEST_ASSERT_CASE (result.error, domain, code, SUBJECT, what);
  g_assert_cmpint (result.ms, <=, bound_ms);
  g_assert_true (result.intact);
  closed = cp_test_rank_find_line (rank, "CLOSED ");
  g_assert_nonnull (closed);
  g_assert_cmpint (g_ascii_strtoll (closed + strlen ("CLOSED "), NULL, 10), <, 3000);
  cp_test_assert_exit (rank, 0);
  g_clear_error (&result.error);
}

static void
assert_succeeded (CpTestRank *rank)
{
  Result result = { 0 };

  read_result (rank, &result);
  g_assert_cmpint (result.code, ==, 0);
  cp_test_assert_exit (rank, 0);
}

static void
assert_killed (CpTestRank *rank)
{
  g_assert_true (g_subprocess_get_if_signaled (rank->process));
  g_assert_cmpint (g_subprocess_get_term_sig (rank->process), ==, SIGKILL);
}

/* Two ranks run the all-reduce scenario with @fault armed; a rank that
 * fails waits @linger_ms before it leaves. */
static void
run_pair (CpTestGroup *group,
          const char  *fault,
          guint        linger_ms)
{
  g_autofree char *fault_setting = g_strdup_printf ("CP_TEST_FAULT=%s", fault);
  g_autofree char *linger = g_strdup_printf ("CP_TEST_LINGER_MS=%u", linger_ms);
  guint16 port = cp_test_free_port ();

  group->program = "cp-test-fault-rank";
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (group, "all-reduce", r, 2, port,
                         CP_TEST_SETTINGS (fault_setting, linger, "CPMESH_TIMEOUT_MS=" G_STRINGIFY (TIMEOUT_MS)));
  cp_test_run_until (group->ranks, group->n, cp_test_all_done);
}

static void
test_kill (gconstpointer data)
{
  const char *step = data;
  g_autofree char *fault = g_strdup_printf ("kill %s 1 2", step);
  g_autofree char *what = g_strdup_printf ("fault: a rank dies at the %s step of an all_reduce (its peer)",
                                           step);
  CpTestGroup group = { 0 };

  g_test_summary ("A rank that dies in an all_reduce fails its peer with PEER_LOST well "
                  "within the timeout");
  run_pair (&group, fault, 0);
  assert_killed (group.ranks[1]);
  assert_failed (group.ranks[0], CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, TIMEOUT_MS, what);
  cp_test_group_clear (&group);
}

static void
test_drop (gconstpointer data)
{
  const char *step = data;
  g_autofree char *fault = g_strdup_printf ("drop %s 1 2", step);
  g_autofree char *what = g_strdup_printf ("fault: a rank's %s message of an all_reduce is lost "
                                           "(both ranks)", step);
  CpTestGroup group = { 0 };

  run_pair (&group, fault, 0);
  for (int r = 0; r < 2; r++)
    assert_failed (group.ranks[r], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, TIMEOUT_MS + SLACK_MS, what);
  cp_test_group_clear (&group);
}

static void
test_truncate (gconstpointer data)
{
  const char *step = data;
  g_autofree char *fault = g_strdup_printf ("truncate %s 1 2", step);
  g_autofree char *receiver = g_strdup_printf ("fault: a rank's %s message of an all_reduce arrives "
                                               "cut short (the receiver)", step);
  g_autofree char *sender = g_strdup_printf ("fault: a rank's %s message of an all_reduce arrives "
                                             "cut short (the sender, told the mesh broke)", step);
  CpTestGroup group = { 0 };

  g_test_summary ("A message cut short is refused by its receiver at once, never taken as "
                  "data; the sender hears at once that the mesh broke, and why");
  run_pair (&group, fault, 0);
  assert_failed (group.ranks[0], CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SLACK_MS, receiver);
  assert_failed (group.ranks[1], CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SLACK_MS, sender);
  g_assert_nonnull (strstr (cp_test_rank_find_line (group.ranks[1], "MESSAGE "),
                            "mesh broken: rank 0 failed in all_reduce #2: "));
  cp_test_group_clear (&group);
}

static void
test_delay_within (void)
{
  CpTestGroup group = { 0 };

  run_pair (&group, "delay descriptor 1 2 500", 0);
  assert_succeeded (group.ranks[0]);
  assert_succeeded (group.ranks[1]);
  cp_test_group_clear (&group);
}

static void
test_delay_past (void)
{
  CpTestGroup group = { 0 };

  /* The peer stays until the late rank arrives. */
  run_pair (&group, "delay descriptor 1 2 4000", 3000);
  assert_failed (group.ranks[0], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, TIMEOUT_MS + SLACK_MS,
                 "fault: a rank arrives at an all_reduce later than the timeout (its peer)");
  assert_failed (group.ranks[1], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, 2 * TIMEOUT_MS + SLACK_MS,
                 "fault: a rank arrives at an all_reduce later than the timeout (the late rank)");
  cp_test_group_clear (&group);
}

static void
test_alloc (void)
{
  CpTestGroup group = { 0 };

  g_test_summary ("A rank that cannot allocate its all_reduce scratch fails both ranks with "
                  "OUT_OF_MEMORY before any data moves");
  run_pair (&group, "alloc 1", 0);
  for (int r = 0; r < 2; r++)
    assert_failed (group.ranks[r], CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, SLACK_MS,
                   "fault: a rank's all_reduce scratch allocation fails (both ranks)");
  cp_test_group_clear (&group);
}

/* Rank 0 (with a long timeout) survives a joiner that suffers @fault
 * while it says hello, then lets a healthy rank 1 in. */
static CpTestRank *
run_hello (CpTestGroup *group,
           const char  *fault)
{
  g_autofree char *fault_setting = g_strdup_printf ("CP_TEST_FAULT=%s", fault);
  guint16 port = cp_test_free_port ();
  CpTestRank *faulty, *healthy;

  group->program = "cp-test-fault-rank";
  cp_test_group_spawn (group, "join", 0, 2, port, CP_TEST_SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  faulty = cp_test_group_spawn (group, "join", 1, 2, port,
                                CP_TEST_SETTINGS (fault_setting, "CPMESH_TIMEOUT_MS=" G_STRINGIFY (TIMEOUT_MS)));
  cp_test_run_until (&faulty, 1, cp_test_all_done);
  healthy = cp_test_group_spawn (group, "join", 1, 2, port, NULL);
  cp_test_run_until (group->ranks, group->n, cp_test_all_done);
  cp_test_assert_exit (group->ranks[0], 0);
  cp_test_assert_exit (healthy, 0);
  g_assert_nonnull (cp_test_rank_find_line (healthy, "JOINED 1"));
  return faulty;
}

static void
test_hello_truncated (void)
{
  CpTestGroup group = { 0 };
  CpTestRank *faulty = run_hello (&group, "truncate hello 1 0");
  g_autoptr(GError) error = cp_test_rank_dup_error (faulty, CP_MESH_ERROR_TRANSPORT, "a malformed hello");

  g_test_summary ("A hello that reaches rank 0 as garbage is refused, and rank 0 keeps "
                  "listening");
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT,
                       "fault: a joiner's hello arrives cut short (rank 0 keeps listening)");
  cp_test_group_clear (&group);
}

/* Rank 0 gives up on a visitor that sends nothing for a second; the
 * joiner then knocks again. */
static void
test_hello_dropped (void)
{
  CpTestGroup group = { 0 };
  guint16 port = cp_test_free_port ();
  CpTestRank *faulty;

  g_test_summary ("A joiner whose hello is lost knocks again once rank 0 dropped the silent "
                  "connection, and joins");
  group.program = "cp-test-fault-rank";
  cp_test_group_spawn (&group, "join", 0, 2, port, NULL);
  faulty = cp_test_group_spawn (&group, "join", 1, 2, port, CP_TEST_SETTINGS ("CP_TEST_FAULT=drop hello 1 0"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (faulty, 0);
  g_assert_nonnull (cp_test_rank_find_line (faulty, "JOINED 1"));
  cp_test_record_outcome (SUBJECT, "fault: a joiner's hello is lost", "the joiner knocks again and joins",
                          "rank 0 dropped the silent connection; the joiner's next knock got it in");
  cp_test_group_clear (&group);
}

static void
test_hello_killed (void)
{
  CpTestGroup group = { 0 };
  CpTestRank *faulty = run_hello (&group, "kill hello 1 0");

  g_test_summary ("A joiner that dies in the middle of the rendezvous does not harm rank 0");
  assert_killed (faulty);
  cp_test_record_outcome (SUBJECT, "fault: a joiner dies before its hello", "rank 0 keeps listening",
                          "the joiner died; rank 0 let a healthy rank 1 join after it");
  cp_test_group_clear (&group);
}

int
main (int   argc,
      char *argv[])
{
  if (!CP_HAS_UCX)
    {
      g_print ("1..0 # SKIP libcpmesh was built without UCX\n");
      return 0;
    }
  g_setenv ("UCX_NET_DEVICES", "lo", TRUE);
  g_test_init (&argc, &argv, NULL);

  g_test_add_data_func ("/Cp/Fault/ucx/kill/descriptor", "descriptor", test_kill);
  g_test_add_data_func ("/Cp/Fault/ucx/kill/data", "data", test_kill);
  g_test_add_data_func ("/Cp/Fault/ucx/drop/descriptor", "descriptor", test_drop);
  g_test_add_data_func ("/Cp/Fault/ucx/drop/data", "data", test_drop);
  g_test_add_data_func ("/Cp/Fault/ucx/truncate/descriptor", "descriptor", test_truncate);
  g_test_add_data_func ("/Cp/Fault/ucx/truncate/data", "data", test_truncate);
  g_test_add_func ("/Cp/Fault/ucx/delay/within-timeout", test_delay_within);
  g_test_add_func ("/Cp/Fault/ucx/delay/past-timeout", test_delay_past);
  g_test_add_func ("/Cp/Fault/ucx/alloc/all-reduce", test_alloc);
  g_test_add_func ("/Cp/Fault/ucx/hello/truncated", test_hello_truncated);
  g_test_add_func ("/Cp/Fault/ucx/hello/dropped", test_hello_dropped);
  g_test_add_func ("/Cp/Fault/ucx/hello/killed", test_hello_killed);

  return g_test_run ();
}
