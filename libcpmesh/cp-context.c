/* cp-context.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-context-private.h"
#include "cp-enum-types.h"
#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-mesh-private.h"
#include "cp-task-private.h"
#include "cp-tensor-private.h"

/**
 * CpContext:
 *
 * A set of registered sequence buffers that [method@Cp.Context.enter]
 * shards in place to this rank's head-tail layout and
 * [method@Cp.Context.exit] restores.
 *
 * Entering makes the same [class@Cp.Tensor] objects hold this rank's
 * local piece, like PyTorch's `resize_()` followed by `copy_()`: code that
 * holds a buffer sees the local shape. For C ranks and a padded length S,
 * each buffer then has S/C positions along its sequence dimension, rank r
 * holding chunks r and 2·C−1−r of 2·C. Exiting puts back the buffers
 * registered as restorable, with their exact contents at enter; the others
 * stay local. A context can be entered again after it exits: buffers that
 * are still local are left as they are, the others are sharded again.
 *
 * Enter checks everything before it changes anything: every buffer is in
 * memory this build reaches (host or test memory, and CUDA memory in builds
 * with [const@Cp.HAS_CUDA]), has its sequence dimension, and has the same
 * padded length, a multiple of 2·C; then all ranks compare their layouts
 * (and, for a context [method@Cp.Batch.prepare] made, the batch's length
 * before padding) in one small all-gather. Any problem, on any rank, is
 * an error on every rank and no buffer is modified anywhere.
 *
 * Sharding in place never writes the buffer's own memory: the tensor is
 * given new memory for its local piece. A buffer over read-only memory (a
 * #GBytes) can therefore be registered; it is read, and restored as it
 * was.
 *
 * Restorable buffers are restored without a copy: enter gives the tensor
 * new local memory and keeps the original memory aside, untouched. Writes
 * made during the context through other views of that original memory
 * (for example a numpy array taken before enter) do show after exit.
 *
 * The rotate method (how attention moves keys and values between ranks)
 * is a property of the context, not process-wide state.
 *
 * [method@Cp.Batch.prepare] builds a context from a batch, as the
 * reference `make_cp_batch_and_ctx` does. In Python a context is a
 * context manager (`with ctx:`); gjs and Vala use [method@Cp.Context.run]
 * or enter and exit.
 *
 * While it is entered a context holds its buffers: no other context (of
 * another rank, or another one entered on this rank) and no
 * [method@Cp.Batch.prepare] may change them in place, and such an enter or
 * prepare fails with %CP_TENSOR_ERROR_IN_USE on every rank of its call.
 * Give every rank its own tensors; only reading a tensor from several
 * ranks at once is safe, and then not while a context holds it.
 *
 * Misuse is an error, not a warning: entering an entered context, exiting
 * one that is not entered, or registering a buffer while entered fail with
 * %CP_BATCH_ERROR_CONTEXT_STATE and change nothing.
 *
 * A context is used by the thread of its rank.
 *
 * Since: 1.0
 */

typedef struct
{
  char *name;
  CpTensor *tensor;
  int seq_dim;
  gboolean restore;

  /* The storage enter installed; compared by address only, to recognise a
   * buffer that is still local when the context is entered again. */
  gconstpointer local;

  /* The full view exit puts back (restorable buffers while entered). */
  CpStorage *saved_storage;
  gsize saved_offset;
  gint64 saved_shape[CP_TENSOR_MAX_DIMS];
  guint saved_n_dims;
} Buffer;

struct _CpContext
{
  GObject parent_instance;

  CpMesh *mesh;          /* the context-parallel group, or NULL */
  CpRotateMethod rotate_method;
  GPtrArray *buffers;    /* of Buffer* */
  CpLayout *layout;
  gint64 unpadded_len;   /* the batch's length before prepare padded it, or -1 */
  gboolean entered;
  gboolean holds_buffers; /* entered with a group: the buffers are claimed */
};

