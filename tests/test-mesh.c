/* test-mesh.c: the in-process backend
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-util.h"

static const CpDType all_dtypes[] = {
  CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
};

static void
test_properties (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 3 };
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (names, sizes, 2, &error);
  CpMesh *rank4;
  CpMesh *cp;
  g_auto(GStrv) dim_names = NULL;
  g_auto(GStrv) copied_names = NULL;
  g_autoptr(GVariant) dim_sizes = NULL;
  g_autoptr(GVariant) expected_sizes = g_variant_ref_sink (g_variant_new_parsed ("[2, 3]"));
  char *backend;
  int world;

  g_assert_no_error (error);
  g_assert_cmpuint (g_list_length (meshes), ==, 6);
  rank4 = g_list_nth_data (meshes, 4);
  g_object_get (rank4, "world-size", &world, "backend", &backend, "dim-names", &dim_names,
                "dim-sizes", &dim_sizes, NULL);
  g_assert_cmpint (world, ==, 6);
  g_assert_cmpstr (backend, ==, "local");
  g_free (backend);
  g_assert_cmpstrv (dim_names, names);
  g_assert_cmpstrv (cp_mesh_get_dim_names (rank4), names);
  copied_names = cp_mesh_dup_dim_names (rank4);
  g_assert_cmpstrv (copied_names, names);
  g_assert_true ((const char * const *) copied_names != cp_mesh_get_dim_names (rank4));
  g_assert_true (g_variant_equal (dim_sizes, expected_sizes));
  g_assert_cmpint (cp_mesh_get_rank (rank4), ==, 4);
  g_assert_cmpint (cp_mesh_get_coordinate (rank4, "dp"), ==, 1);
  g_assert_cmpint (cp_mesh_get_coordinate (rank4, "cp"), ==, 1);
  g_assert_cmpint (cp_mesh_get_dim_size (rank4, "cp"), ==, 3);
  g_assert_cmpint (cp_mesh_get_dim_size (rank4, "tp"), ==, -1);
  g_assert_cmpuint (cp_mesh_get_timeout_ms (rank4), ==, 120000);

  cp = cp_mesh_get_submesh (rank4, "cp", &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_mesh_get_rank (cp), ==, 1);
  g_assert_cmpint (cp_mesh_get_world_size (cp), ==, 3);
  g_assert_true (cp_mesh_get_submesh (rank4, "cp", NULL) == cp);
  g_assert_true (cp_mesh_get_submesh (cp, "cp", NULL) == cp);
  g_assert_cmpint (cp_mesh_get_rank (cp_mesh_get_submesh (rank4, "dp", NULL)), ==, 1);

  g_assert_null (cp_mesh_get_submesh (rank4, "tp", &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                       "cp_mesh_get_submesh of a dimension the mesh does not have");
  g_assert_nonnull (strstr (error->message, "no dimension \"tp\"; it has dp, cp"));
  cp_test_free_group (meshes);
}

static void
test_bad_dims (void)
{
  const char *names[] = { "dp", "dp", NULL };
  const char *one[] = { "cp", NULL };
  const int sizes[] = { 2, 2 };
  const int zero[] = { 0 };
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_mesh_new_local_group (names, sizes, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                       "cp_mesh_new_local_group with a repeated dimension name");
  g_assert_nonnull (strstr (error->message, "\"dp\""));
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_local_group (one, sizes, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                       "cp_mesh_new_local_group with fewer names than sizes");
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_local_group (one, zero, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                       "cp_mesh_new_local_group with a dimension of size 0");
  g_assert_nonnull (strstr (error->message, "size 0"));
}

/* all_gather along every dimension, 1 to 8 ranks: the result equals the
 * concatenation computed element by element. */
typedef struct
{
  int dim;
  int n;
} GatherCase;

static void
gather_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  GatherCase *c = user_data;
  const gint64 shape[] = { 2, 3, 4 };
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) mine = cp_test_tensor_pattern (CP_DTYPE_INT32, shape, 3, (guint) rank);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (mesh, mine, c->dim, &error);
  int d = c->dim < 0 ? c->dim + 3 : c->dim;
  gint64 out_shape[3] = { 2, 3, 4 };

  g_assert_no_error (error);
  out_shape[d] *= c->n;
  g_assert_cmpmem (cp_tensor_get_shape (gathered, NULL), sizeof out_shape, out_shape, sizeof out_shape);
  for (gint64 i = 0; i < cp_tensor_get_numel (gathered); i++)
    {
      gint64 coord[3] = { i / (out_shape[1] * out_shape[2]), (i / out_shape[2]) % out_shape[1],
                          i % out_shape[2] };
      int source = (int) (coord[d] / shape[d]);
      gint64 flat;
      g_autoptr(CpTensor) theirs = NULL;

      coord[d] %= shape[d];
      flat = (coord[0] * shape[1] + coord[1]) * shape[2] + coord[2];
      theirs = cp_test_tensor_pattern (CP_DTYPE_INT32, shape, 3, (guint) source);
      g_assert_cmpfloat (cp_tensor_get_value (gathered, i), ==, cp_tensor_get_value (theirs, flat));
    }
}

