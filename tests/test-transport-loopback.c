/* test-transport-loopback.c: a mesh over the loopback backend, which
 * only the test variant of the library has: proof that a backend is a
 * source file and one line of the backend table
 *
 * The cases every backend must pass are test-conformance.c's, which
 * runs them on loopback too (conformance-loopback); here are the ones
 * of this backend alone, and a local mesh routed over it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-test-util.h"
#include "cp-mesh-private.h"

typedef struct
{
  int rank;
  int world_size;
  guint port;
  gboolean two_dims;  /* dp x cp, 2 x world_size / 2 */
  CpMesh *mesh;
  GError *error;
} Join;

static gpointer
join_loopback (gpointer data)
{
  Join *join = data;
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", join->rank,
                                                   "world-size", join->world_size,
                                                   "port", join->port, "timeout-ms", 20000,
                                                   "transport", "loopback", NULL);
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, join->world_size / 2 };

  if (join->two_dims)
    cp_mesh_options_set_dims (options, names, sizes, 2);
  join->mesh = cp_mesh_new_with_options (options, &join->error);
  return NULL;
}

/* Every rank's mesh, in rank order, as a local group's would be. */
static GList *
loopback_group (int      world_size,
                gboolean two_dims)
{
  static guint next_port = 1;
  g_autofree Join *joins = g_new0 (Join, world_size);
  g_autofree GThread **threads = g_new0 (GThread *, world_size);
  GList *meshes = NULL;

  cp_harness_set_up_glib ();
  for (int r = 0; r < world_size; r++)
    {
      joins[r] = (Join) { r, world_size, next_port, two_dims };
      threads[r] = g_thread_new ("join", join_loopback, &joins[r]);
    }
  next_port++;
  for (int r = world_size - 1; r >= 0; r--)
    {
      g_thread_join (threads[r]);
      g_assert_no_error (joins[r].error);
      g_assert_cmpstr (cp_mesh_get_backend (joins[r].mesh), ==, "loopback");
      meshes = g_list_prepend (meshes, joins[r].mesh);
    }
  return meshes;
}

/* A tensor of @shape filled with @value, in the suite's memory. */
static CpTensor *
full (CpDType       dtype,
      const gint64 *shape,
      guint         n_dims,
      double        value)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new_full (dtype, shape, n_dims, value, &error);

  g_assert_no_error (error);
  return cp_test_on_device (tensor);
}

static void
check_collectives (CpMesh   *mesh,
                   gpointer  unused)
{
  int rank = cp_mesh_get_rank (mesh);
  int n = cp_mesh_get_world_size (mesh);
  const gint64 shape[] = { 2, 3 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) piece = full (CP_DTYPE_FLOAT32, shape, 2, rank + 1);
  g_autoptr(CpTensor) gathered = NULL;
  g_autoptr(CpTensor) sum = full (CP_DTYPE_INT64, shape, 2, rank + 1);
  g_autoptr(CpTensor) root = full (CP_DTYPE_INT32, shape, 2, rank);

  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);

  gathered = cp_mesh_all_gather (mesh, piece, 1, &error);
  g_assert_no_error (error);
  for (int row = 0; row < 2; row++)
    for (int r = 0; r < n; r++)
      for (int k = 0; k < 3; k++)
        g_assert_cmpfloat (cp_tensor_get_value (gathered, (row * n + r) * 3 + k), ==, r + 1);

  g_assert_true (cp_mesh_all_reduce (mesh, sum, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  for (int i = 0; i < 6; i++)
    g_assert_cmpfloat (cp_tensor_get_value (sum, i), ==, n * (n + 1) / 2);

  g_assert_true (cp_mesh_broadcast (mesh, root, n - 1, &error));
  g_assert_no_error (error);
  for (int i = 0; i < 6; i++)
    g_assert_cmpfloat (cp_tensor_get_value (root, i), ==, n - 1);
}

/* One value per destination rank: rank r sends r * 10 + d to rank d. */
static void
check_all_to_all (CpMesh   *mesh,
                  gpointer  unused)
{
  int rank = cp_mesh_get_rank (mesh);
  int n = cp_mesh_get_world_size (mesh);
  const gint64 shape[] = { n };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) send = full (CP_DTYPE_INT32, shape, 1, 0);
  g_autoptr(CpTensor) recv = NULL;

  for (int d = 0; d < n; d++)
    cp_tensor_set_value (send, d, rank * 10 + d);
  recv = cp_mesh_all_to_all (mesh, send, 0, &error);
  g_assert_no_error (error);
  for (int s = 0; s < n; s++)
    g_assert_cmpfloat (cp_tensor_get_value (recv, s), ==, s * 10 + rank);
}

/* Ranks that disagree fail together, with the verdict of the descriptor
 * exchange. */
static void
check_disagreement (CpMesh   *mesh,
                    gpointer  unused)
{
  const gint64 shape[] = { 2 + (cp_mesh_get_rank (mesh) == 1) };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) piece = full (CP_DTYPE_FLOAT32, shape, 1, 0);
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (mesh, piece, 0, &error);

  g_assert_null (gathered);
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
}

