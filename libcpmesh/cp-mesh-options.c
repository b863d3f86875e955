/* cp-mesh-options.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-mesh-options.h"

/**
 * CpMeshOptions:
 *
 * How a process joins a multi-process mesh with
 * [ctor@Cp.Mesh.new_with_options]:
 *
 * - [property@Cp.MeshOptions:rank] and [property@Cp.MeshOptions:world-size]:
 *   who this process is among how many;
 * - [property@Cp.MeshOptions:address] and [property@Cp.MeshOptions:port]:
 *   where rank 0 listens;
 * - [property@Cp.MeshOptions:token]: the secret every rank proves it holds;
 * - [property@Cp.MeshOptions:dim-names] and
 *   [property@Cp.MeshOptions:dim-sizes]: the mesh's dimensions;
 * - [property@Cp.MeshOptions:timeout-ms]: the bound on the rendezvous and on
 *   every later operation;
 * - [property@Cp.MeshOptions:transport]: the transport, by name.
 *
 * The values are checked when the mesh is made, which reports a bad one
 * as an error naming it. In Python:
 * `Cp.MeshOptions(rank=1, world_size=2, port=29501)`.
 *
 * Since: 1.0
 */
struct _CpMeshOptions
{
  GObject parent_instance;

  int rank;
  int world_size;
  char *address;
  guint port;
  char *token;
  char **dim_names;
  int *dim_sizes;
  gsize n_dims;
  guint timeout_ms;
  char *transport;
};

G_DEFINE_FINAL_TYPE (CpMeshOptions, cp_mesh_options, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_RANK,
  PROP_WORLD_SIZE,
  PROP_ADDRESS,
  PROP_PORT,
  PROP_TOKEN,
  PROP_DIM_NAMES,
  PROP_DIM_SIZES,
  PROP_TIMEOUT_MS,
  PROP_TRANSPORT,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
cp_mesh_options_finalize (GObject *object)
{
  CpMeshOptions *self = (CpMeshOptions *) object;

  g_free (self->address);
  g_free (self->token);
  g_strfreev (self->dim_names);
  g_free (self->dim_sizes);
  g_free (self->transport);

  G_OBJECT_CLASS (cp_mesh_options_parent_class)->finalize (object);
}

static GVariant *
dim_sizes_variant (CpMeshOptions *self)
{
  if (self->dim_sizes == NULL)
    return NULL;
  return g_variant_new_fixed_array (G_VARIANT_TYPE_INT32, self->dim_sizes, self->n_dims,
                                    sizeof (gint32));
}

static void
cp_mesh_options_get_property (GObject    *object,
                              guint       prop_id,
                              GValue     *value,
                              GParamSpec *pspec)
{
  CpMeshOptions *self = CP_MESH_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_RANK:
      g_value_set_int (value, self->rank);
      break;
    case PROP_WORLD_SIZE:
      g_value_set_int (value, self->world_size);
      break;
    case PROP_ADDRESS:
      g_value_set_string (value, self->address);
      break;
    case PROP_PORT:
      g_value_set_uint (value, self->port);
      break;
    case PROP_TOKEN:
      g_value_set_string (value, self->token);
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
    case PROP_TRANSPORT:
      g_value_set_string (value, self->transport);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
set_dim_names (CpMeshOptions      *self,
               const char * const *dim_names)
{
  g_strfreev (self->dim_names);
  self->dim_names = g_strdupv ((char **) dim_names);
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_DIM_NAMES]);
}

static void
set_dim_sizes (CpMeshOptions *self,
               const int     *dim_sizes,
               gsize          n_dims)
{
  g_free (self->dim_sizes);
  self->dim_sizes = dim_sizes != NULL ? g_memdup2 (dim_sizes, MAX (n_dims, 1) * sizeof (int)) : NULL;
  self->n_dims = dim_sizes != NULL ? n_dims : 0;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_DIM_SIZES]);
}

static void
set_dim_sizes_variant (CpMeshOptions *self,
                       GVariant      *sizes)
{
  gsize n_dims = 0;
  const gint32 *values = sizes != NULL ? g_variant_get_fixed_array (sizes, &n_dims, sizeof (gint32)) : NULL;

  set_dim_sizes (self, sizes != NULL ? values : NULL, n_dims);
}