static void
test_all_gather (void)
{
  for (int n = 1; n <= 8; n++)
    for (int dim = -1; dim < 3; dim++)
      {
        GList *meshes = cp_test_local_group ("cp", n);
        GatherCase c = { dim, n };

        cp_test_run_ranks (meshes, gather_rank, &c);
        cp_test_free_group (meshes);
      }
}

static void
gather_into_rank (CpMesh   *mesh,
                  gpointer  user_data)
{
  const gint64 shape[] = { 2 };
  const gint64 out_shape[] = { 6 };
  const gint64 bad_shape[] = { 5 };
  g_autoptr(CpTensor) mine = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT64, shape, 1, cp_mesh_get_rank (mesh), NULL));
  g_autoptr(CpTensor) out = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT64, out_shape, 1, NULL));
  g_autoptr(CpTensor) bad = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT64, bad_shape, 1, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_gather_into (mesh, mine, 0, out, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (out, 0, 0, 1, 1, 2, 2);

  /* Rank 2's output is wrong: every rank fails, naming rank 2. */
  g_assert_false (cp_mesh_all_gather_into (mesh, mine, 0, cp_mesh_get_rank (mesh) == 2 ? bad : out, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "all_gather_into where one rank's output has the wrong shape (every rank fails)");
  g_assert_nonnull (strstr (error->message, "communicator rank 2: all_gather: the output is float64[5]"));
  g_clear_error (&error);

  /* An empty piece may have any length; the gathered one must fit int64. */
  {
    const gint64 huge[] = { 0, G_GINT64_CONSTANT (1) << 62 };
    g_autoptr(CpTensor) empty = cp_test_on_device (cp_tensor_new (CP_DTYPE_UINT8, huge, 2, NULL));
    g_autoptr(CpTensor) gathered = cp_mesh_all_gather (mesh, empty, 1, &error);

    g_assert_null (gathered);
    CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                         "all_gather whose gathered length would overflow int64 (every rank fails)");
    g_assert_nonnull (strstr (error->message, "too long to concatenate from 3 ranks"));
  }
}

static void
test_all_gather_into (void)
{
  GList *meshes = cp_test_local_group ("cp", 3);

  cp_test_run_ranks (meshes, gather_into_rank, NULL);
  cp_test_free_group (meshes);
}

/* Rank r sends 10·r + j to rank j, into an output it reuses. */
static void
all_to_all_into_rank (CpMesh   *mesh,
                      gpointer  user_data)
{
  const gint64 shape[] = { 3 };
  const gint64 bad_shape[] = { 4 };
  const gint64 twice[] = { 6 };
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) mine = CP_TEST_TENSOR (CP_DTYPE_INT32, shape, 10 * rank, 10 * rank + 1, 10 * rank + 2);
  g_autoptr(CpTensor) out = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, shape, 1, NULL));
  g_autoptr(CpTensor) bad = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, bad_shape, 1, NULL));
  g_autoptr(CpTensor) both = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, twice, 1, NULL));
  g_autoptr(CpTensor) low = NULL, high = NULL;
  g_autoptr(GError) error = NULL;

  for (int round = 0; round < 2; round++)
    {
      g_assert_true (cp_mesh_all_to_all_into (mesh, mine, 0, out, &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (out, rank, 10 + rank, 20 + rank);
    }

  /* Rank 1's output is wrong: every rank fails, naming rank 1. */
  g_assert_false (cp_mesh_all_to_all_into (mesh, mine, 0, rank == 1 ? bad : out, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "all_to_all_into where one rank's output has the wrong shape (every rank fails)");
  g_assert_nonnull (strstr (error->message, "communicator rank 1: all_to_all: the output is int32[4]"));
  g_clear_error (&error);

  /* An output that overlaps the tensor would be read while written. */
  low = cp_tensor_narrow (both, 0, 0, 3, &error);
  g_assert_no_error (error);
  high = cp_tensor_narrow (both, 0, 2, 3, &error);
  g_assert_no_error (error);
  g_assert_false (cp_mesh_all_to_all_into (mesh, low, 0, rank == 2 ? high : out, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "all_to_all_into whose output overlaps its tensor on one rank (every rank fails)");
  g_assert_nonnull (strstr (error->message, "all_to_all: the output overlaps the tensor"));
}

static void
test_all_to_all_into (void)
{
  GList *meshes = cp_test_local_group ("cp", 3);

  cp_test_run_ranks (meshes, all_to_all_into_rank, NULL);
  cp_test_free_group (meshes);
}

static void
all_to_all_rank (CpMesh   *mesh,
                 gpointer  user_data)
{
  int n = cp_mesh_get_world_size (mesh);
  int rank = cp_mesh_get_rank (mesh);
  const gint64 shape[] = { 2, 2 * n, 3 };
  g_autoptr(CpTensor) mine = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, shape, 3, NULL));
  g_autoptr(CpTensor) got = NULL;
  g_autoptr(GError) error = NULL;

  /* value = 1000·sender + index: piece j of rank r goes to rank j. */
  for (gint64 i = 0; i < cp_tensor_get_numel (mine); i++)
    cp_tensor_set_value (mine, i, 1000.0 * rank + (double) i);
  got = cp_mesh_all_to_all (mesh, mine, 1, &error);
  g_assert_no_error (error);
  for (gint64 o = 0; o < 2; o++)
    for (gint64 s = 0; s < 2 * n; s++)
      for (gint64 k = 0; k < 3; k++)
        {
          gint64 sender = s / 2;
          gint64 sent_index = (o * 2 * n + rank * 2 + s % 2) * 3 + k;

          g_assert_cmpfloat (cp_tensor_get_value (got, (o * 2 * n + s) * 3 + k), ==,
                             1000.0 * sender + (double) sent_index);
        }
}

static void
test_all_to_all (void)
{
  for (int n = 1; n <= 4; n++)
    {
      GList *meshes = cp_test_local_group ("cp", n);

      cp_test_run_ranks (meshes, all_to_all_rank, NULL);
      cp_test_free_group (meshes);
    }
}

static void
all_to_all_indivisible_rank (CpMesh   *mesh,
                             gpointer  user_data)
{
  const gint64 shape[] = { 5 };
  g_autoptr(CpTensor) mine = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, shape, 1, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_mesh_all_to_all (mesh, mine, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "all_to_all of a dimension not divisible by the world size");
  g_assert_nonnull (strstr (error->message, "length 5, not a multiple of the world size 2"));
}

static void
test_all_to_all_indivisible (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, all_to_all_indivisible_rank, NULL);
  cp_test_free_group (meshes);
}