static void
check_send_recv (CpMesh   *mesh,
                 gpointer  unused)
{
  int rank = cp_mesh_get_rank (mesh);
  int n = cp_mesh_get_world_size (mesh);
  const gint64 shape[] = { 300000 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) send = full (CP_DTYPE_FLOAT64, shape, 1, rank);
  g_autoptr(CpTensor) recv = full (CP_DTYPE_FLOAT64, shape, 1, 0);

  g_assert_true (cp_mesh_send_recv (mesh, send, (rank + 1) % n, recv, (rank + n - 1) % n, 7, &error));
  g_assert_no_error (error);
  g_assert_cmpfloat (cp_tensor_get_value (recv, 299999), ==, (rank + n - 1) % n);
}

/* The loopback transport moves host memory only: test memory crosses
 * to the host and back around its collectives. */
static void
check_staged_device (CpMesh   *mesh,
                     gpointer  unused)
{
  const gint64 shape[] = { 4 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 1, &error);
  g_autoptr(CpTensor) test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, &error);

  g_assert_no_error (error);
  g_assert_true (cp_mesh_all_reduce (mesh, test, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (test), ==, CP_DEVICE_KIND_TEST);
  g_assert_cmpfloat (cp_tensor_get_value (test, 3), ==, cp_mesh_get_world_size (mesh));
}

static void
run_on_loopback (int             world_size,
                 CpTestRankFunc  func)
{
  GList *meshes = loopback_group (world_size, FALSE);

  cp_test_run_ranks (meshes, func, NULL);
  cp_test_free_group (meshes);
}

/* A rank whose peers never come gives up at its timeout. */
static void
test_meet_timeout (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", 0,
                                                   "world-size", 2, "port", 2000,
                                                   "timeout-ms", 200, "transport", "loopback",
                                                   NULL);
  g_autoptr(CpMesh) mesh = cp_mesh_new_with_options (options, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "loopback transport",
                       "join a mesh whose other rank never comes");
}

static void
test_staged_device (void)
{
  run_on_loopback (2, check_staged_device);
}

static void
test_all_to_all (void)
{
  run_on_loopback (4, check_all_to_all);
}

static void
test_send_recv (void)
{
  run_on_loopback (3, check_send_recv);
}

/* The submesh's traffic shares the sockets with the world's. */
static void
check_submesh (CpMesh   *mesh,
               gpointer  unused)
{
  g_autoptr(GError) error = NULL;
  CpMesh *cp = cp_mesh_get_submesh (mesh, "cp", &error);

  g_assert_no_error (error);
  check_collectives (cp, NULL);
  check_collectives (mesh, NULL);
}

static void
test_submesh (void)
{
  GList *meshes = loopback_group (4, TRUE);

  cp_test_run_ranks (meshes, check_submesh, NULL);
  cp_test_free_group (meshes);
}

/* A local group whose collectives and messages move over loopback
 * transports, while its agreement stays on the local one: the shape of a
 * mesh with a host transport and a device transport. */
static GList *
routed_group (const char * const *names,
              const int          *sizes,
              gsize               n_dims)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (names, sizes, n_dims, &error);
  GList *loopback = loopback_group (g_list_length (meshes), FALSE);

  g_assert_no_error (error);
  for (GList *l = meshes, *m = loopback; l != NULL; l = l->next, m = m->next)
    {
      g_assert_true (_cp_mesh_add_transport (l->data, _cp_mesh_get_comm (m->data)->transport, &error));
      g_assert_no_error (error);
    }
  cp_test_free_group (loopback);
  return meshes;
}

static void
test_routed (void)
{
  const char *names[] = { "cp", NULL };
  const int sizes[] = { 3 };
  GList *meshes = routed_group (names, sizes, 1);

  g_assert_cmpstr (cp_mesh_get_backend (meshes->data), ==, "local");
  g_assert_cmpstr (_cp_transport_get_name (_cp_mesh_get_comm (meshes->data)->transport), ==, "local");
  cp_test_run_ranks (meshes, check_collectives, NULL);
  cp_test_run_ranks (meshes, check_all_to_all, NULL);
  cp_test_run_ranks (meshes, check_send_recv, NULL);
  cp_test_run_ranks (meshes, check_disagreement, NULL);
  cp_test_free_group (meshes);
}

static void
test_routed_submesh (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 2 };
  GList *meshes = routed_group (names, sizes, 2);

  cp_test_run_ranks (meshes, check_submesh, NULL);
  cp_test_free_group (meshes);
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Transport/loopback/all-to-all", test_all_to_all);
  g_test_add_func ("/Cp/Transport/loopback/send-recv", test_send_recv);
  g_test_add_func ("/Cp/Transport/loopback/submesh", test_submesh);
  g_test_add_func ("/Cp/Transport/loopback/meet-timeout", test_meet_timeout);
  g_test_add_func ("/Cp/Transport/loopback/staged-device", test_staged_device);
  g_test_add_func ("/Cp/Transport/routed/collectives", test_routed);
  g_test_add_func ("/Cp/Transport/routed/submesh", test_routed_submesh);
  return g_test_run ();
}
