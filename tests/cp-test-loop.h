/* cp-test-loop.h: in-process ranks driven from one main loop
 *
 * The ranks of a local group, each making _async calls from this
 * thread: a test starts one call per rank with CP_TEST_LOOP_DONE (ranks,
 * r) as its callback, runs the main loop until the ranks it waits for
 * have reported, and completes each call with its _finish function on
 * ranks->results[r].
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <libcpmesh.h>

G_BEGIN_DECLS

#define CP_TEST_LOOP_MAX_RANKS 32

typedef struct
{
  int n;
  guint timeout_ms;       /* of every mesh, the time factor included */
  GList *group;
  CpMesh *meshes[CP_TEST_LOOP_MAX_RANKS];
  GAsyncResult *results[CP_TEST_LOOP_MAX_RANKS];
} CpTestLoopRanks;

/* A local group of @n ranks along "cp" whose timeout is @timeout_ms
 * times the test time factor. */
void  cp_test_loop_ranks_init   (CpTestLoopRanks *ranks,
                                 int              n,
                                 guint            timeout_ms);
/* Drops the results of the last calls, before the next ones. */
void  cp_test_loop_ranks_forget (CpTestLoopRanks *ranks);
void  cp_test_loop_ranks_clear  (CpTestLoopRanks *ranks);

/* A GAsyncReadyCallback that keeps the result in the slot @user_data. */
void  cp_test_loop_done         (GObject         *source,
                                 GAsyncResult    *result,
                                 gpointer         user_data);

#define CP_TEST_LOOP_DONE(ranks, r) cp_test_loop_done, &(ranks)->results[r]

/* Runs the main loop until ranks [@first, @last) reported, failing the
 * test when one has not @limit_ms (times the test time factor) after
 * @since, a g_get_monotonic_time (). */
void  cp_test_loop_await        (CpTestLoopRanks *ranks,
                                 int              first,
                                 int              last,
                                 gint64           since,
                                 guint            limit_ms);
/* Every rank, within the mesh timeout. */
void  cp_test_loop_await_all    (CpTestLoopRanks *ranks);

/* Asserts that an async call of rank @cancelled_rank was cancelled and
 * broke the mesh: a barrier on every rank fails at once with
 * CP_MESH_ERROR_CANCELLED naming it.  Records the case under @subject. */
void  cp_test_loop_assert_broken (CpTestLoopRanks *ranks,
                                  int              cancelled_rank,
                                  const char      *subject);

/* Asserts that @error is CP_MESH_ERROR_CANCELLED and names rank
 * @cancelled_rank as the one cancelled; @which names the case. */
void  cp_test_loop_assert_cancelled (const GError *error,
                                     int           cancelled_rank,
                                     const char   *which);

/* Starts rank @r's call with @cancellable (NULL for most ranks). */
typedef void    (*CpTestLoopStart)  (int           r,
                                     GCancellable *cancellable,
                                     gpointer      user_data);
/* Completes rank @r's call, asserts that it failed and returns the
 * error. */
typedef GError *(*CpTestLoopFinish) (int           r,
                                     gpointer      user_data);

/* Cancels one rank's call and checks what every rank gets.  @before:
 * rank n/2's cancellable is cancelled before the calls start; else the
 * last rank comes late, the others wait in the call, and rank 0's
 * cancellable is cancelled 100 ms later, then the late rank calls.
 * Every rank's call must fail promptly with CP_MESH_ERROR_CANCELLED
 * naming the cancelled rank (the cancelled rank, the late one and one
 * other are recorded as "@what: …" under @subject), and the mesh must
 * then fail every later call at once. */
void  cp_test_loop_cancel_one   (CpTestLoopRanks  *ranks,
                                 gboolean          before,
                                 CpTestLoopStart   start,
                                 CpTestLoopFinish  finish,
                                 gpointer          user_data,
                                 const char       *subject,
                                 const char       *what);

G_END_DECLS
