/* test-async.c: the _async/_finish calls, every rank of an in-process mesh
 * driven from one main loop, and their cancellation
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-loop.h"
#include "cp-test-util.h"

#define MAX_RANKS CP_TEST_LOOP_MAX_RANKS

/* Meshes whose timeout no test reaches: a call that fails here failed
 * for what the test did, not for the clock. */
#define TIMEOUT_MS 30000

typedef CpTestLoopRanks Ranks;

#define DONE CP_TEST_LOOP_DONE

/* One tensor per rank. */
typedef struct
{
  CpTensor *t[MAX_RANKS];
} Tensors;

static void
tensors_clear (Tensors *tensors)
{
  for (int r = 0; r < MAX_RANKS; r++)
    g_clear_object (&tensors->t[r]);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Tensors, tensors_clear)

static CpTensor *
tensor_of (const gint64 *shape,
           guint         n_dims,
           double        (*value) (int rank, gint64 i),
           int           rank)
{
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_FLOAT32, shape, n_dims, NULL);

  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    cp_tensor_set_value (tensor, i, value (rank, i));
  return cp_test_on_device (tensor);
}

static double
rank_and_index (int    rank,
                gint64 i)
{
  return rank * 100 + (double) i;
}

static double
index_only (int    rank,
            gint64 i)
{
  return (double) i;
}

/* ---- every mesh call, its values checked ---- */

static void
check_all_gather (Ranks *ranks)
{
  const gint64 shape[] = { 2 };
  g_auto(Tensors) pieces = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      pieces.t[r] = tensor_of (shape, 1, rank_and_index, r);
      cp_mesh_all_gather_async (ranks->meshes[r], pieces.t[r], 0, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) gathered = cp_mesh_all_gather_finish (ranks->meshes[r], ranks->results[r], &error);

      g_assert_no_error (error);
      CP_TEST_ASSERT_SHAPE (gathered, 2 * ranks->n);
      for (int s = 0; s < ranks->n; s++)
        for (int i = 0; i < 2; i++)
          g_assert_cmpfloat (cp_tensor_get_value (gathered, 2 * s + i), ==, s * 100 + i);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
check_all_gather_into (Ranks *ranks)
{
  const gint64 shape[] = { 1, 2 };
  const gint64 out_shape[] = { 1, 2 * ranks->n };
  g_auto(Tensors) pieces = { { NULL } };
  g_auto(Tensors) outs = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      pieces.t[r] = tensor_of (shape, 2, rank_and_index, r);
      outs.t[r] = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, out_shape, 2, NULL));
      cp_mesh_all_gather_into_async (ranks->meshes[r], pieces.t[r], -1, outs.t[r], NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_all_gather_into_finish (ranks->meshes[r], ranks->results[r], &error));
      g_assert_no_error (error);
      for (int s = 0; s < ranks->n; s++)
        g_assert_cmpfloat (cp_tensor_get_value (outs.t[r], 2 * s + 1), ==, s * 100 + 1);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
