/* test-context.c: CpContext, in-place sharding and restore
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-util.h"

static void
count_notify (GObject    *object,
              GParamSpec *pspec,
              gpointer    user_data)
{
  (*(int *) user_data)++;
}

static void
register_ok (CpContext *context,
             CpTensor  *tensor,
             int        seq_dim,
             gboolean   restore)
{
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_context_register_buffer (context, tensor, seq_dim, restore, &error));
  g_assert_no_error (error);
}

static void
test_no_mesh (void)
{
  const gint64 shape[] = { 1, 6 };
  g_autoptr(CpContext) context = cp_context_new (NULL, CP_ROTATE_METHOD_ALLTOALL);
  g_autoptr(CpTensor) ids = CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3, 4, 5, 6);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) same = NULL;
  CpRotateMethod method;
  int notified = 0;

  g_signal_connect (context, "notify::is-entered", G_CALLBACK (count_notify), &notified);
  g_object_get (context, "rotate-method", &method, NULL);
  g_assert_cmpint (method, ==, CP_ROTATE_METHOD_ALLTOALL);
  g_assert_cmpint (cp_context_get_rotate_method (context), ==, CP_ROTATE_METHOD_ALLTOALL);
  g_assert_cmpint (cp_context_get_cp_size (context), ==, 1);
  g_assert_cmpint (cp_context_get_cp_rank (context), ==, 0);
  g_assert_null (cp_context_get_layout (context));
  register_ok (context, ids, 1, FALSE);
  g_assert_true (cp_context_enter (context, &error));
  g_assert_true (cp_context_is_entered (context));
  CP_TEST_ASSERT_VALUES (ids, 1, 2, 3, 4, 5, 6);
  g_assert_true (cp_context_exit (context, &error));
  g_assert_no_error (error);
  g_assert_false (cp_context_is_entered (context));
  g_assert_cmpint (notified, ==, 2);
  same = cp_context_unshard (context, ids, 1, &error);
  g_assert_true (same == ids);
}

/* Manual registration on three ranks: the buffers shard in place, exit
 * restores only the restorable one, and entering again re-shards that
 * one while the local ones stay as they are. */
static void
manual_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const gint64 row[] = { 2, 12 };
  const gint64 cube[] = { 2, 12, 3 };
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) a = cp_test_tensor_pattern (CP_DTYPE_INT32, row, 2, 0);
  g_autoptr(CpTensor) b = cp_test_tensor_pattern (CP_DTYPE_FLOAT16, cube, 3, 1);
  g_autoptr(CpTensor) a_full = NULL;
  g_autoptr(CpTensor) b_full = NULL;
  g_autoptr(CpTensor) b_local = NULL;
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 12, 3, NULL);
  g_autoptr(GError) error = NULL;
  int rank = cp_mesh_get_rank (mesh);
  CpStorage *b_storage;

  for (gint64 i = 0; i < 24; i++)
    cp_tensor_set_value (a, i, (double) (i % 12));
  a_full = cp_tensor_copy (a, NULL);
  b_full = cp_tensor_copy (b, NULL);
  register_ok (context, a, -1, TRUE);
  register_ok (context, b, 1, FALSE);
  g_assert_true (cp_context_enter (context, &error));
  g_assert_no_error (error);
  g_assert_true (cp_layout_equal (cp_context_get_layout (context), layout));
  if (rank == 1)
    CP_TEST_ASSERT_VALUES (a, 2, 3, 8, 9, 2, 3, 8, 9);
  b_local = cp_layout_shard (layout, b_full, 1, rank, NULL);
  g_assert_true (cp_tensor_equal (b, b_local));
  b_storage = cp_tensor_get_storage (b);

  g_assert_true (cp_context_exit (context, &error));
  g_assert_true (cp_tensor_equal (a, a_full));
  g_assert_cmpint (cp_tensor_get_dim (b, 1), ==, 4);

  g_assert_true (cp_context_enter (context, &error));
  g_assert_no_error (error);
  g_assert_true (cp_tensor_get_storage (b) == b_storage);
  g_assert_true (cp_tensor_equal (b, b_local));
  g_assert_cmpint (cp_tensor_get_dim (a, 1), ==, 4);
  g_assert_true (cp_context_exit (context, &error));
  g_assert_true (cp_tensor_equal (a, a_full));
}

