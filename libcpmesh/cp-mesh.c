/* cp-mesh.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-enum-types.h"
#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-mesh-private.h"
#include "cp-memory-private.h"
#include "cp-task-private.h"
#include "cp-tensor-private.h"

/**
 * CpMesh:
 *
 * A group of ranks arranged over named dimensions — for example
 * `dp × cp × tp` — and the transport that moves tensors between them.
 *
 * Each rank holds its own `CpMesh`. [func@Cp.Mesh.new_local_group] makes one
 * mesh per rank for ranks that are threads of one process;
 * [ctor@Cp.Mesh.new_from_env], [ctor@Cp.Mesh.new_ucx] and
 * [func@Cp.Mesh.connect_async] join ranks that are processes, on one host
 * or many, over UCX. Ranks are numbered row-major over the
 * dimensions, the last dimension varying fastest, and
 * [method@Cp.Mesh.get_submesh] gives the 1-D mesh of the ranks that differ
 * only along one dimension, such as the context-parallel group.
 *
 * Collectives block until every rank of the mesh has called them, and at
 * most [property@Cp.Mesh:timeout-ms]: a rank that never arrives makes the
 * others fail with %CP_MESH_ERROR_TIMED_OUT, never hang. Ranks compare what
 * they were asked to do before any byte moves, so shapes, dtypes or
 * operations that disagree are an error on every rank rather than
 * corrupted memory. A multi-process mesh also fails, within the timeout,
 * with %CP_MESH_ERROR_PEER_LOST when a peer process dies or its link is
 * cut, and emits [signal@Cp.Mesh::rank-lost].
 *
 * A failure — a timeout, a lost peer, a message cut short — breaks the
 * mesh and every submesh of it, on every rank: every later call of every
 * rank fails at once with the first failure's code and a message naming
 * it ("mesh broken: rank 1 timed out in all_gather #12: …"). Create a new
 * mesh to go on. Ranks that are processes may disagree about the one call
 * during which a peer stalled; [Meshes](mesh.html) tells how.
 *
 * A mesh is used by one thread at a time — normally the thread of its
 * rank. Its properties never change apart from the timeout. Every call
 * that waits on other ranks has an `_async`/`_finish` pair that runs it on
 * a worker thread, so that one main loop can drive every in-process rank;
 * cancelling one fails every rank of the call with
 * %CP_MESH_ERROR_CANCELLED and breaks the mesh ([Threading](threading.html)).
 *
 * Since: 1.0
 */
struct _CpMesh
{
  GObject parent_instance;

  CpComm *comm;          /* the host communicator: agreement runs here */
  CpComm *routes[CP_MESH_N_ROUTES]; /* per memory kind: who moves it, or NULL */
  GPtrArray *device_comms; /* CpComm*: communicators besides the host one */
  char *label;
  char **dim_names;
  int *dim_sizes;
  gsize n_dims;
  int *coordinates;
  guint timeout_ms;
  int local_rank;
  GHashTable *submeshes; /* dim name → CpMesh */
  GSource *poll_source;  /* set while watching a transport's peers */
};

