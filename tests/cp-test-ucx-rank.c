/* cp-test-ucx-rank.c: one rank of a multi-process mesh, for test-ucx and
 * test-shm (CPMESH_TRANSPORT names the backend it expects)
 *
 * Usage: cp-test-ucx-rank SCENARIO
 *
 * Joins the mesh the environment describes (cp_mesh_new_from_env) and
 * plays SCENARIO:
 *
 *   collectives  every collective and point-to-point case (and, where
 *                libcpmesh has CpBatch, a batch's prepare, enter and
 *                exit), each compared bit for bit with the in-process
 *                backend running the same inputs on threads
 *   join         joins, then a barrier
 *   gather-loop  all_gathers until one fails, then reports how long the
 *                failing call and the teardown took
 *   wait-lost    rank 0 waits on its main loop for CpMesh::rank-lost;
 *                the other ranks leave after a barrier
 *   stop-loop    tiny all_gathers, each checked, until one fails ("READY"
 *                after the first), so that the test can stop a rank
 *                (SIGSTOP) and continue it; then reports the failure,
 *                "STOPPED INDEX CODE MS" and "MESSAGE …", makes 100 calls
 *                of every kind, which must all fail, "LATER CALLS
 *                SUCCEEDED SLOWEST_MS" and "LATER_MESSAGE …" (the first
 *                of their errors), and keeps its mesh until its stdin ends
 *   async        joins with cp_mesh_connect_async and runs a barrier with
 *                cp_mesh_barrier_async on a main loop
 *   soak         joins, all_reduces and leaves CP_TEST_CYCLES times
 *                (1000 unless set), then reports its resident memory and
 *                open descriptors after the first tenth of the cycles
 *                and at the end: "SOAK CYCLES MS RSS_KIB RSS_KIB FDS FDS"
 *
 * With CP_TEST_GO_FILE set, a rank that joined waits until that file
 * exists (at most the mesh timeout) before it plays: the test does what
 * it wants to the formed mesh in between.
 *
 * It reports on stdout, one line per fact ("JOINED 1", "ERROR 4 …",
 * "READY", "FAILED 2 153", "CLOSED 12", "LOST 1 320", "OK"), and fails
 * its assertions with a non-zero exit.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cp-test-broken.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"

/* ---- inputs ---- */

/* Values that round differently in every order of summation, so that a
 * reduction in another order shows. */
static CpTensor *
make_input (CpDType       dtype,
            const gint64 *shape,
            guint         n_dims,
            int           rank,
            guint         seed)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);
  gboolean is_float = dtype == CP_DTYPE_FLOAT16 || dtype == CP_DTYPE_BFLOAT16 ||
                      dtype == CP_DTYPE_FLOAT32 || dtype == CP_DTYPE_FLOAT64;

  g_assert_no_error (error);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    {
      double x = sin ((double) i * 0.731 + rank * 1.37 + seed) * 1000.0 / (1 + i % 7);
      double v = is_float ? x : (double) ((i * 7 + rank * 13 + seed * 5) % 201 - 100);

      if (dtype == CP_DTYPE_BOOL || dtype == CP_DTYPE_UINT8)
        v = dtype == CP_DTYPE_BOOL ? (i + rank + seed) % 3 == 0 : (i * 3 + rank + seed) % 256;
      cp_tensor_set_value (tensor, i, v);
    }
  return tensor;
}

/* ---- steps: each runs on the UCX mesh and on the in-process group ---- */

typedef CpTensor *(*StepFunc) (CpMesh   *mesh,
                               gpointer  data);

typedef struct
{
  CpDType dtype;
  gint64 shape[3];
  guint n_dims;
  int dim;        /* gather, all-to-all; root for broadcast; op for reduce */
  guint seed;
} Case;

static CpTensor *
step_all_gather (CpMesh   *mesh,
                 gpointer  data)
{
  const Case *c = data;
  g_autoptr(CpTensor) mine = make_input (c->dtype, c->shape, c->n_dims, cp_mesh_get_rank (mesh), c->seed);
  g_autoptr(GError) error = NULL;
  CpTensor *out = cp_mesh_all_gather (mesh, mine, c->dim, &error);

  g_assert_no_error (error);
  return out;
}