static void
test_manual_registration (void)
{
  cp_test_run_group ("cp", 3, manual_rank, NULL);
}

/* A failed enter, whatever rank it starts on, fails everywhere and leaves
 * every buffer on every rank as it was. */
typedef enum
{
  LENGTHS_DISAGREE,
  INDIVISIBLE,
  RANKS_DISAGREE,
  ONE_RANK_BAD_DIM,
} Failure;

typedef struct
{
  Failure failure;
  GQuark domain;
  int code;
  const char *needle;
} FailureCase;

/* For the reliability table. */
static const char * const failure_names[] = {
  [LENGTHS_DISAGREE] = "cp_context_enter with buffers of different sequence lengths (every rank fails)",
  [INDIVISIBLE] = "cp_context_enter with a length not a multiple of 2·C (every rank fails)",
  [RANKS_DISAGREE] = "cp_context_enter where ranks' lengths disagree (every rank fails)",
  [ONE_RANK_BAD_DIM] = "cp_context_enter where one rank's buffer lacks its sequence dimension (every rank fails)",
};

static void
failure_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  const FailureCase *c = user_data;
  int rank = cp_mesh_get_rank (mesh);
  gint64 len = c->failure == INDIVISIBLE ? 6 : c->failure == RANKS_DISAGREE && rank == 1 ? 12 : 8;
  const gint64 a_shape[] = { 1, len };
  const gint64 b_shape[] = { 1, c->failure == LENGTHS_DISAGREE ? 6 : len, 2 };
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) a = cp_test_tensor_pattern (CP_DTYPE_INT64, a_shape, 2, 1);
  g_autoptr(CpTensor) b = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, b_shape, 3, 2);
  g_autoptr(CpTensor) a_copy = cp_tensor_copy (a, NULL);
  g_autoptr(CpTensor) b_copy = cp_tensor_copy (b, NULL);
  CpStorage *a_storage = cp_tensor_get_storage (a);
  g_autoptr(GError) error = NULL;

  register_ok (context, a, 1, FALSE);
  register_ok (context, b, c->failure == ONE_RANK_BAD_DIM && rank == 1 ? 5 : 1, TRUE);
  g_assert_false (cp_context_enter (context, &error));
  CP_TEST_ASSERT_CASE (error, c->domain, c->code, "CpContext", failure_names[c->failure]);
  cp_test_assert_message (error, c->needle);
  /* Fingerprints show as 8 hexadecimal digits, not as 19 decimal ones. */
  if (c->failure == RANKS_DISAGREE &&
      (!g_regex_match_simple ("layout fingerprint [0-9a-f]{8}[,;]", error->message, 0, 0) ||
       g_regex_match_simple ("[0-9]{11}", error->message, 0, 0)))
    g_error ("\"%s\" does not show the layout fingerprints as 8 hexadecimal digits",
             error->message);
  g_assert_false (cp_context_is_entered (context));
  g_assert_true (cp_tensor_get_storage (a) == a_storage);
  g_assert_true (cp_tensor_equal (a, a_copy));
  g_assert_true (cp_tensor_equal (b, b_copy));
}

static void
test_failure (gconstpointer data)
{
  cp_test_run_group ("cp", 2, failure_rank, (gpointer) data);
}

static const FailureCase lengths_disagree = {
  LENGTHS_DISAGREE, 0, 0,
  "buffers disagree on the sequence length: buffer 0 (int64[1, 8] on host) has 8 along "
  "dimension 1, buffer 1 (float32[1, 6, 2] on host) has 6"
};
static const FailureCase indivisible = {
  INDIVISIBLE, 0, 0, "sequence length 6 along dimension 1, not a multiple of 2·C = 4"
};
static const FailureCase ranks_disagree = {
  RANKS_DISAGREE, 0, 0,
  "enter: ranks disagree: rank 0 has padded sequence length 8, layout fingerprint"
};
static const FailureCase one_rank_bad_dim = {
  ONE_RANK_BAD_DIM, 0, 0, "communicator rank 1: buffer 1 (float32[1, 8, 2] on host): dimension 5 does not exist"
};

