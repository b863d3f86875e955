/* cp-ucx-worker.c: one UCP context and worker, endpoints, operations
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "cp-error.h"
#include "cp-ucx-private.h"

/* Sets a UCX configuration value unless the user chose it through the
 * environment: UCX_* variables always win. */
static void
set_default (ucp_config_t *config,
             const char   *name,
             const char   *value)
{
  g_autofree char *variable = g_strconcat ("UCX_", name, NULL);

  if (g_getenv (variable) == NULL)
    ucp_config_modify (config, name, value);
}

/* Peer failure handling (which every endpoint asks for) disables UCX
 * 1.13's shared-memory transports unless they check their peers too;
 * without them, processes on one host talk over TCP loopback at a third
 * of the speed (doc/mesh-ucx.md has the measurements).  Keepalive finds
 * a dead peer the mesh is waiting for well within any sensible timeout. */
static void
tune_config (ucp_config_t *config,
             guint         keepalive_ms)
{
  g_autofree char *keepalive = g_strdup_printf ("%ums", keepalive_ms);

  if (g_getenv ("UCX_POSIX_ERROR_HANDLING") == NULL && g_getenv ("UCX_SYSV_ERROR_HANDLING") == NULL)
    set_default (config, "MM_ERROR_HANDLING", "y");
  set_default (config, "KEEPALIVE_INTERVAL", keepalive);
}

/* UCX's TCP transport listens on a port of every interface it uses, and
 * takes anything from anyone there: UCX 1.13 aborts on a connection that
 * sends it bytes of its own making.  So UCX keeps to what the mesh needs.
 * Ranks that meet over loopback are all on this host, and shared memory
 * (which checks its peers, see tune_config) is all they need: no port at
 * all.  Otherwise only the interface that reaches MASTER_ADDR is used,
 * where the other hosts are.  A user who names devices or transports
 * (UCX_NET_DEVICES, UCX_TLS) chose for themselves. */
static gboolean
confine (ucp_config_t            *config,
         const CpBootstrapRoute  *route,
         GError                 **error)
{
  const char *name = route->is_loopback ? "TLS" : "NET_DEVICES";
  const char *value = route->is_loopback ? "sm,self" : route->interface;
  ucs_status_t status;

  if (g_getenv ("UCX_TLS") != NULL || g_getenv ("UCX_NET_DEVICES") != NULL)
    return TRUE;
  if (value == NULL)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "no network interface of this host has the address it reaches MASTER_ADDR from, "
                   "so UCX cannot be kept to it: name the interface in UCX_NET_DEVICES");
      return FALSE;
    }
  status = ucp_config_modify (config, name, value);
  if (status == UCS_OK)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "UCX refused %s=%s: %s", name, value,
               ucs_status_string (status));
  return FALSE;
}

/* In unified mode UCX packs only resource indices and takes the rest of
 * a peer's address from its own resources, so a peer's address cannot be
 * checked before UCX reads it (cp-ucx-address.c). */
static gboolean
refuse_unified_mode (GError **error)
{
  const char *value = g_getenv ("UCX_UNIFIED_MODE");

  if (value == NULL || g_ascii_strcasecmp (value, "n") == 0 || g_ascii_strcasecmp (value, "no") == 0 ||
      g_ascii_strcasecmp (value, "off") == 0 || g_str_equal (value, "0"))
    return FALSE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "UCX_UNIFIED_MODE=%s: in unified mode UCX reads peers' worker addresses against its "
               "own resources, and this library cannot check them first; unset it", value);
  return TRUE;
}

static gboolean
check_status (ucs_status_t   status,
              const char    *what,
              GError       **error)
{
  if (status == UCS_OK)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, _cp_ucx_error_code (status), "UCX could not %s: %s",
               what, ucs_status_string (status));
  return FALSE;
}

gboolean
_cp_ucx_worker_probe (GError **error)
{
  ucp_config_t *config = NULL;
  ucs_status_t status;

  if (refuse_unified_mode (error))
    return FALSE;
  status = ucp_config_read (NULL, NULL, &config);
  if (status == UCS_OK)
    {
      ucp_config_release (config);
      return TRUE;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "UCX refuses its configuration (the UCX_* environment): %s", ucs_status_string (status));
  return FALSE;
}