G_DEFINE_FINAL_TYPE (CpContext, cp_context, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_MESH,
  PROP_ROTATE_METHOD,
  PROP_IS_ENTERED,
  PROP_CP_SIZE,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
buffer_free (gpointer data)
{
  Buffer *buffer = data;

  g_free (buffer->name);
  g_clear_object (&buffer->tensor);
  g_clear_pointer (&buffer->saved_storage, cp_storage_unref);
  g_free (buffer);
}

static void release_buffers (CpContext *self,
                             guint      n);

static void
cp_context_dispose (GObject *object)
{
  CpContext *self = (CpContext *) object;

  /* A context dropped while entered leaves its buffers local, and free
   * for others to use. */
  if (self->holds_buffers)
    release_buffers (self, self->buffers->len);
  self->holds_buffers = FALSE;
  g_clear_object (&self->mesh);
  g_ptr_array_set_size (self->buffers, 0);

  G_OBJECT_CLASS (cp_context_parent_class)->dispose (object);
}

static void
cp_context_finalize (GObject *object)
{
  CpContext *self = (CpContext *) object;

  g_ptr_array_unref (self->buffers);
  g_clear_pointer (&self->layout, cp_layout_unref);

  G_OBJECT_CLASS (cp_context_parent_class)->finalize (object);
}

CpMesh *
_cp_context_resolve_mesh (CpMesh  *mesh,
                          GError **error)
{
  gsize n_dims;

  cp_mesh_get_dim_sizes (mesh, &n_dims);
  if (n_dims == 1)
    return mesh;
  return cp_mesh_get_submesh (mesh, "cp", error);
}

/* A mesh without a "cp" dimension is a programmer error here; prepare
 * reports it as a GError. */
static void
cp_context_constructed (GObject *object)
{
  CpContext *self = (CpContext *) object;
  g_autoptr(GError) error = NULL;
  CpMesh *group;

  G_OBJECT_CLASS (cp_context_parent_class)->constructed (object);

  if (self->mesh == NULL)
    return;
  group = _cp_context_resolve_mesh (self->mesh, &error);
  if (group == NULL)
    g_critical ("CpContext: %s", error->message);
  else
    g_object_ref (group);
  g_clear_object (&self->mesh);
  self->mesh = group;
}

static void
cp_context_get_property (GObject    *object,
                         guint       prop_id,
                         GValue     *value,
                         GParamSpec *pspec)
{
  CpContext *self = CP_CONTEXT (object);

  switch (prop_id)
    {
    case PROP_MESH:
      g_value_set_object (value, self->mesh);
      break;
    case PROP_ROTATE_METHOD:
      g_value_set_enum (value, self->rotate_method);
      break;
    case PROP_IS_ENTERED:
      g_value_set_boolean (value, self->entered);
      break;
    case PROP_CP_SIZE:
      g_value_set_int (value, cp_context_get_cp_size (self));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_context_set_property (GObject      *object,
                         guint         prop_id,
                         const GValue *value,
                         GParamSpec   *pspec)
{
  CpContext *self = CP_CONTEXT (object);

  switch (prop_id)
    {
    case PROP_MESH:
      self->mesh = g_value_dup_object (value);
      break;
    case PROP_ROTATE_METHOD:
      self->rotate_method = g_value_get_enum (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_context_class_init (CpContextClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->dispose = cp_context_dispose;
  object_class->finalize = cp_context_finalize;
  object_class->constructed = cp_context_constructed;
  object_class->get_property = cp_context_get_property;
  object_class->set_property = cp_context_set_property;

  /**
   * CpContext:mesh:
   *
   * The context-parallel group: the mesh given at construction when it
   * is 1-D, its `cp` dimension otherwise. %NULL for a context that does
   * nothing (no context parallelism).
   *
   * Since: 1.0
   */
  properties[PROP_MESH] =
    g_param_spec_object ("mesh", NULL, NULL,
                         CP_TYPE_MESH,
                         G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * CpContext:rotate-method:
   *
   * How context-parallel attention under this context moves keys and
   * values between ranks.
   *
   * Since: 1.0
   */
  properties[PROP_ROTATE_METHOD] =
    g_param_spec_enum ("rotate-method", NULL, NULL,
                       CP_TYPE_ROTATE_METHOD, CP_ROTATE_METHOD_ALLGATHER,
                       G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * CpContext:is-entered:
   *
   * Whether the context is entered: its buffers hold local pieces.
   *
   * Since: 1.0
   */
  properties[PROP_IS_ENTERED] =
    g_param_spec_boolean ("is-entered", NULL, NULL,
                          FALSE,
                          G_PARAM_READABLE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * CpContext:cp-size:
   *
   * The number of ranks sharing the sequence: 1 without a mesh.
   *
   * Since: 1.0
   */
  properties[PROP_CP_SIZE] =
    g_param_spec_int ("cp-size", NULL, NULL,
                      1, G_MAXINT, 1,
                      G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_context_init (CpContext *self)
{
  self->buffers = g_ptr_array_new_with_free_func (buffer_free);
  self->unpadded_len = -1;
}

/**
 * cp_context_new:
 * @mesh: (nullable): the context-parallel group: a 1-D mesh, or a mesh
 *   with a `cp` dimension; %NULL for a context that does nothing
 * @rotate_method: how attention moves keys and values between ranks
 *
 * Creates a context with no buffers; add them with
 * [method@Cp.Context.register_buffer]. [method@Cp.Batch.prepare] creates
 * and fills one from a batch.
 *
 * Returns: (transfer full): a new context
 *
 * Since: 1.0
 */
CpContext *
cp_context_new (CpMesh         *mesh,
                CpRotateMethod  rotate_method)
{
  g_return_val_if_fail (mesh == NULL || CP_IS_MESH (mesh), NULL);
  g_return_val_if_fail ((guint) rotate_method <= CP_ROTATE_METHOD_ALLTOALL, NULL);

  return g_object_new (CP_TYPE_CONTEXT,
                       "mesh", mesh,
                       "rotate-method", rotate_method,
                       NULL);
}

/**
 * cp_context_get_mesh:
 * @self: a context
 *
 * Gets the context-parallel group.
 *
 * Returns: (transfer none) (nullable): the group, or %NULL when the context
 *   does nothing
 *
 * Since: 1.0
 */
CpMesh *
cp_context_get_mesh (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), NULL);

  return self->mesh;
}

/**
 * cp_context_get_rotate_method:
 * @self: a context
 *
 * Gets how attention under this context moves keys and values.
 *
 * Returns: the rotate method
 *
 * Since: 1.0
 */
CpRotateMethod
cp_context_get_rotate_method (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), CP_ROTATE_METHOD_ALLGATHER);

  return self->rotate_method;
}

/**
 * cp_context_get_cp_size:
 * @self: a context
 *
 * Gets the number of ranks that share the sequence.
 *
 * Returns: the size of the group, 1 without a mesh
 *
 * Since: 1.0
 */
int
cp_context_get_cp_size (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), 1);

  return self->mesh != NULL ? cp_mesh_get_world_size (self->mesh) : 1;
}

/**
 * cp_context_get_cp_rank:
 * @self: a context
 *
 * Gets this rank's position in the context-parallel group.
 *
 * Returns: the rank, 0 without a mesh
 *
 * Since: 1.0
 */
int
cp_context_get_cp_rank (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), 0);

  return self->mesh != NULL ? cp_mesh_get_rank (self->mesh) : 0;
}

/**
 * cp_context_is_entered:
 * @self: a context
 *
 * Tells whether the context is entered.
 *
 * Returns: %TRUE between a successful enter and exit
 *
 * Since: 1.0
 */
gboolean
cp_context_is_entered (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);

  return self->entered;
}

/**
 * cp_context_get_layout:
 * @self: a context
 *
 * Gets the layout the buffers are sharded with: known once
 * [method@Cp.Batch.prepare] has padded the batch, or after the first
 * enter. Use it for [method@Cp.Layout.shard_backward] on a
 * gradient-bearing primary buffer.
 *
 * Returns: (transfer none) (nullable): the layout, or %NULL before it is
 *   known and for a context without context parallelism
 *
 * Since: 1.0
 */
CpLayout *
cp_context_get_layout (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), NULL);

  return self->layout;
}

