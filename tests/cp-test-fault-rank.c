/* cp-test-fault-rank.c: one rank of a UCX mesh that may suffer a fault
 *
 * Usage: cp-test-fault-rank SCENARIO
 *
 * Linked with the fault-injection variant of the library.  Arms the
 * fault CP_TEST_FAULT describes, if any:
 *
 *   "KIND STEP RANK OPERATION [DELAY_MS]"  KIND one of drop, delay,
 *                                          truncate, kill; STEP one of
 *                                          descriptor, data, hello
 *   "alloc RANK"                           rank RANK's all_reduce cannot
 *                                          allocate its scratch
 *
 * then joins the mesh the environment describes and plays SCENARIO:
 *
 *   all-reduce  a barrier (operation 0), then an all_reduce (operation 1)
 *               of a tensor of its own, timed: "RESULT DOMAIN CODE MS
 *               INTACT", DOMAIN "-" and CODE 0 for success (the sum
 *               checked), else the error's domain and code, with its
 *               message on the next line ("MESSAGE …"); INTACT 1 when
 *               the tensor is as it was before the call.  A rank that
 *               failed keeps its mesh CP_TEST_LINGER_MS more (0 unless
 *               set), as a program that does not give up at once would.
 *               Then it destroys the mesh: "CLOSED MS".
 *   join        joins, then a barrier
 *
 * A rank that cannot join reports "ERROR CODE MESSAGE" and exits 3.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp-fault-private.h"
#include "cp-test-util.h"

static const char *kinds[] = { "none", "drop", "delay", "truncate", "kill" };
static const char *steps[] = { "descriptor", "data", "hello" };

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
  fault.backend = "ucx";
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
  mesh = cp_mesh_new_from_env (&error);

  if (mesh == NULL)
    {
      printf ("ERROR %d %s\n", error->code, error->message);
      return 3;
    }
  printf ("JOINED %d\n", cp_mesh_get_rank (mesh));
  fflush (stdout);
  if (g_str_equal (scenario, "all-reduce"))
    {
      play_all_reduce (mesh, alloc_rank);
      return 0;
    }
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  g_object_unref (mesh);
  return 0;
}
