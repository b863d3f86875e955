/* cp-test-broken.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>

#include "cp-test-broken.h"

static const char *call_names[] = {
  [CP_TEST_CALL_BARRIER] = "barrier",
  [CP_TEST_CALL_ALL_GATHER] = "all_gather",
  [CP_TEST_CALL_ALL_TO_ALL] = "all_to_all",
  [CP_TEST_CALL_ALL_REDUCE] = "all_reduce",
  [CP_TEST_CALL_BROADCAST] = "broadcast",
  [CP_TEST_CALL_SEND_RECV] = "send_recv",
};

const char *
cp_test_call_name (CpTestCall call)
{
  return call_names[call];
}

int
cp_test_call_from_name (const char *name)
{
  for (int c = 0; c < CP_TEST_N_CALLS; c++)
    if (g_str_equal (call_names[c], name))
      return c;
  return -1;
}

/* Element @i of what @rank contributes to call @index: exact in int64
 * and in the doubles that carry it, and different for every call. */
static double
contribution (guint index,
              int   rank,
              gsize i)
{
  return (double) index * 10000 + rank * 100 + (double) i;
}

/* [rows, 3] int64 holding @rank's contribution to call @index. */
static CpTensor *
contributed (guint index,
             int   rank,
             gint64 rows)
{
  const gint64 shape[] = { rows, 3 };
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);

  for (gint64 i = 0; i < rows * 3; i++)
    cp_tensor_set_value (tensor, i, contribution (index, rank, (gsize) i));
  return tensor;
}

typedef double (*ExpectFunc) (guint index,
                              int   n,
                              int   me,
                              gsize i);

static gboolean
holds (CpTensor   *tensor,
       ExpectFunc  expect,
       guint       index,
       int         n,
       int         me)
{
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    if (cp_tensor_get_value (tensor, i) != expect (index, n, me, (gsize) i))
      return FALSE;
  return TRUE;
}

/* Row pairs of [2n, 3]: pair k comes from rank k. */
static double
gathered (guint index,
          int   n,
          int   me,
          gsize i)
{
  return contribution (index, (int) (i / 6), i % 6);
}

/* Pair k comes from rank k, which sent this rank its pair number me. */
static double
exchanged (guint index,
           int   n,
           int   me,
           gsize i)
{
  return contribution (index, (int) (i / 6), (gsize) me * 6 + i % 6);
}

static double
summed (guint index,
        int   n,
        int   me,
        gsize i)
{
  double sum = 0;

  for (int r = 0; r < n; r++)
    sum += contribution (index, r, i);
  return sum;
}

static double
from_last (guint index,
           int   n,
           int   me,
           gsize i)
{
  return contribution (index, n - 1, i);
}

static double
from_previous (guint index,
               int   n,
               int   me,
               gsize i)
{
  return contribution (index, (me + n - 1) % n, i);
}

/* Runs @call; on success, whether the result holds what @expect says. */
static gboolean
run_checked (CpMesh      *mesh,
             CpTestCall   call,
             guint        index,
             gboolean    *correct,
             GError     **error)
{
  int n = cp_mesh_get_world_size (mesh), me = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) mine = contributed (index, me, call == CP_TEST_CALL_ALL_TO_ALL ? 2 * n : 2);
  g_autoptr(CpTensor) out = NULL;

  *correct = FALSE;
  switch (call)
    {
    case CP_TEST_CALL_BARRIER:
      *correct = cp_mesh_barrier (mesh, error);
      return *correct;
    case CP_TEST_CALL_ALL_GATHER:
      out = cp_mesh_all_gather (mesh, mine, 0, error);
      *correct = out != NULL && holds (out, gathered, index, n, me);
      return out != NULL;
    case CP_TEST_CALL_ALL_TO_ALL:
      out = cp_mesh_all_to_all (mesh, mine, 0, error);
      *correct = out != NULL && holds (out, exchanged, index, n, me);
      return out != NULL;
    case CP_TEST_CALL_ALL_REDUCE:
      if (!cp_mesh_all_reduce (mesh, mine, CP_REDUCE_OP_SUM, error))
        return FALSE;
      *correct = holds (mine, summed, index, n, me);
      return TRUE;
    case CP_TEST_CALL_BROADCAST:
      if (!cp_mesh_broadcast (mesh, mine, n - 1, error))
        return FALSE;
      *correct = holds (mine, from_last, index, n, me);
      return TRUE;
    case CP_TEST_CALL_SEND_RECV:
      out = contributed (index, -1, 2);
      if (!cp_mesh_send_recv (mesh, mine, (me + 1) % n, out, (me + n - 1) % n, 7 + index, error))
        return FALSE;
      *correct = holds (out, from_previous, index, n, me);
      return TRUE;
    default:
      g_assert_not_reached ();
    }
}