check_all_to_all (Ranks *ranks)
{
  const gint64 shape[] = { ranks->n };
  g_auto(Tensors) sent = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      sent.t[r] = tensor_of (shape, 1, rank_and_index, r);
      cp_mesh_all_to_all_async (ranks->meshes[r], sent.t[r], 0, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) received = cp_mesh_all_to_all_finish (ranks->meshes[r], ranks->results[r], &error);

      g_assert_no_error (error);
      /* Piece r of rank s: s·100 + r. */
      for (int s = 0; s < ranks->n; s++)
        g_assert_cmpfloat (cp_tensor_get_value (received, s), ==, s * 100 + r);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
check_all_reduce (Ranks *ranks)
{
  const gint64 shape[] = { 3 };
  g_auto(Tensors) values = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      values.t[r] = tensor_of (shape, 1, rank_and_index, r);
      cp_mesh_all_reduce_async (ranks->meshes[r], values.t[r], CP_REDUCE_OP_MAX, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_all_reduce_finish (ranks->meshes[r], ranks->results[r], &error));
      g_assert_no_error (error);
      for (int i = 0; i < 3; i++)
        g_assert_cmpfloat (cp_tensor_get_value (values.t[r], i), ==, (ranks->n - 1) * 100 + i);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
check_broadcast (Ranks *ranks)
{
  const gint64 shape[] = { 3 };
  g_auto(Tensors) values = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      values.t[r] = tensor_of (shape, 1, rank_and_index, r);
      cp_mesh_broadcast_async (ranks->meshes[r], values.t[r], 1, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_broadcast_finish (ranks->meshes[r], ranks->results[r], &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (values.t[r], 100, 101, 102);
    }
  cp_test_loop_ranks_forget (ranks);
}

/* Each rank sends to the next and receives from the one before. */
static void
check_ring (Ranks *ranks)
{
  const gint64 shape[] = { 2 };
  g_auto(Tensors) sent = { { NULL } };
  g_auto(Tensors) received = { { NULL } };
  int n = ranks->n;

  for (int r = 0; r < n; r++)
    {
      sent.t[r] = tensor_of (shape, 1, rank_and_index, r);
      received.t[r] = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL));
      cp_mesh_send_recv_async (ranks->meshes[r], sent.t[r], (r + 1) % n, received.t[r], (r + n - 1) % n,
                               7, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;
      int from = (r + n - 1) % n;

      g_assert_true (cp_mesh_send_recv_finish (ranks->meshes[r], ranks->results[r], &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (received.t[r], from * 100, from * 100 + 1);
    }
  cp_test_loop_ranks_forget (ranks);
}

/* Rank 0 sends to the last rank; the ranks between take no part. */
static void
check_send_recv (Ranks *ranks)
{
  const gint64 shape[] = { 2 };
  g_autoptr(CpTensor) sent = tensor_of (shape, 1, rank_and_index, 0);
  g_autoptr(CpTensor) received = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL));
  g_autoptr(GError) error = NULL;
  int last = ranks->n - 1;

  cp_mesh_send_async (ranks->meshes[0], sent, last, 3, NULL, DONE (ranks, 0));
  cp_mesh_recv_async (ranks->meshes[last], received, 0, 3, NULL, DONE (ranks, last));
  cp_test_loop_await (ranks, 0, 1, g_get_monotonic_time (), TIMEOUT_MS);
  cp_test_loop_await (ranks, last, last + 1, g_get_monotonic_time (), TIMEOUT_MS);
  g_assert_true (cp_mesh_send_finish (ranks->meshes[0], ranks->results[0], &error));
  g_assert_no_error (error);
  g_assert_true (cp_mesh_recv_finish (ranks->meshes[last], ranks->results[last], &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (received, 0, 1);
  cp_test_loop_ranks_forget (ranks);
}

/* Unshards every rank's piece of @layout (NULL: head-tail) of
 * arange(@seq_len) and checks that each rank gets the whole. */
static void
check_unshard (Ranks    *ranks,
               CpLayout *layout,
               gint64    seq_len)
{
  const gint64 shape[] = { 1, seq_len };
  g_autoptr(CpTensor) full = tensor_of (shape, 2, index_only, 0);
  g_autoptr(CpLayout) head_tail = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, ranks->n, NULL);
  g_auto(Tensors) pieces = { { NULL } };

  for (int r = 0; r < ranks->n; r++)
    {
      pieces.t[r] = cp_layout_shard (layout ? layout : head_tail, full, 1, r, NULL);
      if (layout != NULL)
        cp_mesh_unshard_layout_async (ranks->meshes[r], pieces.t[r], -1, layout, NULL, DONE (ranks, r));
      else
        cp_mesh_unshard_async (ranks->meshes[r], pieces.t[r], 1, NULL, DONE (ranks, r));
    }
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) whole = NULL;

      if (layout != NULL)
        whole = cp_mesh_unshard_layout_finish (ranks->meshes[r], ranks->results[r], &error);
      else
        whole = cp_mesh_unshard_finish (ranks->meshes[r], ranks->results[r], &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (whole, full));
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
check_barrier (Ranks *ranks)
{
  for (int r = 0; r < ranks->n; r++)
    cp_mesh_barrier_async (ranks->meshes[r], NULL, DONE (ranks, r));
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_barrier_finish (ranks->meshes[r], ranks->results[r], &error));
      g_assert_no_error (error);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
test_mesh_calls (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  const gint64 bounds[] = { 0, 4 * n, 10 * n };
  g_autoptr(CpLayout) thd = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), n, NULL);
  Ranks ranks;

  g_test_summary ("Every async call of a mesh, every rank driven from one main loop, gives the "
                  "values of its blocking twin");
  cp_test_loop_ranks_init (&ranks, n, TIMEOUT_MS);
  check_barrier (&ranks);
  check_all_gather (&ranks);
  check_all_gather_into (&ranks);
  check_all_to_all (&ranks);
  check_all_reduce (&ranks);
  check_broadcast (&ranks);
  check_ring (&ranks);
  check_send_recv (&ranks);
  check_unshard (&ranks, NULL, 4 * n);
  check_unshard (&ranks, thd, 10 * n);
  cp_test_loop_ranks_clear (&ranks);
}

/* ---- a batch: prepare, enter, unshard, exit ---- */

static CpTensor *
row (gint64 length,
     double offset)
{
  const gint64 shape[] = { 1, length };
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);

  for (gint64 i = 0; i < length; i++)
    cp_tensor_set_value (tensor, i, offset + (double) i);
  return cp_test_on_device (tensor);
}

