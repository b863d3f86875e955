/* cp-batch.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-batch-private.h"
#include "cp-error.h"

/**
 * CpBatch:
 *
 * An ordered set of named tensors: one training batch.
 *
 * The keys the library knows are those of the reference:
 *
 * - `input_ids` `[B, S]` or `inputs_embeds` `[B, S, H]` — exactly one of
 *   them, the primary buffer;
 * - `labels` `[B, S]`;
 * - `position_ids` `[B, S]`, `[1, S]`, or multimodal (mRoPE) `[3, B, S]`
 *   whose sequence dimension is 2;
 * - `loss_mask`, `padding_mask` `[B, S]`; `attention_mask`, which a
 *   context-parallel prepare drops;
 * - `seq_lens` and `seq_lens_padded` `[B, N]` for packed documents
 *   ([method@Cp.Batch.to_thd]);
 * - any other key, an extra sequence buffer once
 *   [method@Cp.Batch.set_seq_dim] gives its sequence dimension (for
 *   example `teacher_logits` `[B, S, V]` on dimension 1).
 *
 * [method@Cp.Batch.prepare] is the native `make_cp_batch_and_ctx`: it pads
 * the batch to a multiple of 2·C and returns the [class@Cp.Context] whose
 * enter shards every sequence buffer in place. In Python a batch behaves
 * like a dict: `batch["input_ids"] = tensor`, `"labels" in batch`,
 * `del batch["attention_mask"]`, `batch.keys()`.
 *
 * A batch is not locked: use it from one thread at a time.
 *
 * Since: 1.0
 */

typedef struct
{
  char *key;
  CpTensor *tensor;
  gboolean marked;
  int seq_dim;
} Entry;

struct _CpBatch
{
  GObject parent_instance;

  GPtrArray *entries;    /* of Entry*, in insertion order */
  GPtrArray *keys;       /* NULL-terminated view of the entries' keys */
  char *qkv_format;
  GPtrArray *layouts;    /* of CpLayout*, set by to_thd when it shards */
};