void
_cp_context_set_layout (CpContext *self,
                        CpLayout  *layout)
{
  g_clear_pointer (&self->layout, cp_layout_unref);
  self->layout = layout != NULL ? cp_layout_ref (layout) : NULL;
}

void
_cp_context_set_unpadded_length (CpContext *self,
                                 gint64     length)
{
  self->unpadded_len = length;
}

static gboolean
is_registered (CpContext *self,
               CpTensor  *tensor)
{
  for (guint i = 0; i < self->buffers->len; i++)
    if (((Buffer *) g_ptr_array_index (self->buffers, i))->tensor == tensor)
      return TRUE;
  return FALSE;
}

void
_cp_context_register_named (CpContext  *self,
                            const char *name,
                            CpTensor   *tensor,
                            int         seq_dim,
                            gboolean    restore)
{
  Buffer *buffer = g_new0 (Buffer, 1);

  buffer->name = g_strdup (name);
  buffer->tensor = g_object_ref (tensor);
  buffer->seq_dim = seq_dim;
  buffer->restore = restore;
  g_ptr_array_add (self->buffers, buffer);
}

static gboolean
set_state_error (GError     **error,
                 const char  *what,
                 const char  *problem)
{
  g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONTEXT_STATE, "%s: %s", what, problem);
  return FALSE;
}