G_DEFINE_FINAL_TYPE (CpMesh, cp_mesh, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_RANK,
  PROP_WORLD_SIZE,
  PROP_BACKEND,
  PROP_DIM_NAMES,
  PROP_DIM_SIZES,
  PROP_TIMEOUT_MS,
  PROP_LOCAL_RANK,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

enum {
  RANK_LOST,
  N_SIGNALS
};

static guint signals[N_SIGNALS];

static void
cp_mesh_finalize (GObject *object)
{
  CpMesh *self = (CpMesh *) object;

  if (self->poll_source != NULL)
    g_source_destroy (self->poll_source);
  g_clear_pointer (&self->poll_source, g_source_unref);
  g_clear_pointer (&self->submeshes, g_hash_table_unref);
  g_clear_pointer (&self->device_comms, g_ptr_array_unref);
  g_clear_pointer (&self->comm, _cp_comm_free);
  g_clear_pointer (&self->label, g_free);
  g_clear_pointer (&self->dim_names, g_strfreev);
  g_clear_pointer (&self->dim_sizes, g_free);
  g_clear_pointer (&self->coordinates, g_free);

  G_OBJECT_CLASS (cp_mesh_parent_class)->finalize (object);
}

static GVariant *
dim_sizes_variant (CpMesh *self)
{
  g_autofree gint32 *sizes = g_new (gint32, MAX (self->n_dims, 1));

  for (gsize i = 0; i < self->n_dims; i++)
    sizes[i] = self->dim_sizes[i];
  return g_variant_new_fixed_array (G_VARIANT_TYPE_INT32, sizes, self->n_dims, sizeof (gint32));
}

static void
cp_mesh_get_property (GObject    *object,
                      guint       prop_id,
                      GValue     *value,
                      GParamSpec *pspec)
{
  CpMesh *self = CP_MESH (object);

  switch (prop_id)
    {
    case PROP_RANK:
      g_value_set_int (value, cp_mesh_get_rank (self));
      break;
    case PROP_WORLD_SIZE:
      g_value_set_int (value, cp_mesh_get_world_size (self));
      break;
    case PROP_BACKEND:
      g_value_set_string (value, cp_mesh_get_backend (self));
      break;
    case PROP_DIM_NAMES:
      g_value_set_boxed (value, self->dim_names);
      break;
    case PROP_DIM_SIZES:
      g_value_set_variant (value, dim_sizes_variant (self));
      break;
    case PROP_TIMEOUT_MS:
      g_value_set_uint (value, self->timeout_ms);
      break;
    case PROP_LOCAL_RANK:
      g_value_set_int (value, self->local_rank);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_mesh_set_property (GObject      *object,
                      guint         prop_id,
                      const GValue *value,
                      GParamSpec   *pspec)
{
  CpMesh *self = CP_MESH (object);

  switch (prop_id)
    {
    case PROP_TIMEOUT_MS:
      cp_mesh_set_timeout_ms (self, g_value_get_uint (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_mesh_class_init (CpMeshClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = cp_mesh_finalize;
  object_class->get_property = cp_mesh_get_property;
  object_class->set_property = cp_mesh_set_property;

  /**
   * CpMesh:rank:
   *
   * The rank of this member, in `[0, world-size)`.
   *
   * Since: 1.0
   */
  properties[PROP_RANK] =
    g_param_spec_int ("rank", NULL, NULL, 0, G_MAXINT, 0,
                      G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:world-size:
   *
   * The number of ranks: the product of the dimension sizes.
   *
   * Since: 1.0
   */
  properties[PROP_WORLD_SIZE] =
    g_param_spec_int ("world-size", NULL, NULL, 1, G_MAXINT, 1,
                      G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:backend:
   *
   * The transport: `"local"` for ranks that are threads of one process,
   * `"shm"` for processes of one host, `"ucx"` for processes on one host
   * or several: a mesh whose ranks span hosts runs on `"ucx"` as a
   * whole.
   *
   * Since: 1.0
   */
  properties[PROP_BACKEND] =
    g_param_spec_string ("backend", NULL, NULL, NULL,
                         G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:dim-names:
   *
   * The names of the dimensions, outermost first.
   *
   * Since: 1.0
   */
  properties[PROP_DIM_NAMES] =
    g_param_spec_boxed ("dim-names", NULL, NULL, G_TYPE_STRV,
                        G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:dim-sizes:
   *
   * The sizes of the dimensions, as a variant of type `ai`.
   *
   * Since: 1.0
   */
  properties[PROP_DIM_SIZES] =
    g_param_spec_variant ("dim-sizes", NULL, NULL, G_VARIANT_TYPE ("ai"), NULL,
                          G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:timeout-ms:
   *
   * How long any blocking call waits for the other ranks, in milliseconds.
   *
   * Since: 1.0
   */
  properties[PROP_TIMEOUT_MS] =
    g_param_spec_uint ("timeout-ms", NULL, NULL, 1, G_MAXINT, CP_MESH_DEFAULT_TIMEOUT_MS,
                       G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * CpMesh:local-rank:
   *
   * This rank's index among the ranks on its host, as the launcher
   * reported it (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
   * `SLURM_LOCALID`), or -1 when it did not. For ranks that are threads
   * of one process, the rank.
   *
   * Since: 1.0
   */
  properties[PROP_LOCAL_RANK] =
    g_param_spec_int ("local-rank", NULL, NULL, -1, G_MAXINT, -1,
                      G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);

  /**
   * CpMesh::rank-lost:
   * @self: the mesh
   * @rank: the rank that was lost, a rank of @self
   * @reason: what the transport reported
   *
   * Emitted when the transport loses the process of another rank: it
   * died, its link was cut, or it closed its mesh. It is emitted in the
   * thread-default main context of the thread that created the mesh,
   * once per lost rank, and only by multi-process meshes made with
   * [ctor@Cp.Mesh.new_from_env], [ctor@Cp.Mesh.new_ucx] or
   * [func@Cp.Mesh.connect_async] (not by their submeshes). An idle mesh
   * notices losses while that main context runs; operations in progress
   * fail with %CP_MESH_ERROR_PEER_LOST either way.
   *
   * Since: 1.0
   */
  signals[RANK_LOST] =
    g_signal_new ("rank-lost", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST, 0, NULL, NULL, NULL,
                  G_TYPE_NONE, 2, G_TYPE_INT, G_TYPE_STRING);
}

static void
cp_mesh_init (CpMesh *self)
{
  self->timeout_ms = CP_MESH_DEFAULT_TIMEOUT_MS;
  self->local_rank = -1;
  self->submeshes = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_object_unref);
  self->device_comms = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_comm_free);
}

/* Routes every memory kind @comm's transport moves to @comm. */
static void
route_kinds (CpMesh *self,
             CpComm *comm)
{
  guint kinds = _cp_transport_get_device_kinds (comm->transport);

  for (guint k = 0; k < CP_MESH_N_ROUTES; k++)
    if (kinds & CP_TRANSPORT_DEVICE (k))
      self->routes[k] = comm;
}

gboolean
_cp_mesh_add_transport (CpMesh       *self,
                        CpTransport  *transport,
                        GError      **error)
{
  CpComm *comm = _cp_transport_comm_new (transport, self->label, self->comm->members,
                                         self->comm->size, self->comm->index, error);

  if (comm == NULL)
    return FALSE;
  g_ptr_array_add (self->device_comms, comm);
  route_kinds (self, comm);
  return TRUE;
}

void
_cp_mesh_foreach_transport (CpMesh              *self,
                            CpMeshTransportFunc  func,
                            gpointer             user_data)
{
  func (self->comm->transport, user_data);
  for (guint i = 0; i < self->device_comms->len; i++)
    func (((CpComm *) g_ptr_array_index (self->device_comms, i))->transport, user_data);
}

static void
compute_coordinates (CpMesh *self)
{
  int rest = self->comm->index;

  self->coordinates = g_new (int, self->n_dims);
  for (gsize i = self->n_dims; i-- > 0;)
    {
      self->coordinates[i] = rest % self->dim_sizes[i];
      rest /= self->dim_sizes[i];
    }
}

CpMesh *
_cp_mesh_new (CpTransport         *transport,
              const char          *label,
              const int           *members,
              int                  n_members,
              int                  my_index,
              const char * const  *dim_names,
              const int           *dim_sizes,
              gsize                n_dims,
              GError             **error)
{
  g_autoptr(CpMesh) self = NULL;
  int world_size;

  if (!_cp_mesh_config_check_dims (dim_names, dim_sizes, n_dims, &world_size, error))
    return NULL;
  g_assert (world_size == n_members);

  self = g_object_new (CP_TYPE_MESH, NULL);
  self->comm = _cp_transport_comm_new (transport, label, members, n_members, my_index, error);
  if (self->comm == NULL)
    return NULL;
  route_kinds (self, self->comm);
  self->label = g_strdup (label);
  self->dim_names = g_strdupv ((char **) dim_names);
  self->dim_sizes = g_memdup2 (dim_sizes, n_dims * sizeof (int));
  self->n_dims = n_dims;
  compute_coordinates (self);
  return g_steal_pointer (&self);
}

/**
 * cp_mesh_new_local_group:
 * @dim_names: (array zero-terminated=1): the dimension names, outermost
 *   first, for example `{"dp", "cp", NULL}`
 * @dim_sizes: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @error: return location for a #GError
 *
 * Creates a mesh whose ranks are threads of this process: one `CpMesh` per
 * rank, in rank order. Hand each to its own thread; collectives copy
 * straight between the ranks' buffers.
 *
 * Returns: (transfer full) (element-type CpMesh): the meshes, one per rank
 *   in rank order (free with `g_list_free_full (list, g_object_unref)`),
 *   or %NULL with %CP_MESH_ERROR_INVALID_TOPOLOGY
 *
 * Since: 1.0
 */
GList *
cp_mesh_new_local_group (const char * const  *dim_names,
                         const int           *dim_sizes,
                         gsize                n_dims,
                         GError             **error)
{
  GList *meshes = NULL;
  g_autofree int *members = NULL;
  CpTransport **transports;
  int world_size;

  g_return_val_if_fail (dim_sizes != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_mesh_config_check_dims (dim_names, dim_sizes, n_dims, &world_size, error))
    return NULL;

  members = g_new (int, world_size);
  for (int r = 0; r < world_size; r++)
    members[r] = r;
  transports = _cp_transport_local_new_group (world_size);
  for (int r = world_size - 1; r >= 0; r--)
    {
      CpMesh *mesh = _cp_mesh_new (transports[r], "world", members, world_size, r, dim_names,
                                   dim_sizes, n_dims, NULL);

      mesh->local_rank = r;
      meshes = g_list_prepend (meshes, mesh);
      _cp_transport_unref (transports[r]);
    }
  g_free (transports);
  return meshes;
}

/**
 * cp_mesh_get_rank:
 * @self: a mesh
 *
 * Gets the rank of this member of the mesh.
 *
 * Returns: the rank, in `[0, world-size)`
 *
 * Since: 1.0
 */
int
cp_mesh_get_rank (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), 0);

  return self->comm->index;
}

/**
 * cp_mesh_get_world_size:
 * @self: a mesh
 *
 * Gets the number of ranks of the mesh.
 *
 * Returns: the number of ranks
 *
 * Since: 1.0
 */
int
cp_mesh_get_world_size (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), 1);

  return self->comm->size;
}

/**
 * cp_mesh_get_backend:
 * @self: a mesh
 *
 * Gets the name of the transport the mesh runs on.
 *
 * Returns: (transfer none): the backend name, such as `"local"`
 *
 * Since: 1.0
 */
const char *
cp_mesh_get_backend (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), NULL);

  return _cp_transport_get_name (self->comm->transport);
}

/**
 * cp_mesh_get_dim_names:
 * @self: a mesh
 *
 * Gets the names of the dimensions.
 *
 * Returns: (transfer none) (array zero-terminated=1): the names
 *
 * Since: 1.0
 */
const char * const *
cp_mesh_get_dim_names (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), NULL);

  return (const char * const *) self->dim_names;
}

/**
 * cp_mesh_dup_dim_names:
 * @self: a mesh
 *
 * Copies the names of the dimensions, for bindings whose string arrays
 * are not const (Vala); C reads them with [method@Cp.Mesh.get_dim_names].
 *
 * Returns: (transfer full) (array zero-terminated=1): the names; free with
 *   g_strfreev()
 *
 * Since: 1.0
 */
char **
cp_mesh_dup_dim_names (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), NULL);

  return g_strdupv (self->dim_names);
}

/**
 * cp_mesh_get_dim_sizes:
 * @self: a mesh
 * @n_dims: (out) (optional): the number of dimensions
 *
 * Gets the sizes of the dimensions.
 *
 * Returns: (transfer none) (array length=n_dims): the sizes
 *
 * Since: 1.0
 */
const int *
cp_mesh_get_dim_sizes (CpMesh *self,
                       gsize  *n_dims)
{
  g_return_val_if_fail (CP_IS_MESH (self), NULL);

  if (n_dims != NULL)
    *n_dims = self->n_dims;
  return self->dim_sizes;
}

static int
find_dim (CpMesh     *self,
          const char *dim_name)
{
  for (gsize i = 0; i < self->n_dims; i++)
    if (g_str_equal (self->dim_names[i], dim_name))
      return (int) i;
  return -1;
}

/**
 * cp_mesh_get_dim_size:
 * @self: a mesh
 * @dim_name: a dimension name
 *
 * Gets the size of one dimension.
 *
 * Returns: the size, or -1 when the mesh has no such dimension
 *
 * Since: 1.0
 */
int
cp_mesh_get_dim_size (CpMesh     *self,
                      const char *dim_name)
{
  int d;

  g_return_val_if_fail (CP_IS_MESH (self), -1);
  g_return_val_if_fail (dim_name != NULL, -1);

  d = find_dim (self, dim_name);
  return d < 0 ? -1 : self->dim_sizes[d];
}

/**
 * cp_mesh_get_coordinate:
 * @self: a mesh
 * @dim_name: a dimension name
 *
 * Gets this rank's index along one dimension: its rank in the submesh of
 * that dimension.
 *
 * Returns: the coordinate, or -1 when the mesh has no such dimension
 *
 * Since: 1.0
 */
int
cp_mesh_get_coordinate (CpMesh     *self,
                        const char *dim_name)
{
  int d;

  g_return_val_if_fail (CP_IS_MESH (self), -1);
  g_return_val_if_fail (dim_name != NULL, -1);

  d = find_dim (self, dim_name);
  return d < 0 ? -1 : self->coordinates[d];
}

/**
 * cp_mesh_get_local_rank:
 * @self: a mesh
 *
 * Gets [property@Cp.Mesh:local-rank]: this rank's index among the ranks on
 * its host, for choosing a device.
 *
 * Returns: the local rank, or -1 when the launcher did not report it
 *
 * Since: 1.0
 */
int
cp_mesh_get_local_rank (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), -1);

  return self->local_rank;
}