static CpTensor *
step_all_to_all (CpMesh   *mesh,
                 gpointer  data)
{
  const Case *c = data;
  gint64 shape[3];
  g_autoptr(CpTensor) mine = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *out;

  memcpy (shape, c->shape, sizeof shape);
  shape[c->dim] *= cp_mesh_get_world_size (mesh);
  mine = make_input (c->dtype, shape, c->n_dims, cp_mesh_get_rank (mesh), c->seed);
  out = cp_mesh_all_to_all (mesh, mine, c->dim, &error);
  g_assert_no_error (error);
  return out;
}

static CpTensor *
step_all_reduce (CpMesh   *mesh,
                 gpointer  data)
{
  const Case *c = data;
  CpTensor *t = make_input (c->dtype, c->shape, c->n_dims, cp_mesh_get_rank (mesh), c->seed);
  g_autoptr(GError) error = NULL;

  gboolean ok = cp_mesh_all_reduce (mesh, t, (CpReduceOp) c->dim, &error);

  g_assert_no_error (error);
  g_assert_true (ok);
  return t;
}

static CpTensor *
step_broadcast (CpMesh   *mesh,
                gpointer  data)
{
  const Case *c = data;
  CpTensor *t = make_input (c->dtype, c->shape, c->n_dims, cp_mesh_get_rank (mesh), c->seed);
  g_autoptr(GError) error = NULL;

  gboolean ok = cp_mesh_broadcast (mesh, t, c->dim % cp_mesh_get_world_size (mesh), &error);

  g_assert_no_error (error);
  g_assert_true (ok);
  return t;
}

/* A value passed around the ring, one send_recv per step. */
static CpTensor *
step_ring (CpMesh   *mesh,
           gpointer  data)
{
  const Case *c = data;
  int n = cp_mesh_get_world_size (mesh), rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) out = make_input (c->dtype, c->shape, c->n_dims, rank, c->seed);
  CpTensor *in = cp_tensor_new (c->dtype, c->shape, c->n_dims, NULL);
  g_autoptr(GError) error = NULL;

  for (int step = 0; step < n; step++)
    {
      g_assert_true (cp_mesh_send_recv (mesh, out, (rank + 1) % n, in, (rank + n - 1) % n, 9, &error));
      g_assert_no_error (error);
      memcpy (cp_tensor_get_data (out), cp_tensor_get_data (in), cp_tensor_get_nbytes (in));
    }
  return in;
}

/* dp × cp: reduce over cp, gather over dp. */
static CpTensor *
step_submeshes (CpMesh   *mesh,
                gpointer  data)
{
  const Case *c = data;
  g_autoptr(GError) error = NULL;
  CpMesh *cp = cp_mesh_get_submesh (mesh, "cp", &error);
  CpMesh *dp = cp_mesh_get_submesh (mesh, "dp", &error);
  g_autoptr(CpTensor) t = make_input (c->dtype, c->shape, c->n_dims, cp_mesh_get_rank (mesh), c->seed);
  CpTensor *out;

  g_assert_no_error (error);
  g_assert_true (cp_mesh_all_reduce (cp, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  out = cp_mesh_all_gather (dp, t, 0, &error);
  g_assert_no_error (error);
  return out;
}

#ifdef CP_TYPE_BATCH
/* Appends @tensor's elements, as int64, to @values; nothing for a key
 * the batch does not hold (a mesh of one rank leaves the batch as it is). */
static void
append_values (GArray   *values,
               CpTensor *tensor)
{
  for (gint64 i = 0; tensor != NULL && i < cp_tensor_get_numel (tensor); i++)
    {
      gint64 v = (gint64) cp_tensor_get_value (tensor, i);

      g_array_append_val (values, v);
    }
}

/* A batch prepared, entered and exited over the mesh's cp group: the
 * local pieces after enter and position_ids after exit, one row. */
static CpTensor *
step_batch (CpMesh   *mesh,
            gpointer  data)
{
  const Case *c = data;
  const gint64 shape[] = { 2, 13 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) ids = make_input (CP_DTYPE_INT64, shape, 2, 0, c->seed);
  g_autoptr(CpTensor) labels = make_input (CP_DTYPE_INT64, shape, 2, 0, c->seed + 1);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GArray) values = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  gint64 length;

  cp_batch_set (batch, "input_ids", ids);
  cp_batch_set (batch, "labels", labels);
  context = cp_batch_prepare (batch, mesh, NULL, &error);
  g_assert_no_error (error);
  g_assert_true (cp_context_enter (context, &error));
  g_assert_no_error (error);
  append_values (values, cp_batch_get (batch, "input_ids"));
  append_values (values, cp_batch_get (batch, "labels"));
  append_values (values, cp_batch_get (batch, "position_ids"));
  g_assert_true (cp_context_exit (context, &error));
  g_assert_no_error (error);
  append_values (values, cp_batch_get (batch, "position_ids"));
  length = values->len;
  bytes = g_bytes_new (values->data, values->len * sizeof (gint64));
  return cp_tensor_new_from_bytes (CP_DTYPE_INT64, &length, 1, bytes, NULL);
}
#endif

typedef struct
{
  StepFunc func;
  gpointer data;
  CpTensor **results;
} ReferenceRun;

static void
reference_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  ReferenceRun *run = user_data;

  run->results[cp_mesh_get_rank (mesh)] = run->func (mesh, run->data);
}