/**
 * cp_context_register_buffer:
 * @self: a context that is not entered
 * @tensor: a sequence-bearing tensor in memory this build reaches,
 *   registered once
 * @seq_dim: its sequence dimension; negative values count from the last
 * @restore: whether exit puts the full buffer back (otherwise it stays
 *   local after exit)
 * @error: return location for a #GError
 *
 * Adds a buffer that enter shards in place. Buffers are kept in
 * registration order; all of them must have the same padded length
 * along their sequence dimensions when the context is entered.
 *
 * Returns: %TRUE when @tensor was added, or %FALSE with
 *   %CP_BATCH_ERROR_CONTEXT_STATE while the context is entered, or
 *   %CP_BATCH_ERROR_CONFLICTING_KEYS when @tensor is registered already
 *   (sharding it twice in place would corrupt it)
 *
 * Since: 1.0
 */
gboolean
cp_context_register_buffer (CpContext  *self,
                            CpTensor   *tensor,
                            int         seq_dim,
                            gboolean    restore,
                            GError    **error)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (self->entered)
    return set_state_error (error, "register_buffer",
                            "the context is entered; register buffers before enter or after exit");
  if (is_registered (self, tensor))
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONFLICTING_KEYS,
                   "register_buffer: the tensor is registered already; sharding it twice in "
                   "place would corrupt it");
      return FALSE;
    }
  _cp_context_register_named (self, NULL, tensor, seq_dim, restore);
  return TRUE;
}

/**
 * cp_context_get_n_buffers:
 * @self: a context
 *
 * Gets the number of registered buffers.
 *
 * Returns: the number of buffers
 *
 * Since: 1.0
 */
guint
cp_context_get_n_buffers (CpContext *self)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), 0);

  return self->buffers->len;
}

static Buffer *
get_buffer (CpContext *self,
            guint      index)
{
  return g_ptr_array_index (self->buffers, index);
}

/**
 * cp_context_get_buffer:
 * @self: a context
 * @index: a registration index, below [method@Cp.Context.get_n_buffers]
 *
 * Gets a registered buffer: the very tensor object that was registered.
 *
 * Returns: (transfer none): the buffer
 *
 * Since: 1.0
 */
CpTensor *
cp_context_get_buffer (CpContext *self,
                       guint      index)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), NULL);
  g_return_val_if_fail (index < self->buffers->len, NULL);

  return get_buffer (self, index)->tensor;
}

/**
 * cp_context_get_buffer_seq_dim:
 * @self: a context
 * @index: a registration index
 *
 * Gets the sequence dimension a buffer was registered with.
 *
 * Returns: the dimension, as registered
 *
 * Since: 1.0
 */
int
cp_context_get_buffer_seq_dim (CpContext *self,
                               guint      index)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), 0);
  g_return_val_if_fail (index < self->buffers->len, 0);

  return get_buffer (self, index)->seq_dim;
}

/**
 * cp_context_get_buffer_restores:
 * @self: a context
 * @index: a registration index
 *
 * Tells whether exit restores a buffer to its full length.
 *
 * Returns: %TRUE for a restorable buffer
 *
 * Since: 1.0
 */
gboolean
cp_context_get_buffer_restores (CpContext *self,
                                guint      index)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);
  g_return_val_if_fail (index < self->buffers->len, FALSE);

  return get_buffer (self, index)->restore;
}

/**
 * cp_context_get_buffer_name:
 * @self: a context
 * @index: a registration index
 *
 * Gets the batch key of a buffer [method@Cp.Batch.prepare] registered
 * (`"loss_mask"` for the loss mask).
 *
 * Returns: (nullable): the key, or %NULL for a buffer registered with
 *   [method@Cp.Context.register_buffer]
 *
 * Since: 1.0
 */
const char *
cp_context_get_buffer_name (CpContext *self,
                            guint      index)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), NULL);
  g_return_val_if_fail (index < self->buffers->len, NULL);

  return get_buffer (self, index)->name;
}

/* "'labels'" or "buffer 2": no shape, which another thread may be
 * changing when a claim fails. */