typedef struct
{
  CpBatch *batches[MAX_RANKS];
  CpContext *contexts[MAX_RANKS];
} Batches;

/* Batches of 3·n + 1 tokens: prepare pads them to 4·n. */
static void
batches_init (Batches *b,
              int      n)
{
  memset (b, 0, sizeof *b);
  for (int r = 0; r < n; r++)
    {
      b->batches[r] = cp_batch_new ();
      cp_test_batch_take (b->batches[r], "input_ids", row (3 * n + 1, 1000));
      cp_test_batch_take (b->batches[r], "labels", row (3 * n + 1, 2000));
    }
}

static void
batches_clear (Batches *b)
{
  for (int r = 0; r < MAX_RANKS; r++)
    {
      g_clear_object (&b->contexts[r]);
      g_clear_object (&b->batches[r]);
    }
}

static void
prepare_all (Ranks   *ranks,
             Batches *b)
{
  for (int r = 0; r < ranks->n; r++)
    cp_batch_prepare_async (b->batches[r], ranks->meshes[r], NULL, NULL, DONE (ranks, r));
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      b->contexts[r] = cp_batch_prepare_finish (b->batches[r], ranks->results[r], &error);
      g_assert_no_error (error);
      g_assert_nonnull (b->contexts[r]);
    }
  cp_test_loop_ranks_forget (ranks);
}

static void
enter_all (Ranks   *ranks,
           Batches *b)
{
  for (int r = 0; r < ranks->n; r++)
    cp_context_enter_async (b->contexts[r], NULL, DONE (ranks, r));
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_context_enter_finish (b->contexts[r], ranks->results[r], &error));
      g_assert_no_error (error);
    }
  cp_test_loop_ranks_forget (ranks);
}

/* Rank r holds chunks r and 2n−1−r of 2n, two tokens each; the padding
 * (the last n − 1 tokens) is 0. */
static void
assert_local_ids (CpTensor *ids,
                  int       r,
                  int       n)
{
  gint64 padded = 4 * n, real = 3 * n + 1;

  CP_TEST_ASSERT_SHAPE (ids, 1, 4);
  for (int i = 0; i < 4; i++)
    {
      gint64 chunk = i < 2 ? r : 2 * n - 1 - r;
      gint64 position = chunk * 2 + i % 2;

      g_assert_cmpint (position, <, padded);
      g_assert_cmpfloat (cp_tensor_get_value (ids, i), ==, position < real ? 1000 + position : 0);
    }
}

static void
test_batch_calls (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  Ranks ranks;
  Batches b;

  g_test_summary ("prepare_async, enter_async, unshard_async and exit_async on every rank from one "
                  "main loop give each rank its head-tail share, and the whole back");
  cp_test_loop_ranks_init (&ranks, n, TIMEOUT_MS);
  batches_init (&b, n);
  prepare_all (&ranks, &b);
  enter_all (&ranks, &b);
  for (int r = 0; r < n; r++)
    {
      assert_local_ids (cp_batch_get (b.batches[r], "input_ids"), r, n);
      cp_context_unshard_async (b.contexts[r], cp_batch_get (b.batches[r], "position_ids"), 1, NULL,
                                DONE (&ranks, r));
    }
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) positions = cp_context_unshard_finish (b.contexts[r], ranks.results[r], &error);

      g_assert_no_error (error);
      /* Synthesized over the real tokens; the padding holds 0. */
      CP_TEST_ASSERT_SHAPE (positions, 1, 4 * n);
      for (int i = 0; i < 4 * n; i++)
        g_assert_cmpfloat (cp_tensor_get_value (positions, i), ==, i < 3 * n + 1 ? i : 0);
    }
  cp_test_loop_ranks_forget (&ranks);
  for (int r = 0; r < n; r++)
    cp_context_exit_async (b.contexts[r], NULL, DONE (&ranks, r));
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_context_exit_finish (b.contexts[r], ranks.results[r], &error));
      g_assert_no_error (error);
      g_assert_false (cp_context_is_entered (b.contexts[r]));
      /* Only position_ids is restored. */
      CP_TEST_ASSERT_SHAPE (cp_batch_get (b.batches[r], "position_ids"), 1, 4 * n);
      assert_local_ids (cp_batch_get (b.batches[r], "input_ids"), r, n);
    }
  batches_clear (&b);
  cp_test_loop_ranks_clear (&ranks);
}