/* What the in-process backend computes for this rank. */
static CpTensor *
reference (CpMesh   *ucx,
           StepFunc  func,
           gpointer  data)
{
  gsize n_dims = 0;
  const int *sizes = cp_mesh_get_dim_sizes (ucx, &n_dims);
  int n = cp_mesh_get_world_size (ucx);
  g_autoptr(GError) error = NULL;
  GList *group = cp_mesh_new_local_group (cp_mesh_get_dim_names (ucx), sizes, n_dims, &error);
  g_autofree CpTensor **results = g_new0 (CpTensor *, n);
  ReferenceRun run = { func, data, results };
  CpTensor *mine;

  g_assert_no_error (error);
  cp_test_run_ranks (group, reference_rank, &run);
  cp_test_free_group (group);
  mine = results[cp_mesh_get_rank (ucx)];
  for (int r = 0; r < n; r++)
    if (r != cp_mesh_get_rank (ucx))
      g_object_unref (results[r]);
  return mine;
}

static void
check_step (CpMesh     *mesh,
            const char *name,
            StepFunc    func,
            Case        c)
{
  g_autoptr(CpTensor) want = reference (mesh, func, &c);
  g_autoptr(CpTensor) got = func (mesh, &c);
  g_autofree char *have = cp_tensor_describe (got);

  if (!cp_tensor_equal (got, want))
    g_error ("rank %d: %s (%s, seed %u) differs from the in-process backend", cp_mesh_get_rank (mesh),
             name, have, c.seed);
}

static void
check_all_reduces (CpMesh *mesh)
{
  static const CpDType dtypes[] = {
    CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
    CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
  };

  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (int op = CP_REDUCE_OP_SUM; op <= CP_REDUCE_OP_MIN; op++)
      check_step (mesh, "all_reduce", step_all_reduce, (Case) { dtypes[d], { 37 }, 1, op, d });
  /* Uneven slices, large enough for the rendezvous protocol. */
  check_step (mesh, "all_reduce", step_all_reduce, (Case) { CP_DTYPE_FLOAT32, { 300001 }, 1, 0, 7 });
  check_step (mesh, "all_reduce", step_all_reduce, (Case) { CP_DTYPE_BFLOAT16, { 3, 1001 }, 2, 0, 8 });
  check_step (mesh, "all_reduce", step_all_reduce, (Case) { CP_DTYPE_FLOAT64, { 1 }, 1, 0, 9 });
}

static void
check_gathers (CpMesh *mesh)
{
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_FLOAT32, { 5, 3 }, 2, 0, 1 });
  /* Strided slots: every rank's piece lands in [outer] chunks. */
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_BFLOAT16, { 5, 3, 2 }, 3, 1, 2 });
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_INT64, { 4, 2 }, 2, -1, 3 });
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_BOOL, { 7 }, 1, 0, 4 });
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_FLOAT32, { 0, 4 }, 2, 0, 5 });
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_FLOAT32, { 1 << 18 }, 1, 0, 6 });
  check_step (mesh, "all_gather", step_all_gather, (Case) { CP_DTYPE_FLOAT16, { 64, 4096 }, 2, 1, 7 });
}

