/* cp-mesh-connect.c: meshes whose ranks are processes
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-error.h"
#include "transports/cp-mesh-config-private.h"
#include "cp-mesh-private.h"

static CpMesh *
mesh_from_transport (CpTransport         *transport,
                     const CpMeshConfig  *config,
                     GMainContext        *context,
                     GError             **error)
{
  g_autofree int *members = g_new (int, config->world_size);
  CpMesh *mesh;

  for (int r = 0; r < config->world_size; r++)
    members[r] = r;
  mesh = _cp_mesh_new (transport, "world", members, config->world_size, config->rank,
                       (const char * const *) config->dim_names, config->dim_sizes, config->n_dims,
                       error);
  if (mesh == NULL)
    return NULL;
  cp_mesh_set_timeout_ms (mesh, config->timeout_ms);
  _cp_mesh_set_local_rank (mesh, config->local_rank);
  _cp_mesh_watch_peers (mesh, context);
  return mesh;
}

/* Connects with the backend @config asks for, or the one the default
 * chain picks; lost peers are reported in @context. */
static CpMesh *
connect_mesh (const CpMeshConfig  *config,
              GMainContext        *context,
              GCancellable        *cancellable,
              GError             **error)
{
  CpTransport *transport = _cp_transport_connect (config, cancellable, error);
  CpMesh *mesh;

  if (transport == NULL)
    return NULL;
  mesh = mesh_from_transport (transport, config, context, error);
  _cp_transport_unref (transport);
  return mesh;
}

static CpMesh *
connect_here (const CpMeshConfig  *config,
              GError             **error)
{
  g_autoptr(GMainContext) context = g_main_context_ref_thread_default ();

  return connect_mesh (config, context, NULL, error);
}

/**
 * cp_mesh_new_from_env:
 * @error: return location for a #GError
 *
 * Joins this process to a multi-process mesh as described by the
 * environment of the launcher that started it, and blocks until every rank
 * has joined or the timeout passed.
 *
 * Rank and world size come from the first launcher whose variables are
 * set: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, as set by
 * `cpmesh launch` too), then Open MPI (`OMPI_COMM_WORLD_RANK`,
 * `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`), then Slurm
 * (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`). With none of them
 * set, the process is a mesh of one rank.
 *
 * Rank 0 listens at `MASTER_ADDR` (under Slurm without `MASTER_ADDR`, the
 * first node of the step; otherwise `127.0.0.1`), on `CPMESH_PORT` or,
 * when that is not set, one port above `MASTER_PORT` (29500 by default):
 * torchrun's agent, and torch.distributed in a program that uses it too,
 * listen on `MASTER_PORT` itself. `CPMESH_TOKEN` is the shared secret
 * every rank must prove it holds; without it, any process that reaches
 * the port may join, and a mesh whose `MASTER_ADDR` is not loopback says
 * so once on standard error.
 * `CPMESH_TIMEOUT_MS` bounds the rendezvous and every later operation
 * (default 120000). `CPMESH_MESH_DIMS` names the dimensions, outermost
 * first, as in `dp=2,cp=4`; by default the mesh has one dimension `cp`
 * over all ranks. `CPMESH_TRANSPORT` names the one transport to use
 * ([property@Cp.Mesh:backend]): `shm` for processes of one host, `ucx`,
 * or `local` for a mesh of one process. Without it, the ranks pick, all
 * alike, the first transport of the default chain (`cpmesh info` lists
 * it) that every rank can use, from the offers they exchange in their one
 * rendezvous: `shm` when every rank is on one host, else `ucx` for the
 * whole mesh.
 *
 * Programs started by `mpirun`, `srun`, torchrun or `cpmesh launch` run
 * unchanged. [signal@Cp.Mesh::rank-lost] is emitted in the thread-default
 * main context of the calling thread.
 *
 * Returns: (transfer full): this rank's mesh, or %NULL with
 *   %CP_MESH_ERROR_INVALID_TOPOLOGY naming the variable and value when the
 *   environment is bad or contradicts itself, %CP_MESH_ERROR_AUTH when
 *   rank 0 refused the token (or the process on rank 0's port could not
 *   prove it holds it), %CP_MESH_ERROR_TIMED_OUT when ranks did not all
 *   join in time, %CP_MESH_ERROR_PEER_LOST when rank 0 left after
 *   admitting this rank, %CP_MESH_ERROR_TRANSPORT when rank 0 cannot
 *   listen or what answers on its port is not a libcpmesh rank 0, or
 *   %CP_MESH_ERROR_UNSUPPORTED when rank 0 speaks another protocol, when
 *   no transport this libcpmesh has can connect the ranks (the message
 *   says why of each), when `CPMESH_TRANSPORT` names a transport it was
 *   built without (the message lists those it has), or one that cannot
 *   run on some rank or connect these ranks (the message says why)
 *
 * Since: 1.0
 */
