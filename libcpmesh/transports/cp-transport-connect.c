/* cp-transport-connect.c: one rendezvous, several backends, one pick
 *
 * A process joins a mesh in four steps, each over every candidate row of
 * the backend table (cp-transport-backends.c), most preferred first:
 *
 *   probe    can the backend work in this process at all?  (A backend
 *            that cannot is left out of this rank's offer, and says why
 *            on this rank.)
 *   offer    its blob for the other ranks and its private state
 *   exchange one rendezvous (cp-bootstrap.c) that carries every blob of
 *            every rank, each checked by its backend
 *   pick     from the table of offers alone, so every rank picks alike:
 *            the first row that every rank offered and whose usable_with
 *            takes the blobs (shm: every rank on one host), then finish
 *            it and abandon the others.
 *
 * CPMESH_TRANSPORT (or CpMeshOptions:transport) makes the named row the
 * only candidate: if it cannot connect the mesh, the error says why and
 * no other backend is tried.
 *
 * A rank whose candidates all fail their probe or offer still joins the
 * rendezvous, offering nothing, so that every rank fails with the same
 * verdict at once rather than waiting for it until the timeout.
 *
 * Ranks on several hosts: the whole mesh uses the first backend that
 * spans hosts (ucx); a hierarchy — shm among the ranks of a host, ucx
 * between hosts — is not built, and the debug log says which backend was
 * passed over and why.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-error.h"
#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

static gboolean
needs_rendezvous (const CpTransportBackend *backend)
{
  return backend->offer != NULL;
}

static void
candidate_clear (CpTransportCandidate *candidate)
{
  g_clear_error (&candidate->unusable);
  g_clear_pointer (&candidate->blob, g_bytes_unref);
  if (candidate->state != NULL && candidate->backend->abandon != NULL)
    candidate->backend->abandon (candidate->state);
  candidate->state = NULL;
}

/* ---- the pick ---- */

/* "1", "1 and 3", "1, 3, 4, 5, 6, 7, 8, 9 and 3 more": the ranks whose
 * blob is missing. */
static char *
list_missing (GBytes * const *blobs,
              guint           n,
              guint           n_missing)
{
  GString *text = g_string_new (NULL);
  guint shown = 0, limit = n_missing > 9 ? 8 : n_missing;

  for (guint r = 0; r < n && shown < limit; r++)
    if (blobs[r] == NULL)
      {
        shown++;
        g_string_append_printf (text, "%s%u", shown == 1 ? "" : shown == n_missing ? " and " : ", ", r);
      }
  if (shown < n_missing)
    g_string_append_printf (text, " and %u more", n_missing - shown);
  return g_string_free (text, FALSE);
}

/* Whether @candidate can connect the mesh whose offers are @table;
 * FALSE with why not. */
static gboolean
judge_candidate (const CpTransportCandidate *candidate,
                 const CpMeshConfig         *config,
                 GPtrArray                  *table,
                 GError                    **error)
{
  const CpTransportBackend *backend = candidate->backend;
  g_autofree GBytes **blobs = NULL;
  guint n_missing = 0;

  if (!needs_rendezvous (backend) || candidate->unusable != NULL)
    {
      if (candidate->unusable == NULL)
        return TRUE;
      g_propagate_error (error, g_error_copy (candidate->unusable));
      return FALSE;
    }
  g_assert (table != NULL);
  blobs = _cp_bootstrap_table_blobs (table, backend->name, &n_missing, NULL);
  if (n_missing > 0)
    {
      g_autofree char *missing = list_missing (blobs, table->len, n_missing);

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "%s %s do%s not offer it (it is not built or not usable there)",
                   n_missing == 1 ? "rank" : "ranks", missing, n_missing == 1 ? "es" : "");
      return FALSE;
    }
  return backend->usable_with == NULL || backend->usable_with (config, blobs, error);
}