static gboolean
is_loopback_interface (const char *name)
{
  struct ifaddrs *list = NULL;
  gboolean loopback = FALSE;

  if (getifaddrs (&list) != 0)
    return FALSE;
  for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next)
    if (g_str_equal (ifa->ifa_name, name) && (ifa->ifa_flags & IFF_LOOPBACK) != 0)
      loopback = TRUE;
  freeifaddrs (list);
  return loopback;
}

/* The devices, other than loopback, on which @context uses UCX's TCP
 * transport, as UCX lists its resources ("tcp/eth0"), comma-separated;
 * NULL when there are none. */
static char *
reachable_tcp_devices (ucp_context_h context)
{
  g_autofree char *text = NULL;
  size_t size = 0;
  FILE *stream = open_memstream (&text, &size);
  g_auto(GStrv) lines = NULL;
  GString *devices = g_string_new (NULL);

  if (stream == NULL)
    return g_string_free (devices, TRUE);
  ucp_context_print_info (context, stream);
  fclose (stream);
  lines = g_strsplit (text != NULL ? text : "", "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++)
    {
      const char *tcp = strstr (lines[i], " tcp/");
      const char *device = tcp != NULL ? tcp + strlen (" tcp/") : NULL;

      if (device == NULL || strstr (lines[i], "resource") == NULL || is_loopback_interface (device))
        continue;
      g_string_append_printf (devices, "%s%s", devices->len > 0 ? ", " : "", device);
    }
  return g_string_free (devices, devices->len == 0);
}

/* UCX's TCP transport listens on a port of every device it uses, for the
 * life of the mesh, and UCX 1.13 aborts the process on bytes of a
 * stranger's making there; nothing in UCX 1.13 turns that port off or
 * authenticates it (doc/mesh-ucx.md says how to confine it).  Ranks that
 * meet over loopback use shared memory alone, so this is said only when
 * TCP runs on an interface other hosts reach — once per process, as a
 * message, so that programs that chose it go on. */
static void
warn_if_tcp_reachable (ucp_context_h context)
{
  static gsize warned = 0;
  g_autofree char *devices = NULL;

  if ((devices = reachable_tcp_devices (context)) == NULL || !g_once_init_enter (&warned))
    return;
  g_message ("UCX uses TCP on %s: any process that reaches that network can connect to this rank's "
             "UCX port, and bytes of its making abort the rank. Keep multi-host meshes on a network "
             "only the job's hosts reach, or name other devices in UCX_NET_DEVICES.", devices);
  g_once_init_leave (&warned, 1);
}

static gboolean
create_context (CpUcxWorker             *self,
                guint                    keepalive_ms,
                const CpBootstrapRoute  *route,
                GError                 **error)
{
  ucp_params_t params = {
    .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
    .features = UCP_FEATURE_TAG,
    .name = "libcpmesh",
  };
  ucp_config_t *config = NULL;
  ucs_status_t status;

  if (refuse_unified_mode (error) ||
      !check_status (ucp_config_read (NULL, NULL, &config), "read its configuration", error))
    return FALSE;
  tune_config (config, keepalive_ms);
  if (!confine (config, route, error))
    {
      ucp_config_release (config);
      return FALSE;
    }
  status = ucp_init (&params, config, &self->context);
  ucp_config_release (config);
  if (!check_status (status, "initialise", error))
    return FALSE;
  warn_if_tcp_reachable (self->context);
  return TRUE;
}

typedef struct
{
  gpointer data;
  GDestroyNotify destroy;
} Retained;

void
_cp_ucx_worker_retain (CpUcxWorker    *self,
                       gpointer        data,
                       GDestroyNotify  destroy)
{
  Retained retained = { data, destroy };

  g_array_append_val (self->retained, retained);
}

CpUcxWorker *
_cp_ucx_worker_new (guint                    keepalive_ms,
                    const CpBootstrapRoute  *route,
                    GError                 **error)
{
  ucp_worker_params_t params = {
    .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
    .thread_mode = UCS_THREAD_MODE_SERIALIZED,
  };
  CpUcxWorker *self = g_new0 (CpUcxWorker, 1);

  _cp_mutex_init (&self->lock);
  self->endpoints = g_ptr_array_new_with_free_func (g_free);
  self->retained = g_array_new (FALSE, FALSE, sizeof (Retained));
  if (!create_context (self, keepalive_ms, route, error) ||
      !check_status (ucp_worker_create (self->context, &params, &self->worker),
                     "create a worker", error))
    {
      _cp_ucx_worker_free (self);
      return NULL;
    }
  return self;
}

void
_cp_ucx_worker_free (CpUcxWorker *self)
{
  if (self == NULL)
    return;
  g_clear_pointer (&self->worker, ucp_worker_destroy);
  g_clear_pointer (&self->context, ucp_cleanup);
  g_clear_pointer (&self->endpoints, g_ptr_array_unref);
  for (guint i = 0; self->retained != NULL && i < self->retained->len; i++)
    {
      Retained *retained = &g_array_index (self->retained, Retained, i);

      retained->destroy (retained->data);
    }
  g_clear_pointer (&self->retained, g_array_unref);
  _cp_mutex_clear (&self->lock);
  g_free (self);
}

GBytes *
_cp_ucx_worker_dup_address (CpUcxWorker  *self,
                            GError      **error)
{
  ucp_address_t *address = NULL;
  size_t length = 0;
  GBytes *bytes;

  if (!check_status (ucp_worker_get_address (self->worker, &address, &length),
                     "read its worker address", error))
    return NULL;
  bytes = g_bytes_new (address, length);
  ucp_worker_release_address (self->worker, address);
  return bytes;
}

unsigned
_cp_ucx_worker_progress (CpUcxWorker *self)
{
  unsigned events;

  _cp_mutex_lock (&self->lock);
  events = ucp_worker_progress (self->worker);
  _cp_mutex_unlock (&self->lock);
  return events;
}

void
_cp_ucx_idle (guint *idle_rounds)
{
  guint rounds = ++*idle_rounds;

  if (rounds < 64)
    return;
  if (rounds < 4096)
    sched_yield ();
  else
    g_usleep (100);
}

static void
on_endpoint_error (void         *arg,
                   ucp_ep_h      ep,
                   ucs_status_t  status)
{
  CpUcxEndpoint *endpoint = arg;

  if (endpoint->failure == UCS_OK)
    endpoint->failure = status;
  if (endpoint->failed_func != NULL)
    endpoint->failed_func (endpoint, endpoint->failed_data);
}

static CpUcxEndpoint *
create_endpoint (CpUcxWorker      *self,
                 ucp_ep_params_t  *params,
                 int               peer,
                 GError          **error)
{
  CpUcxEndpoint *endpoint = g_new0 (CpUcxEndpoint, 1);

  params->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params->err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params->err_handler.cb = on_endpoint_error;
  params->err_handler.arg = endpoint;
  if (!check_status (ucp_ep_create (self->worker, params, &endpoint->ep), "create an endpoint", error))
    {
      g_free (endpoint);
      return NULL;
    }
  endpoint->peer = peer;
  g_ptr_array_add (self->endpoints, endpoint);
  return endpoint;
}

CpUcxEndpoint *
_cp_ucx_connect_address (CpUcxWorker  *self,
                         GBytes       *address,
                         int           peer,
                         GError      **error)
{
  ucp_ep_params_t params = {
    .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
    .address = g_bytes_get_data (address, NULL),
  };

  return create_endpoint (self, &params, peer, error);
}

/* Closing by force never leaves a request behind: UCX 1.13 aborts when a
 * worker is destroyed while a flushing close is still pending. */
static void *
start_close (CpUcxEndpoint *endpoint)
{
  ucp_request_param_t param = {
    .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
    .flags = UCP_EP_CLOSE_FLAG_FORCE,
  };
  ucs_status_ptr_t request = ucp_ep_close_nbx (endpoint->ep, &param);

  endpoint->ep = NULL;
  endpoint->failed_func = NULL;
  return UCS_PTR_IS_PTR (request) ? request : NULL;
}

/* Progresses until every request of @requests completed or @deadline,
 * then releases them to UCX, which frees any still in flight once done. */
static void
finish_requests (CpUcxWorker  *self,
                 void        **requests,
                 guint         n,
                 gint64        deadline)
{
  guint idle = 0;
  gboolean done = FALSE;

  while (!done)
    {
      _cp_mutex_lock (&self->lock);
      ucp_worker_progress (self->worker);
      done = TRUE;
      for (guint i = 0; i < n; i++)
        done &= requests[i] == NULL || ucp_request_check_status (requests[i]) != UCS_INPROGRESS;
      _cp_mutex_unlock (&self->lock);
      if (done || g_get_monotonic_time () >= deadline)
        break;
      _cp_ucx_idle (&idle);
    }
  _cp_mutex_lock (&self->lock);
  for (guint i = 0; i < n; i++)
    g_clear_pointer (&requests[i], ucp_request_free);
  _cp_mutex_unlock (&self->lock);
}

/* Waits, until @deadline at most, for what was sent to reach the peers. */
static void
flush_worker (CpUcxWorker *self,
              gint64       deadline)
{
  ucp_request_param_t param = { 0 };
  ucs_status_ptr_t request;

  _cp_mutex_lock (&self->lock);
  request = ucp_worker_flush_nbx (self->worker, &param);
  _cp_mutex_unlock (&self->lock);
  if (UCS_PTR_IS_PTR (request))
    finish_requests (self, &request, 1, deadline);
}

void
_cp_ucx_close_endpoints (CpUcxWorker    *self,
                         CpUcxEndpoint **endpoints,
                         guint           n,
                         gboolean        graceful,
                         gint64          deadline)
{
  g_autofree void **requests = g_new0 (void *, MAX (n, 1));

  if (graceful)
    flush_worker (self, deadline);
  _cp_mutex_lock (&self->lock);
  for (guint i = 0; i < n; i++)
    if (endpoints[i] != NULL && endpoints[i]->ep != NULL)
      requests[i] = start_close (endpoints[i]);
  _cp_mutex_unlock (&self->lock);
  finish_requests (self, requests, n, g_get_monotonic_time () + G_TIME_SPAN_SECOND);
}

void
_cp_ucx_op_begin (CpUcxOp          *op,
                  ucs_status_ptr_t  ptr)
{
  op->request = NULL;
  if (ptr == NULL)
    op->status = UCS_OK;
  else if (UCS_PTR_IS_ERR (ptr))
    op->status = UCS_PTR_STATUS (ptr);
  else
    {
      op->request = ptr;
      op->status = UCS_INPROGRESS;
    }
}

gboolean
_cp_ucx_op_poll (CpUcxOp *op)
{
  ucs_status_t status;

  if (op->request == NULL)
    return TRUE;
  if (op->is_recv)
    status = ucp_tag_recv_request_test (op->request, &op->info);
  else
    status = ucp_request_check_status (op->request);
  if (status == UCS_INPROGRESS)
    return FALSE;
  /* Tagged receives take any message that fits; one that is shorter than
   * the sender's buffer was cut on the way. */
  if (status == UCS_OK && op->is_recv && op->expected > 0 && op->info.length != op->expected)
    status = UCS_ERR_MESSAGE_TRUNCATED;
  op->status = status;
  g_clear_pointer (&op->request, ucp_request_free);
  return TRUE;
}

/* With the lock held.  A request still in flight is released to UCX,
 * which frees it when it completes. */
void
_cp_ucx_op_clear (CpUcxOp *op)
{
  g_clear_pointer (&op->request, ucp_request_free);
  g_clear_pointer (&op->iov, g_free);
}

int
_cp_ucx_error_code (ucs_status_t status)
{
  switch (status)
    {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    /* A peer that died takes its shared-memory segments with it: a
     * transfer from them fails this way before the keepalive notices. */
    case UCS_ERR_SHMEM_SEGMENT:
      return CP_MESH_ERROR_PEER_LOST;
    case UCS_ERR_TIMED_OUT:
      return CP_MESH_ERROR_TIMED_OUT;
    default:
      return CP_MESH_ERROR_TRANSPORT;
    }
}
