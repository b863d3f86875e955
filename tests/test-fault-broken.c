/* test-fault-broken.c: after a failure, a mesh is broken on every rank
 *
 * Linked with the fault-injection variant of the library
 * (cp-fault-private.h).  The last rank of 2 or 3 is late by once or
 * twice the timeout at one step of one call — every step of every
 * collective and of send_recv — on in-process ranks (threads) and on UCX
 * ranks (processes of cp-test-fault-rank).  Every rank then makes one
 * call of each kind (cp-test-broken.h).  Whatever the struck call gave
 * each rank:
 *
 *   - a call that succeeds has the right data;
 *   - no rank waits out more than one timeout: the late rank fails (or
 *     succeeds) as soon as it wakes;
 *   - if any rank failed the struck call, every later call of every rank
 *     fails, at once — well under the timeout after it started, or after
 *     the first failure if it was already waiting then — with the code
 *     of the failure and a message naming it: "mesh broken: rank R timed
 *     out in …", R a rank that failed the struck call by itself;
 *   - if none failed, every later call succeeds.
 *
 * Twice the timeout must fail the struck call on every rank that takes
 * part in it with the late one (the late rank hears of its peers' failure
 * when it wakes); in a ring of three, the rank whose messages do not pass
 * through a late receiver completes its send_recv.  Where an in-process
 * rank is late after arriving, its peers may be reading its memory, so
 * nothing times out and every rank succeeds late.  Once the timeout is a
 * race, and ranks may disagree about the struck call only — the window
 * doc/mesh.md describes; the test reports when they do.
 *
 * The other cases: more than 65,536 calls after a failed one, on two UCX
 * ranks, none of which may succeed (the 16-bit sequence of the old tag
 * layout wrapped there and delivered stale data as a success); and more
 * than 65,536 successful calls across the wrap of the sequence field,
 * each with its own data.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>

#include "cp-fault-private.h"
#include "cp-test-broken.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"

/* The struck call's timeout; later calls have the mesh's own, 3 s or
 * more. */
#define TIMEOUT_MS 150
/* What a later call may take: "at once", on a loaded machine; the
 * bounds below scale with cp_test_time_factor(). */
#define FAST_MS (100 * (gint64) cp_test_time_factor ())
/* Past this an in-process case has hung: it fails then, not when Meson
 * kills the test. */
#define LIMIT_MS 10000
/* More than the 65,536 calls the old 16-bit sequence took to wrap.
 * Sanitizers make a call ten times slower; their runs look for memory
 * errors and races, and still cross the wrap of the sequence field (from
 * 300 calls before it), with fewer calls. */
#if defined (__SANITIZE_ADDRESS__) || defined (__SANITIZE_THREAD__)
#define MANY_CALLS 3000
#else
#define MANY_CALLS 70000
#endif

typedef struct
{
  CpTestCall call;
  guint operation;        /* 2: the call (after the warm-up, 1); 3: a send_recv's receive */
  CpFaultStep step;
  const char *fault_step; /* as cp-test-fault-rank reads it */
  const char *name;       /* in test paths and the reliability table */
} Strike;

static const Strike strikes[] = {
  { CP_TEST_CALL_BARRIER, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "descriptor" },
  { CP_TEST_CALL_ALL_GATHER, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "descriptor" },
  { CP_TEST_CALL_ALL_GATHER, 2, CP_FAULT_STEP_DATA, "data", "data" },
  { CP_TEST_CALL_ALL_TO_ALL, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "descriptor" },
  { CP_TEST_CALL_ALL_TO_ALL, 2, CP_FAULT_STEP_DATA, "data", "data" },
  { CP_TEST_CALL_ALL_REDUCE, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "descriptor" },
  { CP_TEST_CALL_ALL_REDUCE, 2, CP_FAULT_STEP_DATA, "data", "data" },
  { CP_TEST_CALL_ALL_REDUCE, 2, CP_FAULT_STEP_RESULT, "result", "result" },
  { CP_TEST_CALL_BROADCAST, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "descriptor" },
  { CP_TEST_CALL_BROADCAST, 2, CP_FAULT_STEP_DATA, "data", "data" },
  { CP_TEST_CALL_SEND_RECV, 2, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "send-header" },
  { CP_TEST_CALL_SEND_RECV, 2, CP_FAULT_STEP_DATA, "data", "send-data" },
  { CP_TEST_CALL_SEND_RECV, 3, CP_FAULT_STEP_DESCRIPTOR, "descriptor", "recv-header" },
  { CP_TEST_CALL_SEND_RECV, 3, CP_FAULT_STEP_DATA, "data", "recv-data" },
};

typedef struct
{
  gboolean ucx;
  int n;
  guint factor;            /* the delay, in timeouts */
  const Strike *strike;
} Case;