typedef struct
{
  CpDType dtype;
  CpReduceOp op;
} ReduceCase;

/* What element i of the all-reduce must be, from every rank's pattern. */
static double
expected_reduction (const ReduceCase *c,
                    int               n,
                    gint64            i)
{
  const gint64 shape[] = { 37 };
  double acc = 0;

  for (int r = 0; r < n; r++)
    {
      g_autoptr(CpTensor) t = cp_test_tensor_pattern (c->dtype, shape, 1, (guint) r * 5);
      double v = cp_tensor_get_value (t, i);

      if (r == 0 || c->op == CP_REDUCE_OP_SUM)
        acc = r == 0 ? v : acc + v;
      else
        acc = c->op == CP_REDUCE_OP_MAX ? MAX (acc, v) : MIN (acc, v);
    }
  if (c->dtype == CP_DTYPE_BOOL && c->op == CP_REDUCE_OP_SUM)
    acc = acc != 0;
  if (c->dtype == CP_DTYPE_UINT8)
    acc = (double) ((gint64) acc % 256);
  return acc;
}

/* Ranks that are threads may pass one tensor object to a collective
 * that writes in place; each would write where the others read, so every
 * rank refuses, and nothing is written. */
static void
shared_buffer_rank (CpMesh   *mesh,
                    gpointer  user_data)
{
  CpTensor *shared = user_data;
  const gint64 piece_shape[] = { 2 };
  g_autoptr(CpTensor) piece = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT64, piece_shape, 1, 7, NULL));
  g_autoptr(CpTensor) own = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT64, piece_shape, 1, 1, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_false (cp_mesh_all_reduce (mesh, shared, CP_REDUCE_OP_SUM, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpMesh",
                       "all_reduce of one tensor object passed by every in-process rank (every rank fails)");
  g_assert_nonnull (strstr (error->message, "communicator ranks 0 and 1 passed overlapping memory"));
  g_clear_error (&error);

  g_assert_false (cp_mesh_broadcast (mesh, shared, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpMesh",
                       "broadcast into one tensor object passed by every in-process rank (every rank fails)");
  g_clear_error (&error);

  g_assert_false (cp_mesh_all_gather_into (mesh, piece, 0, shared, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpMesh",
                       "all_gather_into one output tensor passed by every in-process rank (every rank fails)");
  g_clear_error (&error);

  /* The mesh is still whole: a refusal every rank reached is no failure. */
  g_assert_true (cp_mesh_all_reduce (mesh, own, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (own, 2, 2);
}

static void
test_shared_buffer (void)
{
  g_autoptr(CpTensor) shared = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_FLOAT64, 0, 4, 1, NULL));

  cp_test_run_group ("cp", 2, shared_buffer_rank, shared);
  CP_TEST_ASSERT_VALUES (shared, 0, 1, 2, 3);
  CP_TEST_ASSERT_SHAPE (shared, 4);
}

static void
reduce_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const ReduceCase *c = user_data;
  const gint64 shape[] = { 37 };
  int n = cp_mesh_get_world_size (mesh);
  g_autoptr(CpTensor) t = cp_test_tensor_pattern (c->dtype, shape, 1, (guint) cp_mesh_get_rank (mesh) * 5);
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_reduce (mesh, t, c->op, &error));
  g_assert_no_error (error);
  for (gint64 i = 0; i < shape[0]; i++)
    {
      /* Round the exact result through the dtype, as the float32
       * accumulator rounds it once. */
      g_autoptr(CpTensor) want = cp_test_on_device (cp_tensor_new_full (c->dtype, shape, 1,
                                                     expected_reduction (c, n, i), NULL));

      g_assert_cmpfloat (cp_tensor_get_value (t, i), ==, cp_tensor_get_value (want, 0));
    }
}