int
_cp_transport_pick (const CpTransportCandidate *candidates,
                    guint                       n,
                    gboolean                    named,
                    const CpMeshConfig         *config,
                    GPtrArray                  *table,
                    char                      **story,
                    GError                    **error)
{
  g_autoptr(GString) passed_over = g_string_new (NULL);

  g_return_val_if_fail (!named || n == 1, -1);

  for (guint i = 0; i < n; i++)
    {
      g_autoptr(GError) why = NULL;

      if (judge_candidate (&candidates[i], config, table, &why))
        {
          if (story != NULL)
            *story = g_strdup_printf ("%s%s%s", candidates[i].backend->name, passed_over->len ? "; passed over: " : "",
                                      passed_over->str);
          return (int) i;
        }
      if (named)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                       "rank %d: transport \"%s\" was asked for (CPMESH_TRANSPORT or CpMeshOptions:transport) "
                       "but cannot connect this mesh of %d: %s", config->rank, candidates[i].backend->name,
                       config->world_size, why->message);
          return -1;
        }
      g_string_append_printf (passed_over, "%s%s (%s)", passed_over->len ? "; " : "", candidates[i].backend->name,
                              why->message);
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "rank %d: no transport this libcpmesh has can connect this mesh of %d: %s", config->rank,
               config->world_size, passed_over->len ? passed_over->str : "it has none");
  return -1;
}

/* ---- connecting ---- */

/* Probes @candidate's backend and, where it works, lets it offer. */
static void
prepare (CpTransportCandidate   *candidate,
         const CpMeshConfig     *config,
         const CpBootstrapRoute *route)
{
  const CpTransportBackend *backend = candidate->backend;

  if (backend->probe != NULL && !backend->probe (config, &candidate->unusable))
    return;
  if (needs_rendezvous (backend))
    candidate->blob = backend->offer (config, route, &candidate->state, &candidate->unusable);
}

/* This rank's blobs, and the check of every backend that offered. */
static CpBootstrapOffer *
gather_offer (const CpTransportCandidate *candidates,
              guint                       n,
              GArray                     *checks)
{
  CpBootstrapOffer *offer = _cp_bootstrap_offer_new ();

  for (guint i = 0; i < n; i++)
    {
      const CpTransportCandidate *candidate = &candidates[i];
      CpBootstrapCheck check = { candidate->backend->name, candidate->backend->check, candidate->state };

      if (candidate->blob == NULL)
        {
          if (candidate->unusable != NULL)
            g_debug ("transport: %s cannot run on this rank: %s", candidate->backend->name,
                     candidate->unusable->message);
          continue;
        }
      _cp_bootstrap_offer_add (offer, candidate->backend->name, candidate->blob);
      g_array_append_val (checks, check);
    }
  return offer;
}

/* Whether any candidate takes part in the rendezvous. */
static gboolean
any_needs_rendezvous (const CpTransportCandidate *candidates,
                      guint                       n)
{
  for (guint i = 0; i < n; i++)
    if (needs_rendezvous (candidates[i].backend))
      return TRUE;
  return FALSE;
}

/* The rendezvous: every rank's offer, or NULL with the error. */
static GPtrArray *
exchange (CpTransportCandidate *candidates,
          guint                 n,
          const CpMeshConfig   *config,
          CpBootstrapRoute     *route,
          gint64                deadline,
          GCancellable         *cancellable,
          GError              **error)
{
  g_autoptr(GArray) checks = g_array_new (FALSE, FALSE, sizeof (CpBootstrapCheck));
  g_autoptr(CpBootstrapOffer) offer = NULL;
  g_autofree char *offered = NULL;

  for (guint i = 0; i < n; i++)
    prepare (&candidates[i], config, route);
  offer = gather_offer (candidates, n, checks);
  offered = _cp_bootstrap_offer_describe (offer);
  g_debug ("transport: rank %d offers %s", config->rank, offered);
  return _cp_bootstrap_exchange (config, route, offer, (const CpBootstrapCheck *) checks->data, checks->len,
                                 deadline, cancellable, error);
}