CpMesh *
cp_mesh_new_from_env (GError **error)
{
  CpMeshConfig config;
  CpMesh *mesh;

  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_mesh_config_init_from_environ (&config, NULL, error))
    return NULL;
  mesh = connect_here (&config, error);
  _cp_mesh_config_clear (&config);
  return mesh;
}

/* Names and sizes set one by one, as properties, may not pair up. */
static gboolean
check_dims_pair (const char * const  *dim_names,
                 const int           *dim_sizes,
                 gsize                n_dims,
                 GError             **error)
{
  guint n_names = dim_names != NULL ? g_strv_length ((char **) dim_names) : 0;

  if ((dim_names == NULL && dim_sizes == NULL) || (dim_sizes != NULL && n_names == n_dims))
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
               "mesh options: %u dimension names (dim-names) but %" G_GSIZE_FORMAT
               " sizes (dim-sizes); give one size per name", n_names,
               dim_sizes != NULL ? n_dims : 0);
  return FALSE;
}

/* The config @options describe; a transport they leave unnamed comes
 * from CPMESH_TRANSPORT, if set. */
static gboolean
config_from_options (CpMeshConfig   *config,
                     CpMeshOptions  *options,
                     GError        **error)
{
  gsize n_dims = 0;
  const int *dim_sizes = cp_mesh_options_get_dim_sizes (options, &n_dims);
  const char *transport = cp_mesh_options_get_transport (options);

  if (!check_dims_pair (cp_mesh_options_get_dim_names (options), dim_sizes, n_dims, error))
    return FALSE;
  if (!_cp_mesh_config_init (config, cp_mesh_options_get_rank (options),
                             cp_mesh_options_get_world_size (options),
                             cp_mesh_options_get_address (options), cp_mesh_options_get_port (options),
                             cp_mesh_options_get_token (options),
                             cp_mesh_options_get_dim_names (options), dim_sizes, n_dims,
                             cp_mesh_options_get_timeout_ms (options), error))
    return FALSE;
  if (transport == NULL)
    transport = g_getenv ("CPMESH_TRANSPORT");
  config->transport = transport != NULL && transport[0] != '\0' ? g_strdup (transport) : NULL;
  return TRUE;
}

/**
 * cp_mesh_new_with_options: (constructor)
 * @options: how to join: rank, world size, rendezvous, token, dimensions,
 *   timeout and transport
 * @error: return location for a #GError
 *
 * Joins this process to a multi-process mesh, like
 * [ctor@Cp.Mesh.new_from_env] with every setting given in @options: rank 0
 * listens at [property@Cp.MeshOptions:address] and
 * [property@Cp.MeshOptions:port], every other rank connects there and
 * proves it holds [property@Cp.MeshOptions:token], and the call returns
 * once every rank has joined, over the transport
 * [property@Cp.MeshOptions:transport] names. [signal@Cp.Mesh::rank-lost]
 * is emitted in the thread-default main context of the calling thread.
 *
 * Returns: (transfer full): this rank's mesh, or %NULL with
 *   %CP_MESH_ERROR_INVALID_TOPOLOGY naming the value when the options are
 *   bad or contradict each other, %CP_MESH_ERROR_UNSUPPORTED naming the
 *   transport when this build does not have it, or the errors of
 *   [ctor@Cp.Mesh.new_from_env]
 *
 * Since: 1.0
 */
CpMesh *
cp_mesh_new_with_options (CpMeshOptions  *options,
                          GError        **error)
{
  CpMeshConfig config;
  CpMesh *mesh;

  g_return_val_if_fail (CP_IS_MESH_OPTIONS (options), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!config_from_options (&config, options, error))
    return NULL;
  mesh = connect_here (&config, error);
  _cp_mesh_config_clear (&config);
  return mesh;
}