static void
test_all_reduce (void)
{
  for (int n = 1; n <= 8; n++)
    for (guint d = 0; d < G_N_ELEMENTS (all_dtypes); d++)
      for (int op = CP_REDUCE_OP_SUM; op <= CP_REDUCE_OP_MIN; op++)
        {
          GList *meshes = cp_test_local_group ("cp", n);
          ReduceCase c = { all_dtypes[d], op };

          cp_test_run_ranks (meshes, reduce_rank, &c);
          cp_test_free_group (meshes);
        }
}

/* Element i of rank r: negative for odd i, and past 2^32 in magnitude
 * for 64-bit integers, so that a reduction computed in 32 bits, or one
 * that drops the sign, shows; the sums stay exact in a double. */
static gint64
wide_value (CpDType dtype,
            int     r,
            gint64  i)
{
  gint64 magnitude = dtype == CP_DTYPE_INT64 ? (G_GINT64_CONSTANT (1) << 33) * (r + 1) + 7 * i + r
                                             : 1000 * (r + 1) + 7 * i + r;

  return (i % 2 != 0 ? -magnitude : magnitude) + (i % 3 == 0 ? 3 * r : -5 * r);
}

static void
wide_reduce_rank (CpMesh   *mesh,
                  gpointer  user_data)
{
  const ReduceCase *c = user_data;
  const gint64 shape[] = { 12 };
  int n = cp_mesh_get_world_size (mesh), me = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) host = cp_tensor_new (c->dtype, shape, 1, NULL);
  g_autoptr(CpTensor) t = NULL;
  g_autoptr(GError) error = NULL;

  for (gint64 i = 0; i < shape[0]; i++)
    cp_tensor_set_value (host, i, (double) wide_value (c->dtype, me, i));
  t = cp_test_on_device (g_steal_pointer (&host));
  g_assert_true (cp_mesh_all_reduce (mesh, t, c->op, &error));
  g_assert_no_error (error);
  for (gint64 i = 0; i < shape[0]; i++)
    {
      gint64 want = wide_value (c->dtype, 0, i);

      for (int r = 1; r < n; r++)
        {
          gint64 v = wide_value (c->dtype, r, i);

          want = c->op == CP_REDUCE_OP_SUM ? want + v : c->op == CP_REDUCE_OP_MAX ? MAX (want, v) : MIN (want, v);
        }
      g_assert_cmpint ((gint64) cp_tensor_get_value (t, i), ==, want);
    }
}

static void
test_all_reduce_wide (void)
{
  g_test_summary ("all_reduce of signed integers, negative and, for int64, past 2^32, is exact for "
                  "sum, max and min");
  for (int n = 2; n <= 3; n++)
    for (guint d = 0; d < 2; d++)
      for (int op = CP_REDUCE_OP_SUM; op <= CP_REDUCE_OP_MIN; op++)
        {
          GList *meshes = cp_test_local_group ("cp", n);
          ReduceCase c = { d == 0 ? CP_DTYPE_INT64 : CP_DTYPE_INT32, op };

          cp_test_run_ranks (meshes, wide_reduce_rank, &c);
          cp_test_free_group (meshes);
        }
}