void
_cp_mesh_set_local_rank (CpMesh *self,
                         int     local_rank)
{
  self->local_rank = local_rank;
}

/* The link between a transport's callbacks, on any thread, and the mesh
 * in its main context.  The mesh may be gone by the time they run. */
typedef struct
{
  GWeakRef mesh;
  GMainContext *context;
} PeerWatch;

typedef struct
{
  PeerWatch *watch;
  int rank;
  char *reason;
} RankLost;

static void
peer_watch_clear (PeerWatch *watch)
{
  g_weak_ref_clear (&watch->mesh);
  g_main_context_unref (watch->context);
}

static void
rank_lost_release_watch (PeerWatch *watch)
{
  g_atomic_rc_box_release_full (watch, (GDestroyNotify) peer_watch_clear);
}

static void
rank_lost_free (RankLost *lost)
{
  rank_lost_release_watch (lost->watch);
  g_free (lost->reason);
  g_free (lost);
}

static gboolean
emit_rank_lost (gpointer user_data)
{
  RankLost *lost = user_data;
  g_autoptr(CpMesh) self = g_weak_ref_get (&lost->watch->mesh);

  if (self != NULL)
    g_signal_emit (self, signals[RANK_LOST], 0, lost->rank, lost->reason);
  return G_SOURCE_REMOVE;
}

/* Never emits from here: the transport may hold its locks, and a
 * handler may well use the mesh. */
static void
on_peer_lost (int          rank,
              const char  *reason,
              gpointer     user_data)
{
  PeerWatch *watch = user_data;
  RankLost *lost = g_new0 (RankLost, 1);
  GSource *source = g_idle_source_new ();

  lost->watch = g_atomic_rc_box_acquire (watch);
  lost->rank = rank;
  lost->reason = g_strdup (reason);
  g_source_set_callback (source, emit_rank_lost, lost, (GDestroyNotify) rank_lost_free);
  g_source_set_static_name (source, "[libcpmesh] rank-lost");
  g_source_attach (source, watch->context);
  g_source_unref (source);
}

static gboolean
poll_transport (gpointer user_data)
{
  CpTransport *transport = user_data;

  _cp_transport_poll (transport);
  return G_SOURCE_CONTINUE;
}

void
_cp_mesh_watch_peers (CpMesh       *self,
                      GMainContext *context)
{
  CpTransport *transport = self->comm->transport;
  PeerWatch *watch = g_atomic_rc_box_new0 (PeerWatch);

  g_weak_ref_init (&watch->mesh, self);
  watch->context = g_main_context_ref (context);
  _cp_transport_set_peer_lost_func (transport, on_peer_lost, watch,
                                    (GDestroyNotify) rank_lost_release_watch);
  if (!_cp_transport_can_poll (transport))
    return;
  self->poll_source = g_timeout_source_new (CP_MESH_POLL_INTERVAL_MS);
  g_source_set_callback (self->poll_source, poll_transport, _cp_transport_ref (transport),
                         (GDestroyNotify) _cp_transport_unref);
  g_source_set_static_name (self->poll_source, "[libcpmesh] poll peers");
  g_source_attach (self->poll_source, context);
}

/**
 * cp_mesh_get_timeout_ms:
 * @self: a mesh
 *
 * Gets [property@Cp.Mesh:timeout-ms].
 *
 * Returns: the timeout in milliseconds
 *
 * Since: 1.0
 */
guint
cp_mesh_get_timeout_ms (CpMesh *self)
{
  g_return_val_if_fail (CP_IS_MESH (self), 0);

  return self->timeout_ms;
}

/**
 * cp_mesh_set_timeout_ms:
 * @self: a mesh
 * @timeout_ms: the timeout in milliseconds, in `[1, G_MAXINT]`
 *
 * Sets how long blocking calls wait for the other ranks. Submeshes made
 * afterwards inherit it.
 *
 * There is no timeout of 0: neither "wait forever" (a mesh never hangs)
 * nor "do not wait" (ranks always wait for each other) would be what
 * every caller meant. A value out of range is a programmer error: it is
 * reported as a critical naming the value, and the mesh keeps the
 * timeout it had.
 *
 * Since: 1.0
 */
void
cp_mesh_set_timeout_ms (CpMesh *self,
                        guint   timeout_ms)
{
  g_return_if_fail (CP_IS_MESH (self));

  if (timeout_ms < 1 || timeout_ms > G_MAXINT)
    {
      g_critical ("cp_mesh_set_timeout_ms: a timeout of %u ms is out of [1, %d]; the mesh keeps its "
                  "timeout of %u ms", timeout_ms, G_MAXINT, self->timeout_ms);
      return;
    }

  if (self->timeout_ms == timeout_ms)
    return;
  self->timeout_ms = timeout_ms;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_TIMEOUT_MS]);
}

/* The transport ranks of the members that share every coordinate with
 * this rank except along dimension @d, in order along @d. */
static int *
submesh_members (CpMesh *self,
                 int     d)
{
  int *members = g_new (int, self->dim_sizes[d]);
  int stride = 1;
  int base;

  for (gsize i = (gsize) d + 1; i < self->n_dims; i++)
    stride *= self->dim_sizes[i];
  base = self->comm->index - self->coordinates[d] * stride;
  for (int k = 0; k < self->dim_sizes[d]; k++)
    members[k] = self->comm->members[base + k * stride];
  return members;
}

static CpMesh *
create_submesh (CpMesh      *self,
                int          d,
                GError     **error)
{
  g_autofree int *members = submesh_members (self, d);
  g_autofree char *label = g_strdup_printf ("%s/%s", self->label, self->dim_names[d]);
  const char *names[] = { self->dim_names[d], NULL };
  CpMesh *submesh;

  submesh = _cp_mesh_new (self->comm->transport, label, members, self->dim_sizes[d],
                          self->coordinates[d], names, &self->dim_sizes[d], 1, error);
  if (submesh == NULL)
    return NULL;
  submesh->timeout_ms = self->timeout_ms;
  submesh->local_rank = self->local_rank;
  for (guint i = 0; i < self->device_comms->len; i++)
    {
      CpComm *comm = g_ptr_array_index (self->device_comms, i);

      if (!_cp_mesh_add_transport (submesh, comm->transport, error))
        {
          g_object_unref (submesh);
          return NULL;
        }
    }
  return submesh;
}

/**
 * cp_mesh_get_submesh:
 * @self: a mesh
 * @dim_name: the dimension to keep, for example `"cp"`
 * @error: return location for a #GError
 *
 * Gets the 1-D mesh of the ranks that share this rank's coordinates in
 * every other dimension: for a `dp × cp` mesh, the context-parallel group
 * this rank belongs to. Its rank is this rank's coordinate along
 * @dim_name. A 1-D mesh asked for its own dimension returns itself.
 *
 * Returns: (transfer none): the submesh, owned by @self, or %NULL with
 *   %CP_MESH_ERROR_INVALID_TOPOLOGY when there is no such dimension
 *
 * Since: 1.0
 */
