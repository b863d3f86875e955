/* cp-transport-backends.c: which transports this build has, and which
 * one connects a mesh
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-error.h"
#include "cp-features.h"
#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

/* One line per backend, the default first: a new backend is a source
 * file and a line here. */
static const CpTransportBackend backends[] = {
#if CP_HAS_UCX
  { "ucx", CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST), _cp_transport_ucx_connect },
#endif
  { "shm", CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST), _cp_transport_shm_connect },
  { "local", CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST), _cp_transport_local_connect },
#ifdef CP_TEST_BACKENDS
  { "loopback", CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST), _cp_transport_loopback_connect },
#endif
};

char *
_cp_transport_backend_list (void)
{
  GString *names = g_string_new (NULL);

  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    g_string_append_printf (names, "%s%s", i > 0 ? ", " : "", backends[i].name);
  return g_string_free (names, FALSE);
}

const CpTransportBackend *
_cp_transport_backend_find (const char  *name,
                            GError     **error)
{
  g_autofree char *built = NULL;
  g_autofree char *shown = NULL;

  if (name == NULL)
    return &backends[0];
  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    if (g_str_equal (backends[i].name, name))
      return &backends[i];
  built = _cp_transport_backend_list ();
  /* The name may come from the environment (CPMESH_TRANSPORT). */
  shown = _cp_mesh_escape_text (name, -1);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "transport \"%s\" is not built into this libcpmesh; it has %s", shown, built);
  return NULL;
}

gboolean
_cp_transport_backend_serves (const CpTransportBackend *backend,
                              CpDeviceKind              device)
{
  return (backend->device_kinds & CP_TRANSPORT_DEVICE (device)) != 0;
}