/* An exit waits on no peer: cancelled before it begins, it fails on its
 * rank alone, and every rank's mesh works on. */
static void
test_exit_cancelled_before (void)
{
  const int n = 2;
  Ranks ranks;
  Batches b;
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();

  g_test_summary ("exit_async cancelled before it begins fails on that rank alone, with "
                  "CP_MESH_ERROR_CANCELLED; the others exit, and the mesh works on for all");
  cp_test_loop_ranks_init (&ranks, n, TIMEOUT_MS);
  batches_init (&b, n);
  prepare_all (&ranks, &b);
  enter_all (&ranks, &b);
  g_cancellable_cancel (cancellable);
  cp_context_exit_async (b.contexts[0], cancellable, DONE (&ranks, 0));
  cp_context_exit_async (b.contexts[1], NULL, DONE (&ranks, 1));
  cp_test_loop_await_all (&ranks);
  {
    g_autoptr(GError) error = NULL;

    g_assert_false (cp_context_exit_finish (b.contexts[0], ranks.results[0], &error));
    CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED, "CpContext",
                         "exit_async cancelled before it began (that rank alone fails; the mesh stays whole)");
    g_assert_cmpstr (error->message, ==, "exit: cancelled before it began");
    g_assert_true (cp_context_is_entered (b.contexts[0]));
    g_clear_error (&error);
    g_assert_true (cp_context_exit_finish (b.contexts[1], ranks.results[1], &error));
    g_assert_no_error (error);
  }
  cp_test_loop_ranks_forget (&ranks);
  /* The mesh is whole: a barrier of every rank succeeds, and the
   * cancelled rank exits now. */
  for (int r = 0; r < n; r++)
    cp_mesh_barrier_async (ranks.meshes[r], NULL, DONE (&ranks, r));
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_barrier_finish (ranks.meshes[r], ranks.results[r], &error));
      g_assert_no_error (error);
    }
  cp_test_exit_ok (b.contexts[0]);
  batches_clear (&b);
  cp_test_loop_ranks_clear (&ranks);
}

/* ---- many ranks at once ---- */

/* More ranks than a bounded pool of workers holds: each call waits for
 * all the others, so one of them left in a queue would stall them all
 * until the timeout. */
static void
test_many_ranks (void)
{
  const gint64 shape[] = { 1 };
  g_auto(Tensors) values = { { NULL } };
  Ranks ranks;

  g_test_summary ("32 in-process ranks driven from one main loop all run at once: none waits "
                  "for a free worker");
  cp_test_loop_ranks_init (&ranks, MAX_RANKS, 2000);
  for (int r = 0; r < MAX_RANKS; r++)
    {
      values.t[r] = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 1.0, NULL));
      cp_mesh_all_reduce_async (ranks.meshes[r], values.t[r], CP_REDUCE_OP_SUM, NULL, DONE (&ranks, r));
    }
  cp_test_loop_await (&ranks, 0, MAX_RANKS, g_get_monotonic_time (), 2000);
  for (int r = 0; r < MAX_RANKS; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_all_reduce_finish (ranks.meshes[r], ranks.results[r], &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (values.t[r], MAX_RANKS);
    }
  cp_test_loop_ranks_clear (&ranks);
}

/* ---- cancellation ---- */

typedef enum { BARRIER, ALL_GATHER, RECV, PREPARE, ENTER } Family;
typedef enum { BEFORE, WAITING } When;

typedef struct
{
  Family family;
  When when;
  int n;
  const char *path;
  const char *what;
} CancelCase;

