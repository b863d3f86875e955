/* cp-transport-backends.c: which transports this build has, and in
 * which order the default chain tries them
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-error.h"
#include "cp-features.h"
#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

/* Processes cannot share the in-process backend's memory: as a backend
 * that connects processes, it makes the mesh of a lone process.  Every
 * rank of a mesh has the same world size, so every rank answers alike,
 * as a row without a rendezvous must. */
static gboolean
local_probe (const CpMeshConfig  *config,
             GError             **error)
{
  g_autofree char *built = NULL;

  if (config == NULL || config->world_size == 1)
    return TRUE;
  built = _cp_transport_backend_list ();
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "it joins the threads of one process, not %d processes; this libcpmesh has %s%s",
               config->world_size, built,
               CP_HAS_UCX ? "" : " (rebuild with -Ducx=enabled for processes on several hosts)");
  return FALSE;
}

static CpTransport *
local_finish (const CpMeshConfig  *config,
              gpointer             state,
              GBytes * const      *blobs,
              gint64               deadline,
              GCancellable        *cancellable,
              GError             **error)
{
  return _cp_transport_local_connect (config, cancellable, error);
}

static const CpTransportBackend local_backend = {
  .name = "local",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .priority = 10,
  .summary = "in-process ranks on threads; a mesh of one process",
  .probe = local_probe,
  .finish = local_finish,
};

#ifdef CP_TEST_BACKENDS
static CpTransport *
loopback_finish (const CpMeshConfig  *config,
                 gpointer             state,
                 GBytes * const      *blobs,
                 gint64               deadline,
                 GCancellable        *cancellable,
                 GError             **error)
{
  return _cp_transport_loopback_connect (config, cancellable, error);
}

/* Its ranks are threads that meet in a table of their own. */
static const CpTransportBackend loopback_backend = {
  .name = "loopback",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .priority = -1,
  .summary = "threads over socketpairs (tests only)",
  .finish = loopback_finish,
};
#endif

/* One line per backend: a new backend is a source file and a line here.
 * The default chain tries them by priority (CpTransportBackend), the
 * shared-memory one — when every rank is on one host — before UCX. */
static const CpTransportBackend * const backends[] = {
#if CP_HAS_UCX
  &_cp_transport_ucx_backend,
#endif
  &_cp_transport_shm_backend,
  &local_backend,
#ifdef CP_TEST_BACKENDS
  &loopback_backend,
#endif
};

static gint
by_priority (gconstpointer a,
             gconstpointer b)
{
  const CpTransportBackend *first = *(const CpTransportBackend * const *) a;
  const CpTransportBackend *second = *(const CpTransportBackend * const *) b;

  return (first->priority < second->priority) - (first->priority > second->priority);
}

/* Every built row, most preferred first; the sort is stable, so rows of
 * one priority keep the table's order. */
static GPtrArray *
rows_by_priority (void)
{
  GPtrArray *rows = g_ptr_array_sized_new (G_N_ELEMENTS (backends));

  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    g_ptr_array_add (rows, (gpointer) backends[i]);
  g_ptr_array_sort (rows, by_priority);
  return rows;
}

char *
_cp_transport_backend_list (void)
{
  g_autoptr(GPtrArray) rows = rows_by_priority ();
  GString *names = g_string_new (NULL);

  for (guint i = 0; i < rows->len; i++)
    g_string_append_printf (names, "%s%s", i > 0 ? ", " : "",
                            ((const CpTransportBackend *) rows->pdata[i])->name);
  return g_string_free (names, FALSE);
}

const CpTransportBackend *
_cp_transport_backend_find (const char  *name,
                            GError     **error)
{
  g_autofree char *built = NULL;
  g_autofree char *shown = NULL;

  if (name == NULL)
    {
      g_autoptr(GPtrArray) rows = rows_by_priority ();

      return rows->pdata[0];
    }
  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    if (g_str_equal (backends[i]->name, name))
      return backends[i];
  built = _cp_transport_backend_list ();
  /* The name may come from the environment (CPMESH_TRANSPORT). */
  shown = _cp_mesh_escape_text (name, -1);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "transport \"%s\" is not built into this libcpmesh; it has %s", shown, built);
  return NULL;
}

GPtrArray *
_cp_transport_backend_candidates (const char  *name,
                                  GError     **error)
{
  GPtrArray *rows;

  if (name != NULL)
    {
      const CpTransportBackend *named = _cp_transport_backend_find (name, error);

      if (named == NULL)
        return NULL;
      rows = g_ptr_array_new ();
      g_ptr_array_add (rows, (gpointer) named);
      return rows;
    }
  rows = rows_by_priority ();
  while (rows->len > 0 && ((const CpTransportBackend *) rows->pdata[rows->len - 1])->priority < 0)
    g_ptr_array_remove_index (rows, rows->len - 1);
  return rows;
}

gboolean
_cp_transport_backend_serves (const CpTransportBackend *backend,
                              CpDeviceKind              device)
{
  return (backend->device_kinds & CP_TRANSPORT_DEVICE (device)) != 0;
}

char *
_cp_transport_describe_backends (void)
{
  g_autoptr(GPtrArray) rows = rows_by_priority ();
  g_autoptr(GPtrArray) chain = NULL;
  GString *text = g_string_new (NULL);

  for (guint i = 0; i < rows->len; i++)
    {
      const CpTransportBackend *row = rows->pdata[i];
      g_autoptr(GError) error = NULL;
      gboolean usable = row->probe == NULL || row->probe (NULL, &error);

      g_string_append_printf (text, "  %-8s %-4s %s%s%s\n", row->name, usable ? "yes" : "no", row->summary,
                              usable ? "" : ": ", usable ? "" : error->message);
    }
  chain = _cp_transport_backend_candidates (NULL, NULL);
  g_string_append (text, "  default chain:");
  for (guint i = 0; i < chain->len; i++)
    g_string_append_printf (text, "%s %s", i > 0 ? "," : "", ((const CpTransportBackend *) chain->pdata[i])->name);
  /* What a mesh whose ranks span hosts gets: no composition yet. */
  g_string_append (text, "; a backend for one host is passed over when the ranks are on several, and the "
                         "whole mesh uses the next (no hierarchy of a backend within hosts and another "
                         "between them)\n");
  return g_string_free (text, FALSE);
}
