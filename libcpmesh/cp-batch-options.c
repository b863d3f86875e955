/* cp-batch-options.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-batch-options-private.h"
#include "cp-enum-types.h"
#include "cp-error.h"

/**
 * CpBatchOptions:
 *
 * The options of [method@Cp.Batch.prepare], the arguments of the
 * reference `make_cp_batch_and_ctx` that are not the batch itself.
 *
 * - [property@Cp.BatchOptions:loss-mask]: a loss mask that is not a batch
 *   key. Prepare pads and registers it like the other buffers, in place,
 *   so the caller's tensor is the padded and, inside the context, sharded
 *   one.
 * - [property@Cp.BatchOptions:rotate-method]: how attention moves keys and
 *   values; it becomes the context's own setting. A value outside
 *   [enum@Cp.RotateMethod], or an unknown name given to
 *   [method@Cp.BatchOptions.set_rotate_method_name], makes prepare fail
 *   with %CP_BATCH_ERROR_INVALID_OPTION.
 * - extra sequence buffers ([method@Cp.BatchOptions.add_extra_buffer]):
 *   batch keys registered with their sequence dimension, in order, such as
 *   teacher logits `[B, S, V]` on dimension 1. A key missing from the
 *   batch is an error. [method@Cp.Batch.set_seq_dim] marks extra buffers
 *   on the batch itself.
 *
 * In Python: `Cp.BatchOptions(loss_mask=mask, rotate_method=Cp.RotateMethod.ALLTOALL)`.
 *
 * Since: 1.0
 */

typedef struct
{
  char *key;
  int seq_dim;
} Extra;

struct _CpBatchOptions
{
  GObject parent_instance;

  CpTensor *loss_mask;
  int rotate_method;     /* not an enum: an out-of-range value is reported */
  char *rotate_name;     /* an unknown name, kept for the error message */
  GArray *extras;        /* of Extra */
};