static char *
name_buffer (Buffer *buffer,
             guint   index)
{
  if (buffer->name != NULL)
    return g_strdup_printf ("'%s'", buffer->name);
  return g_strdup_printf ("buffer %u", index);
}

/* "'labels' (int64[1, 6] on host)" or "buffer 2 (…)" */
static char *
describe_buffer (Buffer *buffer,
                 guint   index)
{
  g_autofree char *name = name_buffer (buffer, index);
  g_autofree char *tensor = cp_tensor_describe (buffer->tensor);

  return g_strdup_printf ("%s (%s)", name, tensor);
}

static void
release_buffers (CpContext *self,
                 guint      n)
{
  for (guint i = 0; i < n; i++)
    _cp_tensor_release (get_buffer (self, i)->tensor, self);
}

/* Claims every buffer for this context, or none. */
static gboolean
claim_buffers (CpContext  *self,
               GError    **error)
{
  for (guint i = 0; i < self->buffers->len; i++)
    {
      Buffer *buffer = get_buffer (self, i);
      g_autofree char *label = NULL;

      if (_cp_tensor_claim (buffer->tensor, self))
        continue;
      release_buffers (self, i);
      label = name_buffer (buffer, i);
      _cp_tensor_set_in_use_error (error, "enter", label);
      return FALSE;
    }
  return TRUE;
}

/* A buffer left local by an earlier enter still holds the storage that
 * enter installed, with the local length. */
static gboolean
buffer_is_local (Buffer   *buffer,
                 guint     dim,
                 CpLayout *layout,
                 int       rank)
{
  return buffer->local != NULL && layout != NULL &&
         (gconstpointer) cp_tensor_get_storage (buffer->tensor) == buffer->local &&
         cp_tensor_get_dim (buffer->tensor, (int) dim) == cp_layout_get_local_len (layout, rank);
}

typedef struct
{
  guint dim;
  gboolean local;        /* already sharded: left as it is */
  CpTensor *piece;       /* the new local tensor, for the others */
} Step;

static void
steps_free (Step *steps,
            guint n)
{
  for (guint i = 0; i < n; i++)
    g_clear_object (&steps[i].piece);
  g_free (steps);
}

static gboolean
check_buffer (Buffer   *buffer,
              guint     index,
              guint    *dim,
              GError  **error)
{
  g_autofree char *name = name_buffer (buffer, index);
  g_autofree char *label = describe_buffer (buffer, index);

  if (!_cp_tensor_require_device (buffer->tensor, "enter", name, CP_DEVICE_KINDS_REACHABLE, error))
    return FALSE;
  return _cp_tensor_normalize_dim (buffer->tensor, label, buffer->seq_dim, dim, error);
}

/* The padded length every full buffer must share: the first full
 * buffer's. */
static gboolean
find_seq_len (CpContext *self,
              Step      *steps,
              gint64    *seq_len,
              guint     *first)
{
  for (guint i = 0; i < self->buffers->len; i++)
    if (!steps[i].local)
      {
        *seq_len = cp_tensor_get_dim (get_buffer (self, i)->tensor, (int) steps[i].dim);
        *first = i;
        return TRUE;
      }
  return FALSE;
}

static gboolean
check_lengths (CpContext *self,
               Step      *steps,
               gint64     seq_len,
               guint      first,
               GError   **error)
{
  for (guint i = first + 1; i < self->buffers->len; i++)
    {
      gint64 length = cp_tensor_get_dim (get_buffer (self, i)->tensor, (int) steps[i].dim);
      g_autofree char *a = NULL;
      g_autofree char *b = NULL;

      if (steps[i].local || length == seq_len)
        continue;
      a = describe_buffer (get_buffer (self, first), first);
      b = describe_buffer (get_buffer (self, i), i);
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "enter: buffers disagree on the sequence length: %s has %" G_GINT64_FORMAT
                   " along dimension %u, %s has %" G_GINT64_FORMAT " along dimension %u",
                   a, seq_len, steps[first].dim, b, length, steps[i].dim);
      return FALSE;
    }
  return TRUE;
}