static CpTransport *
finish (CpTransportCandidate *picked,
        const CpMeshConfig   *config,
        GPtrArray            *table,
        gint64                deadline,
        GCancellable         *cancellable,
        GError              **error)
{
  g_autofree GBytes **blobs = table != NULL ? _cp_bootstrap_table_blobs (table, picked->backend->name, NULL, NULL)
                                            : NULL;
  gpointer state = g_steal_pointer (&picked->state);

  return picked->backend->finish (config, state, needs_rendezvous (picked->backend) ? blobs : NULL, deadline,
                                  cancellable, error);
}

/* Whether no candidate can run on this rank, whatever the others offer. */
static gboolean
none_usable_here (const CpTransportCandidate *candidates,
                  guint                       n)
{
  for (guint i = 0; i < n; i++)
    if (candidates[i].unusable == NULL)
      return FALSE;
  return TRUE;
}

/* A rendezvous that failed while no candidate could run here anyway
 * (its peers never came, say) fails for the reason this rank can give:
 * why none can run, with what the rendezvous said. */
static void
explain_failed_rendezvous (const CpTransportCandidate *candidates,
                           guint                       n,
                           gboolean                    named,
                           const CpMeshConfig         *config,
                           GError                    **error)
{
  GError *why = NULL;

  if (error == NULL || *error == NULL || g_error_matches (*error, G_IO_ERROR, G_IO_ERROR_CANCELLED) ||
      !none_usable_here (candidates, n))
    return;
  _cp_transport_pick (candidates, n, named, config, NULL, NULL, &why);
  g_prefix_error (error, "%s; and the rendezvous failed: ", why->message);
  (*error)->domain = why->domain;
  (*error)->code = why->code;
  g_error_free (why);
}

static CpTransport *
connect_candidates (CpTransportCandidate *candidates,
                    guint                 n,
                    gboolean              named,
                    const CpMeshConfig   *config,
                    GCancellable         *cancellable,
                    GError              **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) config->timeout_ms * G_TIME_SPAN_MILLISECOND;
  CpBootstrapRoute route = { 0 };
  g_autoptr(GPtrArray) table = NULL;
  g_autofree char *story = NULL;
  int picked;

  if (any_needs_rendezvous (candidates, n))
    {
      gboolean found = _cp_bootstrap_find_route (config, &route, error);

      if (found)
        table = exchange (candidates, n, config, &route, deadline, cancellable, error);
      _cp_bootstrap_route_clear (&route);
      if (found && table == NULL)
        explain_failed_rendezvous (candidates, n, named, config, error);
      if (table == NULL)
        return NULL;
    }
  else
    for (guint i = 0; i < n; i++)
      prepare (&candidates[i], config, NULL);
  picked = _cp_transport_pick (candidates, n, named, config, table, &story, error);
  if (picked < 0)
    return NULL;
  g_debug ("transport: rank %d of %d connects over %s", config->rank, config->world_size, story);
  /* The others' sockets and workers go before the pick connects. */
  for (guint i = 0; i < n; i++)
    if ((int) i != picked)
      candidate_clear (&candidates[i]);
  return finish (&candidates[picked], config, table, deadline, cancellable, error);
}

CpTransport *
_cp_transport_connect (const CpMeshConfig  *config,
                       GCancellable        *cancellable,
                       GError             **error)
{
  g_autoptr(GPtrArray) rows = _cp_transport_backend_candidates (config->transport, error);
  g_autoptr(GArray) candidates = NULL;
  CpTransport *transport;

  if (rows == NULL)
    return NULL;
  candidates = g_array_sized_new (FALSE, TRUE, sizeof (CpTransportCandidate), rows->len);
  g_array_set_clear_func (candidates, (GDestroyNotify) candidate_clear);
  for (guint i = 0; i < rows->len; i++)
    {
      CpTransportCandidate candidate = { .backend = rows->pdata[i] };

      g_array_append_val (candidates, candidate);
    }
  transport = connect_candidates ((CpTransportCandidate *) candidates->data, candidates->len,
                                  config->transport != NULL, config, cancellable, error);
  return transport;
}