/* What the ranks of one cancelled call work on. */
typedef struct
{
  const CancelCase *c;
  Ranks ranks;
  CpTensor *tensors[MAX_RANKS];
  Batches batches;
  GPtrArray *snapshots[MAX_RANKS];
} Scene;

static void
scene_init (Scene           *scene,
            const CancelCase *c)
{
  const gint64 shape[] = { 2 };
  int n = c->n;

  memset (scene, 0, sizeof *scene);
  scene->c = c;
  cp_test_loop_ranks_init (&scene->ranks, n, TIMEOUT_MS);
  batches_init (&scene->batches, n);
  if (c->family == ENTER)
    prepare_all (&scene->ranks, &scene->batches);
  for (int r = 0; r < n; r++)
    {
      scene->tensors[r] = tensor_of (shape, 1, rank_and_index, r);
      scene->snapshots[r] = cp_test_snapshot_batch (scene->batches.batches[r]);
    }
}

static void
scene_clear (Scene *scene)
{
  for (int r = 0; r < scene->ranks.n; r++)
    {
      g_clear_object (&scene->tensors[r]);
      g_clear_pointer (&scene->snapshots[r], g_ptr_array_unref);
    }
  batches_clear (&scene->batches);
  cp_test_loop_ranks_clear (&scene->ranks);
}

/* Starts rank @r's call of @c.  In a receive, every rank waits for a
 * message from the next one, which never sends it. */
static void
start_call (int           r,
            GCancellable *cancellable,
            gpointer      data)
{
  Scene *scene = data;
  const CancelCase *c = scene->c;
  CpMesh *mesh = scene->ranks.meshes[r];
  GAsyncResult **slot = &scene->ranks.results[r];

  switch (c->family)
    {
    case BARRIER:
      cp_mesh_barrier_async (mesh, cancellable, cp_test_loop_done, slot);
      break;
    case ALL_GATHER:
      cp_mesh_all_gather_async (mesh, scene->tensors[r], 0, cancellable, cp_test_loop_done, slot);
      break;
    case RECV:
      cp_mesh_recv_async (mesh, scene->tensors[r], (r + 1) % c->n, 5, cancellable, cp_test_loop_done, slot);
      break;
    case PREPARE:
      cp_batch_prepare_async (scene->batches.batches[r], mesh, NULL, cancellable, cp_test_loop_done, slot);
      break;
    case ENTER:
      cp_context_enter_async (scene->batches.contexts[r], cancellable, cp_test_loop_done, slot);
      break;
    default:
      g_assert_not_reached ();
    }
}

/* The outcome of rank @r's call, which must have failed. */
static GError *
finish_call (int      r,
             gpointer data)
{
  Scene *scene = data;
  const CancelCase *c = scene->c;
  GAsyncResult *result = scene->ranks.results[r];
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(CpContext) context = NULL;
  GError *error = NULL;
  gboolean ok;

  switch (c->family)
    {
    case BARRIER:
      ok = cp_mesh_barrier_finish (scene->ranks.meshes[r], result, &error);
      break;
    case ALL_GATHER:
      out = cp_mesh_all_gather_finish (scene->ranks.meshes[r], result, &error);
      ok = out != NULL;
      break;
    case RECV:
      ok = cp_mesh_recv_finish (scene->ranks.meshes[r], result, &error);
      break;
    case PREPARE:
      context = cp_batch_prepare_finish (scene->batches.batches[r], result, &error);
      ok = context != NULL;
      break;
    case ENTER:
      ok = cp_context_enter_finish (scene->batches.contexts[r], result, &error);
      break;
    default:
      g_assert_not_reached ();
    }
  g_assert_false (ok);
  g_assert_nonnull (error);
  return error;
}

/* After the cancellation, nothing the ranks of the call held changed. */
static void
assert_untouched (Scene            *scene,
                  const CancelCase *c)
{
  for (int r = 0; r < c->n; r++)
    {
      cp_test_assert_batch_unchanged (scene->batches.batches[r], scene->snapshots[r]);
      if (c->family == ENTER)
        g_assert_false (cp_context_is_entered (scene->batches.contexts[r]));
    }
}

static void
test_cancel (gconstpointer data)
{
  const CancelCase *c = data;
  Scene scene;

  scene_init (&scene, c);
  cp_test_loop_cancel_one (&scene.ranks, c->when == BEFORE, start_call, finish_call, &scene,
                           c->family == PREPARE ? "CpBatch" : c->family == ENTER ? "CpContext" : "CpMesh",
                           c->what);
  assert_untouched (&scene, c);
  scene_clear (&scene);
}