static CpLayout *
make_layout (CpContext *self,
             Step      *steps,
             gint64     seq_len,
             guint      first,
             GError   **error)
{
  int cp_size = cp_context_get_cp_size (self);
  gint64 divisor = 2 * (gint64) cp_size;

  if (self->layout != NULL && cp_layout_get_seq_len (self->layout) == seq_len)
    return cp_layout_ref (self->layout);
  if (seq_len % divisor != 0)
    {
      g_autofree char *label = describe_buffer (get_buffer (self, first), first);

      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INDIVISIBLE,
                   "enter: %s has sequence length %" G_GINT64_FORMAT " along dimension %u, "
                   "not a multiple of 2·C = %" G_GINT64_FORMAT "; pad it first "
                   "(cp_batch_prepare() does)", label, seq_len, steps[first].dim, divisor);
      return NULL;
    }
  return cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, cp_size, error);
}

/* Sizes every step: which buffers are already local, and a local tensor
 * for each of the others.  Changes nothing. */
static CpLayout *
plan_enter (CpContext *self,
            Step      *steps,
            GError   **error)
{
  int rank = cp_context_get_cp_rank (self);
  g_autoptr(CpLayout) layout = NULL;
  gint64 seq_len;
  guint first;

  for (guint i = 0; i < self->buffers->len; i++)
    {
      if (!check_buffer (get_buffer (self, i), i, &steps[i].dim, error))
        return NULL;
      steps[i].local = buffer_is_local (get_buffer (self, i), steps[i].dim, self->layout, rank);
    }
  if (!find_seq_len (self, steps, &seq_len, &first))
    return self->layout != NULL ? cp_layout_ref (self->layout) : NULL;
  if (!check_lengths (self, steps, seq_len, first, error))
    return NULL;
  layout = make_layout (self, steps, seq_len, first, error);
  if (layout == NULL)
    return NULL;
  for (guint i = 0; i < self->buffers->len; i++)
    if (!steps[i].local)
      {
        steps[i].piece = cp_layout_shard (layout, get_buffer (self, i)->tensor,
                                          (int) steps[i].dim, rank, error);
        if (steps[i].piece == NULL)
          return NULL;
      }
  return g_steal_pointer (&layout);
}

static void
save_full_view (Buffer *buffer)
{
  const gint64 *shape = cp_tensor_get_shape (buffer->tensor, &buffer->saved_n_dims);

  buffer->saved_storage = cp_storage_ref (cp_tensor_get_storage (buffer->tensor));
  buffer->saved_offset = cp_tensor_get_storage_offset (buffer->tensor);
  memcpy (buffer->saved_shape, shape, buffer->saved_n_dims * sizeof (gint64));
}

/* Cannot fail: every piece is already computed. */
static void
commit_enter (CpContext *self,
              Step      *steps)
{
  for (guint i = 0; i < self->buffers->len; i++)
    {
      Buffer *buffer = get_buffer (self, i);

      if (steps[i].local)
        continue;
      if (buffer->restore)
        save_full_view (buffer);
      _cp_tensor_assign (buffer->tensor, self, steps[i].piece);
      buffer->local = cp_tensor_get_storage (buffer->tensor);
    }
}

static void
set_entered (CpContext *self,
             gboolean   entered)
{
  self->entered = entered;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_IS_ENTERED]);
}

static gboolean
enter_group (CpContext  *self,
             GError    **error)
{
  static const char * const names[] = {
    "padded sequence length", "layout fingerprint", "sequence length before padding",
  };
  guint n = self->buffers->len;
  Step *steps = g_new0 (Step, MAX (n, 1));
  g_autoptr(CpLayout) layout = NULL;
  GError *invalid = NULL;
  gint64 values[3] = { 0, 0, self->unpadded_len };
  gboolean claimed = FALSE;
  gboolean agreed;

  /* Entered already, or a buffer held elsewhere: this rank's error goes
   * to the all-gather like any other, so every rank fails alike. */
  if (self->entered)
    set_state_error (&invalid, "enter", "the context is entered already; exit it first");
  else if ((claimed = claim_buffers (self, &invalid)))
    layout = plan_enter (self, steps, &invalid);
  if (layout != NULL)
    {
      values[0] = cp_layout_get_seq_len (layout);
      values[1] = (gint64) cp_layout_fingerprint (layout);
    }
  /* One collective whatever happened locally: a rank whose buffers are
   * bad makes every rank fail, before any rank has changed anything. */
  agreed = _cp_mesh_agree (self->mesh, "enter", names, values, G_N_ELEMENTS (values), invalid, error);
  if (agreed)
    {
      commit_enter (self, steps);
      if (layout != NULL)
        _cp_context_set_layout (self, layout);
      self->holds_buffers = TRUE;
    }
  else if (claimed)
    release_buffers (self, n);
  steps_free (steps, n);
  return agreed;
}