static void
broadcast_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  const gint64 shape[] = { 3 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, cp_mesh_get_rank (mesh) + 0.5, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_broadcast (mesh, t, 2, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (t, 2.5, 2.5, 2.5);

  g_assert_false (cp_mesh_broadcast (mesh, t, 7, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpMesh",
                       "broadcast from a root outside the mesh");
}

static void
test_broadcast (void)
{
  GList *meshes = cp_test_local_group ("cp", 4);

  cp_test_run_ranks (meshes, broadcast_rank, NULL);
  cp_test_free_group (meshes);
}

static void
ring_rank (CpMesh   *mesh,
           gpointer  user_data)
{
  int n = cp_mesh_get_world_size (mesh);
  int rank = cp_mesh_get_rank (mesh);
  const gint64 shape[] = { 1000 };
  g_autoptr(CpTensor) out = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT64, shape, 1, rank, NULL));
  g_autoptr(CpTensor) in = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, shape, 1, NULL));
  g_autoptr(GError) error = NULL;

  /* Pass a value around the whole ring: it comes back to its origin. */
  for (int step = 0; step < n; step++)
    {
      CpTensor *sent = out;

      g_assert_true (cp_mesh_send_recv (mesh, out, (rank + 1) % n, in, (rank + n - 1) % n, 9, &error));
      g_assert_no_error (error);
      g_assert_cmpfloat (cp_tensor_get_value (in, 999), ==, (double) ((rank - step - 1 + 2 * n) % n));
      /* What came in goes out next. */
      out = in;
      in = sent;
    }
  g_assert_cmpfloat (cp_tensor_get_value (out, 0), ==, rank);
}

static void
test_send_recv_ring (void)
{
  for (int n = 1; n <= 5; n++)
    {
      GList *meshes = cp_test_local_group ("cp", n);

      cp_test_run_ranks (meshes, ring_rank, NULL);
      cp_test_free_group (meshes);
    }
}

static void
pair_rank (CpMesh   *mesh,
           gpointer  user_data)
{
  const gint64 four[] = { 4 };
  const gint64 five[] = { 5 };
  g_autoptr(GError) error = NULL;

  if (cp_mesh_get_rank (mesh) == 0)
    {
      g_autoptr(CpTensor) t = cp_tensor_new_arange (CP_DTYPE_INT32, 0, 4, 1, NULL);

      g_assert_true (cp_mesh_send (mesh, t, 1, 3, &error));
      g_assert_no_error (error);
      g_assert_false (cp_mesh_send (mesh, t, 1, 4, &error));
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                           "send with a tag the receiver posted a different shape for (sender fails)");
      g_assert_nonnull (strstr (error->message, "rank 0 sent int32[4] with tag 4 but rank 1 expected int32[5]"));
      g_clear_error (&error);
      g_assert_false (cp_mesh_send (mesh, t, 0, 4, &error));
      CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                           "send to itself");
    }
  else
    {
      g_autoptr(CpTensor) got = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, four, 1, NULL));
      g_autoptr(CpTensor) wrong = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, five, 1, 7, NULL));

      g_assert_true (cp_mesh_recv (mesh, got, 0, 3, &error));
      g_assert_no_error (error);
      CP_TEST_ASSERT_VALUES (got, 0, 1, 2, 3);
      g_assert_false (cp_mesh_recv (mesh, wrong, 0, 4, &error));
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                           "recv into a tensor of a different shape than was sent (receiver fails)");
      CP_TEST_ASSERT_VALUES (wrong, 7, 7, 7, 7, 7); /* untouched */
    }
}

static void
test_send_recv_pair (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, pair_rank, NULL);
  cp_test_free_group (meshes);
}