CpMesh *
cp_mesh_get_submesh (CpMesh      *self,
                     const char  *dim_name,
                     GError     **error)
{
  CpMesh *submesh;
  int d;

  g_return_val_if_fail (CP_IS_MESH (self), NULL);
  g_return_val_if_fail (dim_name != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  d = find_dim (self, dim_name);
  if (d < 0)
    {
      g_autofree char *names = g_strjoinv (", ", self->dim_names);

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "the mesh has no dimension \"%s\"; it has %s", dim_name, names);
      return NULL;
    }
  if (self->n_dims == 1)
    return self;
  submesh = g_hash_table_lookup (self->submeshes, dim_name);
  if (submesh == NULL)
    {
      submesh = create_submesh (self, d, error);
      if (submesh == NULL)
        return NULL;
      g_hash_table_insert (self->submeshes, g_strdup (dim_name), submesh);
    }
  return submesh;
}

CpComm *
_cp_mesh_get_comm (CpMesh *self)
{
  return self->comm;
}

gint64
_cp_mesh_deadline (CpMesh *self)
{
  return g_get_monotonic_time () + (gint64) self->timeout_ms * G_TIME_SPAN_MILLISECOND;
}

GCancellable *
_cp_mesh_cancellable (CpMesh *self)
{
  return _cp_task_get_cancellable ();
}

static void
describe_operand (CpCollective *coll,
                  CpCollKind    kind,
                  CpTensor     *tensor)
{
  const gint64 *shape = tensor ? cp_tensor_get_shape (tensor, &coll->n_dims) : NULL;

  memset (coll, 0, sizeof *coll);
  coll->kind = kind;
  if (tensor == NULL)
    return;
  coll->dtype = cp_tensor_get_dtype (tensor);
  coll->n_dims = cp_tensor_get_n_dims (tensor);
  memcpy (coll->shape, shape, coll->n_dims * sizeof (gint64));
  coll->device = cp_tensor_get_device (tensor);
}

/* Runs @coll on the host communicator, the rendezvous included even when
 * this rank's own arguments are bad (@invalid, taken), so that every rank
 * fails with the same error instead of timing out waiting for this one. */
static gboolean
run_on_host (CpMesh        *self,
             CpCollective  *coll,
             GError        *invalid,
             GError       **error)
{
  gboolean ok;

  coll->invalid = invalid;
  ok = _cp_comm_collective (self->comm, coll, _cp_mesh_deadline (self), _cp_mesh_cancellable (self),
                            error);
  g_clear_error (&coll->invalid);
  return ok;
}

/* A descriptor as numbers: kind, dtype, dims, shape, dim, root, op,
 * device. */
#define DESCRIPTOR_WORDS (7 + CP_TENSOR_MAX_DIMS)

static void
pack_descriptor (const CpCollective *coll,
                 gint64             *words)
{
  memset (words, 0, DESCRIPTOR_WORDS * sizeof (gint64));
  words[0] = coll->kind;
  words[1] = coll->dtype;
  words[2] = coll->n_dims;
  memcpy (words + 3, coll->shape, coll->n_dims * sizeof (gint64));
  words[3 + CP_TENSOR_MAX_DIMS] = coll->dim;
  words[4 + CP_TENSOR_MAX_DIMS] = coll->root;
  words[5 + CP_TENSOR_MAX_DIMS] = coll->op;
  words[6 + CP_TENSOR_MAX_DIMS] = coll->device;
}

static void
unpack_descriptor (const gint64 *words,
                   CpCollective *coll)
{
  memset (coll, 0, sizeof *coll);
  coll->kind = (CpCollKind) words[0];
  coll->dtype = (CpDType) words[1];
  coll->n_dims = (guint) MIN (words[2], CP_TENSOR_MAX_DIMS);
  memcpy (coll->shape, words + 3, coll->n_dims * sizeof (gint64));
  coll->dim = (int) words[3 + CP_TENSOR_MAX_DIMS];
  coll->root = (int) words[4 + CP_TENSOR_MAX_DIMS];
  coll->op = (CpReduceOp) words[5 + CP_TENSOR_MAX_DIMS];
  coll->device = (CpDeviceKind) words[6 + CP_TENSOR_MAX_DIMS];
}

/* Every rank's descriptor of @coll, exchanged over the host communicator
 * and compared, before a device communicator moves any byte: a device
 * transport (NCCL) cannot tell ranks that disagree from ranks that
 * agree. */
static gboolean
agree_on_host (CpMesh        *self,
               CpCollective  *coll,
               GError        *invalid,
               GError       **error)
{
  int n = self->comm->size;
  gint64 mine[DESCRIPTOR_WORDS];
  g_autofree gint64 *table = g_new0 (gint64, (gsize) n * DESCRIPTOR_WORDS);
  g_autofree CpCollective *descs = g_new0 (CpCollective, n);
  g_autofree const CpCollective **order = g_new0 (const CpCollective *, n);
  CpCollective gather = { .kind = CP_COLL_ALL_GATHER, .dtype = CP_DTYPE_INT64, .n_dims = 1,
                          .shape = { DESCRIPTOR_WORDS }, .outer = 1, .block = sizeof mine };
  gboolean ok;

  pack_descriptor (coll, mine);
  _cp_region_init_host (&gather.send, mine, sizeof mine);
  _cp_region_init_host (&gather.recv, table, (gsize) n * sizeof mine);
  ok = run_on_host (self, &gather, invalid, error);
  _cp_collective_clear (&gather);
  if (!ok)
    return FALSE;
  for (int r = 0; r < n; r++)
    {
      unpack_descriptor (table + (gsize) r * DESCRIPTOR_WORDS, &descs[r]);
      order[r] = &descs[r];
    }
  return _cp_collective_check_agreement (order, n, self->comm->transport->rank, error);
}

/* The communicator that moves memory of kind @device, or NULL. */
static CpComm *
route (CpMesh       *self,
       CpDeviceKind  device)
{
  return (guint) device < CP_MESH_N_ROUTES ? self->routes[device] : NULL;
}

/* Runs @coll over the communicator that moves its memory.  A mesh with
 * communicators besides the host one agrees on the host first; one that
 * has only the host communicator agrees and moves in one call, as its
 * backend compares descriptors itself. */
static gboolean
run_routed (CpMesh        *self,
            CpCollective  *coll,
            GError        *invalid,
            GError       **error)
{
  if (self->device_comms->len == 0)
    return run_on_host (self, coll, invalid, error);
  if (!agree_on_host (self, coll, invalid, error))
    return FALSE;
  return _cp_comm_collective (route (self, coll->device), coll, _cp_mesh_deadline (self),
                              _cp_mesh_cancellable (self), error);
}

/* The bytes @coll sends and receives, by the geometry CpCollective
 * documents; @in_place when it also reads what it receives into. */
static void
staged_sizes (CpMesh             *self,
              const CpCollective *coll,
              gsize              *send_bytes,
              gsize              *recv_bytes,
              gboolean           *in_place)
{
  gsize all = coll->outer * (gsize) self->comm->size * coll->block;

  *send_bytes = *recv_bytes = 0;
  *in_place = FALSE;
  switch (coll->kind)
    {
    case CP_COLL_ALL_GATHER:
      *send_bytes = coll->outer * coll->block;
      *recv_bytes = all;
      break;
    case CP_COLL_ALL_TO_ALL:
      *send_bytes = *recv_bytes = all;
      break;
    case CP_COLL_ALL_REDUCE:
    case CP_COLL_BROADCAST:
      *recv_bytes = coll->count * cp_dtype_get_size (coll->dtype);
      *in_place = TRUE;
      break;
    case CP_COLL_BARRIER:
    default:
      break;
    }
}

/* Memory no communicator moves but the memory interface reaches (test
 * memory; a device without a transport of its own) crosses to the host
 * before the host communicator's collective and back after it. */
static gboolean
run_staged (CpMesh        *self,
            CpCollective  *coll,
            GError        *invalid,
            GError       **error)
{
  CpCollective staged = *coll; /* borrows @coll's regions, replaced below */
  gsize send_bytes, recv_bytes;
  gboolean in_place, ok;
  g_autofree guint8 *send = NULL;
  g_autofree guint8 *recv = NULL;
  GError *failed = NULL;

  staged.device = CP_DEVICE_KIND_HOST;
  /* Bad arguments move nothing: the rendezvous only reports them. */
  if (invalid != NULL)
    return run_routed (self, &staged, invalid, error);
  staged_sizes (self, coll, &send_bytes, &recv_bytes, &in_place);
  staged.send = staged.recv = CP_REGION_NONE;
  if (_cp_region_is_set (&coll->send))
    {
      send = g_malloc (MAX (send_bytes, 1));
      _cp_region_init_host (&staged.send, send, send_bytes);
      _cp_memory_download_region (send, &coll->send, 0, send_bytes, &failed);
    }
  if (_cp_region_is_set (&coll->recv))
    {
      recv = g_malloc (MAX (recv_bytes, 1));
      _cp_region_init_host (&staged.recv, recv, recv_bytes);
      if (in_place && failed == NULL)
        _cp_memory_download_region (recv, &coll->recv, 0, recv_bytes, &failed);
    }
  /* A download that failed fails the collective on every rank, as bad
   * arguments do; an upload that fails after it is this rank's alone. */
  ok = run_routed (self, &staged, failed, error);
  _cp_collective_clear (&staged);
  if (ok && _cp_region_is_set (&coll->recv))
    ok = _cp_memory_upload_region (&coll->recv, 0, recv, recv_bytes, error);
  return ok;
}