/**
 * cp_context_enter:
 * @self: a context that is not entered
 * @error: return location for a #GError
 *
 * Shards every registered buffer in place to this rank's layout. Every
 * rank of the group calls it together. Checks run first, then all ranks
 * compare their padded lengths and layouts, and the lengths of their
 * batches before prepare padded them; on any error, on any rank, every
 * rank fails and no buffer is modified.
 *
 * From here to [method@Cp.Context.exit] the context holds its buffers:
 * a buffer that another context or a prepare holds at the same time makes
 * every rank fail with %CP_TENSOR_ERROR_IN_USE.
 *
 * Returns: %TRUE on success, or %FALSE with %CP_TENSOR_ERROR_SHAPE
 *   (buffers disagree on the length, or a dimension does not exist),
 *   %CP_BATCH_ERROR_INDIVISIBLE (the length is not a multiple of 2·C),
 *   %CP_TENSOR_ERROR_DEVICE, %CP_TENSOR_ERROR_IN_USE (a buffer is held by
 *   another context or prepare), %CP_BATCH_ERROR_CONTEXT_STATE (the
 *   context is entered already: it stays entered), or
 *   %CP_MESH_ERROR_INVALID_TOPOLOGY (ranks disagree on the layout or the
 *   batch length); each names the buffer and the values
 *
 * Since: 1.0
 */
gboolean
cp_context_enter (CpContext  *self,
                  GError    **error)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (cp_context_get_cp_size (self) > 1)
    {
      if (!enter_group (self, error))
        return FALSE;
    }
  else if (self->entered)
    return set_state_error (error, "enter", "the context is entered already; exit it first");
  set_entered (self, TRUE);
  return TRUE;
}

static void
restore_full_view (CpContext *self,
                   Buffer    *buffer)
{
  if (buffer->saved_storage == NULL)
    return;
  _cp_tensor_replace (buffer->tensor, self, buffer->saved_storage, buffer->saved_offset,
                      buffer->saved_shape, buffer->saved_n_dims);
  g_clear_pointer (&buffer->saved_storage, cp_storage_unref);
  buffer->local = NULL;
}

/**
 * cp_context_exit:
 * @self: an entered context
 * @error: return location for a #GError
 *
 * Puts back the full contents of every restorable buffer; the others
 * keep their local pieces. Needs no communication. The context no longer
 * holds its buffers afterwards.
 *
 * Returns: %TRUE on success, or %FALSE with %CP_BATCH_ERROR_CONTEXT_STATE
 *   when the context is not entered
 *
 * Since: 1.0
 */
gboolean
cp_context_exit (CpContext  *self,
                 GError    **error)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!self->entered)
    return set_state_error (error, "exit", "the context is not entered");
  for (guint i = 0; i < self->buffers->len; i++)
    restore_full_view (self, get_buffer (self, i));
  if (self->holds_buffers)
    release_buffers (self, self->buffers->len);
  self->holds_buffers = FALSE;
  set_entered (self, FALSE);
  return TRUE;
}

/**
 * cp_context_run:
 * @self: a context that is not entered
 * @func: (scope call) (closure user_data): the work to do while entered
 * @user_data: data for @func
 * @error: return location for a #GError
 *
 * Enters @self, calls @func, and exits, the pattern a `with` block gives
 * Python; for gjs and Vala. @func is not called when enter fails; exit
 * runs whenever enter succeeded.
 *
 * Returns: %TRUE when enter and exit succeeded
 *
 * Since: 1.0
 */
gboolean
cp_context_run (CpContext      *self,
                CpContextFunc   func,
                gpointer        user_data,
                GError        **error)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), FALSE);
  g_return_val_if_fail (func != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!cp_context_enter (self, error))
    return FALSE;
  func (self, user_data);
  return cp_context_exit (self, error);
}

/**
 * cp_context_unshard:
 * @self: a context
 * @tensor: this rank's head-tail piece, for example local logits
 * @seq_dim: its sequence dimension; negative values count from the last
 * @error: return location for a #GError
 *
 * Rebuilds the full, padded sequence from every rank's piece over the
 * context's group — the native `unshard_context_parallel_tensor`. Every
 * rank calls it together. Without context parallelism it returns @tensor
 * itself. Narrow the result to drop the padding.
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error on
 *   every rank
 *
 * Since: 1.0
 */