/* The domains are not constants, so the cases get them at start-up. */
static void
add_failure (const char  *path,
             FailureCase *c,
             GQuark       domain,
             int          code)
{
  c->domain = domain;
  c->code = code;
  g_test_add_data_func (path, c, test_failure);
}

typedef struct
{
  CpTensor *ids;
  int calls;
} RunState;

static void
run_func (CpContext *context,
          gpointer   user_data)
{
  RunState *state = user_data;

  state->calls++;
  g_assert_true (cp_context_is_entered (context));
  g_assert_cmpint (cp_tensor_get_dim (state->ids, 1), ==, 2);
}

static void
run_rank (CpMesh   *mesh,
          gpointer  user_data)
{
  const gint64 shape[] = { 1, 8 };
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) ids = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0);
  g_autoptr(CpTensor) copy = cp_tensor_copy (ids, NULL);
  g_autoptr(GError) error = NULL;

  RunState state = { ids, 0 };

  register_ok (context, ids, 1, TRUE);
  g_assert_true (cp_context_run (context, run_func, &state, &error));
  g_assert_no_error (error);
  g_assert_cmpint (state.calls, ==, 1);
  g_assert_false (cp_context_is_entered (context));
  g_assert_true (cp_tensor_equal (ids, copy));
}

static void
test_run (void)
{
  cp_test_run_group ("cp", 4, run_rank, NULL);
}

/* One tensor registered in the contexts of every rank cannot be sharded
 * in place by all of them: every rank's enter fails with
 * CP_TENSOR_ERROR_IN_USE naming the buffer, no rank is entered and the
 * tensor keeps its full contents.  Which rank claims it first varies;
 * the verdict must not, so it runs many times on 2 and 4 ranks. */
static void
shared_buffer_rank (CpMesh   *mesh,
                    gpointer  user_data)
{
  const gint64 shape[] = { 1, 8 };
  CpTensor *shared = user_data;
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) own = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 3);
  g_autoptr(CpTensor) own_copy = cp_tensor_copy (own, NULL);
  g_autoptr(GError) error = NULL;

  register_ok (context, own, 1, FALSE);
  register_ok (context, shared, 1, TRUE);
  g_assert_false (cp_context_enter (context, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpContext",
                       "cp_context_enter on every rank with one tensor registered by every rank "
                       "(every rank fails)");
  g_assert_nonnull (strstr (error->message, "enter: buffer 1 is being changed in place"));
  g_assert_false (cp_context_is_entered (context));
  g_assert_true (cp_tensor_equal (own, own_copy));
}

static void
test_shared_buffer (void)
{
  const gint64 shape[] = { 1, 8 };
  const int sizes[] = { 2, 4 };

  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    for (int run = 0; run < 25; run++)
      {
        g_autoptr(CpTensor) shared = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 2, 1);
        g_autoptr(CpTensor) copy = cp_tensor_copy (shared, NULL);
        CpStorage *storage = cp_tensor_get_storage (shared);

        cp_test_run_group ("cp", sizes[i], shared_buffer_rank, shared);
        g_assert_true (cp_tensor_get_storage (shared) == storage);
        g_assert_true (cp_tensor_equal (shared, copy));
      }
}

/* Two contexts of one rank with a buffer in common: while the first is
 * entered, the second cannot enter (on every rank); once the first has
 * exited, or was dropped while entered, it can. */
static void
nested_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const gint64 shape[] = { 2, 8 };
  g_autoptr(CpContext) outer = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpContext) inner = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpContext) dropped = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) common = cp_test_tensor_pattern (CP_DTYPE_INT32, shape, 2, 4);
  g_autoptr(CpTensor) full = cp_tensor_copy (common, NULL);
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 2, NULL);
  g_autoptr(CpTensor) local = cp_layout_shard (layout, full, 1, cp_mesh_get_rank (mesh), NULL);
  g_autoptr(GError) error = NULL;

  register_ok (outer, common, 1, TRUE);
  register_ok (inner, common, 1, TRUE);
  cp_test_enter_ok (outer);
  g_assert_false (cp_context_enter (inner, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpContext",
                       "cp_context_enter of a context whose buffer another entered context of "
                       "the rank holds (every rank fails)");
  g_assert_false (cp_context_is_entered (inner));
  g_assert_true (cp_tensor_equal (common, local));
  cp_test_exit_ok (outer);
  g_assert_true (cp_tensor_equal (common, full));

  cp_test_enter_ok (inner);
  g_assert_true (cp_tensor_equal (common, local));
  cp_test_exit_ok (inner);

  register_ok (dropped, common, 1, TRUE);
  cp_test_enter_ok (dropped);
  g_clear_object (&dropped);
  cp_test_enter_ok (outer);
  cp_test_exit_ok (outer);
}