static gboolean
run_collective (CpMesh        *self,
                CpCollective  *coll,
                GError        *invalid,
                GError       **error)
{
  if (route (self, coll->device) == NULL && _cp_memory_ops_for_kind (coll->device) != NULL)
    return run_staged (self, coll, invalid, error);
  return run_routed (self, coll, invalid, error);
}

/* Runs @coll, then drops the references its regions hold. */
static gboolean
run_and_clear (CpMesh        *self,
               CpCollective  *coll,
               GError        *invalid,
               GError       **error)
{
  gboolean ok = run_collective (self, coll, invalid, error);

  _cp_collective_clear (coll);
  return ok;
}


/* The memory kinds a communicator of the mesh moves, as a set for
 * _cp_tensor_require_device(). */
static guint
routed_kinds (CpMesh *self)
{
  guint kinds = 0;

  for (guint k = 0; k < CP_MESH_N_ROUTES; k++)
    if (self->routes[k] != NULL)
      kinds |= 1u << k;
  return kinds;
}

/* Collectives and messages take memory a communicator of the mesh moves,
 * and also memory none moves but the memory interface reaches: that
 * crosses through host copies (run_staged, host_stand_in). */
static gboolean
check_operand (CpMesh      *self,
               CpTensor    *tensor,
               const char  *what,
               const char  *label,
               GError     **error)
{
  return _cp_tensor_require_device (tensor, what, label,
                                    routed_kinds (self) | CP_DEVICE_KINDS_REACHABLE, error);
}

/* Fills the byte geometry of an all-gather along @dim. */
static void
plan_gather (CpCollective *coll,
             CpTensor     *tensor,
             guint         dim)
{
  gint64 length;
  gsize step;

  _cp_tensor_split_at (tensor, dim, &coll->outer, &length, &step);
  coll->dim = (int) dim;
  coll->block = (gsize) length * step;
}

/* The length of dimension @dim of @tensor once every rank's piece is
 * concatenated along it. */
static gboolean
gathered_length (CpMesh      *self,
                 CpTensor    *tensor,
                 guint        dim,
                 const char  *what,
                 gint64      *length,
                 GError     **error)
{
  gint64 local = cp_tensor_get_dim (tensor, (int) dim);

  if (local > G_MAXINT64 / self->comm->size)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "%s: dimension %u has length %" G_GINT64_FORMAT
                   ", too long to concatenate from %d ranks", what, dim, local, self->comm->size);
      return FALSE;
    }
  *length = local * self->comm->size;
  return TRUE;
}

/* @tensor's shape with dimension @dim gathered from every rank. */
static gboolean
gathered_shape (CpMesh    *self,
                CpTensor  *tensor,
                guint      dim,
                gint64    *shape,
                GError   **error)
{
  memcpy (shape, cp_tensor_get_shape (tensor, NULL), cp_tensor_get_n_dims (tensor) * sizeof (gint64));
  return gathered_length (self, tensor, dim, "all_gather", &shape[dim], error);
}

/* Fails every rank with this rank's @invalid (taken): the others learn of
 * it in the rendezvous of the all-gather they are making. */
static void
fail_gather_together (CpMesh    *self,
                      CpTensor  *tensor,
                      GError    *invalid,
                      GError   **error)
{
  CpCollective coll;

  describe_operand (&coll, CP_COLL_ALL_GATHER, tensor);
  run_collective (self, &coll, invalid, error);
}

static gboolean
check_gather_output (CpMesh     *self,
                     CpTensor   *tensor,
                     guint       dim,
                     CpTensor   *out,
                     GError    **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint n_dims = cp_tensor_get_n_dims (tensor);

  if (!gathered_shape (self, tensor, dim, shape, error))
    return FALSE;
  if (cp_tensor_get_dtype (out) != cp_tensor_get_dtype (tensor) ||
      cp_tensor_get_n_dims (out) != n_dims ||
      memcmp (cp_tensor_get_shape (out, NULL), shape, n_dims * sizeof (gint64)) != 0)
    {
      g_autofree char *have = cp_tensor_describe (out);
      g_autofree char *want = _cp_shape_to_string (shape, n_dims);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "all_gather: the output is %s, it must be %s%s",
                   have, cp_dtype_get_name (cp_tensor_get_dtype (tensor)), want);
      return FALSE;
    }
  /* One collective moves one kind of memory. */
  return _cp_tensor_require_device (out, "all_gather", "the output",
                                    1u << cp_tensor_get_device (tensor), error) &&
         _cp_tensor_require_writable (out, "all_gather", "the output", error);
}

static gboolean
gather_into (CpMesh    *self,
             CpTensor  *tensor,
             int        dim,
             CpTensor  *out,
             GError   **error)
{
  CpCollective coll;
  GError *invalid = NULL;
  guint d = 0;

  describe_operand (&coll, CP_COLL_ALL_GATHER, tensor);
  if (check_operand (self, tensor, "all_gather", "the tensor", &invalid) &&
      _cp_tensor_normalize_dim (tensor, "all_gather", dim, &d, &invalid) &&
      (out == NULL || check_gather_output (self, tensor, d, out, &invalid)))
    {
      plan_gather (&coll, tensor, d);
      _cp_tensor_get_region (tensor, &coll.send);
      if (out != NULL)
        _cp_tensor_get_region (out, &coll.recv);
    }
  return run_and_clear (self, &coll, invalid, error);
}

/* A result of @shape in @tensor's memory; in host memory when this build
 * cannot reach that, which the operand check then reports. */
static CpTensor *
result_like (CpTensor      *tensor,
             const gint64  *shape,
             GError       **error)
{
  CpDeviceKind device = cp_tensor_get_device (tensor);

  if (_cp_memory_ops_for_kind (device) == NULL)
    device = CP_DEVICE_KIND_HOST;
  return _cp_tensor_new_on_device (device, cp_tensor_get_dtype (tensor), shape,
                                   cp_tensor_get_n_dims (tensor), FALSE, error);
}

/**
 * cp_mesh_all_gather:
 * @self: a mesh
 * @tensor: this rank's piece; every rank passes the same dtype and shape
 * @dim: the dimension to concatenate along; negative values count from
 *   the last
 * @error: return location for a #GError
 *
 * Concatenates every rank's @tensor along @dim, in rank order.
 *
 * Returns: (transfer full): the concatenation, or %NULL with an error on
 *   every rank: %CP_TENSOR_ERROR_SHAPE or %CP_TENSOR_ERROR_DTYPE when
 *   ranks disagree, %CP_MESH_ERROR_TIMED_OUT when one never arrives
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_all_gather (CpMesh    *self,
                    CpTensor  *tensor,
                    int        dim,
                    GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  g_autoptr(CpTensor) out = NULL;
  GError *invalid = NULL;
  guint d = 0;

  g_return_val_if_fail (CP_IS_MESH (self), NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (_cp_tensor_normalize_dim (tensor, "all_gather", dim, &d, &invalid) &&
      gathered_shape (self, tensor, d, shape, &invalid))
    out = result_like (tensor, shape, &invalid);
  if (invalid != NULL)
    {
      fail_gather_together (self, tensor, invalid, error);
      return NULL;
    }
  if (!gather_into (self, tensor, dim, out, error))
    return NULL;
  return g_steal_pointer (&out);
}

/**
 * cp_mesh_all_gather_into:
 * @self: a mesh
 * @tensor: this rank's piece; every rank passes the same dtype and shape
 * @dim: the dimension to concatenate along
 * @out: the result: @tensor's shape with @dim multiplied by the world size
 * @error: return location for a #GError
 *
 * Like [method@Cp.Mesh.all_gather], writing into a tensor the caller
 * reuses.
 *
 * Returns: %TRUE on success, or %FALSE with an error on every rank;
 *   %CP_TENSOR_ERROR_READ_ONLY when a rank's @out is read-only
 *
 * Since: 1.0
 */
