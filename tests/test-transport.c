/* test-transport.c: the table of backends, the CPMESH_TRANSPORT override
 * and capabilities
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-features.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"
#include "transports/cp-transport-private.h"
#include "cp-mesh-private.h"

#define SETTINGS CP_TEST_SETTINGS

static void
test_table_default (void)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *built = _cp_transport_backend_list ();
  const CpTransportBackend *backend = _cp_transport_backend_find (NULL, &error);

  g_assert_no_error (error);
  g_assert_cmpstr (backend->name, ==, CP_HAS_UCX ? "ucx" : "local");
  g_assert_true (g_str_has_prefix (built, backend->name));
  g_assert_nonnull (strstr (built, "local"));
  g_assert_true (_cp_transport_backend_serves (backend, CP_DEVICE_KIND_HOST));
  g_assert_false (_cp_transport_backend_serves (backend, CP_DEVICE_KIND_CUDA));
}

static void
test_table_unknown (void)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *built = _cp_transport_backend_list ();

  g_assert_null (_cp_transport_backend_find ("carrier-pigeon", &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport table",
                       "look up a backend this build does not have");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
  g_assert_nonnull (strstr (error->message, built));
}

/* The override fails loudly: no other backend is tried in its place. */
static void
test_override_unknown (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=carrier-pigeon"), NULL,
                                            &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport this build does not have");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
  g_assert_nonnull (strstr (error->message, "local"));
}

static void
test_override_local (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=local"), NULL, &error);
  const gint64 shape[] = { 3 };
  g_autoptr(CpTensor) piece = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 1, 7);
  g_autoptr(CpTensor) whole = NULL;

  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "local");
  g_assert_cmpint (cp_mesh_get_world_size (mesh), ==, 1);
  whole = cp_mesh_all_gather (mesh, piece, 0, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (whole, piece));
}

static void
test_override_local_processes (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=local", "RANK=0",
                                                      "WORLD_SIZE=2", "CPMESH_TIMEOUT_MS=2000"),
                                            NULL, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "connect two processes with the in-process transport");
  g_assert_nonnull (strstr (error->message, "\"local\""));
}

static void
test_capability_shared_address_space (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpTransport *transport = _cp_mesh_get_comm (meshes->data)->transport;

  g_assert_true (_cp_transport_has_caps (transport, CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE));
  g_assert_true (_cp_transport_has_caps (transport, CP_TRANSPORT_CAP_NONE));
  g_assert_cmpstr (_cp_transport_get_name (transport), ==, "local");
  g_assert_false (_cp_transport_can_poll (transport));
  cp_test_free_group (meshes);
}

/* Ranks must move the same kind of memory: their descriptors say which. */
static void
test_agreement_device (void)
{
  CpCollective host = { .kind = CP_COLL_ALL_REDUCE, .dtype = CP_DTYPE_FLOAT32, .n_dims = 1,
                        .shape = { 4 }, .device = CP_DEVICE_KIND_HOST };
  CpCollective cuda = host;
  const CpCollective *descs[] = { &host, &cuda };
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_collective_check_agreement (descs, 2, 0, &error));
  g_assert_no_error (error);
  cuda.device = CP_DEVICE_KIND_CUDA;
  g_assert_false (_cp_collective_check_agreement (descs, 2, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "collective agreement",
                       "ranks that pass different kinds of memory");
  g_assert_nonnull (strstr (error->message, "rank 0 passed host memory, rank 1 passed cuda memory"));
}

static void
note_released (gpointer released)
{
  *(gboolean *) released = TRUE;
}

/* A posted message names its memory by a region, which holds the
 * storage: the program may drop the tensor it sent as soon as the send
 * is posted, and the bytes stay until the send completes. */
