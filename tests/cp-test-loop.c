/* cp-test-loop.c: in-process ranks driven from one main loop
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-loop.h"
#include "cp-test-util.h"

void
cp_test_loop_ranks_init (CpTestLoopRanks *ranks,
                         int              n,
                         guint            timeout_ms)
{
  g_assert_cmpint (n, <=, CP_TEST_LOOP_MAX_RANKS);
  memset (ranks, 0, sizeof *ranks);
  ranks->n = n;
  ranks->timeout_ms = timeout_ms * cp_test_time_factor ();
  ranks->group = cp_test_local_group ("cp", n);
  for (int r = 0; r < n; r++)
    {
      ranks->meshes[r] = g_list_nth_data (ranks->group, (guint) r);
      cp_mesh_set_timeout_ms (ranks->meshes[r], ranks->timeout_ms);
    }
}

void
cp_test_loop_ranks_forget (CpTestLoopRanks *ranks)
{
  for (int r = 0; r < CP_TEST_LOOP_MAX_RANKS; r++)
    g_clear_object (&ranks->results[r]);
}

void
cp_test_loop_ranks_clear (CpTestLoopRanks *ranks)
{
  cp_test_loop_ranks_forget (ranks);
  cp_test_free_group (ranks->group);
}

void
cp_test_loop_done (GObject      *source,
                   GAsyncResult *result,
                   gpointer      user_data)
{
  GAsyncResult **slot = user_data;

  g_assert_null (*slot);
  *slot = g_object_ref (result);
}

static gboolean
keep_awake (gpointer unused)
{
  return G_SOURCE_CONTINUE;
}

void
cp_test_loop_await (CpTestLoopRanks *ranks,
                    int              first,
                    int              last,
                    gint64           since,
                    guint            limit_ms)
{
  guint limit = limit_ms * cp_test_time_factor ();
  gint64 deadline = since + (gint64) limit * G_TIME_SPAN_MILLISECOND;
  /* The main loop wakes now and then to look at the clock. */
  guint awake = g_timeout_add (20, keep_awake, NULL);

  for (int r = first; r < last; r++)
    while (ranks->results[r] == NULL)
      {
        if (g_get_monotonic_time () > deadline)
          g_error ("rank %d's call did not report within %u ms", r, limit);
        g_main_context_iteration (NULL, TRUE);
      }
  g_source_remove (awake);
}

void
cp_test_loop_await_all (CpTestLoopRanks *ranks)
{
  cp_test_loop_await (ranks, 0, ranks->n, g_get_monotonic_time (),
                      ranks->timeout_ms / cp_test_time_factor ());
}

void
cp_test_loop_assert_cancelled (const GError *error,
                               int           cancelled_rank,
                               const char   *which)
{
  g_autofree char *fragment = g_strdup_printf ("rank %d was cancelled", cancelled_rank);

  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
  if (strstr (error->message, fragment) == NULL)
    g_error ("%s: \"%s\" does not say \"%s\"", which, error->message, fragment);
}

void
cp_test_loop_assert_broken (CpTestLoopRanks *ranks,
                            int              cancelled_rank,
                            const char      *subject)
{
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;
      gint64 started = g_get_monotonic_time ();

      g_assert_false (cp_mesh_barrier (ranks->meshes[r], &error));
      g_assert_cmpint (g_get_monotonic_time () - started, <,
                       (gint64) 500 * cp_test_time_factor () * G_TIME_SPAN_MILLISECOND);
      cp_test_loop_assert_cancelled (error, cancelled_rank, "a later barrier");
      g_assert_nonnull (strstr (error->message, "mesh broken"));
      if (r == 0)
        cp_test_record_error (subject, "a later call after an async call was cancelled", error);
    }
}

/* How long the ranks of a cancelled call may take to fail, all of them:
 * a small part of any timeout the tests give their meshes. */
#define PROMPT_MS 3000

static gboolean
cancel_now (gpointer cancellable)
{
  g_cancellable_cancel (cancellable);
  return G_SOURCE_REMOVE;
}

void
cp_test_loop_cancel_one (CpTestLoopRanks  *ranks,
                         gboolean          before,
                         CpTestLoopStart   start,
                         CpTestLoopFinish  finish,
                         gpointer          user_data,
                         const char       *subject,
                         const char       *what)
{
  int n = ranks->n;
  int cancelled = before ? n / 2 : 0;
  int late = before ? n : n - 1;
  int witness = cancelled == 0 ? 1 : 0;
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  gint64 since;

  if (before)
    g_cancellable_cancel (cancellable);
  since = g_get_monotonic_time ();
  for (int r = 0; r < late; r++)
    start (r, r == cancelled ? cancellable : NULL, user_data);
  if (!before)
    {
      g_timeout_add (100, cancel_now, cancellable);
      since += 100 * G_TIME_SPAN_MILLISECOND;
    }
  cp_test_loop_await (ranks, 0, late, since, PROMPT_MS);
  /* The late rank's call fails at once. */
  if (late < n)
    {
      since = g_get_monotonic_time ();
      start (late, NULL, user_data);
      cp_test_loop_await (ranks, late, n, since, 500);
    }
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = finish (r, user_data);
      g_autofree char *which = g_strdup_printf ("%s: %s", what,
                                                r == cancelled ? "the cancelled rank"
                                                : r == late ? "the late rank"
                                                : "a rank waiting in the call");

      cp_test_loop_assert_cancelled (error, cancelled, which);
      if (r == cancelled || r == late || r == witness)
        cp_test_record_error (subject, which, error);
    }
  cp_test_loop_assert_broken (ranks, cancelled, subject);
}