gboolean
cp_mesh_all_gather_into (CpMesh    *self,
                         CpTensor  *tensor,
                         int        dim,
                         CpTensor  *out,
                         GError   **error)
{
  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (out), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return gather_into (self, tensor, dim, out, error);
}

static gboolean
plan_all_to_all (CpMesh        *self,
                 CpCollective  *coll,
                 CpTensor      *tensor,
                 int            dim,
                 GError       **error)
{
  gint64 length;
  gsize step;
  guint d;

  if (!check_operand (self, tensor, "all_to_all", "the tensor", error) ||
      !_cp_tensor_normalize_dim (tensor, "all_to_all", dim, &d, error))
    return FALSE;
  _cp_tensor_split_at (tensor, d, &coll->outer, &length, &step);
  if (length % self->comm->size != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "all_to_all: dimension %u has length %" G_GINT64_FORMAT
                   ", not a multiple of the world size %d", d, length, self->comm->size);
      return FALSE;
    }
  coll->dim = (int) d;
  coll->block = (gsize) (length / self->comm->size) * step;
  return TRUE;
}

/* Runs the all-to-all of @tensor into @out, or only its rendezvous when
 * this rank's arguments are bad (@invalid, taken, or @out NULL). */
static gboolean
exchange_into (CpMesh    *self,
               CpTensor  *tensor,
               int        dim,
               CpTensor  *out,
               GError    *invalid,
               GError   **error)
{
  CpCollective coll;

  describe_operand (&coll, CP_COLL_ALL_TO_ALL, tensor);
  if (invalid == NULL && plan_all_to_all (self, &coll, tensor, dim, &invalid) && out != NULL)
    {
      _cp_tensor_get_region (tensor, &coll.send);
      _cp_tensor_get_region (out, &coll.recv);
    }
  return run_and_clear (self, &coll, invalid, error);
}

/**
 * cp_mesh_all_to_all:
 * @self: a mesh
 * @tensor: this rank's tensor; every rank passes the same dtype and shape
 * @dim: the dimension to split and concatenate along; its length must be
 *   a multiple of the world size
 * @error: return location for a #GError
 *
 * Splits @tensor along @dim into world-size equal pieces, sends piece j to
 * rank j, and concatenates the pieces received, in rank order, along @dim.
 * The result has the shape of @tensor.
 *
 * Returns: (transfer full): the exchanged tensor, or %NULL with an error
 *   on every rank
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_all_to_all (CpMesh    *self,
                    CpTensor  *tensor,
                    int        dim,
                    GError   **error)
{
  g_autoptr(CpTensor) out = NULL;
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_MESH (self), NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  out = result_like (tensor, cp_tensor_get_shape (tensor, NULL), &invalid);
  if (!exchange_into (self, tensor, dim, out, invalid, error))
    return NULL;
  return g_steal_pointer (&out);
}

/* Whether @out can take the pieces all_to_all brings to @tensor's rank:
 * @tensor's dtype and shape, in its memory, writable and apart from it,
 * which every rank still reads while pieces arrive. */
static gboolean
check_exchange_output (CpTensor  *tensor,
                       CpTensor  *out,
                       GError   **error)
{
  guint n_dims = cp_tensor_get_n_dims (tensor);
  CpStorage *storage = cp_tensor_get_storage (tensor);
  gsize start = cp_tensor_get_storage_offset (tensor), end = start + cp_tensor_get_nbytes (tensor);
  gsize out_start = cp_tensor_get_storage_offset (out), out_end = out_start + cp_tensor_get_nbytes (out);

  if (cp_tensor_get_dtype (out) != cp_tensor_get_dtype (tensor) ||
      cp_tensor_get_n_dims (out) != n_dims ||
      memcmp (cp_tensor_get_shape (out, NULL), cp_tensor_get_shape (tensor, NULL),
              n_dims * sizeof (gint64)) != 0)
    {
      g_autofree char *have = cp_tensor_describe (out);
      g_autofree char *want = cp_tensor_describe (tensor);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "all_to_all: the output is %s, it must be %s, the tensor's", have, want);
      return FALSE;
    }
  if (cp_tensor_get_storage (out) == storage && out_start < end && start < out_end)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "all_to_all: the output overlaps the tensor (bytes %" G_GSIZE_FORMAT
                   " to %" G_GSIZE_FORMAT " of one storage, the tensor's %" G_GSIZE_FORMAT
                   " to %" G_GSIZE_FORMAT "), which peers still read", out_start, out_end, start, end);
      return FALSE;
    }
  return _cp_tensor_require_device (out, "all_to_all", "the output",
                                    1u << cp_tensor_get_device (tensor), error) &&
         _cp_tensor_require_writable (out, "all_to_all", "the output", error);
}

/**
 * cp_mesh_all_to_all_into:
 * @self: a mesh
 * @tensor: this rank's tensor; every rank passes the same dtype and shape
 * @dim: the dimension to split and concatenate along; its length must be
 *   a multiple of the world size
 * @out: the result: a tensor of @tensor's dtype, shape and memory kind,
 *   apart from @tensor
 * @error: return location for a #GError
 *
 * Like [method@Cp.Mesh.all_to_all], writing into a tensor the caller
 * reuses.
 *
 * Returns: %TRUE on success, or %FALSE with an error on every rank;
 *   %CP_TENSOR_ERROR_SHAPE when a rank's @out does not match its @tensor
 *   or overlaps it, %CP_TENSOR_ERROR_READ_ONLY when it is read-only
 *
 * Since: 1.0
 */
gboolean
cp_mesh_all_to_all_into (CpMesh    *self,
                         CpTensor  *tensor,
                         int        dim,
                         CpTensor  *out,
                         GError   **error)
{
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (out), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  check_exchange_output (tensor, out, &invalid);
  return exchange_into (self, tensor, dim, out, invalid, error);
}

/**
 * cp_mesh_all_reduce:
 * @self: a mesh
 * @tensor: this rank's tensor, replaced in place by the result; every rank
 *   passes the same dtype and shape
 * @op: the reduction
 * @error: return location for a #GError
 *
 * Reduces @tensor element-wise over every rank and leaves the result in
 * every rank's @tensor. The reduction runs in rank order, so every rank
 * gets identical bits, run after run; integers wrap, booleans combine with
 * or (sum, max) and and (min), 16-bit floats accumulate in float32.
 *
 * Returns: %TRUE on success, or %FALSE with an error on every rank;
 *   %CP_TENSOR_ERROR_READ_ONLY when a rank's @tensor is read-only
 *   ([method@Cp.Storage.get_read_only])
 *
 * Since: 1.0
 */
gboolean
cp_mesh_all_reduce (CpMesh      *self,
                    CpTensor    *tensor,
                    CpReduceOp   op,
                    GError     **error)
{
  CpCollective coll;
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (op <= CP_REDUCE_OP_MIN, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  describe_operand (&coll, CP_COLL_ALL_REDUCE, tensor);
  coll.op = op;
  if (check_operand (self, tensor, "all_reduce", "the tensor", &invalid) &&
      _cp_tensor_require_writable (tensor, "all_reduce", "the tensor", &invalid))
    {
      coll.count = (gsize) cp_tensor_get_numel (tensor);
      _cp_tensor_get_region (tensor, &coll.recv);
    }
  return run_and_clear (self, &coll, invalid, error);
}

/**
 * cp_mesh_broadcast:
 * @self: a mesh
 * @tensor: the root's data; on every other rank, replaced in place by it
 * @root: the rank whose tensor is sent
 * @error: return location for a #GError
 *
 * Copies @root's @tensor into every rank's @tensor.
 *
 * Returns: %TRUE on success, or %FALSE with an error on every rank;
 *   %CP_TENSOR_ERROR_READ_ONLY when the @tensor of a rank other than
 *   @root is read-only ([method@Cp.Storage.get_read_only])
 *
 * Since: 1.0
 */
gboolean
cp_mesh_broadcast (CpMesh    *self,
                   CpTensor  *tensor,
                   int        root,
                   GError   **error)
{
  CpCollective coll;
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  describe_operand (&coll, CP_COLL_BROADCAST, tensor);
  coll.root = root;
  if (root < 0 || root >= self->comm->size)
    g_set_error (&invalid, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                 "broadcast: root %d is outside [0, %d)", root, self->comm->size);
  else if (check_operand (self, tensor, "broadcast", "the tensor", &invalid) &&
           (root == self->comm->index ||
            _cp_tensor_require_writable (tensor, "broadcast", "the tensor", &invalid)))
    {
      coll.count = (gsize) cp_tensor_get_numel (tensor);
      _cp_tensor_get_region (tensor, &coll.recv);
    }
  return run_and_clear (self, &coll, invalid, error);
}

#define MAX_AGREE_VALUES 4

static char *
describe_values (const char * const *names,
                 const gint64       *values,
                 guint               n_values)
{
  GString *text = g_string_new (NULL);

  for (guint i = 0; i < n_values; i++)
    if (g_str_has_suffix (names[i], "fingerprint"))
      g_string_append_printf (text, "%s%s " CP_FINGERPRINT_SHORT_FORMAT, i ? ", " : "", names[i],
                              CP_FINGERPRINT_SHORT (values[i]));
    else
      g_string_append_printf (text, "%s%s %" G_GINT64_FORMAT, i ? ", " : "", names[i], values[i]);
  return g_string_free (text, FALSE);
}

/* Every rank sees the same gathered table, so every rank reports the same
 * first disagreement. */
static gboolean
check_agreement (CpMesh              *self,
                 const char          *what,
                 const char * const  *names,
                 const gint64        *table,
                 guint                n_values,
                 GError             **error)
{
  for (int r = 1; r < self->comm->size; r++)
    {
      const gint64 *mine = table + (gsize) r * n_values;
      g_autofree char *first = NULL;
      g_autofree char *other = NULL;

      if (memcmp (mine, table, n_values * sizeof (gint64)) == 0)
        continue;
      first = describe_values (names, table, n_values);
      other = describe_values (names, mine, n_values);
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "%s: ranks disagree: rank 0 has %s; rank %d has %s", what, first, r, other);
      return FALSE;
    }
  return TRUE;
}