static void
test_message_region_keeps_storage (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpComm *sender = _cp_mesh_get_comm (meshes->data);
  CpComm *receiver = _cp_mesh_get_comm (meshes->next->data);
  const gint64 shape[] = { 4 };
  float *values = g_new (float, 4);
  gboolean released = FALSE;
  g_autoptr(GError) error = NULL;
  CpTensor *sent = cp_tensor_new_borrowed (CP_DTYPE_FLOAT32, shape, 1, GPOINTER_TO_SIZE (values),
                                           4 * sizeof (float), note_released, &released, NULL,
                                           &error);
  g_autoptr(CpTensor) received = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, &error);
  CpMessage outgoing, incoming;
  CpRequest *send_request, *recv_request;
  gint64 deadline = g_get_monotonic_time () + 10 * G_TIME_SPAN_SECOND;

  g_assert_no_error (error);
  for (int i = 0; i < 4; i++)
    values[i] = 1.5f * (float) (i + 1);
  _cp_message_from_tensor (&outgoing, sent);
  g_assert_true (outgoing.data.storage == cp_tensor_get_storage (sent));
  g_assert_cmpuint (outgoing.nbytes, ==, 4 * sizeof (float));
  send_request = _cp_comm_isend (sender, 1, 7, &outgoing);
  g_clear_object (&sent);
  g_assert_false (released);

  _cp_message_from_tensor (&incoming, received);
  recv_request = _cp_comm_irecv (receiver, 0, 7, &incoming);
  g_assert_true (_cp_comm_wait (receiver, recv_request, deadline, NULL, &error));
  g_assert_no_error (error);
  g_assert_true (_cp_comm_wait (sender, send_request, deadline, NULL, &error));
  g_assert_no_error (error);
  g_assert_false (released);
  for (int i = 0; i < 4; i++)
    g_assert_cmpfloat (cp_tensor_get_value (received, i), ==, 1.5 * (i + 1));
  _cp_message_clear (&outgoing);
  _cp_message_clear (&incoming);
  g_assert_true (released);
  g_free (values);
  cp_test_free_group (meshes);
}

/* Cancellation reaches a transport as an argument of its wait, not
 * through the thread that runs it: a wait given a cancelled cancellable
 * ends at once, long before its deadline, and names the cancellation. */
static void
test_wait_cancellable (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpComm *receiver = _cp_mesh_get_comm (meshes->next->data);
  const gint64 shape[] = { 2 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) tensor = cp_tensor_new (CP_DTYPE_INT32, shape, 1, &error);
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  gint64 started = g_get_monotonic_time ();
  CpMessage incoming;
  CpRequest *request;

  g_assert_no_error (error);
  g_cancellable_cancel (cancellable);
  _cp_message_from_tensor (&incoming, tensor);
  request = _cp_comm_irecv (receiver, 0, 3, &incoming);
  g_assert_false (_cp_comm_wait (receiver, request, started + 30 * G_TIME_SPAN_SECOND, cancellable,
                                 &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED, "transport wait",
                       "wait for a message with a cancelled cancellable");
  g_assert_nonnull (strstr (error->message, "cancelled"));
  g_assert_cmpint (g_get_monotonic_time () - started, <, 5 * G_TIME_SPAN_SECOND);
  _cp_message_clear (&incoming);
  cp_test_free_group (meshes);
}

static void
test_options_defaults (void)
{
  g_autoptr(CpMeshOptions) options = cp_mesh_options_new ();
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 3 };
  g_autoptr(GVariant) dim_sizes = NULL;
  g_autofree char *printed = NULL;
  g_auto(GStrv) copied_names = NULL;
  gsize n_dims = 9;

  g_assert_cmpint (cp_mesh_options_get_rank (options), ==, 0);
  g_assert_cmpint (cp_mesh_options_get_world_size (options), ==, 1);
  g_assert_null (cp_mesh_options_get_address (options));
  g_assert_cmpuint (cp_mesh_options_get_port (options), ==, 0);
  g_assert_null (cp_mesh_options_get_token (options));
  g_assert_null (cp_mesh_options_get_dim_names (options));
  g_assert_null (cp_mesh_options_dup_dim_names (options));
  g_assert_null (cp_mesh_options_get_dim_sizes (options, &n_dims));
  g_assert_cmpuint (n_dims, ==, 0);
  g_assert_cmpuint (cp_mesh_options_get_timeout_ms (options), ==, 0);
  g_assert_null (cp_mesh_options_get_transport (options));

  cp_mesh_options_set_dims (options, names, sizes, 2);
  g_assert_cmpstrv (cp_mesh_options_get_dim_names (options), names);
  copied_names = cp_mesh_options_dup_dim_names (options);
  g_assert_cmpstrv (copied_names, names);
  g_assert_true ((const char * const *) copied_names != cp_mesh_options_get_dim_names (options));
  g_assert_cmpmem (cp_mesh_options_get_dim_sizes (options, &n_dims), sizeof sizes, sizes, sizeof sizes);
  g_object_get (options, "dim-sizes", &dim_sizes, NULL);
  printed = g_variant_print (dim_sizes, FALSE);
  g_assert_cmpstr (printed, ==, "[2, 3]");
}