/**
 * cp_mesh_new_ucx: (constructor)
 * @rank: this process's rank, in `[0, world_size)`
 * @world_size: the number of processes, at most 1024
 * @address: (nullable): the host rank 0 listens on; %NULL for `127.0.0.1`
 * @port: the port rank 0 listens on; 0 only for a mesh of one rank
 * @token: (nullable): the shared secret every rank must prove it holds,
 *   or %NULL for none
 * @dim_names: (array zero-terminated=1) (nullable): the dimension names,
 *   outermost first; %NULL for one dimension `cp` over all ranks
 * @dim_sizes: (array length=n_dims) (nullable): the size of each dimension
 * @n_dims: the number of dimensions
 * @timeout_ms: the bound on the rendezvous and on every later operation,
 *   in milliseconds, at most %G_MAXINT; 0 for the default of 120000
 * @error: return location for a #GError
 *
 * Joins this process to a multi-process mesh over UCX: a shorthand for
 * [ctor@Cp.Mesh.new_with_options] with these values and
 * [property@Cp.MeshOptions:transport] `"ucx"`.
 *
 * Returns: (transfer full): this rank's mesh, or %NULL with an error
 *
 * Since: 1.0
 */
CpMesh *
cp_mesh_new_ucx (int                  rank,
                 int                  world_size,
                 const char          *address,
                 guint                port,
                 const char          *token,
                 const char * const  *dim_names,
                 const int           *dim_sizes,
                 gsize                n_dims,
                 guint                timeout_ms,
                 GError             **error)
{
  g_autoptr(CpMeshOptions) options = NULL;

  g_return_val_if_fail (dim_names == NULL || dim_sizes != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", rank, "world-size", world_size,
                          "address", address, "port", port, "token", token,
                          "timeout-ms", timeout_ms, "transport", "ucx", NULL);
  cp_mesh_options_set_dims (options, dim_names, dim_sizes, n_dims);
  return cp_mesh_new_with_options (options, error);
}

typedef struct
{
  CpMeshConfig config;
  GMainContext *context;
} ConnectData;

static void
connect_data_free (ConnectData *data)
{
  _cp_mesh_config_clear (&data->config);
  g_main_context_unref (data->context);
  g_free (data);
}

static void
connect_thread (GTask        *task,
                gpointer      source_object,
                gpointer      task_data,
                GCancellable *cancellable)
{
  ConnectData *data = task_data;
  GError *error = NULL;
  CpMesh *mesh = connect_mesh (&data->config, data->context, cancellable, &error);

  if (mesh != NULL)
    g_task_return_pointer (task, mesh, g_object_unref);
  else
    g_task_return_error (task, error);
}

/**
 * cp_mesh_connect_async:
 * @environment: (array zero-terminated=1) (nullable): `NAME=VALUE`
 *   strings to read the settings from, or %NULL for this process's
 *   environment
 * @cancellable: (nullable): a #GCancellable to give up waiting for the
 *   other ranks
 * @callback: called in the thread-default main context when done
 * @user_data: data for @callback
 *
 * Joins a multi-process mesh in a worker thread, like
 * [ctor@Cp.Mesh.new_from_env], so that main-loop programs (gjs, GTK) keep
 * running while the ranks meet. The settings are read from @environment,
 * which lets a program give explicit values by building an environment of
 * its own (`RANK=1`, `WORLD_SIZE=2`, `MASTER_PORT=…`).
 * [signal@Cp.Mesh::rank-lost] is emitted in the thread-default main
 * context of the calling thread.
 *
 * Since: 1.0
 */
void
cp_mesh_connect_async (const char * const  *environment,
                       GCancellable        *cancellable,
                       GAsyncReadyCallback  callback,
                       gpointer             user_data)
{
  g_autoptr(GTask) task = NULL;
  ConnectData *data = g_new0 (ConnectData, 1);
  GError *error = NULL;

  g_return_if_fail (cancellable == NULL || G_IS_CANCELLABLE (cancellable));

  task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, cp_mesh_connect_async);
  g_task_set_name (task, "[libcpmesh] connect");
  data->context = g_main_context_ref_thread_default ();
  if (!_cp_mesh_config_init_from_environ (&data->config, environment, &error))
    {
      connect_data_free (data);
      g_task_return_error (task, error);
      return;
    }
  g_task_set_task_data (task, data, (GDestroyNotify) connect_data_free);
  g_task_run_in_thread (task, connect_thread);
}

/**
 * cp_mesh_connect_finish:
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [func@Cp.Mesh.connect_async].
 *
 * Returns: (transfer full): this rank's mesh, or %NULL with the errors of
 *   [ctor@Cp.Mesh.new_from_env], or %G_IO_ERROR_CANCELLED
 *
 * Since: 1.0
 */
CpMesh *
cp_mesh_connect_finish (GAsyncResult  *result,
                        GError       **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), NULL);
  g_return_val_if_fail (g_task_get_source_tag (G_TASK (result)) == cp_mesh_connect_async, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return g_task_propagate_pointer (G_TASK (result), error);
}