gboolean
_cp_mesh_agree (CpMesh              *self,
                const char          *what,
                const char * const  *names,
                const gint64        *values,
                guint                n_values,
                GError              *invalid,
                GError             **error)
{
  g_autofree gint64 *table = g_new0 (gint64, (gsize) self->comm->size * n_values);
  gint64 mine[MAX_AGREE_VALUES] = { 0 };
  CpCollective coll = { .kind = CP_COLL_ALL_GATHER, .dtype = CP_DTYPE_INT64, .n_dims = 1 };
  gboolean ok;

  g_assert (n_values >= 1 && n_values <= MAX_AGREE_VALUES);
  /* A rank with bad input of its own still sends numbers of the agreed
   * shape, so the rendezvous matches and reports its error everywhere. */
  if (invalid == NULL)
    memcpy (mine, values, n_values * sizeof (gint64));
  coll.shape[0] = n_values;
  coll.outer = 1;
  coll.block = n_values * sizeof (gint64);
  _cp_region_init_host (&coll.send, mine, coll.block);
  _cp_region_init_host (&coll.recv, table, (gsize) self->comm->size * coll.block);
  ok = run_on_host (self, &coll, invalid, error);
  _cp_collective_clear (&coll);
  if (!ok)
    return FALSE;
  return check_agreement (self, what, names, table, n_values, error);
}

/**
 * cp_mesh_barrier:
 * @self: a mesh
 * @error: return location for a #GError
 *
 * Waits until every rank has called it.
 *
 * Returns: %TRUE on success, or %FALSE with %CP_MESH_ERROR_TIMED_OUT
 *
 * Since: 1.0
 */
gboolean
cp_mesh_barrier (CpMesh  *self,
                 GError **error)
{
  CpCollective coll;

  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  describe_operand (&coll, CP_COLL_BARRIER, NULL);
  return run_collective (self, &coll, NULL, error);
}

void
_cp_message_from_tensor (CpMessage *message,
                         CpTensor  *tensor)
{
  const gint64 *shape = cp_tensor_get_shape (tensor, &message->n_dims);

  message->dtype = cp_tensor_get_dtype (tensor);
  memcpy (message->shape, shape, message->n_dims * sizeof (gint64));
  _cp_tensor_get_region (tensor, &message->data);
  message->nbytes = message->data.length;
  message->stream = NULL;
}

static gboolean
check_peer (CpMesh      *self,
            const char  *what,
            int          peer,
            CpTensor    *tensor,
            GError     **error)
{
  if (peer < 0 || peer >= self->comm->size)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "%s: rank %d is outside [0, %d)", what, peer, self->comm->size);
      return FALSE;
    }
  return check_operand (self, tensor, what, "the tensor", error);
}

void
_cp_mesh_transfer_post (CpMesh          *self,
                        CpMeshTransfer  *transfer,
                        CpTensor        *tensor,
                        gboolean         send,
                        int              peer,
                        guint64          tag)
{
  g_assert (transfer->request == NULL);
  transfer->comm = route (self, cp_tensor_get_device (tensor));
  g_assert (transfer->comm != NULL);
  _cp_message_from_tensor (&transfer->message, tensor);
  if (send)
    transfer->request = _cp_comm_isend (transfer->comm, peer, tag, &transfer->message);
  else
    transfer->request = _cp_comm_irecv (transfer->comm, peer, tag, &transfer->message);
}

gboolean
_cp_mesh_can_share (CpMesh       *self,
                    CpDeviceKind  device)
{
  CpComm *comm = route (self, device);

  return comm != NULL && _cp_comm_can_share (comm, device);
}

CpStorage *
_cp_mesh_alloc_shared (CpMesh        *self,
                       CpDeviceKind   device,
                       gsize          size,
                       GError       **error)
{
  CpComm *comm = route (self, device);

  return comm != NULL ? _cp_transport_alloc_shared (comm->transport, size, error) : NULL;
}

gboolean
_cp_mesh_share (CpMesh    *self,
                CpTensor  *tensor,
                CpLoans   *loans,
                GError   **error)
{
  CpRegion mine;
  gboolean ok;

  _cp_tensor_get_region (tensor, &mine);
  ok = _cp_comm_share (route (self, cp_tensor_get_device (tensor)), &mine, loans,
                                _cp_mesh_deadline (self), _cp_mesh_cancellable (self), error);

  _cp_region_clear (&mine);
  return ok;
}

gboolean
_cp_mesh_unshare (CpMesh        *self,
                  CpDeviceKind   device,
                  GError       **error)
{
  return _cp_comm_unshare (route (self, device), _cp_mesh_deadline (self),
                           _cp_mesh_cancellable (self), error);
}

gboolean
_cp_mesh_transfer_wait (CpMesh          *self,
                        CpMeshTransfer  *transfer,
                        gint64           deadline,
                        GError         **error)
{
  gboolean ok;

  if (transfer->request == NULL)
    return TRUE;
  ok = _cp_comm_wait (transfer->comm, g_steal_pointer (&transfer->request), deadline,
                      _cp_mesh_cancellable (self), error);
  _cp_message_clear (&transfer->message);
  transfer->comm = NULL;
  return ok;
}

/* Posts every operation before waiting for any, so that exchanges in a
 * ring cannot deadlock. */
static gboolean
exchange_routed (CpMesh    *self,
                 CpTensor  *send_tensor,
                 int        dst,
                 CpTensor  *recv_tensor,
                 int        src,
                 guint64    tag,
                 GError   **error)
{
  gint64 deadline = _cp_mesh_deadline (self);
  CpMeshTransfer sent = { 0 }, received = { 0 };
  GError *recv_error = NULL;
  gboolean ok = TRUE;

  if (send_tensor != NULL)
    _cp_mesh_transfer_post (self, &sent, send_tensor, TRUE, dst, tag);
  if (recv_tensor != NULL)
    {
      _cp_mesh_transfer_post (self, &received, recv_tensor, FALSE, src, tag);
      ok = _cp_mesh_transfer_wait (self, &received, deadline, &recv_error);
    }
  ok = _cp_mesh_transfer_wait (self, &sent, deadline, recv_error ? NULL : error) && ok;
  if (recv_error != NULL)
    g_propagate_error (error, recv_error);
  return ok;
}

/* @tensor itself when a communicator moves its memory; otherwise a host
 * tensor that stands in for it, holding its bytes when @copy_in, as a
 * staged collective's buffers do. */