void
cp_test_call_run (CpMesh        *mesh,
                  CpTestCall     call,
                  guint          index,
                  CpTestOutcome *outcome)
{
  outcome->started_us = g_get_monotonic_time ();
  outcome->ok = run_checked (mesh, call, index, &outcome->correct, &outcome->error);
  outcome->ended_us = g_get_monotonic_time ();
  g_assert_true (outcome->ok == (outcome->error == NULL));
}

void
cp_test_report_play (CpMesh        *mesh,
                     CpTestCall     struck,
                     guint          timeout_ms,
                     CpTestReport  *report)
{
  guint own_timeout_ms = cp_mesh_get_timeout_ms (mesh);
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  cp_mesh_set_timeout_ms (mesh, timeout_ms);
  cp_test_call_run (mesh, struck, 0, &report->struck);
  /* Long again: a rank that finished early waits for the late ones, and
   * a broken mesh must fail without waiting for anything. */
  cp_mesh_set_timeout_ms (mesh, own_timeout_ms);
  for (int c = 0; c < CP_TEST_N_CALLS; c++)
    cp_test_call_run (mesh, c, 1 + (guint) c, &report->later[c]);
}

static void
outcome_clear (CpTestOutcome *outcome)
{
  g_clear_error (&outcome->error);
}

void
cp_test_report_clear (CpTestReport *report)
{
  outcome_clear (&report->struck);
  for (int c = 0; c < CP_TEST_N_CALLS; c++)
    outcome_clear (&report->later[c]);
}

static void
print_outcome (guint                index,
               const CpTestOutcome *outcome)
{
  const GError *e = outcome->error;

  printf ("CALL %u %d %d %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %s %d %s\n", index, outcome->ok,
          outcome->correct, outcome->started_us, outcome->ended_us,
          e ? g_quark_to_string (e->domain) : "-", e ? e->code : 0, e ? e->message : "");
}

void
cp_test_report_print (const CpTestReport *report)
{
  print_outcome (0, &report->struck);
  for (int c = 0; c < CP_TEST_N_CALLS; c++)
    print_outcome (1 + (guint) c, &report->later[c]);
  fflush (stdout);
}

static void
parse_outcome (const char    *line,
               CpTestReport  *report)
{
  char domain[64];
  guint index;
  int ok, correct, code, consumed = 0;
  gint64 started, ended;
  CpTestOutcome *outcome;

  g_assert_cmpint (sscanf (line, "CALL %u %d %d %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %63s %d %n",
                           &index, &ok, &correct, &started, &ended, domain, &code, &consumed), ==, 7);
  g_assert_cmpuint (index, <=, CP_TEST_N_CALLS);
  outcome = index == 0 ? &report->struck : &report->later[index - 1];
  outcome->ok = ok;
  outcome->correct = correct;
  outcome->started_us = started;
  outcome->ended_us = ended;
  if (!g_str_equal (domain, "-"))
    outcome->error = g_error_new_literal (g_quark_from_string (domain), code, line + consumed);
}

void
cp_test_report_parse (GPtrArray    *lines,
                      CpTestReport *report)
{
  guint n = 0;

  for (guint i = 0; i < lines->len; i++)
    if (g_str_has_prefix (g_ptr_array_index (lines, i), "CALL "))
      {
        parse_outcome (g_ptr_array_index (lines, i), report);
        n++;
      }
  g_assert_cmpuint (n, ==, 1 + CP_TEST_N_CALLS);
}