static void
test_options_local (void)
{
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "transport", "local",
                                                   "timeout-ms", 5000, NULL);
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 1, 1 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  cp_mesh_options_set_dims (options, names, sizes, 2);
  mesh = cp_mesh_new_with_options (options, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "local");
  g_assert_cmpuint (cp_mesh_get_timeout_ms (mesh), ==, 5000);
  g_assert_cmpint (cp_mesh_get_dim_size (mesh, "dp"), ==, 1);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

static void
test_options_names_without_sizes (void)
{
  const char *names[] = { "dp", "cp", NULL };
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "transport", "local",
                                                   "dim-names", names, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_with_options (options, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMeshOptions",
                       "set dimension names without sizes");
  g_assert_nonnull (strstr (error->message, "2 dimension names"));
}

static void
test_options_bad_rank (void)
{
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", 3,
                                                   "world-size", 2, "port", 1, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_with_options (options, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMeshOptions",
                       "a rank outside the world size");
  g_assert_nonnull (strstr (error->message, "rank 3 of world size 2"));
}

/* Options that leave the transport unnamed take CPMESH_TRANSPORT. */
static void
test_options_environment (void)
{
  g_autoptr(CpMeshOptions) options = cp_mesh_options_new ();
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_setenv ("CPMESH_TRANSPORT", "carrier-pigeon", TRUE);
  mesh = cp_mesh_new_with_options (options, &error);
  g_unsetenv ("CPMESH_TRANSPORT");
  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport this build does not have, under explicit options");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
}

#if CP_HAS_UCX
typedef struct
{
  guint16 port;
  int rank;
  CpMesh *mesh;
  GError *error;
} UcxJoin;

static gpointer
join_with_options (gpointer data)
{
  UcxJoin *join = data;
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 1, 2 };
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", join->rank,
                                                   "world-size", 2, "port", (guint) join->port,
                                                   "token", "t0k3n", "timeout-ms", 20000,
                                                   "transport", "ucx", NULL);

  cp_mesh_options_set_dims (options, names, sizes, 2);
  join->mesh = cp_mesh_new_with_options (options, &join->error);
  return NULL;
}

static void
test_options_ucx (void)
{
  guint16 port = cp_test_free_port ();
  UcxJoin joins[2] = { { port, 0 }, { port, 1 } };
  GThread *threads[2];

  cp_harness_set_up_glib ();
  for (int r = 0; r < 2; r++)
    threads[r] = g_thread_new ("rank", join_with_options, &joins[r]);
  for (int r = 0; r < 2; r++)
    g_thread_join (threads[r]);
  for (int r = 0; r < 2; r++)
    {
      g_assert_no_error (joins[r].error);
      g_assert_cmpstr (cp_mesh_get_backend (joins[r].mesh), ==, "ucx");
      g_assert_cmpint (cp_mesh_get_rank (joins[r].mesh), ==, r);
      g_assert_cmpint (cp_mesh_get_dim_size (joins[r].mesh, "cp"), ==, 2);
      g_object_unref (joins[r].mesh);
    }
}
#endif

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Transport/table/default", test_table_default);
  g_test_add_func ("/Cp/Transport/table/unknown", test_table_unknown);
  g_test_add_func ("/Cp/Transport/override/unknown", test_override_unknown);
  g_test_add_func ("/Cp/Transport/override/local", test_override_local);
  g_test_add_func ("/Cp/Transport/override/local-processes", test_override_local_processes);
  g_test_add_func ("/Cp/Transport/capability/shared-address-space",
                   test_capability_shared_address_space);
  g_test_add_func ("/Cp/Transport/agreement/device", test_agreement_device);
  g_test_add_func ("/Cp/Transport/message/region-keeps-storage", test_message_region_keeps_storage);
  g_test_add_func ("/Cp/Transport/cancel/wait-argument", test_wait_cancellable);
  g_test_add_func ("/Cp/MeshOptions/properties/defaults", test_options_defaults);
  g_test_add_func ("/Cp/MeshOptions/new/local", test_options_local);
  g_test_add_func ("/Cp/MeshOptions/new/names-without-sizes", test_options_names_without_sizes);
  g_test_add_func ("/Cp/MeshOptions/new/bad-rank", test_options_bad_rank);
  g_test_add_func ("/Cp/MeshOptions/new/environment", test_options_environment);
#if CP_HAS_UCX
  g_test_add_func ("/Cp/MeshOptions/new/ucx", test_options_ucx);
#endif
  return g_test_run ();
}