static CpTensor *
host_stand_in (CpMesh    *self,
               CpTensor  *tensor,
               gboolean   copy_in,
               GError   **error)
{
  if (route (self, cp_tensor_get_device (tensor)) != NULL)
    return g_object_ref (tensor);
  if (copy_in)
    return cp_tensor_to_device (tensor, CP_DEVICE_KIND_HOST, error);
  return _cp_tensor_new_on_device (CP_DEVICE_KIND_HOST, cp_tensor_get_dtype (tensor),
                                   cp_tensor_get_shape (tensor, NULL),
                                   cp_tensor_get_n_dims (tensor), FALSE, error);
}

static gboolean
exchange (CpMesh    *self,
          CpTensor  *send_tensor,
          int        dst,
          CpTensor  *recv_tensor,
          int        src,
          guint64    tag,
          GError   **error)
{
  g_autoptr(CpTensor) sent = NULL;
  g_autoptr(CpTensor) received = NULL;

  if (send_tensor != NULL && (sent = host_stand_in (self, send_tensor, TRUE, error)) == NULL)
    return FALSE;
  if (recv_tensor != NULL && (received = host_stand_in (self, recv_tensor, FALSE, error)) == NULL)
    return FALSE;
  if (!exchange_routed (self, sent, dst, received, src, tag, error))
    return FALSE;
  if (received != recv_tensor && received != NULL)
    return _cp_memory_copy (recv_tensor, 0, received, 0, cp_tensor_get_nbytes (recv_tensor), FALSE,
                            error);
  return TRUE;
}

/**
 * cp_mesh_send:
 * @self: a mesh
 * @tensor: the data to send
 * @dst: the receiving rank, not this one
 * @tag: matches the send with the receive of the same tag
 * @error: return location for a #GError
 *
 * Sends @tensor to rank @dst and returns once @dst has received it with
 * [method@Cp.Mesh.recv]. Sends and receives between the same pair of ranks
 * with the same tag match in order. For exchanges in which every rank
 * both sends and receives, use [method@Cp.Mesh.send_recv].
 *
 * Returns: %TRUE on success; %FALSE with %CP_TENSOR_ERROR_SHAPE when the
 *   receiver expected another dtype or shape, or %CP_MESH_ERROR_TIMED_OUT
 *
 * Since: 1.0
 */
gboolean
cp_mesh_send (CpMesh    *self,
              CpTensor  *tensor,
              int        dst,
              guint      tag,
              GError   **error)
{
  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_peer (self, "send", dst, tensor, error))
    return FALSE;
  if (dst == self->comm->index)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "send: rank %d cannot wait for itself to receive; use send_recv", dst);
      return FALSE;
    }
  return exchange (self, tensor, dst, NULL, 0, tag, error);
}

/**
 * cp_mesh_recv:
 * @self: a mesh
 * @tensor: where to receive; its dtype and shape must match what is sent
 * @src: the sending rank, not this one
 * @tag: the tag the sender used
 * @error: return location for a #GError
 *
 * Receives into @tensor what rank @src sends with [method@Cp.Mesh.send].
 *
 * Returns: %TRUE on success; %FALSE with %CP_TENSOR_ERROR_SHAPE on a
 *   dtype or shape mismatch (@tensor is then untouched),
 *   %CP_TENSOR_ERROR_READ_ONLY when @tensor is read-only, or
 *   %CP_MESH_ERROR_TIMED_OUT
 *
 * Since: 1.0
 */
gboolean
cp_mesh_recv (CpMesh    *self,
              CpTensor  *tensor,
              int        src,
              guint      tag,
              GError   **error)
{
  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_peer (self, "recv", src, tensor, error) ||
      !_cp_tensor_require_writable (tensor, "recv", "the tensor", error))
    return FALSE;
  if (src == self->comm->index)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "recv: rank %d cannot wait for a send from itself; use send_recv", src);
      return FALSE;
    }
  return exchange (self, NULL, 0, tensor, src, tag, error);
}

/**
 * cp_mesh_send_recv:
 * @self: a mesh
 * @send_tensor: the data to send to @dst
 * @dst: the rank to send to
 * @recv_tensor: where to receive from @src; not @send_tensor
 * @src: the rank to receive from
 * @tag: the tag of both messages
 * @error: return location for a #GError
 *
 * Sends and receives at once, the step of a ring: every rank can call it
 * with its neighbours without deadlocking.
 *
 * Returns: %TRUE on success, or %FALSE with an error
 *
 * Since: 1.0
 */
gboolean
cp_mesh_send_recv (CpMesh    *self,
                   CpTensor  *send_tensor,
                   int        dst,
                   CpTensor  *recv_tensor,
                   int        src,
                   guint      tag,
                   GError   **error)
{
  g_return_val_if_fail (CP_IS_MESH (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (send_tensor), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (recv_tensor), FALSE);
  g_return_val_if_fail (send_tensor != recv_tensor, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_peer (self, "send_recv", dst, send_tensor, error) ||
      !check_peer (self, "send_recv", src, recv_tensor, error) ||
      !_cp_tensor_require_writable (recv_tensor, "send_recv", "the receive tensor", error))
    return FALSE;
  return exchange (self, send_tensor, dst, recv_tensor, src, tag, error);
}

/**
 * cp_mesh_unshard:
 * @self: the context-parallel mesh (1-D, or any mesh whose ranks all hold
 *   pieces)
 * @tensor: this rank's head-tail piece
 * @seq_dim: its sequence dimension; negative values count from the last
 * @error: return location for a #GError
 *
 * Rebuilds the full sequence from every rank's head-tail piece: an
 * all-gather in rank order, then the restore permutation — the native
 * `unshard_context_parallel_tensor`. The result keeps the padded length;
 * narrow it to drop the padding. With one rank, returns @tensor itself.
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error on
 *   every rank; %CP_TENSOR_ERROR_SHAPE when the local length is odd
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_unshard (CpMesh    *self,
                 CpTensor  *tensor,
                 int        seq_dim,
                 GError   **error)
{
  g_autoptr(CpLayout) layout = NULL;
  GError *invalid = NULL;
  gint64 seq_len = 0;
  guint d = 0;

  g_return_val_if_fail (CP_IS_MESH (self), NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* One rank holds the whole sequence, but a bad dimension is still an
   * error, as it is on every other mesh. */
  if (self->comm->size == 1)
    return _cp_tensor_normalize_dim (tensor, "unshard", seq_dim, &d, error) ? g_object_ref (tensor) : NULL;
  if (_cp_tensor_normalize_dim (tensor, "unshard", seq_dim, &d, &invalid) &&
      gathered_length (self, tensor, d, "unshard", &seq_len, &invalid))
    layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, self->comm->size, &invalid);
  if (invalid != NULL)
    {
      fail_gather_together (self, tensor, invalid, error);
      return NULL;
    }
  return cp_mesh_unshard_layout (self, tensor, seq_dim, layout, error);
}

/**
 * cp_mesh_unshard_layout:
 * @self: the context-parallel mesh
 * @tensor: this rank's piece of @layout
 * @seq_dim: its sequence dimension; negative values count from the last
 * @layout: the layout the pieces follow, over the mesh's world size (for
 *   example a per-document THD layout)
 * @error: return location for a #GError
 *
 * Like [method@Cp.Mesh.unshard] for any layout.
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error on
 *   every rank
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_unshard_layout (CpMesh    *self,
                        CpTensor  *tensor,
                        int        seq_dim,
                        CpLayout  *layout,
                        GError   **error)
{
  g_autoptr(CpTensor) gathered = NULL;
  GError *invalid = NULL;
  int rank;
  guint d = 0;

  g_return_val_if_fail (CP_IS_MESH (self), NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (layout != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  rank = self->comm->index;
  if (cp_layout_get_cp_size (layout) != self->comm->size)
    g_set_error (&invalid, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                 "unshard: the layout is over %d ranks, the mesh has %d",
                 cp_layout_get_cp_size (layout), self->comm->size);
  else if (_cp_tensor_normalize_dim (tensor, "unshard", seq_dim, &d, &invalid) &&
           cp_tensor_get_dim (tensor, (int) d) != cp_layout_get_local_len (layout, rank))
    g_set_error (&invalid, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                 "unshard: dimension %u of rank %d's piece has length %" G_GINT64_FORMAT
                 ", the layout gives it %" G_GINT64_FORMAT, d, rank,
                 cp_tensor_get_dim (tensor, (int) d), cp_layout_get_local_len (layout, rank));
  if (invalid != NULL)
    {
      fail_gather_together (self, tensor, invalid, error);
      return NULL;
    }
  gathered = cp_mesh_all_gather (self, tensor, (int) d, error);
  if (gathered == NULL)
    return NULL;
  return _cp_layout_restore_gathered (layout, gathered, d, error);
}