G_DEFINE_FINAL_TYPE (CpBatchOptions, cp_batch_options, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_LOSS_MASK,
  PROP_ROTATE_METHOD,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
extra_clear (gpointer data)
{
  g_free (((Extra *) data)->key);
}

static void
cp_batch_options_dispose (GObject *object)
{
  CpBatchOptions *self = (CpBatchOptions *) object;

  g_clear_object (&self->loss_mask);

  G_OBJECT_CLASS (cp_batch_options_parent_class)->dispose (object);
}

static void
cp_batch_options_finalize (GObject *object)
{
  CpBatchOptions *self = (CpBatchOptions *) object;

  g_free (self->rotate_name);
  g_array_unref (self->extras);

  G_OBJECT_CLASS (cp_batch_options_parent_class)->finalize (object);
}

static void
cp_batch_options_get_property (GObject    *object,
                               guint       prop_id,
                               GValue     *value,
                               GParamSpec *pspec)
{
  CpBatchOptions *self = CP_BATCH_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_LOSS_MASK:
      g_value_set_object (value, self->loss_mask);
      break;
    case PROP_ROTATE_METHOD:
      g_value_set_enum (value, self->rotate_method);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_batch_options_set_property (GObject      *object,
                               guint         prop_id,
                               const GValue *value,
                               GParamSpec   *pspec)
{
  CpBatchOptions *self = CP_BATCH_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_LOSS_MASK:
      cp_batch_options_set_loss_mask (self, g_value_get_object (value));
      break;
    case PROP_ROTATE_METHOD:
      cp_batch_options_set_rotate_method (self, g_value_get_enum (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_batch_options_class_init (CpBatchOptionsClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->dispose = cp_batch_options_dispose;
  object_class->finalize = cp_batch_options_finalize;
  object_class->get_property = cp_batch_options_get_property;
  object_class->set_property = cp_batch_options_set_property;

  /**
   * CpBatchOptions:loss-mask:
   *
   * A loss mask `[B, S]` that is not a batch key, or %NULL. Prepare pads
   * it with zeros and registers it after the position ids, without
   * restore, so the same tensor object is padded and then sharded.
   *
   * Since: 1.0
   */
  properties[PROP_LOSS_MASK] =
    g_param_spec_object ("loss-mask", NULL, NULL,
                         CP_TYPE_TENSOR,
                         G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  /**
   * CpBatchOptions:rotate-method:
   *
   * How attention under the prepared context moves keys and values.
   *
   * Since: 1.0
   */
  properties[PROP_ROTATE_METHOD] =
    g_param_spec_enum ("rotate-method", NULL, NULL,
                       CP_TYPE_ROTATE_METHOD, CP_ROTATE_METHOD_ALLGATHER,
                       G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_batch_options_init (CpBatchOptions *self)
{
  self->rotate_method = CP_ROTATE_METHOD_ALLGATHER;
  self->extras = g_array_new (FALSE, FALSE, sizeof (Extra));
  g_array_set_clear_func (self->extras, extra_clear);
}

/**
 * cp_batch_options_new:
 *
 * Creates options with the reference defaults: no loss mask, rotate
 * method %CP_ROTATE_METHOD_ALLGATHER, no extra buffers.
 *
 * Returns: (transfer full): new options
 *
 * Since: 1.0
 */
CpBatchOptions *
cp_batch_options_new (void)
{
  return g_object_new (CP_TYPE_BATCH_OPTIONS, NULL);
}

/**
 * cp_batch_options_get_loss_mask:
 * @self: options
 *
 * Gets the loss mask prepare registers.
 *
 * Returns: (transfer none) (nullable): the loss mask
 *
 * Since: 1.0
 */
CpTensor *
cp_batch_options_get_loss_mask (CpBatchOptions *self)
{
  g_return_val_if_fail (CP_IS_BATCH_OPTIONS (self), NULL);

  return self->loss_mask;
}

/**
 * cp_batch_options_set_loss_mask:
 * @self: options
 * @loss_mask: (nullable): a loss mask `[B, S]`, or %NULL
 *
 * Sets the loss mask prepare pads and registers in place.
 *
 * Since: 1.0
 */
void
cp_batch_options_set_loss_mask (CpBatchOptions *self,
                                CpTensor       *loss_mask)
{
  g_return_if_fail (CP_IS_BATCH_OPTIONS (self));
  g_return_if_fail (loss_mask == NULL || CP_IS_TENSOR (loss_mask));

  if (g_set_object (&self->loss_mask, loss_mask))
    g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_LOSS_MASK]);
}

/**
 * cp_batch_options_get_rotate_method:
 * @self: options
 *
 * Gets the rotate method the prepared context will carry.
 *
 * Returns: the rotate method
 *
 * Since: 1.0
 */
CpRotateMethod
cp_batch_options_get_rotate_method (CpBatchOptions *self)
{
  g_return_val_if_fail (CP_IS_BATCH_OPTIONS (self), CP_ROTATE_METHOD_ALLGATHER);

  return (CpRotateMethod) self->rotate_method;
}

static void
store_rotate_method (CpBatchOptions *self,
                     int             rotate_method,
                     const char     *unknown_name)
{
  g_free (self->rotate_name);
  self->rotate_name = g_strdup (unknown_name);
  if (self->rotate_method == rotate_method)
    return;
  self->rotate_method = rotate_method;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_ROTATE_METHOD]);
}

/**
 * cp_batch_options_set_rotate_method:
 * @self: options
 * @rotate_method: how attention moves keys and values
 *
 * Sets the rotate method. The value is checked by
 * [method@Cp.Batch.prepare], which rejects one outside
 * [enum@Cp.RotateMethod] with %CP_BATCH_ERROR_INVALID_OPTION.
 *
 * Since: 1.0
 */
void
cp_batch_options_set_rotate_method (CpBatchOptions *self,
                                    CpRotateMethod  rotate_method)
{
  g_return_if_fail (CP_IS_BATCH_OPTIONS (self));

  store_rotate_method (self, (int) rotate_method, NULL);
}

/* Out of the enumeration's range, so prepare reports the name. */
#define UNKNOWN_ROTATE_METHOD (-1)

/**
 * cp_batch_options_set_rotate_method_name:
 * @self: options
 * @name: `"allgather"` or `"alltoall"`, as configuration files spell them
 *
 * Sets the rotate method by name. An unknown name is kept and reported by
 * [method@Cp.Batch.prepare] with %CP_BATCH_ERROR_INVALID_OPTION, as the
 * reference rejects it when its context is created.
 *
 * Since: 1.0
 */
void
cp_batch_options_set_rotate_method_name (CpBatchOptions *self,
                                         const char     *name)
{
  g_return_if_fail (CP_IS_BATCH_OPTIONS (self));
  g_return_if_fail (name != NULL);

  if (g_strcmp0 (name, "allgather") == 0)
    store_rotate_method (self, CP_ROTATE_METHOD_ALLGATHER, NULL);
  else if (g_strcmp0 (name, "alltoall") == 0)
    store_rotate_method (self, CP_ROTATE_METHOD_ALLTOALL, NULL);
  else
    store_rotate_method (self, UNKNOWN_ROTATE_METHOD, name);
}

/**
 * cp_batch_options_add_extra_buffer:
 * @self: options
 * @key: a batch key, for example `"teacher_logits"`
 * @seq_dim: its sequence dimension; negative values count from the last
 *
 * Asks prepare to pad and register the batch entry @key along @seq_dim,
 * after the standard buffers and in the order added. Prepare fails with
 * %CP_BATCH_ERROR_MISSING_KEY when the batch has no such key.
 *
 * Since: 1.0
 */
void
cp_batch_options_add_extra_buffer (CpBatchOptions *self,
                                   const char     *key,
                                   int             seq_dim)
{
  Extra extra;

  g_return_if_fail (CP_IS_BATCH_OPTIONS (self));
  g_return_if_fail (key != NULL);

  extra.key = g_strdup (key);
  extra.seq_dim = seq_dim;
  g_array_append_val (self->extras, extra);
}

/**
 * cp_batch_options_get_n_extra_buffers:
 * @self: options
 *
 * Gets how many extra buffers were added.
 *
 * Returns: the number of extra buffers
 *
 * Since: 1.0
 */
guint
cp_batch_options_get_n_extra_buffers (CpBatchOptions *self)
{
  g_return_val_if_fail (CP_IS_BATCH_OPTIONS (self), 0);

  return self->extras->len;
}

/**
 * cp_batch_options_get_extra_buffer:
 * @self: options
 * @index: below [method@Cp.BatchOptions.get_n_extra_buffers]
 * @seq_dim: (out) (optional): its sequence dimension
 *
 * Gets an extra buffer, in the order added.
 *
 * Returns: the batch key
 *
 * Since: 1.0
 */
const char *
cp_batch_options_get_extra_buffer (CpBatchOptions *self,
                                   guint           index,
                                   int            *seq_dim)
{
  const Extra *extra;

  g_return_val_if_fail (CP_IS_BATCH_OPTIONS (self), NULL);
  g_return_val_if_fail (index < self->extras->len, NULL);

  extra = &g_array_index (self->extras, Extra, index);
  if (seq_dim != NULL)
    *seq_dim = extra->seq_dim;
  return extra->key;
}

gboolean
_cp_batch_options_check (CpBatchOptions  *self,
                         GError         **error)
{
  if (self == NULL || (self->rotate_method >= CP_ROTATE_METHOD_ALLGATHER &&
                       self->rotate_method <= CP_ROTATE_METHOD_ALLTOALL))
    return TRUE;
  if (self->rotate_name != NULL)
    g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_OPTION,
                 "context parallelism does not support \"%s\" for the key/value rotation; "
                 "use \"allgather\" or \"alltoall\"", self->rotate_name);
  else
    g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_OPTION,
                 "rotate method %d is not a CpRotateMethod; use %d (ALLGATHER) or %d (ALLTOALL)",
                 self->rotate_method, CP_ROTATE_METHOD_ALLGATHER, CP_ROTATE_METHOD_ALLTOALL);
  return FALSE;
}