static void
cp_mesh_options_set_property (GObject      *object,
                              guint         prop_id,
                              const GValue *value,
                              GParamSpec   *pspec)
{
  CpMeshOptions *self = CP_MESH_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_RANK:
      cp_mesh_options_set_rank (self, g_value_get_int (value));
      break;
    case PROP_WORLD_SIZE:
      cp_mesh_options_set_world_size (self, g_value_get_int (value));
      break;
    case PROP_ADDRESS:
      cp_mesh_options_set_address (self, g_value_get_string (value));
      break;
    case PROP_PORT:
      cp_mesh_options_set_port (self, g_value_get_uint (value));
      break;
    case PROP_TOKEN:
      cp_mesh_options_set_token (self, g_value_get_string (value));
      break;
    case PROP_DIM_NAMES:
      set_dim_names (self, g_value_get_boxed (value));
      break;
    case PROP_DIM_SIZES:
      set_dim_sizes_variant (self, g_value_get_variant (value));
      break;
    case PROP_TIMEOUT_MS:
      cp_mesh_options_set_timeout_ms (self, g_value_get_uint (value));
      break;
    case PROP_TRANSPORT:
      cp_mesh_options_set_transport (self, g_value_get_string (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

#define RW_FLAGS (G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS)

static void
cp_mesh_options_class_init (CpMeshOptionsClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = cp_mesh_options_finalize;
  object_class->get_property = cp_mesh_options_get_property;
  object_class->set_property = cp_mesh_options_set_property;

  /* Ranges are wide on purpose: [ctor@Cp.Mesh.new_with_options] checks
   * the values together and reports a bad one as an error naming it. */

  /**
   * CpMeshOptions:rank:
   *
   * This process's rank, in `[0, world-size)`.
   *
   * Since: 1.0
   */
  properties[PROP_RANK] =
    g_param_spec_int ("rank", NULL, NULL, G_MININT, G_MAXINT, 0, RW_FLAGS);

  /**
   * CpMeshOptions:world-size:
   *
   * The number of processes, at most 1024.
   *
   * Since: 1.0
   */
  properties[PROP_WORLD_SIZE] =
    g_param_spec_int ("world-size", NULL, NULL, G_MININT, G_MAXINT, 1, RW_FLAGS);

  /**
   * CpMeshOptions:address:
   *
   * The host rank 0 listens on; %NULL for `127.0.0.1`.
   *
   * Since: 1.0
   */
  properties[PROP_ADDRESS] =
    g_param_spec_string ("address", NULL, NULL, NULL, RW_FLAGS);

  /**
   * CpMeshOptions:port:
   *
   * The port rank 0 listens on, in `[1, 65535]`; 0 only for a mesh of one
   * rank.
   *
   * Since: 1.0
   */
  properties[PROP_PORT] =
    g_param_spec_uint ("port", NULL, NULL, 0, G_MAXUINT, 0, RW_FLAGS);

  /**
   * CpMeshOptions:token:
   *
   * The shared secret every rank must prove it holds, or %NULL for none.
   *
   * Since: 1.0
   */
  properties[PROP_TOKEN] =
    g_param_spec_string ("token", NULL, NULL, NULL, RW_FLAGS);

  /**
   * CpMeshOptions:dim-names:
   *
   * The dimension names, outermost first; %NULL for one dimension `cp`
   * over all ranks.
   *
   * Since: 1.0
   */
  properties[PROP_DIM_NAMES] =
    g_param_spec_boxed ("dim-names", NULL, NULL, G_TYPE_STRV, RW_FLAGS);

  /**
   * CpMeshOptions:dim-sizes:
   *
   * The size of each dimension, as a variant of type `ai`, one per name
   * of [property@Cp.MeshOptions:dim-names].
   *
   * Since: 1.0
   */
  properties[PROP_DIM_SIZES] =
    g_param_spec_variant ("dim-sizes", NULL, NULL, G_VARIANT_TYPE ("ai"), NULL, RW_FLAGS);

  /**
   * CpMeshOptions:timeout-ms:
   *
   * The bound on the rendezvous and on every later operation, in
   * milliseconds, at most %G_MAXINT; 0 for the default of 120000.
   *
   * Since: 1.0
   */
  properties[PROP_TIMEOUT_MS] =
    g_param_spec_uint ("timeout-ms", NULL, NULL, 0, G_MAXUINT, 0, RW_FLAGS);

  /**
   * CpMeshOptions:transport:
   *
   * The transport that connects the ranks, by name: `"ucx"`, or `"local"`
   * for a mesh of one process. %NULL takes `CPMESH_TRANSPORT` from the
   * environment or, when that is not set either, the default (`"ucx"`
   * when libcpmesh was built with it). A name this build does not have
   * is an error; no other transport is tried in its place.
   *
   * Since: 1.0
   */
  properties[PROP_TRANSPORT] =
    g_param_spec_string ("transport", NULL, NULL, NULL, RW_FLAGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_mesh_options_init (CpMeshOptions *self)
{
  self->world_size = 1;
}

/**
 * cp_mesh_options_new:
 *
 * Creates options for a mesh of one rank, rank 0 listening on
 * `127.0.0.1`, with no token, one dimension `cp`, the default timeout and
 * the default transport.
 *
 * Returns: (transfer full): new options
 *
 * Since: 1.0
 */
CpMeshOptions *
cp_mesh_options_new (void)
{
  return g_object_new (CP_TYPE_MESH_OPTIONS, NULL);
}

/* Whether *@field changed (GLib 2.76's g_set_str). */
static gboolean
replace_string (char       **field,
                const char  *value)
{
  if (g_strcmp0 (*field, value) == 0)
    return FALSE;
  g_free (*field);
  *field = g_strdup (value);
  return TRUE;
}

#define DEFINE_INT_ACCESSORS(field, type, prop)                             \
  type                                                                      \
  cp_mesh_options_get_##field (CpMeshOptions *self)                         \
  {                                                                         \
    g_return_val_if_fail (CP_IS_MESH_OPTIONS (self), 0);                    \
    return self->field;                                                     \
  }                                                                         \
  void                                                                      \
  cp_mesh_options_set_##field (CpMeshOptions *self,                         \
                               type           value)                        \
  {                                                                         \
    g_return_if_fail (CP_IS_MESH_OPTIONS (self));                           \
    if (self->field == value)                                               \
      return;                                                               \
    self->field = value;                                                    \
    g_object_notify_by_pspec (G_OBJECT (self), properties[prop]);           \
  }

#define DEFINE_STRING_ACCESSORS(field, prop)                                \
  const char *                                                              \
  cp_mesh_options_get_##field (CpMeshOptions *self)                         \
  {                                                                         \
    g_return_val_if_fail (CP_IS_MESH_OPTIONS (self), NULL);                 \
    return self->field;                                                     \
  }                                                                         \
  void                                                                      \
  cp_mesh_options_set_##field (CpMeshOptions *self,                         \
                               const char    *value)                        \
  {                                                                         \
    g_return_if_fail (CP_IS_MESH_OPTIONS (self));                           \
    if (replace_string (&self->field, value))                                    \
      g_object_notify_by_pspec (G_OBJECT (self), properties[prop]);         \
  }

/**
 * cp_mesh_options_get_rank:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:rank].
 *
 * Returns: the rank
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_rank:
 * @self: options
 * @rank: this process's rank
 *
 * Sets [property@Cp.MeshOptions:rank].
 *
 * Since: 1.0
 */
DEFINE_INT_ACCESSORS (rank, int, PROP_RANK)

/**
 * cp_mesh_options_get_world_size:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:world-size].
 *
 * Returns: the number of processes
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_world_size:
 * @self: options
 * @world_size: the number of processes
 *
 * Sets [property@Cp.MeshOptions:world-size].
 *
 * Since: 1.0
 */
DEFINE_INT_ACCESSORS (world_size, int, PROP_WORLD_SIZE)

/**
 * cp_mesh_options_get_port:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:port].
 *
 * Returns: the port rank 0 listens on
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_port:
 * @self: options
 * @port: the port rank 0 listens on
 *
 * Sets [property@Cp.MeshOptions:port].
 *
 * Since: 1.0
 */
DEFINE_INT_ACCESSORS (port, guint, PROP_PORT)

/**
 * cp_mesh_options_get_timeout_ms:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:timeout-ms].
 *
 * Returns: the timeout in milliseconds, or 0 for the default
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_timeout_ms:
 * @self: options
 * @timeout_ms: the timeout in milliseconds, or 0 for the default
 *
 * Sets [property@Cp.MeshOptions:timeout-ms].
 *
 * Since: 1.0
 */
DEFINE_INT_ACCESSORS (timeout_ms, guint, PROP_TIMEOUT_MS)

/**
 * cp_mesh_options_get_address:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:address].
 *
 * Returns: (nullable): the host rank 0 listens on, or %NULL for `127.0.0.1`
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_address:
 * @self: options
 * @address: (nullable): the host rank 0 listens on
 *
 * Sets [property@Cp.MeshOptions:address].
 *
 * Since: 1.0
 */
DEFINE_STRING_ACCESSORS (address, PROP_ADDRESS)

/**
 * cp_mesh_options_get_token:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:token].
 *
 * Returns: (nullable): the shared secret, or %NULL for none
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_token:
 * @self: options
 * @token: (nullable): the shared secret, or %NULL for none
 *
 * Sets [property@Cp.MeshOptions:token].
 *
 * Since: 1.0
 */
DEFINE_STRING_ACCESSORS (token, PROP_TOKEN)

/**
 * cp_mesh_options_get_transport:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:transport].
 *
 * Returns: (nullable): the transport's name, or %NULL for the default
 *
 * Since: 1.0
 */
/**
 * cp_mesh_options_set_transport:
 * @self: options
 * @transport: (nullable): the transport's name, such as `"ucx"`, or %NULL
 *   for `CPMESH_TRANSPORT` or the default
 *
 * Sets [property@Cp.MeshOptions:transport].
 *
 * Since: 1.0
 */
DEFINE_STRING_ACCESSORS (transport, PROP_TRANSPORT)

/**
 * cp_mesh_options_get_dim_names:
 * @self: options
 *
 * Gets [property@Cp.MeshOptions:dim-names].
 *
 * Returns: (transfer none) (array zero-terminated=1) (nullable): the
 *   names, or %NULL for one dimension `cp`
 *
 * Since: 1.0
 */
const char * const *
cp_mesh_options_get_dim_names (CpMeshOptions *self)
{
  g_return_val_if_fail (CP_IS_MESH_OPTIONS (self), NULL);

  return (const char * const *) self->dim_names;
}

/**
 * cp_mesh_options_dup_dim_names:
 * @self: options
 *
 * Copies [property@Cp.MeshOptions:dim-names], for bindings whose string
 * arrays are not const (Vala); C reads them with
 * [method@Cp.MeshOptions.get_dim_names].
 *
 * Returns: (transfer full) (array zero-terminated=1) (nullable): the
 *   names, or %NULL for one dimension `cp`; free with g_strfreev()
 *
 * Since: 1.0
 */
char **
cp_mesh_options_dup_dim_names (CpMeshOptions *self)
{
  g_return_val_if_fail (CP_IS_MESH_OPTIONS (self), NULL);

  return g_strdupv (self->dim_names);
}

/**
 * cp_mesh_options_get_dim_sizes:
 * @self: options
 * @n_dims: (out) (optional): the number of dimensions
 *
 * Gets [property@Cp.MeshOptions:dim-sizes].
 *
 * Returns: (transfer none) (array length=n_dims) (nullable): the sizes
 *
 * Since: 1.0
 */
const int *
cp_mesh_options_get_dim_sizes (CpMeshOptions *self,
                               gsize         *n_dims)
{
  g_return_val_if_fail (CP_IS_MESH_OPTIONS (self), NULL);

  if (n_dims != NULL)
    *n_dims = self->n_dims;
  return self->dim_sizes;
}

/**
 * cp_mesh_options_set_dims:
 * @self: options
 * @dim_names: (array zero-terminated=1) (nullable): the dimension names,
 *   outermost first; %NULL for one dimension `cp` over all ranks
 * @dim_sizes: (array length=n_dims) (nullable): the size of each dimension
 * @n_dims: the number of dimensions
 *
 * Sets [property@Cp.MeshOptions:dim-names] and
 * [property@Cp.MeshOptions:dim-sizes] together.
 *
 * Since: 1.0
 */
void
cp_mesh_options_set_dims (CpMeshOptions       *self,
                          const char * const  *dim_names,
                          const int           *dim_sizes,
                          gsize                n_dims)
{
  g_return_if_fail (CP_IS_MESH_OPTIONS (self));
  g_return_if_fail (dim_names == NULL || dim_sizes != NULL || n_dims == 0);

  g_object_freeze_notify (G_OBJECT (self));
  set_dim_names (self, dim_names);
  set_dim_sizes (self, dim_names != NULL ? dim_sizes : NULL, n_dims);
  g_object_thaw_notify (G_OBJECT (self));
}