/* The in-process backend has neither an all_reduce result step nor a
 * send's data step: a send is one envelope. */
static gboolean
exists_in_process (const Strike *strike)
{
  return strike->step != CP_FAULT_STEP_RESULT &&
         !(strike->call == CP_TEST_CALL_SEND_RECV && strike->operation == 2 &&
           strike->step == CP_FAULT_STEP_DATA);
}

/* An in-process rank late after arriving: its peers wait for its copies
 * without a deadline. */
static gboolean
is_late_only (const Case *c)
{
  return !c->ucx && c->strike->step == CP_FAULT_STEP_DATA;
}

static const char *
subject (const Case *c)
{
  return c->ucx ? "CpMesh (ucx)" : "CpMesh (in-process)";
}

/* ---- running the scenario ---- */

typedef struct
{
  const Case *c;
  CpTestReport *reports;
} LocalRun;

static void
play_local (CpMesh   *mesh,
            gpointer  user_data)
{
  LocalRun *run = user_data;

  cp_test_report_play (mesh, run->c->strike->call, TIMEOUT_MS, &run->reports[cp_mesh_get_rank (mesh)]);
}

static void
run_local (const Case   *c,
           CpTestReport *reports)
{
  CpFault fault = { CP_FAULT_DELAY, "local", c->n - 1, c->strike->operation, c->strike->step,
                    c->factor * TIMEOUT_MS };
  LocalRun run = { c, reports };

  _cp_fault_arm (&fault);
  cp_test_run_group_within ("cp", c->n, play_local, &run, LIMIT_MS);
  _cp_fault_disarm ();
}

/* Every rank keeps its mesh until all have reported. */
static void
run_ucx (const Case   *c,
         CpTestReport *reports)
{
  g_autofree char *fault = g_strdup_printf ("CP_TEST_FAULT=delay %s %d %u %u", c->strike->fault_step,
                                            c->n - 1, c->strike->operation, c->factor * TIMEOUT_MS);
  g_autofree char *call = g_strdup_printf ("CP_TEST_CALL=%s", cp_test_call_name (c->strike->call));
  CpTestGroup group = { "cp-test-fault-rank" };
  guint16 port = cp_test_free_port ();

  for (int r = 0; r < c->n; r++)
    cp_test_group_spawn (&group, "broken", r, c->n, port,
                         CP_TEST_SETTINGS (fault, call, "CP_TEST_CALL_TIMEOUT_MS=" G_STRINGIFY (TIMEOUT_MS)));
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  for (int r = 0; r < c->n; r++)
    cp_test_rank_release (group.ranks[r]);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < c->n; r++)
    {
      cp_test_assert_exit (group.ranks[r], 0);
      cp_test_report_parse (group.ranks[r]->lines, &reports[r]);
    }
  cp_test_group_clear (&group);
}

/* ---- judging it ---- */

static gint64
duration_ms (const CpTestOutcome *outcome)
{
  return (outcome->ended_us - outcome->started_us) / 1000;
}

static void
log_outcome (int                  rank,
             const char          *which,
             const CpTestOutcome *outcome)
{
  g_test_message ("rank %d, %s: %s after %" G_GINT64_FORMAT " ms", rank, which,
                  outcome->ok ? (outcome->correct ? "success" : "WRONG DATA")
                              : outcome->error->message, duration_ms (outcome));
}

static gboolean
failed_by_itself (const CpTestOutcome *outcome)
{
  return !outcome->ok && strstr (outcome->error->message, "mesh broken") == NULL;
}

/* How many ranks twice the timeout must fail: every rank of a
 * collective; of a ring of three whose last rank is late to receive, the
 * two that send to or through it. */
static int
expected_failures (const Case *c)
{
  if (is_late_only (c))
    return 0;
  if (c->strike->call == CP_TEST_CALL_SEND_RECV && c->strike->operation == 3 && c->n == 3)
    return 2;
  return c->n;
}

/* The struck call: success with the right data, or a timeout, after one
 * timeout at most, or the delay for the late rank, which then goes on at
 * once.  Returns how many ranks failed it. */
static int
judge_struck (const Case   *c,
              CpTestReport *reports)
{
  int failed = 0;

  for (int r = 0; r < c->n; r++)
    {
      CpTestOutcome *struck = &reports[r].struck;
      gboolean late = r == c->n - 1 || is_late_only (c);

      log_outcome (r, "struck call", struck);
      g_assert_cmpint (duration_ms (struck), <=, (late ? c->factor : 1) * TIMEOUT_MS + FAST_MS);
      if (struck->ok)
        g_assert_true (struck->correct);
      else
        {
          g_assert_error (struck->error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT);
          failed++;
        }
    }
  if (failed > 0 && failed < c->n && c->strike->call != CP_TEST_CALL_SEND_RECV)
    g_test_message ("the ranks disagree about the struck call: %d of %d failed it", failed, c->n);
  return failed;
}

