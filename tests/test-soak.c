/* test-soak.c: many cycles, flat memory, no descriptor growth
 *
 * Each case repeats a whole cycle of the library's life many times and
 * checks, between the end of a warm-up (the first tenth of the cycles:
 * caches, arenas and UCX's pools fill) and the end, that resident memory
 * grows by less than RSS_BOUND_KIB and that no file descriptor is left
 * open.  That catches what the leak checkers cannot: memory still
 * referenced (a list, a cache) that grows with every cycle, and
 * descriptors; a cycle that kept a kilobyte fails the 10,000-cycle case.
 *
 *   local/prepare-enter-exit  10,000 cycles of prepare, enter and exit on
 *                             a 2-rank in-process mesh (one thread per rank)
 *   local/connect-teardown    1,000 in-process meshes made, used for an
 *                             all_reduce and freed
 *   ucx/connect-teardown      1,000 meshes of two UCX processes joined, used
 *                             and torn down, the processes kept (set
 *                             CP_SOAK_UCX_CYCLES to change the count)
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

/* Resident growth allowed after the warm-up: below what a kilobyte kept
 * per cycle costs over 9,000 cycles, above the few hundred KiB (2.5 MiB
 * under ASan) that malloc's arenas and UCX's pools were seen to move. */
#define RSS_BOUND_KIB (8 * 1024)

typedef struct
{
  guint cycles;
  gsize rss_warm;
  gsize rss_end;
  gsize fds_warm;
  gsize fds_end;
} Soak;

static void
note_warm (Soak  *soak,
           guint  cycle)
{
  if (cycle + 1 == MAX (soak->cycles / 10, 1))
    {
      soak->rss_warm = cp_test_resident_kib ();
      soak->fds_warm = cp_test_open_fds ();
    }
}

static void
assert_flat (const char *what,
             Soak       *soak,
             gint64      elapsed_us)
{
  soak->rss_end = cp_test_resident_kib ();
  soak->fds_end = cp_test_open_fds ();
  g_test_message ("%s: %u cycles in %" G_GINT64_FORMAT " ms; resident %" G_GSIZE_FORMAT " KiB after "
                  "warm-up, %" G_GSIZE_FORMAT " KiB at the end; %" G_GSIZE_FORMAT " then %" G_GSIZE_FORMAT
                  " open descriptors", what, soak->cycles, elapsed_us / 1000, soak->rss_warm, soak->rss_end,
                  soak->fds_warm, soak->fds_end);
  g_assert_cmpuint (soak->rss_end, <=, soak->rss_warm + RSS_BOUND_KIB);
  g_assert_cmpuint (soak->fds_end, <=, soak->fds_warm);
}

/* ---- prepare, enter, exit ---- */

static CpBatch *
cycle_batch (guint cycle)
{
  const gint64 shape[] = { 2, 29 };
  CpBatch *batch = cp_batch_new ();

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, cycle));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, cycle + 1));
  cp_test_batch_take (batch, "padding_mask", cp_test_tensor_pattern (CP_DTYPE_BOOL, shape, 2, cycle));
  return batch;
}

static void
prepare_enter_exit_rank (CpMesh   *mesh,
                         gpointer  user_data)
{
  Soak *soak = user_data;

  for (guint i = 0; i < soak->cycles; i++)
    {
      g_autoptr(CpBatch) batch = cycle_batch (i);
      g_autoptr(GError) error = NULL;
      g_autoptr(CpContext) context = cp_batch_prepare (batch, mesh, NULL, &error);

      g_assert_no_error (error);
      g_assert_true (cp_context_enter (context, &error));
      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_dim (cp_batch_get (batch, "input_ids"), 1), ==, 16);
      g_assert_true (cp_context_exit (context, &error));
      if (cp_mesh_get_rank (mesh) == 0)
        note_warm (soak, i);
    }
}

static void
test_prepare_enter_exit (void)
{
  Soak soak = { 10000 };
  gint64 started = g_get_monotonic_time ();

  g_test_summary ("10,000 prepare/enter/exit cycles leave resident memory flat and no "
                  "descriptor open");
  cp_test_run_group ("cp", 2, prepare_enter_exit_rank, &soak);
  assert_flat ("prepare/enter/exit", &soak, g_get_monotonic_time () - started);
}

/* ---- in-process meshes ---- */

static void
all_reduce_rank (CpMesh   *mesh,
                 gpointer  user_data)
{
  const gint64 shape[] = { 64 };
  g_autoptr(CpTensor) t = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 1.0, NULL);
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_reduce (mesh, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  g_assert_cmpfloat (cp_tensor_get_value (t, 63), ==, 2.0);
}

static void
test_local_connect (void)
{
  Soak soak = { 1000 };
  gint64 started = g_get_monotonic_time ();

  for (guint i = 0; i < soak.cycles; i++)
    {
      cp_test_run_group ("cp", 2, all_reduce_rank, NULL);
      note_warm (&soak, i);
    }
  assert_flat ("in-process connect/teardown", &soak, g_get_monotonic_time () - started);
}

/* ---- UCX meshes ---- */

static void
assert_rank_flat (CpTestRank *rank,
                  guint       cycles)
{
  const char *line = cp_test_rank_find_line (rank, "SOAK ");
  Soak soak = { 0 };
  gint64 ms = 0;

  g_assert_nonnull (line);
  g_test_message ("%s", line);
  g_assert_cmpint (sscanf (line, "SOAK %u %" G_GINT64_FORMAT " %" G_GSIZE_FORMAT " %" G_GSIZE_FORMAT " %"
                           G_GSIZE_FORMAT " %" G_GSIZE_FORMAT, &soak.cycles, &ms, &soak.rss_warm,
                           &soak.rss_end, &soak.fds_warm, &soak.fds_end), ==, 6);
  g_assert_cmpuint (soak.cycles, ==, cycles);
  g_assert_cmpuint (soak.rss_end, <=, soak.rss_warm + RSS_BOUND_KIB);
  g_assert_cmpuint (soak.fds_end, <=, soak.fds_warm);
  cp_test_assert_exit (rank, 0);
}

static void
test_ucx_connect (void)
{
  const char *count = g_getenv ("CP_SOAK_UCX_CYCLES");
  guint cycles = count != NULL ? (guint) atoi (count) : 1000;
  g_autofree char *setting = g_strdup_printf ("CP_TEST_CYCLES=%u", cycles);
  guint16 port = cp_test_free_port ();
  CpTestGroup group = { 0 };

  if (!CP_HAS_UCX)
    {
      g_test_skip ("libcpmesh was built without UCX");
      return;
    }
  g_test_summary ("1,000 two-process UCX meshes joined and torn down in the same two "
                  "processes leave their memory flat and no descriptor open");
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "soak", r, 2, port, CP_TEST_SETTINGS (setting, "CPMESH_TIMEOUT_MS=20000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    assert_rank_flat (group.ranks[r], cycles);
  cp_test_group_clear (&group);
}

int
main (int   argc,
      char *argv[])
{
  g_setenv ("UCX_NET_DEVICES", "lo", TRUE);
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Soak/local/prepare-enter-exit", test_prepare_enter_exit);
  g_test_add_func ("/Cp/Soak/local/connect-teardown", test_local_connect);
  g_test_add_func ("/Cp/Soak/ucx/connect-teardown", test_ucx_connect);

  return g_test_run ();
}