static const CancelCase cancel_cases[] = {
  { ALL_GATHER, BEFORE, 2, "/Cp/Async/cancel/before/all-gather/2",
    "all_gather_async of 2 ranks, one cancelled before the call" },
  { ALL_GATHER, BEFORE, 4, "/Cp/Async/cancel/before/all-gather/4",
    "all_gather_async of 4 ranks, one cancelled before the call" },
  { RECV, BEFORE, 2, "/Cp/Async/cancel/before/recv/2",
    "recv_async, one of 2 ranks cancelled before the call" },
  { PREPARE, BEFORE, 4, "/Cp/Async/cancel/before/prepare/4",
    "prepare_async of 4 ranks, one cancelled before the call" },
  { BARRIER, WAITING, 2, "/Cp/Async/cancel/waiting/barrier/2",
    "barrier_async of 2 ranks, one cancelled while it waits" },
  { ALL_GATHER, WAITING, 2, "/Cp/Async/cancel/waiting/all-gather/2",
    "all_gather_async of 2 ranks, one cancelled while it waits" },
  { ALL_GATHER, WAITING, 4, "/Cp/Async/cancel/waiting/all-gather/4",
    "all_gather_async of 4 ranks, one cancelled while it waits" },
  { RECV, WAITING, 2, "/Cp/Async/cancel/waiting/recv/2",
    "recv_async, one of 2 ranks cancelled while it waits for the message" },
  { RECV, WAITING, 4, "/Cp/Async/cancel/waiting/recv/4",
    "recv_async, one of 4 ranks cancelled while it waits for the message" },
  { PREPARE, WAITING, 4, "/Cp/Async/cancel/waiting/prepare/4",
    "prepare_async of 4 ranks, one cancelled while it waits" },
  { ENTER, WAITING, 4, "/Cp/Async/cancel/waiting/enter/4",
    "enter_async of 4 ranks, one cancelled while it waits" },
};

/* Cancelled once every rank has completed: the results stand and the
 * mesh goes on. */
static void
test_cancel_after (void)
{
  const gint64 shape[] = { 2 };
  g_auto(Tensors) values = { { NULL } };
  GCancellable *cancellables[4] = { NULL };
  Ranks ranks;

  g_test_summary ("Cancelling an async call after it completed changes nothing: the result "
                  "stands and the mesh stays usable");
  cp_test_loop_ranks_init (&ranks, 4, TIMEOUT_MS);
  for (int r = 0; r < 4; r++)
    {
      values.t[r] = tensor_of (shape, 1, rank_and_index, r);
      cancellables[r] = g_cancellable_new ();
      cp_mesh_all_reduce_async (ranks.meshes[r], values.t[r], CP_REDUCE_OP_SUM, cancellables[r],
                                DONE (&ranks, r));
    }
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < 4; r++)
    g_cancellable_cancel (cancellables[r]);
  for (int r = 0; r < 4; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_mesh_all_reduce_finish (ranks.meshes[r], ranks.results[r], &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (values.t[r], 600, 604);
    }
  cp_test_loop_ranks_forget (&ranks);
  check_barrier (&ranks);
  for (int r = 0; r < 4; r++)
    g_object_unref (cancellables[r]);
  cp_test_loop_ranks_clear (&ranks);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_data_func ("/Cp/Async/mesh/2", GINT_TO_POINTER (2), test_mesh_calls);
  g_test_add_data_func ("/Cp/Async/mesh/4", GINT_TO_POINTER (4), test_mesh_calls);
  g_test_add_data_func ("/Cp/Async/batch/2", GINT_TO_POINTER (2), test_batch_calls);
  g_test_add_data_func ("/Cp/Async/batch/4", GINT_TO_POINTER (4), test_batch_calls);
  g_test_add_func ("/Cp/Async/cancel/before/exit", test_exit_cancelled_before);
  g_test_add_func ("/Cp/Async/pool/many-ranks", test_many_ranks);
  for (gsize i = 0; i < G_N_ELEMENTS (cancel_cases); i++)
    g_test_add_data_func (cancel_cases[i].path, &cancel_cases[i], test_cancel);
  g_test_add_func ("/Cp/Async/cancel/after-completion", test_cancel_after);

  return g_test_run ();
}