static void
check_exchanges (CpMesh *mesh)
{
  check_step (mesh, "all_to_all", step_all_to_all, (Case) { CP_DTYPE_INT64, { 2, 2, 3 }, 3, 1, 1 });
  check_step (mesh, "all_to_all", step_all_to_all, (Case) { CP_DTYPE_FLOAT32, { 100000 }, 1, 0, 2 });
  check_step (mesh, "broadcast", step_broadcast, (Case) { CP_DTYPE_FLOAT64, { 1000 }, 1, 3, 1 });
  check_step (mesh, "broadcast", step_broadcast, (Case) { CP_DTYPE_FLOAT32, { 1 << 19 }, 1, 1, 2 });
  check_step (mesh, "send_recv", step_ring, (Case) { CP_DTYPE_INT64, { 1000 }, 1, 0, 1 });
  check_step (mesh, "send_recv", step_ring, (Case) { CP_DTYPE_FLOAT32, { 1 << 18 }, 1, 0, 2 });
}

/* A send and a receive that disagree fail on both sides, naming both,
 * and leave the receiving tensor untouched; the mesh stays usable. */
static void
check_p2p_mismatch (CpMesh *mesh)
{
  const gint64 four[] = { 4 }, big[] = { 1 << 18 };
  g_autoptr(CpTensor) small = cp_tensor_new_arange (CP_DTYPE_INT32, 0, 4, 1, NULL);
  g_autoptr(CpTensor) wrong = cp_tensor_new_full (CP_DTYPE_INT32, (const gint64[]) { 5 }, 1, 7, NULL);
  g_autoptr(CpTensor) large = cp_tensor_new_full (CP_DTYPE_FLOAT32, big, 1, 1.5, NULL);
  g_autoptr(CpTensor) got = cp_tensor_new (CP_DTYPE_INT32, four, 1, NULL);
  g_autoptr(GError) error = NULL;
  int rank = cp_mesh_get_rank (mesh);

  if (rank == 0)
    {
      g_assert_false (cp_mesh_send (mesh, small, 1, 4, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      g_assert_nonnull (strstr (error->message, "rank 0 sent int32[4] with tag 4 but rank 1 expected int32[5]"));
      g_clear_error (&error);
      /* A large message the receiver refuses is drained, not delivered. */
      g_assert_false (cp_mesh_send (mesh, large, 1, 5, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      g_clear_error (&error);
      g_assert_true (cp_mesh_send (mesh, small, 1, 6, &error));
      g_assert_no_error (error);
    }
  else if (rank == 1)
    {
      g_assert_false (cp_mesh_recv (mesh, wrong, 0, 4, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      CP_TEST_ASSERT_VALUES (wrong, 7, 7, 7, 7, 7);
      g_clear_error (&error);
      g_assert_false (cp_mesh_recv (mesh, wrong, 0, 5, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      CP_TEST_ASSERT_VALUES (wrong, 7, 7, 7, 7, 7);
      g_clear_error (&error);
      g_assert_true (cp_mesh_recv (mesh, got, 0, 6, &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (got, 0, 1, 2, 3);
    }
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

/* Ranks that disagree all fail with the same error, and carry on. */
static void
check_disagreement (CpMesh *mesh)
{
  int rank = cp_mesh_get_rank (mesh);
  const gint64 shape[] = { rank == 1 ? 5 : 4 };
  g_autoptr(CpTensor) t = make_input (CP_DTYPE_INT32, shape, 1, rank, 0);
  g_autoptr(CpTensor) before = cp_tensor_copy (t, NULL);
  g_autoptr(CpTensor) same = make_input (CP_DTYPE_INT32, (const gint64[]) { 4 }, 1, rank, 0);
  g_autoptr(CpTensor) same_before = cp_tensor_copy (same, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) out = cp_mesh_all_gather (mesh, t, 0, &error);

  g_assert_null (out);
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
  g_assert_nonnull (strstr (error->message, "rank 0 passed int32[4], rank 1 passed int32[5]"));
  g_assert_true (cp_tensor_equal (t, before));
  g_clear_error (&error);
  g_assert_false (cp_mesh_all_reduce (mesh, same, rank == 0 ? CP_REDUCE_OP_MAX : CP_REDUCE_OP_SUM, &error));
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
  g_assert_true (cp_tensor_equal (same, same_before));
  g_clear_error (&error);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

/* The backend the test expects (CP_TEST_EXPECT_BACKEND, for a test of
 * the default chain), else the one it asked for (CPMESH_TRANSPORT), else
 * UCX. */
static const char *
expected_backend (void)
{
  const char *expected = g_getenv ("CP_TEST_EXPECT_BACKEND");
  const char *named = g_getenv ("CPMESH_TRANSPORT");

  if (expected != NULL)
    return expected;
  return named != NULL && named[0] != '\0' ? named : "ucx";
}

static void
play_collectives (CpMesh *mesh)
{
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, expected_backend ());
  check_gathers (mesh);
  check_all_reduces (mesh);
  check_exchanges (mesh);
  if (cp_mesh_get_world_size (mesh) >= 2)
    {
      check_p2p_mismatch (mesh);
      check_disagreement (mesh);
    }
  if (cp_mesh_get_dim_size (mesh, "dp") == 2)
    check_step (mesh, "submeshes", step_submeshes, (Case) { CP_DTYPE_FLOAT32, { 33 }, 1, 0, 3 });
#ifdef CP_TYPE_BATCH
  /* Built where CpBatch exists: prepare, enter and exit over UCX. */
  check_step (mesh, "batch", step_batch, (Case) { CP_DTYPE_INT64, { 0 }, 0, 0, 4 });
#endif
  printf ("OK\n");
}

/* ---- failures ---- */

static gint64
duration_ms (const CpTestOutcome *outcome)
{
  return (outcome->ended_us - outcome->started_us) / 1000;
}

/* Runs every kind of call @rounds times from call @index on: how many
 * succeeded, the slowest, and the first error. */
static guint
run_later_calls (CpMesh   *mesh,
                 guint     index,
                 guint     rounds,
                 gint64   *slowest_ms,
                 GError  **first_error)
{
  guint succeeded = 0;

  for (guint i = 0; i < rounds * CP_TEST_N_CALLS; i++)
    {
      CpTestOutcome outcome = { 0 };

      cp_test_call_run (mesh, i % CP_TEST_N_CALLS, index + i, &outcome);
      succeeded += outcome.ok;
      *slowest_ms = MAX (*slowest_ms, duration_ms (&outcome));
      if (*first_error == NULL)
        *first_error = g_steal_pointer (&outcome.error);
      g_clear_error (&outcome.error);
    }
  return succeeded;
}

static void
play_stop_loop (CpMesh *mesh)
{
  CpTestOutcome outcome = { 0 };
  g_autoptr(GError) later_error = NULL;
  gint64 slowest_ms = 0;
  guint index, succeeded;
  char line[16];

  for (index = 0;; index++)
    {
      cp_test_call_run (mesh, CP_TEST_CALL_ALL_GATHER, index, &outcome);
      if (!outcome.ok)
        break;
      g_assert_true (outcome.correct);
      if (index == 0)
        printf ("READY\n");
      fflush (stdout);
    }
  printf ("STOPPED %u %d %" G_GINT64_FORMAT "\n", index, outcome.error->code, duration_ms (&outcome));
  printf ("MESSAGE %s\n", outcome.error->message);
  succeeded = run_later_calls (mesh, index + 1, 100, &slowest_ms, &later_error);
  printf ("LATER %u %u %" G_GINT64_FORMAT "\n", 100 * CP_TEST_N_CALLS, succeeded, slowest_ms);
  printf ("LATER_MESSAGE %s\n", later_error ? later_error->message : "");
  fflush (stdout);
  while (fgets (line, sizeof line, stdin) != NULL)
    ;
  g_clear_error (&outcome.error);
}

typedef struct
{
  GMainLoop *loop;
  int rank;
  gint64 since;
} LostState;

static void
on_rank_lost (CpMesh     *mesh,
              int         rank,
              const char *reason,
              gpointer    user_data)
{
  LostState *state = user_data;

  state->rank = rank;
  printf ("LOST %d %" G_GINT64_FORMAT " %s\n", rank, (g_get_monotonic_time () - state->since) / 1000,
          reason);
  g_main_loop_quit (state->loop);
}

static gboolean
give_up (gpointer user_data)
{
  LostState *state = user_data;

  g_main_loop_quit (state->loop);
  return G_SOURCE_REMOVE;
}

/* Rank 0 idles on its main loop until it hears that rank 1 left. */
static void
play_wait_lost (CpMesh *mesh)
{
  LostState state = { g_main_loop_new (NULL, FALSE), -1, 0 };
  g_autoptr(GError) error = NULL;

  g_signal_connect (mesh, "rank-lost", G_CALLBACK (on_rank_lost), &state);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  if (cp_mesh_get_rank (mesh) == 0)
    {
      state.since = g_get_monotonic_time ();
      g_timeout_add (2 * cp_mesh_get_timeout_ms (mesh), give_up, &state);
      g_main_loop_run (state.loop);
      g_assert_cmpint (state.rank, ==, 1);
    }
  g_main_loop_unref (state.loop);
}

/* ---- soak ---- */

static int
soak_cycle (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_harness_join_from_env ();
  g_autoptr(CpTensor) t = NULL;

  if (mesh == NULL)
    return 3;
  t = cp_tensor_new_full (CP_DTYPE_FLOAT32, (const gint64[]) { 64 }, 1, 1.0, NULL);
  g_assert_true (cp_mesh_all_reduce (mesh, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  g_assert_cmpfloat (cp_tensor_get_value (t, 63), ==, cp_mesh_get_world_size (mesh));
  return 0;
}

static int
play_soak (void)
{
  guint64 cycles = 1000;
  guint64 warm_up;
  gsize rss_warm = 0, fds_warm = 0;
  gint64 started = g_get_monotonic_time ();

  if (g_getenv ("CP_TEST_CYCLES") != NULL)
    cycles = g_ascii_strtoull (g_getenv ("CP_TEST_CYCLES"), NULL, 10);
  warm_up = MAX (cycles / 10, 1);
  for (guint64 i = 0; i < cycles; i++)
    {
      int status = soak_cycle ();

      if (status != 0)
        return status;
      if (i + 1 == warm_up)
        {
          rss_warm = cp_test_resident_kib ();
          fds_warm = cp_test_open_fds ();
        }
    }
  printf ("SOAK %" G_GUINT64_FORMAT " %" G_GINT64_FORMAT " %" G_GSIZE_FORMAT " %" G_GSIZE_FORMAT
          " %" G_GSIZE_FORMAT " %" G_GSIZE_FORMAT "\n", cycles, (g_get_monotonic_time () - started) / 1000,
          rss_warm, cp_test_resident_kib (), fds_warm, cp_test_open_fds ());
  return 0;
}

/* ---- ring attention over processes ---- */

/* Prints the ring's report of how it moved K/V ("RING forward …"). */
static void
report_ring (const char     *domain,
             GLogLevelFlags  level,
             const char     *message,
             gpointer        user_data)
{
  if (g_str_has_prefix (message, "attention: "))
    printf ("RING %s\n", message + strlen ("attention: "));
}

static CpTensor *
attention_input (int   heads,
                 guint seed)
{
  const gint64 shape[] = { 1, heads, 6, 16 };

  return cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, G_N_ELEMENTS (shape), seed);
}

static void
digest_tensor (GChecksum *checksum,
               CpTensor  *tensor)
{
  g_checksum_update (checksum, cp_tensor_get_data (tensor), cp_tensor_get_nbytes (tensor));
}

/* Causal ring attention forward and backward on inputs made from the
 * rank number; prints a digest of every output, which must not depend on
 * the transport or on whether the ring read K/V in place. */
static void
play_attention (CpMesh *mesh)
{
  g_autoptr(GError) error = NULL;
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) q = attention_input (4, 4 * rank + 1);
  g_autoptr(CpTensor) k = attention_input (2, 4 * rank + 2);
  g_autoptr(CpTensor) v = attention_input (2, 4 * rank + 3);
  g_autoptr(CpTensor) dout = attention_input (4, 4 * rank + 4);
  g_autoptr(CpTensor) out = NULL, lse = NULL, dq = NULL, dk = NULL, dv = NULL;
  g_autoptr(GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);

  g_log_set_handler ("Cp", G_LOG_LEVEL_DEBUG, report_ring, NULL);
  cp_attention_options_set_causal (options, TRUE);
  cp_attention_options_set_heads (options, 4, 2);
  cp_attention_options_set_rotate_method (options, CP_ROTATE_METHOD_ALLTOALL);
  attention = cp_attention_new (mesh, options, &error);
  g_assert_no_error (error);
  g_assert_true (cp_attention_forward (attention, q, k, v, &out, &lse, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_backward (attention, dout, q, k, v, out, lse, &dq, &dk, &dv, &error));
  g_assert_no_error (error);
  digest_tensor (checksum, out);
  digest_tensor (checksum, lse);
  digest_tensor (checksum, dq);
  digest_tensor (checksum, dk);
  digest_tensor (checksum, dv);
  printf ("DIGEST %d %s\n", rank, g_checksum_get_string (checksum));
}

/* Waits for the test's go-ahead, CP_TEST_GO_FILE, when it asks for one. */
static void
wait_for_go (CpMesh *mesh)
{
  const char *path = g_getenv ("CP_TEST_GO_FILE");
  gint64 deadline = g_get_monotonic_time () + (gint64) cp_mesh_get_timeout_ms (mesh) * G_TIME_SPAN_MILLISECOND;

  while (path != NULL && !g_file_test (path, G_FILE_TEST_EXISTS))
    {
      g_assert_cmpint (g_get_monotonic_time (), <, deadline);
      g_usleep (10 * G_TIME_SPAN_MILLISECOND);
    }
}

/* ---- main-loop programs ---- */

typedef struct
{
  GMainLoop *loop;
  CpMesh *mesh;
  GError *error;
} AsyncState;

static void
barrier_done (GObject      *source,
              GAsyncResult *result,
              gpointer      user_data)
{
  AsyncState *state = user_data;

  cp_mesh_barrier_finish (CP_MESH (source), result, &state->error);
  g_main_loop_quit (state->loop);
}

static int
play_async (void)
{
  AsyncState state = { g_main_loop_new (NULL, FALSE), NULL, NULL };

  state.mesh = cp_test_connect (NULL, NULL, &state.error);
  g_assert_no_error (state.error);
  cp_mesh_barrier_async (state.mesh, NULL, barrier_done, &state);
  g_main_loop_run (state.loop);
  g_assert_no_error (state.error);
  g_assert_cmpstr (cp_mesh_get_backend (state.mesh), ==, expected_backend ());
  printf ("OK %d\n", cp_mesh_get_rank (state.mesh));
  g_object_unref (state.mesh);
  g_main_loop_unref (state.loop);
  return 0;
}

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  const char *scenario = argc > 1 ? argv[1] : "join";
  CpMesh *mesh;

  /* One line at a time, so that a report survives an abnormal exit. */
  setvbuf (stdout, NULL, _IOLBF, 0);

  if (g_str_equal (scenario, "async"))
    return play_async ();
  if (g_str_equal (scenario, "soak"))
    return play_soak ();
  mesh = cp_harness_join_from_env ();
  if (mesh == NULL)
    return 3;
  wait_for_go (mesh);
  if (g_str_equal (scenario, "collectives"))
    play_collectives (mesh);
  else if (g_str_equal (scenario, "gather-loop"))
    {
      g_assert_true (cp_harness_gather_until_failure (mesh));
      return 0;
    }
  else if (g_str_equal (scenario, "wait-lost"))
    play_wait_lost (mesh);
  else if (g_str_equal (scenario, "attention"))
    play_attention (mesh);
  else if (g_str_equal (scenario, "stop-loop"))
    play_stop_loop (mesh);
  else
    {
      g_assert_true (cp_mesh_barrier (mesh, &error));
      g_assert_no_error (error);
    }
  g_object_unref (mesh);
  return 0;
}