/* When the first rank that failed by itself had failed. */
static gint64
first_failure_us (const Case   *c,
                  CpTestReport *reports)
{
  gint64 first = G_MAXINT64;

  for (int r = 0; r < c->n; r++)
    if (failed_by_itself (&reports[r].struck))
      first = MIN (first, reports[r].struck.ended_us);
  return first;
}

/* The rank a later call's "mesh broken: rank R timed out in …" names; it
 * must have failed the struck call by itself, not on hearing of another
 * rank's failure. */
static void
assert_names_first_failure (const Case    *c,
                            CpTestReport  *reports,
                            const GError  *later)
{
  const char *named = strstr (later->message, "mesh broken: rank ");
  int rank = -1;

  g_assert_nonnull (named);
  g_assert_cmpint (sscanf (named, "mesh broken: rank %d timed out in ", &rank), ==, 1);
  g_assert_nonnull (strstr (named, " timed out in "));
  g_assert_cmpint (rank, >=, 0);
  g_assert_cmpint (rank, <, c->n);
  g_assert_true (failed_by_itself (&reports[rank].struck));
}

static void
judge_later (const Case   *c,
             CpTestReport *reports,
             gboolean      broken)
{
  gint64 failure_us = first_failure_us (c, reports);

  for (int r = 0; r < c->n; r++)
    for (int k = 0; k < CP_TEST_N_CALLS; k++)
      {
        CpTestOutcome *later = &reports[r].later[k];

        log_outcome (r, cp_test_call_name (k), later);
        if (!broken)
          {
            g_assert_true (later->ok);
            g_assert_true (later->correct);
            continue;
          }
        g_assert_error (later->error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT);
        g_test_message ("  failed %" G_GINT64_FORMAT " us after it started or the first failure",
                        later->ended_us - MAX (later->started_us, failure_us));
        g_assert_cmpint ((later->ended_us - MAX (later->started_us, failure_us)) / 1000, <=, FAST_MS);
        assert_names_first_failure (c, reports, later->error);
        /* One rank names one first failure. */
        g_assert_cmpstr (strstr (later->error->message, "mesh broken: "), ==,
                         strstr (reports[r].later[0].error->message, "mesh broken: "));
      }
}

static void
record (const Case   *c,
        CpTestReport *reports)
{
  const char *name = cp_test_call_name (c->strike->call);
  g_autofree char *call = g_strdup_printf ("%s %s", g_str_has_prefix (name, "all_") ? "an" : "a", name);
  g_autofree char *what = NULL;

  if (c->factor == 1)
    {
      what = g_strdup_printf ("fault: a rank is late by the timeout at the %s step of %s",
                              c->strike->name, call);
      cp_test_record_outcome (subject (c), what, "one verdict from the next call on",
                              "either every later call succeeds, or every later call of every rank "
                              "fails at once naming the first failure");
    }
  else if (is_late_only (c))
    {
      what = g_strdup_printf ("fault: a rank is late by twice the timeout between arriving at %s "
                              "and copying", call);
      cp_test_record_outcome (subject (c), what, "succeeds late",
                              "peers that may be reading a rank's memory wait for it without a deadline");
    }
  else
    {
      what = g_strdup_printf ("fault: a rank is late by twice the timeout at the %s step of %s "
                              "(every later call of every rank, at once)", c->strike->name, call);
      cp_test_record_error (subject (c), what, reports[0].later[0].error);
    }
}

static void
test_late (gconstpointer data)
{
  const Case *c = data;
  CpTestReport reports[3] = { { { 0 } } };
  int failed;

  if (c->ucx)
    run_ucx (c, reports);
  else
    run_local (c, reports);
  failed = judge_struck (c, reports);
  if (c->factor >= 2 || is_late_only (c))
    g_assert_cmpint (failed, ==, expected_failures (c));
  judge_later (c, reports, failed > 0);
  record (c, reports);
  for (int r = 0; r < c->n; r++)
    cp_test_report_clear (&reports[r]);
}

/* ---- many calls ---- */

static const char *
find_line (CpTestRank *rank,
           const char *prefix)
{
  const char *line = cp_test_rank_find_line (rank, prefix);

  for (guint i = 0; line == NULL && i < rank->lines->len; i++)
    g_test_message ("the rank reported: %s", (const char *) g_ptr_array_index (rank->lines, i));
  g_assert_nonnull (line);
  g_test_message ("%s", line);
  return line;
}