static void
recv_timeout_rank (CpMesh   *mesh,
                   gpointer  user_data)
{
  const gint64 shape[] = { 2 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, shape, 1, NULL));
  g_autoptr(GError) error = NULL;
  gint64 start = g_get_monotonic_time ();

  if (cp_mesh_get_rank (mesh) != 0)
    return;
  cp_mesh_set_timeout_ms (mesh, 100);
  g_assert_false (cp_mesh_recv (mesh, t, 1, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "CpMesh",
                       "recv from a peer that never sends, within the timeout");
  g_assert_cmpint (g_get_monotonic_time () - start, <, 5 * G_TIME_SPAN_SECOND);
  g_clear_error (&error);
  g_assert_false (cp_mesh_send (mesh, t, 1, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "CpMesh",
                       "send to a peer that never receives, within the timeout");
}

/* A timeout of 0 has no meaning a caller could count on: it is refused
 * loudly, and the mesh keeps the timeout it had. */
static void
test_timeout_zero (void)
{
  GList *meshes = cp_test_local_group ("cp", 1);
  CpMesh *mesh = meshes->data;

  g_test_summary ("set_timeout_ms (0) is a critical naming the value and the timeout kept");
  cp_mesh_set_timeout_ms (mesh, 250);
  g_test_expect_message ("Cp", G_LOG_LEVEL_CRITICAL, "cp_mesh_set_timeout_ms: a timeout of 0 ms is out of "
                         "[1, 2147483647]; the mesh keeps its timeout of 250 ms");
  cp_mesh_set_timeout_ms (mesh, 0);
  g_test_assert_expected_messages ();
  g_assert_cmpuint (cp_mesh_get_timeout_ms (mesh), ==, 250);
  cp_test_record_outcome ("CpMesh", "set_timeout_ms (0)", "critical, timeout kept",
                          "cp_mesh_set_timeout_ms: a timeout of 0 ms is out of [1, 2147483647]; the mesh "
                          "keeps its timeout of 250 ms");
  g_test_expect_message ("Cp", G_LOG_LEVEL_CRITICAL, "*a timeout of 2147483648 ms is out of*");
  cp_mesh_set_timeout_ms (mesh, (guint) G_MAXINT + 1);
  g_test_assert_expected_messages ();
  g_assert_cmpuint (cp_mesh_get_timeout_ms (mesh), ==, 250);
  cp_test_free_group (meshes);
}

static void
test_p2p_timeout (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  /* A wait that never ends fails here, not when Meson kills the test. */
  cp_test_run_ranks_within (meshes, recv_timeout_rank, NULL, 5000);
  cp_test_free_group (meshes);
}

/* Rank 2 never arrives: the others fail within the timeout, and the late
 * rank then fails at once instead of waiting for them. */
static void
missing_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  const gint64 shape[] = { 4 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL));
  g_autoptr(CpTensor) got = NULL;
  g_autoptr(GError) error = NULL;
  gint64 start;

  cp_mesh_set_timeout_ms (mesh, 200);
  if (cp_mesh_get_rank (mesh) == 2)
    {
      g_usleep (600 * G_TIME_SPAN_MILLISECOND);
      start = g_get_monotonic_time ();
      g_assert_false (cp_mesh_barrier (mesh, &error));
      CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "CpMesh",
                           "a rank that arrives at a collective after its peers timed out");
      g_assert_cmpint (g_get_monotonic_time () - start, <, 100 * G_TIME_SPAN_MILLISECOND);
      return;
    }
  start = g_get_monotonic_time ();
  got = cp_mesh_all_gather (mesh, t, 0, &error);
  g_assert_null (got);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "CpMesh",
                       "a collective one rank never joins, within the timeout");
  g_assert_nonnull (strstr (error->message, "2 (mesh rank 2)"));
  g_assert_cmpint (g_get_monotonic_time () - start, >=, 150 * G_TIME_SPAN_MILLISECOND);
  g_assert_cmpint (g_get_monotonic_time () - start, <, 3 * G_TIME_SPAN_SECOND);
}

static void
test_timeout_missing_rank (void)
{
  GList *meshes = cp_test_local_group ("cp", 3);

  cp_test_run_ranks_within (meshes, missing_rank, NULL, 5000);
  cp_test_free_group (meshes);
}

typedef enum { SHAPE, DTYPE, OPERATION, LOCAL_ARGUMENT } Disagreement;

static void
disagree_rank (CpMesh   *mesh,
               gpointer  user_data)
{
  Disagreement kind = GPOINTER_TO_INT (user_data);
  gboolean odd = cp_mesh_get_rank (mesh) == 1;
  const gint64 shape[] = { 4 };
  const gint64 other_shape[] = { 5 };
  g_autoptr(CpTensor) t = NULL;
  g_autoptr(CpTensor) before = NULL;
  g_autoptr(GError) error = NULL;
  gboolean ok;

  t = cp_test_tensor_pattern (kind == DTYPE && odd ? CP_DTYPE_INT64 : CP_DTYPE_INT32,
                              kind == SHAPE && odd ? other_shape : shape, 1, 3);
  before = cp_tensor_copy (t, NULL);
  if (kind == OPERATION && odd)
    ok = cp_mesh_all_reduce (mesh, t, CP_REDUCE_OP_SUM, &error);
  else
    {
      g_autoptr(CpTensor) out = cp_mesh_all_gather (mesh, t, kind == LOCAL_ARGUMENT && odd ? 3 : 0, &error);
      ok = out != NULL;
    }
  g_assert_false (ok);
  g_assert_true (cp_tensor_equal (t, before)); /* nothing was written */
  switch (kind)
    {
    case SHAPE:
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                           "a collective whose ranks pass different shapes");
      g_assert_nonnull (strstr (error->message, "rank 0 passed int32[4], rank 1 passed int32[5]"));
      break;
    case DTYPE:
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DTYPE, "CpMesh",
                           "a collective whose ranks pass different dtypes");
      break;
    case OPERATION:
      CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh",
                           "ranks that call different collectives at the same step");
      g_assert_nonnull (strstr (error->message, "rank 0 called all_gather, rank 1 called all_reduce"));
      break;
    case LOCAL_ARGUMENT:
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                           "a collective whose ranks pass different local arguments (dimension)");
      g_assert_nonnull (strstr (error->message, "communicator rank 1: all_gather: dimension 3"));
      {
        /* Every rank says who it is first: the mistake is rank 1's. */
        g_autofree char *speaker = g_strdup_printf ("mesh rank %d: communicator rank 1: all_gather: ",
                                                    cp_mesh_get_rank (mesh));

        if (!g_str_has_prefix (error->message, speaker))
          g_error ("expected \"%s...\", got \"%s\"", speaker, error->message);
      }
      break;
    }
}