G_DEFINE_FINAL_TYPE (CpBatch, cp_batch, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_QKV_FORMAT,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
entry_free (gpointer data)
{
  Entry *entry = data;

  g_free (entry->key);
  g_clear_object (&entry->tensor);
  g_free (entry);
}

static void
cp_batch_dispose (GObject *object)
{
  CpBatch *self = (CpBatch *) object;

  g_ptr_array_set_size (self->keys, 0);
  g_ptr_array_set_size (self->entries, 0);

  G_OBJECT_CLASS (cp_batch_parent_class)->dispose (object);
}

static void
cp_batch_finalize (GObject *object)
{
  CpBatch *self = (CpBatch *) object;

  g_ptr_array_unref (self->keys);
  g_ptr_array_unref (self->entries);
  g_free (self->qkv_format);
  g_clear_pointer (&self->layouts, g_ptr_array_unref);

  G_OBJECT_CLASS (cp_batch_parent_class)->finalize (object);
}

static void
cp_batch_get_property (GObject    *object,
                       guint       prop_id,
                       GValue     *value,
                       GParamSpec *pspec)
{
  CpBatch *self = CP_BATCH (object);

  switch (prop_id)
    {
    case PROP_QKV_FORMAT:
      g_value_set_string (value, self->qkv_format);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_batch_class_init (CpBatchClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->dispose = cp_batch_dispose;
  object_class->finalize = cp_batch_finalize;
  object_class->get_property = cp_batch_get_property;

  /**
   * CpBatch:qkv-format:
   *
   * The layout of the sequence buffers: `"bshd"` (padded rows, the
   * default) or `"thd"` for the packed batches [method@Cp.Batch.to_thd]
   * returns.
   *
   * Since: 1.0
   */
  properties[PROP_QKV_FORMAT] =
    g_param_spec_string ("qkv-format", NULL, NULL,
                         "bshd",
                         G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_batch_init (CpBatch *self)
{
  self->entries = g_ptr_array_new_with_free_func (entry_free);
  self->keys = g_ptr_array_new_null_terminated (8, NULL, TRUE);
  self->qkv_format = g_strdup ("bshd");
}

/**
 * cp_batch_new:
 *
 * Creates an empty batch.
 *
 * Returns: (transfer full): a new batch
 *
 * Since: 1.0
 */
CpBatch *
cp_batch_new (void)
{
  return g_object_new (CP_TYPE_BATCH, NULL);
}

static Entry *
find_entry (CpBatch    *self,
            const char *key,
            guint      *index)
{
  for (guint i = 0; i < self->entries->len; i++)
    {
      Entry *entry = g_ptr_array_index (self->entries, i);

      if (strcmp (entry->key, key) == 0)
        {
          if (index != NULL)
            *index = i;
          return entry;
        }
    }
  return NULL;
}

/**
 * cp_batch_set:
 * @self: a batch
 * @key: the key
 * @tensor: the tensor to store under @key
 *
 * Stores @tensor under @key. A new key goes last; an existing key keeps
 * its position and its sequence dimension.
 *
 * Since: 1.0
 */
void
cp_batch_set (CpBatch    *self,
              const char *key,
              CpTensor   *tensor)
{
  Entry *entry;

  g_return_if_fail (CP_IS_BATCH (self));
  g_return_if_fail (key != NULL);
  g_return_if_fail (CP_IS_TENSOR (tensor));

  entry = find_entry (self, key, NULL);
  if (entry != NULL)
    {
      g_set_object (&entry->tensor, tensor);
      return;
    }
  entry = g_new0 (Entry, 1);
  entry->key = g_strdup (key);
  entry->tensor = g_object_ref (tensor);
  g_ptr_array_add (self->entries, entry);
  g_ptr_array_add (self->keys, entry->key);
}

/**
 * cp_batch_get:
 * @self: a batch
 * @key: the key
 *
 * Looks up a tensor.
 *
 * Returns: (transfer none) (nullable): the tensor stored under @key, or
 *   %NULL
 *
 * Since: 1.0
 */
CpTensor *
cp_batch_get (CpBatch    *self,
              const char *key)
{
  Entry *entry;

  g_return_val_if_fail (CP_IS_BATCH (self), NULL);
  g_return_val_if_fail (key != NULL, NULL);

  entry = find_entry (self, key, NULL);
  return entry != NULL ? entry->tensor : NULL;
}

/**
 * cp_batch_remove:
 * @self: a batch
 * @key: the key
 *
 * Removes @key and its sequence dimension, if any.
 *
 * Returns: %TRUE when @key was present
 *
 * Since: 1.0
 */
gboolean
cp_batch_remove (CpBatch    *self,
                 const char *key)
{
  guint index;

  g_return_val_if_fail (CP_IS_BATCH (self), FALSE);
  g_return_val_if_fail (key != NULL, FALSE);

  if (find_entry (self, key, &index) == NULL)
    return FALSE;
  g_ptr_array_remove_index (self->keys, index);
  g_ptr_array_remove_index (self->entries, index);
  return TRUE;
}

/**
 * cp_batch_contains:
 * @self: a batch
 * @key: the key
 *
 * Tells whether @key is present.
 *
 * Returns: %TRUE when the batch holds a tensor under @key
 *
 * Since: 1.0
 */
gboolean
cp_batch_contains (CpBatch    *self,
                   const char *key)
{
  g_return_val_if_fail (CP_IS_BATCH (self), FALSE);
  g_return_val_if_fail (key != NULL, FALSE);

  return find_entry (self, key, NULL) != NULL;
}

/**
 * cp_batch_get_keys:
 * @self: a batch
 *
 * Gets the keys in insertion order. The array changes when keys are added
 * or removed.
 *
 * Returns: (transfer none) (array zero-terminated=1): the keys
 *
 * Since: 1.0
 */
const char * const *
cp_batch_get_keys (CpBatch *self)
{
  g_return_val_if_fail (CP_IS_BATCH (self), NULL);

  return (const char * const *) self->keys->pdata;
}

/**
 * cp_batch_dup_keys:
 * @self: a batch
 *
 * Copies the keys in insertion order. Unlike [method@Cp.Batch.get_keys],
 * the copy stays as it is when keys are added or removed; bindings whose
 * string arrays are not const (Vala) call this one.
 *
 * Returns: (transfer full) (array zero-terminated=1): the keys; free with
 *   g_strfreev()
 *
 * Since: 1.0
 */
char **
cp_batch_dup_keys (CpBatch *self)
{
  g_return_val_if_fail (CP_IS_BATCH (self), NULL);

  return g_strdupv ((char **) self->keys->pdata);
}

/**
 * cp_batch_get_n_keys:
 * @self: a batch
 *
 * Gets the number of keys.
 *
 * Returns: the number of tensors in the batch
 *
 * Since: 1.0
 */
guint
cp_batch_get_n_keys (CpBatch *self)
{
  g_return_val_if_fail (CP_IS_BATCH (self), 0);

  return self->entries->len;
}

/**
 * cp_batch_set_seq_dim:
 * @self: a batch
 * @key: a key present in the batch
 * @seq_dim: its sequence dimension; negative values count from the last
 *
 * Marks the tensor under @key as an extra sequence buffer:
 * [method@Cp.Batch.prepare] pads it with zeros and registers it along
 * @seq_dim, after the standard buffers and any
 * [method@Cp.BatchOptions.add_extra_buffer] keys. The mark stays when the
 * tensor under @key is replaced and goes when the key is removed.
 *
 * Since: 1.0
 */
void
cp_batch_set_seq_dim (CpBatch    *self,
                      const char *key,
                      int         seq_dim)
{
  Entry *entry;

  g_return_if_fail (CP_IS_BATCH (self));
  g_return_if_fail (key != NULL);

  entry = find_entry (self, key, NULL);
  g_return_if_fail (entry != NULL);
  entry->marked = TRUE;
  entry->seq_dim = seq_dim;
}

/**
 * cp_batch_get_seq_dim:
 * @self: a batch
 * @key: a key
 * @seq_dim: (out) (optional): the dimension given to
 *   [method@Cp.Batch.set_seq_dim]
 *
 * Tells whether @key is marked as an extra sequence buffer.
 *
 * Returns: %TRUE when @key is present and marked
 *
 * Since: 1.0
 */
gboolean
cp_batch_get_seq_dim (CpBatch    *self,
                      const char *key,
                      int        *seq_dim)
{
  Entry *entry;

  g_return_val_if_fail (CP_IS_BATCH (self), FALSE);
  g_return_val_if_fail (key != NULL, FALSE);

  entry = find_entry (self, key, NULL);
  if (entry == NULL || !entry->marked)
    return FALSE;
  if (seq_dim != NULL)
    *seq_dim = entry->seq_dim;
  return TRUE;
}

/**
 * cp_batch_get_qkv_format:
 * @self: a batch
 *
 * Gets [property@Cp.Batch:qkv-format].
 *
 * Returns: `"bshd"` or `"thd"`
 *
 * Since: 1.0
 */
const char *
cp_batch_get_qkv_format (CpBatch *self)
{
  g_return_val_if_fail (CP_IS_BATCH (self), NULL);

  return self->qkv_format;
}

void
_cp_batch_set_qkv_format (CpBatch    *self,
                          const char *qkv_format)
{
  if (g_strcmp0 (self->qkv_format, qkv_format) == 0)
    return;
  g_free (self->qkv_format);
  self->qkv_format = g_strdup (qkv_format);
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_QKV_FORMAT]);
}

GPtrArray *
_cp_batch_dup_marked_keys (CpBatch *self)
{
  GPtrArray *keys = g_ptr_array_new_with_free_func (g_free);

  for (guint i = 0; i < self->entries->len; i++)
    {
      Entry *entry = g_ptr_array_index (self->entries, i);

      if (entry->marked)
        g_ptr_array_add (keys, g_strdup (entry->key));
    }
  return keys;
}

CpTensor *
_cp_batch_get_primary (CpBatch     *self,
                       const char  *what,
                       const char **key,
                       GError     **error)
{
  gboolean ids = cp_batch_contains (self, "input_ids");
  gboolean embeds = cp_batch_contains (self, "inputs_embeds");

  if (ids == embeds)
    {
      g_set_error (error, CP_BATCH_ERROR,
                   ids ? CP_BATCH_ERROR_CONFLICTING_KEYS : CP_BATCH_ERROR_MISSING_KEY,
                   "%s: the batch has %s 'input_ids' %s 'inputs_embeds'; "
                   "it needs exactly one of them", what, ids ? "both" : "neither", ids ? "and" : "nor");
      return NULL;
    }
  *key = ids ? "input_ids" : "inputs_embeds";
  return cp_batch_get (self, *key);
}

gboolean
_cp_batch_shape_error (GError     **error,
                       const char  *what,
                       const char  *key,
                       CpTensor    *tensor,
                       const char  *need)
{
  g_autofree char *description = cp_tensor_describe (tensor);

  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
               "%s: '%s' is %s; it must be %s", what, key, description, need);
  return FALSE;
}

void
_cp_batch_set_layouts (CpBatch   *self,
                       GPtrArray *layouts)
{
  g_clear_pointer (&self->layouts, g_ptr_array_unref);
  self->layouts = layouts;
}

/**
 * cp_batch_get_layout:
 * @self: a batch returned by [method@Cp.Batch.to_thd]
 * @chunk: the chunk, below [property@Cp.ThdOptions:num-chunks]
 *
 * Gets the per-document head-tail layout [method@Cp.Batch.to_thd] sharded
 * a chunk with: which positions each rank holds, and, through
 * [method@Cp.Layout.get_cost] and [method@Cp.Layout.get_imbalance], the
 * causal-attention work of each rank for the packed documents.
 *
 * Returns: (transfer none) (nullable): the layout, or %NULL when the batch
 *   was not sharded by [method@Cp.Batch.to_thd] or @chunk is out of range
 *
 * Since: 1.0
 */
CpLayout *
cp_batch_get_layout (CpBatch *self,
                     guint    chunk)
{
  g_return_val_if_fail (CP_IS_BATCH (self), NULL);

  if (self->layouts == NULL || chunk >= self->layouts->len)
    return NULL;
  return g_ptr_array_index (self->layouts, chunk);
}