/* Rank 1 is late by 1.3 timeouts at the data step of an all_gather: its
 * peer times out waiting for its data, which arrives afterwards. */
static void
test_after_failure (void)
{
  CpTestGroup group = { "cp-test-fault-rank" };
  guint16 port = cp_test_free_port ();
  g_autofree char *fault = g_strdup_printf ("CP_TEST_FAULT=delay data 1 2 %d", TIMEOUT_MS * 13 / 10);
  g_autofree char *calls = g_strdup_printf ("CP_TEST_CALLS=%d", MANY_CALLS);

  g_test_summary ("After a call that failed on a rank, none of 70,000 later calls succeeds on "
                  "any rank, past the wrap of the old 16-bit sequence where stale data passed "
                  "for a success");
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "after-failure", r, 2, port,
                         CP_TEST_SETTINGS (fault, calls, "CP_TEST_CALL_TIMEOUT_MS=" G_STRINGIFY (TIMEOUT_MS)));
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  for (int r = 0; r < 2; r++)
    cp_test_rank_release (group.ranks[r]);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    {
      int struck_ok;
      guint succeeded, wrong, first_wrong;
      gint64 slowest_ms;
      const char *message;
      g_autoptr(GError) error = NULL;

      g_assert_cmpint (sscanf (find_line (group.ranks[r], "AFTER "), "AFTER %d %u %u %u %" G_GINT64_FORMAT,
                               &struck_ok, &succeeded, &wrong, &first_wrong, &slowest_ms), ==, 5);
      message = find_line (group.ranks[r], "MESSAGE ") + strlen ("MESSAGE ");
      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_cmpuint (wrong, ==, 0);
      g_assert_cmpuint (succeeded, ==, 0);
      g_assert_cmpint (slowest_ms, <=, FAST_MS);
      g_assert_nonnull (strstr (message, "mesh broken: rank 0 timed out in all_gather #2: "));
      error = g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, message);
      cp_test_record_error ("CpMesh (ucx)", "fault: 70,000 all_gathers after one that timed out on a rank "
                            "(every rank; none succeeds)", error);
    }
  cp_test_group_clear (&group);
}

/* MANY_CALLS all_gathers, each with data of its own, from 300 calls before
 * the wrap of the 32-bit sequence field. */
static void
test_many (void)
{
  CpTestGroup group = { "cp-test-fault-rank" };
  guint16 port = cp_test_free_port ();
  g_autofree char *calls = g_strdup_printf ("CP_TEST_CALLS=%d", MANY_CALLS);

  g_test_summary ("Sequence numbers never alias: 70,000 collectives (3,000 under sanitizers) "
                  "across the wrap of the tag's sequence field each deliver their own data");
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "many", r, 2, port,
                         CP_TEST_SETTINGS (calls, "CP_TEST_SEQUENCE_ORIGIN=4294966996"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    {
      guint done, wrong, first_wrong;
      gint64 ms;

      g_assert_cmpint (sscanf (find_line (group.ranks[r], "MANY "), "MANY %u %u %u %" G_GINT64_FORMAT,
                               &done, &wrong, &first_wrong, &ms), ==, 4);
      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_cmpuint (done, ==, MANY_CALLS);
      g_assert_cmpuint (wrong, ==, 0);
    }
  cp_test_group_clear (&group);
}

/* ---- the matrix ---- */

static void
add_cases (gboolean ucx)
{
  for (int n = 2; n <= 3; n++)
    for (guint i = 0; i < G_N_ELEMENTS (strikes); i++)
      for (guint factor = 1; factor <= 2; factor++)
        {
          Case *c = g_new0 (Case, 1);
          g_autofree char *call = g_strdelimit (g_strdup (cp_test_call_name (strikes[i].call)), "_", '-');
          g_autofree char *path = NULL;

          if (!ucx && !exists_in_process (&strikes[i]))
            {
              g_free (c);
              continue;
            }
          *c = (Case) { ucx, n, factor, &strikes[i] };
          path = g_strdup_printf ("/Cp/Fault/broken/%s/%d/%s/%s/%ux", ucx ? "ucx" : "local", n, call,
                                  strikes[i].name, factor);
          g_test_add_data_func_full (path, c, test_late, g_free);
        }
}

int
main (int   argc,
      char *argv[])
{
  g_setenv ("UCX_NET_DEVICES", "lo", TRUE);
  g_test_init (&argc, &argv, NULL);

  add_cases (FALSE);
  if (CP_HAS_UCX)
    {
      add_cases (TRUE);
      g_test_add_func ("/Cp/Fault/broken/ucx/after-failure", test_after_failure);
      g_test_add_func ("/Cp/Fault/broken/ucx/many", test_many);
    }
  return g_test_run ();
}
