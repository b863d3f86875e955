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
  g_assert_cmpmem (cp_tensor_get_data (whole), 12, cp_tensor_get_data (piece), 12);
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
  return g_test_run ();
}