static void
test_disagreement (gconstpointer data)
{
  GList *meshes = cp_test_local_group ("cp", 3);

  cp_test_run_ranks (meshes, disagree_rank, (gpointer) data);
  cp_test_free_group (meshes);
}

/* SEED-SEMANTICS E5 and the general round trip: shard with the layout on
 * every rank, unshard through the mesh. */
static void
unshard_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  int n = cp_mesh_get_world_size (mesh);
  const gint64 shape[] = { 2, 4 * n, 3 };
  g_autoptr(CpTensor) full = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 11);
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 4 * n, n, NULL);
  g_autoptr(CpTensor) piece = cp_layout_shard (layout, full, 1, cp_mesh_get_rank (mesh), NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) back = cp_mesh_unshard (mesh, piece, 1, &error);

  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, full));
  if (n == 1)
    g_assert_true (back == piece);

  /* A dimension the piece lacks is an error however many ranks hold it. */
  g_clear_object (&back);
  back = cp_mesh_unshard (mesh, piece, 3, &error);
  g_assert_null (back);
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "unshard along a dimension the piece lacks (any mesh size, one rank too)");
  g_assert_nonnull (strstr (error->message, "dimension 3 does not exist"));
}

static void
test_unshard (void)
{
  static const int sizes[] = { 1, 2, 3, 4, 8 };

  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    {
      GList *meshes = cp_test_local_group ("cp", sizes[i]);

      cp_test_run_ranks (meshes, unshard_rank, NULL);
      cp_test_free_group (meshes);
    }
}

static void
unshard_example_rank (CpMesh   *mesh,
                      gpointer  user_data)
{
  /* Local logits [1, 4, 1] holding the global positions of the rank. */
  static const float positions[2][4] = { { 0, 1, 6, 7 }, { 2, 3, 4, 5 } };
  const gint64 shape[] = { 1, 4, 1 };
  g_autoptr(GBytes) bytes = g_bytes_new (positions[cp_mesh_get_rank (mesh)], sizeof positions[0]);
  g_autoptr(CpTensor) local = cp_tensor_new_from_bytes (CP_DTYPE_FLOAT32, shape, 3, bytes, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) full = cp_mesh_unshard (mesh, local, 1, &error);
  g_autoptr(CpTensor) trimmed = NULL;

  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (full, 0, 1, 2, 3, 4, 5, 6, 7);
  trimmed = cp_tensor_narrow (full, 1, 0, 6, &error);
  CP_TEST_ASSERT_VALUES (trimmed, 0, 1, 2, 3, 4, 5);
}

static void
test_unshard_example (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, unshard_example_rank, NULL);
  cp_test_free_group (meshes);
}

static void
unshard_thd_rank (CpMesh   *mesh,
                  gpointer  user_data)
{
  const gint64 bounds[] = { 0, 8, 12 };
  g_autoptr(CpLayout) layout = cp_layout_new_thd (bounds, 3, 2, NULL);
  g_autoptr(CpTensor) full = cp_tensor_new_arange (CP_DTYPE_INT64, 100, 112, 1, NULL);
  g_autoptr(CpTensor) piece = cp_layout_shard (layout, full, 0, cp_mesh_get_rank (mesh), NULL);
  g_autoptr(CpTensor) wrong = cp_tensor_new_arange (CP_DTYPE_INT64, 0, 5, 1, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) back = cp_mesh_unshard_layout (mesh, piece, 0, layout, &error);

  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, full));
  g_assert_null (cp_mesh_unshard_layout (mesh, wrong, 0, layout, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpMesh",
                       "cp_mesh_unshard_layout of a piece whose length differs from the layout");
}

static void
test_unshard_thd (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, unshard_thd_rank, NULL);
  cp_test_free_group (meshes);
}

/* dp × cp: collectives on a submesh stay inside its group. */
static void
submesh_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  const gint64 shape[] = { 1 };
  int rank = cp_mesh_get_rank (mesh);
  CpMesh *cp = cp_mesh_get_submesh (mesh, "cp", NULL);
  CpMesh *dp = cp_mesh_get_submesh (mesh, "dp", NULL);
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT64, shape, 1, rank, NULL));
  g_autoptr(CpTensor) gathered = NULL;
  g_autoptr(GError) error = NULL;
  int dp_index = rank / 4;

  g_assert_true (cp_mesh_all_reduce (cp, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  /* cp groups are ranks {0..3} and {4..7}. */
  CP_TEST_ASSERT_VALUES (t, dp_index == 0 ? 6 : 22);
  cp_tensor_set_value (t, 0, rank);
  gathered = cp_mesh_all_gather (dp, t, 0, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (gathered, rank % 4, rank % 4 + 4);
  g_assert_true (cp_mesh_barrier (mesh, &error));
}

static void
test_submesh_collectives (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 4 };

  cp_test_run_mesh (names, sizes, 2, submesh_rank, NULL);
}

typedef struct
{
  GMainLoop *loop;
  int done;
  int n;
} AsyncState;

static void
barrier_done (GObject      *source,
              GAsyncResult *result,
              gpointer      user_data)
{
  AsyncState *state = user_data;
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_barrier_finish (CP_MESH (source), result, &error));
  g_assert_no_error (error);
  if (++state->done == state->n)
    g_main_loop_quit (state->loop);
}