/* Misuse is a GError with CP_BATCH_ERROR_CONTEXT_STATE that changes
 * nothing: entering twice (every rank fails, the context stays entered
 * with its local pieces), exiting when not entered, registering while
 * entered, and registering one tensor twice. */
static void
state_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const gint64 shape[] = { 1, 8 };
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpContext) next = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) ids = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0);
  g_autoptr(CpTensor) other = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 1);
  g_autoptr(CpTensor) full = cp_tensor_copy (ids, NULL);
  g_autoptr(CpTensor) local = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_false (cp_context_exit (context, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "CpContext",
                       "cp_context_exit of a context that is not entered");
  g_clear_error (&error);
  register_ok (context, ids, 1, TRUE);
  g_assert_false (cp_context_register_buffer (context, ids, 1, FALSE, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONFLICTING_KEYS, "CpContext",
                       "cp_context_register_buffer of a tensor registered already");
  g_clear_error (&error);
  cp_test_enter_ok (context);
  local = cp_tensor_copy (ids, NULL);

  g_assert_false (cp_context_enter (context, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "CpContext",
                       "cp_context_enter of an entered context (every rank fails)");
  g_assert_nonnull (strstr (error->message, "enter: the context is entered already"));
  g_clear_error (&error);
  g_assert_true (cp_context_is_entered (context));
  g_assert_true (cp_tensor_equal (ids, local));

  g_assert_false (cp_context_register_buffer (context, other, 1, FALSE, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "CpContext",
                       "cp_context_register_buffer on an entered context");
  g_clear_error (&error);
  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, 1);

  cp_test_exit_ok (context);
  g_assert_true (cp_tensor_equal (ids, full));
  g_assert_false (cp_context_exit (context, &error));
  g_assert_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE);

  /* The failed second enter left the buffer held by the first only: once
   * that exited, another context may shard it. */
  register_ok (next, ids, 1, TRUE);
  cp_test_enter_ok (next);
  g_assert_true (cp_tensor_equal (ids, local));
  cp_test_exit_ok (next);
}

static void
test_state (void)
{
  g_autoptr(CpContext) alone = cp_context_new (NULL, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(GError) error = NULL;

  cp_test_run_group ("cp", 2, state_rank, NULL);
  cp_test_enter_ok (alone);
  g_assert_false (cp_context_enter (alone, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "CpContext",
                       "cp_context_enter of an entered context without a mesh");
  g_assert_true (cp_context_is_entered (alone));
  g_clear_error (&error);
  g_assert_false (cp_context_run (alone, run_func, NULL, &error));
  g_assert_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE);
  cp_test_exit_ok (alone);
}

/* A rank whose context is entered makes every rank's enter fail, and the
 * ranks whose contexts were not entered stay as they were. */
static void
one_rank_entered_rank (CpMesh   *mesh,
                       gpointer  user_data)
{
  const gint64 shape[] = { 1, 8 };
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  g_autoptr(CpTensor) ids = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0);
  g_autoptr(CpTensor) full = cp_tensor_copy (ids, NULL);
  g_autoptr(GError) error = NULL;
  int rank = cp_mesh_get_rank (mesh);

  register_ok (context, ids, 1, TRUE);
  cp_test_enter_ok (context);
  if (rank == 0)
    cp_test_exit_ok (context);
  g_assert_false (cp_context_enter (context, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "CpContext",
                       "cp_context_enter where one rank's context is entered (every rank fails)");
  g_assert_nonnull (strstr (error->message, "communicator rank 1: enter: the context is entered already"));
  g_assert_cmpint (cp_context_is_entered (context), ==, rank == 1);
  if (rank == 0)
    g_assert_true (cp_tensor_equal (ids, full));
  else
    cp_test_exit_ok (context);
}

/* Runs the rank function given as test data on a group of two ranks. */
static void
test_on_two_ranks (gconstpointer rank_func)
{
  cp_test_run_group ("cp", 2, (CpTestRankFunc) rank_func, NULL);
}

/* A buffer over a GBytes is read-only: enter gives the tensor new
 * memory for its piece and never writes the bytes, and exit puts them
 * back as they were. */
static void
read_only_buffer_rank (CpMesh   *mesh,
                       gpointer  user_data)
{
  static const gint64 values[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  const gint64 row[] = { 1, 8 };
  g_autoptr(GBytes) bytes = g_bytes_new_static (values, sizeof values);
  g_autoptr(CpTensor) ids = cp_tensor_new_from_bytes (CP_DTYPE_INT64, row, 2, bytes, NULL);
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);
  CpStorage *storage = cp_tensor_get_storage (ids);

  register_ok (context, ids, 1, TRUE);
  cp_test_enter_ok (context);
  g_assert_false (cp_storage_get_read_only (cp_tensor_get_storage (ids)));
  if (cp_mesh_get_rank (mesh) == 0)
    CP_TEST_ASSERT_VALUES (ids, 0, 1, 6, 7);
  else
    CP_TEST_ASSERT_VALUES (ids, 2, 3, 4, 5);
  cp_test_exit_ok (context);
  g_assert_true (cp_tensor_get_storage (ids) == storage);
  CP_TEST_ASSERT_VALUES (ids, 0, 1, 2, 3, 4, 5, 6, 7);
  for (guint i = 0; i < G_N_ELEMENTS (values); i++)
    g_assert_cmpint (values[i], ==, i);
}

/* A dp × cp mesh gives the context its cp dimension. */
static void
test_mesh_resolution (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 3 };
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (names, sizes, 2, &error);
  CpMesh *rank4 = g_list_nth_data (meshes, 4);
  g_autoptr(CpContext) context = cp_context_new (rank4, CP_ROTATE_METHOD_ALLGATHER);
  int cp_size;

  g_assert_no_error (error);
  g_assert_true (cp_context_get_mesh (context) == cp_mesh_get_submesh (rank4, "cp", NULL));
  g_object_get (context, "cp-size", &cp_size, NULL);
  g_assert_cmpint (cp_size, ==, 3);
  g_assert_cmpint (cp_context_get_cp_rank (context), ==, 1);
  cp_test_free_group (meshes);
  /* The context keeps its group alive after the meshes are gone. */
  g_assert_cmpint (cp_mesh_get_world_size (cp_context_get_mesh (context)), ==, 3);
}

int
main (int   argc,
      char *argv[])
{
  static FailureCase cases[4];

  g_test_init (&argc, &argv, NULL);

  cases[0] = lengths_disagree;
  cases[1] = indivisible;
  cases[2] = ranks_disagree;
  cases[3] = one_rank_bad_dim;
  g_test_add_func ("/Cp/Context/no-mesh/no-op", test_no_mesh);
  g_test_add_func ("/Cp/Context/enter/manual-registration", test_manual_registration);
  add_failure ("/Cp/Context/enter/lengths-disagree", &cases[0], CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
  add_failure ("/Cp/Context/enter/indivisible", &cases[1], CP_BATCH_ERROR, CP_BATCH_ERROR_INDIVISIBLE);
  add_failure ("/Cp/Context/enter/ranks-disagree", &cases[2], CP_MESH_ERROR,
               CP_MESH_ERROR_INVALID_TOPOLOGY);
  add_failure ("/Cp/Context/enter/one-rank-bad-dim", &cases[3], CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
  g_test_add_func ("/Cp/Context/run/callback", test_run);
  g_test_add_func ("/Cp/Context/shared/buffer-of-every-rank", test_shared_buffer);
  g_test_add_data_func ("/Cp/Context/shared/nested-contexts", nested_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Context/state/misuse", test_state);
  g_test_add_data_func ("/Cp/Context/state/one-rank-entered", one_rank_entered_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Context/mesh/cp-dimension", test_mesh_resolution);
  g_test_add_data_func ("/Cp/Context/enter/read-only-buffer", read_only_buffer_rank,
                        test_on_two_ranks);

  return g_test_run ();
}