CpTensor *
cp_context_unshard (CpContext  *self,
                    CpTensor   *tensor,
                    int         seq_dim,
                    GError    **error)
{
  g_return_val_if_fail (CP_IS_CONTEXT (self), NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (self->mesh == NULL)
    return g_object_ref (tensor);
  return cp_mesh_unshard (self->mesh, tensor, seq_dim, error);
}

/**
 * cp_context_enter_async:
 * @self: a context that is not entered
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Context.enter] on a worker thread, so that one main
 * loop can drive every in-process rank. The context and its buffers
 * belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_context_enter_async (CpContext           *self,
                        GCancellable        *cancellable,
                        GAsyncReadyCallback  callback,
                        gpointer             user_data)
{
  g_return_if_fail (CP_IS_CONTEXT (self));

  _cp_task_start (self, self->mesh, "enter", cp_context_enter_async, _cp_task_run_plain,
                  &(CpTaskArgs) { .blocking = G_CALLBACK (cp_context_enter) },
                  cancellable, callback, user_data);
}

/**
 * cp_context_enter_finish:
 * @self: a context
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Context.enter_async].
 *
 * Returns: %TRUE when the buffers hold this rank's pieces; %FALSE with the
 *   errors of [method@Cp.Context.enter], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
gboolean
cp_context_enter_finish (CpContext     *self,
                         GAsyncResult  *result,
                         GError       **error)
{
  return _cp_task_finish (self, result, cp_context_enter_async, error, 0);
}

/**
 * cp_context_exit_async:
 * @self: an entered context
 * @cancellable: (nullable): cancels the call before it begins: it then
 *   fails on this rank alone with %CP_MESH_ERROR_CANCELLED, the context
 *   still entered, and the mesh is left whole
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Context.exit] on a worker thread. Exit does not wait
 * for the other ranks; the pair lets a program that drives its ranks from
 * a main loop chain every step of a context the same way. The context
 * and its buffers belong to the call until @callback runs.
 *
 * Since no peer waits in an exit, its cancellation concerns this rank
 * alone: the other ranks' exits succeed and their meshes work on, and
 * this rank may exit again. (A cancelled call that communicates breaks
 * the mesh on every rank instead, since peers may wait in it.)
 *
 * Since: 1.0
 */
void
cp_context_exit_async (CpContext           *self,
                       GCancellable        *cancellable,
                       GAsyncReadyCallback  callback,
                       gpointer             user_data)
{
  g_return_if_fail (CP_IS_CONTEXT (self));

  /* No mesh: the call waits on no peer, so a cancellation before it
   * begins has nothing to break (cp-task.c). */
  _cp_task_start (self, NULL, "exit", cp_context_exit_async, _cp_task_run_plain,
                  &(CpTaskArgs) { .blocking = G_CALLBACK (cp_context_exit) },
                  cancellable, callback, user_data);
}

/**
 * cp_context_exit_finish:
 * @self: a context
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Context.exit_async].
 *
 * Returns: %TRUE when the restorable buffers are whole again
 *
 * Since: 1.0
 */
gboolean
cp_context_exit_finish (CpContext     *self,
                        GAsyncResult  *result,
                        GError       **error)
{
  return _cp_task_finish (self, result, cp_context_exit_async, error, 0);
}

/**
 * cp_context_unshard_async:
 * @self: a context
 * @tensor: this rank's head-tail piece, for example local logits
 * @seq_dim: its sequence dimension; negative values count from the last
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Context.unshard] on a worker thread. The context and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_context_unshard_async (CpContext           *self,
                          CpTensor            *tensor,
                          int                  seq_dim,
                          GCancellable        *cancellable,
                          GAsyncReadyCallback  callback,
                          gpointer             user_data)
{
  g_return_if_fail (CP_IS_CONTEXT (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self->mesh, "unshard", cp_context_unshard_async, _cp_task_run_tensor,
                  &(CpTaskArgs) { G_CALLBACK (cp_context_unshard), { tensor }, { seq_dim } },
                  cancellable, callback, user_data);
}

/**
 * cp_context_unshard_finish:
 * @self: a context
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Context.unshard_async].
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_context_unshard_finish (CpContext     *self,
                           GAsyncResult  *result,
                           GError       **error)
{
  return _cp_task_finish_object (self, result, cp_context_unshard_async, error);
}