/* All ranks driven from one main loop, as gjs does. */
static void
test_barrier_async (void)
{
  GList *meshes = cp_test_local_group ("cp", 4);
  AsyncState state = { g_main_loop_new (NULL, FALSE), 0, 4 };

  for (GList *l = meshes; l != NULL; l = l->next)
    cp_mesh_barrier_async (l->data, NULL, barrier_done, &state);
  g_main_loop_run (state.loop);
  g_assert_cmpint (state.done, ==, 4);
  g_main_loop_unref (state.loop);
  cp_test_free_group (meshes);
}

/* Rank 1 passes test memory, the others host memory: the local backend
 * moves both, but one collective moves one kind, so every rank fails. */
static void
mixed_devices_rank (CpMesh   *mesh,
                    gpointer  user_data)
{
  const gint64 shape[] = { 4 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 1, NULL);
  g_autoptr(CpTensor) t = cp_mesh_get_rank (mesh) == 1
                          ? cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, &error)
                          : g_object_ref (host);

  g_assert_no_error (error);
  g_assert_false (cp_mesh_all_reduce (mesh, t, CP_REDUCE_OP_SUM, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpMesh",
                       "all_reduce where ranks pass different kinds of memory (every rank fails)");
  g_assert_nonnull (strstr (error->message, "rank 0 passed host memory, rank 1 passed test memory"));
}

static void
test_mixed_devices (void)
{
  cp_test_run_group ("cp", 3, mixed_devices_rank, NULL);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Mesh/local-group/properties", test_properties);
  g_test_add_func ("/Cp/Mesh/local-group/bad-dims", test_bad_dims);
  g_test_add_func ("/Cp/Mesh/timeout/zero", test_timeout_zero);
  g_test_add_func ("/Cp/Mesh/all-gather/every-dim", test_all_gather);
  g_test_add_func ("/Cp/Mesh/all-gather/into", test_all_gather_into);
  g_test_add_func ("/Cp/Mesh/all-to-all/into", test_all_to_all_into);
  g_test_add_func ("/Cp/Mesh/all-to-all/values", test_all_to_all);
  g_test_add_func ("/Cp/Mesh/all-to-all/indivisible", test_all_to_all_indivisible);
  g_test_add_func ("/Cp/Mesh/all-reduce/every-dtype-op", test_all_reduce);
  g_test_add_func ("/Cp/Mesh/all-reduce/wide-integers", test_all_reduce_wide);
  g_test_add_func ("/Cp/Mesh/in-place/shared-buffer", test_shared_buffer);
  g_test_add_func ("/Cp/Mesh/broadcast/root", test_broadcast);
  g_test_add_func ("/Cp/Mesh/send-recv/ring", test_send_recv_ring);
  g_test_add_func ("/Cp/Mesh/send-recv/pair", test_send_recv_pair);
  g_test_add_func ("/Cp/Mesh/timeout/p2p", test_p2p_timeout);
  g_test_add_func ("/Cp/Mesh/timeout/missing-rank", test_timeout_missing_rank);
  g_test_add_data_func ("/Cp/Mesh/disagree/shape", GINT_TO_POINTER (SHAPE), test_disagreement);
  g_test_add_data_func ("/Cp/Mesh/disagree/dtype", GINT_TO_POINTER (DTYPE), test_disagreement);
  g_test_add_data_func ("/Cp/Mesh/disagree/operation", GINT_TO_POINTER (OPERATION), test_disagreement);
  g_test_add_data_func ("/Cp/Mesh/disagree/local-argument", GINT_TO_POINTER (LOCAL_ARGUMENT), test_disagreement);
  g_test_add_func ("/Cp/Mesh/unshard/round-trip", test_unshard);
  g_test_add_func ("/Cp/Mesh/unshard/example", test_unshard_example);
  g_test_add_func ("/Cp/Mesh/unshard/thd", test_unshard_thd);
  g_test_add_func ("/Cp/Mesh/submesh/collectives", test_submesh_collectives);
  g_test_add_func ("/Cp/Mesh/barrier/async", test_barrier_async);
  g_test_add_func ("/Cp/Mesh/device/mixed", test_mixed_devices);

  return g_test_run ();
}
