/* cp-attention-options.c: the settings of a CpAttention
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "cp-attention-private.h"
#include "cp-enum-types.h"
#include "cp-error.h"

/**
 * CpAttentionOptions:
 *
 * The settings of a [class@Cp.Attention]: causal or not, the softmax
 * scale, how keys and values travel between ranks, the head counts for
 * grouped-query attention, the layout of the sequence and which positions
 * are padding.
 *
 * The defaults are causal attention, scale 1/√D, %CP_ROTATE_METHOD_ALLGATHER,
 * %CP_LOAD_BALANCE_HEAD_TAIL, head counts taken from the tensors, no
 * padding, and an automatic thread count.
 *
 * Every single-valued setting is also a property, so bindings can set
 * them at construction — in Python
 * `Cp.AttentionOptions(causal=False, rotate_method=Cp.RotateMethod.ALLTOALL)` —
 * while the length arrays (real lengths and document bounds) have only
 * their setters. [ctor@Cp.Attention.new] copies the options, so changing
 * them later does not change an operator.
 *
 * Since: 1.0
 */

G_DEFINE_FINAL_TYPE (CpAttentionOptions, cp_attention_options, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_CAUSAL,
  PROP_SCALE,
  PROP_ROTATE_METHOD,
  PROP_LOAD_BALANCE,
  PROP_N_HEADS,
  PROP_N_KV_HEADS,
  PROP_N_THREADS,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

/* The getters take const options, as they did when the type was boxed;
 * the type checks take a plain pointer. */
#define IS_OPTIONS(self) CP_IS_ATTENTION_OPTIONS ((gpointer) (self))

static void
cp_attention_options_finalize (GObject *object)
{
  CpAttentionOptions *self = (CpAttentionOptions *) object;

  g_clear_pointer (&self->seq_lens, g_array_unref);
  g_clear_pointer (&self->cu_seqlens_padded, g_array_unref);
  g_clear_pointer (&self->cu_seqlens, g_array_unref);

  G_OBJECT_CLASS (cp_attention_options_parent_class)->finalize (object);
}

static void
cp_attention_options_get_property (GObject    *object,
                                   guint       prop_id,
                                   GValue     *value,
                                   GParamSpec *pspec)
{
  CpAttentionOptions *self = CP_ATTENTION_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_CAUSAL:
      g_value_set_boolean (value, self->causal);
      break;
    case PROP_SCALE:
      g_value_set_double (value, self->scale);
      break;
    case PROP_ROTATE_METHOD:
      g_value_set_enum (value, self->rotate_method);
      break;
    case PROP_LOAD_BALANCE:
      g_value_set_enum (value, self->balance);
      break;
    case PROP_N_HEADS:
      g_value_set_int (value, self->n_heads);
      break;
    case PROP_N_KV_HEADS:
      g_value_set_int (value, self->n_kv_heads);
      break;
    case PROP_N_THREADS:
      g_value_set_int (value, self->n_threads);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_attention_options_set_property (GObject      *object,
                                   guint         prop_id,
                                   const GValue *value,
                                   GParamSpec   *pspec)
{
  CpAttentionOptions *self = CP_ATTENTION_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_CAUSAL:
      cp_attention_options_set_causal (self, g_value_get_boolean (value));
      break;
    case PROP_SCALE:
      cp_attention_options_set_scale (self, g_value_get_double (value));
      break;
    case PROP_ROTATE_METHOD:
      cp_attention_options_set_rotate_method (self, g_value_get_enum (value));
      break;
    case PROP_LOAD_BALANCE:
      cp_attention_options_set_load_balance (self, g_value_get_enum (value));
      break;
    case PROP_N_HEADS:
      cp_attention_options_set_heads (self, g_value_get_int (value), self->n_kv_heads);
      break;
    case PROP_N_KV_HEADS:
      cp_attention_options_set_heads (self, self->n_heads, g_value_get_int (value));
      break;
    case PROP_N_THREADS:
      cp_attention_options_set_n_threads (self, g_value_get_int (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_attention_options_class_init (CpAttentionOptionsClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);
  GParamFlags flags = G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS;

  object_class->finalize = cp_attention_options_finalize;
  object_class->get_property = cp_attention_options_get_property;
  object_class->set_property = cp_attention_options_set_property;

  /**
   * CpAttentionOptions:causal:
   *
   * Whether a query attends only to keys at or before its position; see
   * [method@Cp.AttentionOptions.set_causal].
   *
   * Since: 1.0
   */
  properties[PROP_CAUSAL] = g_param_spec_boolean ("causal", NULL, NULL, TRUE, flags);

  /**
   * CpAttentionOptions:scale:
   *
   * The softmax scale, or 0 for 1/√D; see
   * [method@Cp.AttentionOptions.set_scale].
   *
   * Since: 1.0
   */
  properties[PROP_SCALE] = g_param_spec_double ("scale", NULL, NULL, 0.0, G_MAXDOUBLE, 0.0, flags);

  /**
   * CpAttentionOptions:rotate-method:
   *
   * How keys and values move between ranks:
   * %CP_ROTATE_METHOD_ALLGATHER or %CP_ROTATE_METHOD_ALLTOALL.
   *
   * Since: 1.0
   */
  properties[PROP_ROTATE_METHOD] =
    g_param_spec_enum ("rotate-method", NULL, NULL,
                       CP_TYPE_ROTATE_METHOD, CP_ROTATE_METHOD_ALLGATHER, flags);

  /**
   * CpAttentionOptions:load-balance:
   *
   * The layout of an unpacked sequence over the ranks.
   *
   * Since: 1.0
   */
  properties[PROP_LOAD_BALANCE] =
    g_param_spec_enum ("load-balance", NULL, NULL,
                       CP_TYPE_LOAD_BALANCE, CP_LOAD_BALANCE_HEAD_TAIL, flags);

  /**
   * CpAttentionOptions:n-heads:
   *
   * The number of query heads the tensors must have, or 0 to take it from
   * the query; see [method@Cp.AttentionOptions.set_heads].
   *
   * Since: 1.0
   */
  properties[PROP_N_HEADS] = g_param_spec_int ("n-heads", NULL, NULL, 0, G_MAXINT, 0, flags);

  /**
   * CpAttentionOptions:n-kv-heads:
   *
   * The number of key/value heads the tensors must have, or 0 to take it
   * from the keys.
   *
   * Since: 1.0
   */
  properties[PROP_N_KV_HEADS] = g_param_spec_int ("n-kv-heads", NULL, NULL, 0, G_MAXINT, 0, flags);

  /**
   * CpAttentionOptions:n-threads:
   *
   * Threads per rank, or 0 for automatic; see
   * [method@Cp.AttentionOptions.set_n_threads].
   *
   * Since: 1.0
   */
  properties[PROP_N_THREADS] = g_param_spec_int ("n-threads", NULL, NULL, 0, G_MAXINT, 0, flags);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_attention_options_init (CpAttentionOptions *self)
{
  self->causal = TRUE;
  self->rotate_method = CP_ROTATE_METHOD_ALLGATHER;
  self->balance = CP_LOAD_BALANCE_HEAD_TAIL;
}

/**
 * cp_attention_options_new:
 *
 * Creates options with the defaults listed in [class@Cp.AttentionOptions].
 *
 * Returns: (transfer full): new options
 *
 * Since: 1.0
 */
CpAttentionOptions *
cp_attention_options_new (void)
{
  return g_object_new (CP_TYPE_ATTENTION_OPTIONS, NULL);
}

static GArray *
copy_lengths (const gint64 *values,
              gsize         n)
{
  GArray *array = g_array_sized_new (FALSE, FALSE, sizeof (gint64), (guint) n);

  g_array_append_vals (array, values, (guint) n);
  return array;
}

static GArray *
dup_lengths (GArray *array)
{
  return array ? copy_lengths ((const gint64 *) array->data, array->len) : NULL;
}

/**
 * cp_attention_options_copy:
 * @self: options
 *
 * Copies @self: new options with the same settings, which change
 * independently of @self.
 *
 * Returns: (transfer full): a copy
 *
 * Since: 1.0
 */
CpAttentionOptions *
cp_attention_options_copy (const CpAttentionOptions *self)
{
  CpAttentionOptions *copy;

  g_return_val_if_fail (IS_OPTIONS (self), NULL);

  copy = cp_attention_options_new ();
  copy->causal = self->causal;
  copy->scale = self->scale;
  copy->rotate_method = self->rotate_method;
  copy->balance = self->balance;
  copy->n_heads = self->n_heads;
  copy->n_kv_heads = self->n_kv_heads;
  copy->n_threads = self->n_threads;
  copy->seq_lens = dup_lengths (self->seq_lens);
  copy->cu_seqlens_padded = dup_lengths (self->cu_seqlens_padded);
  copy->cu_seqlens = dup_lengths (self->cu_seqlens);
  return copy;
}

/* Stores @value in @slot and notifies @prop when it changes. */
static void
set_int (CpAttentionOptions *self,
         int                *slot,
         int                 value,
         int                 prop)
{
  if (*slot == value)
    return;
  *slot = value;
  g_object_notify_by_pspec (G_OBJECT (self), properties[prop]);
}

/**
 * cp_attention_options_get_causal:
 * @self: options
 *
 * Gets whether a query attends only to keys at or before its position.
 *
 * Returns: %TRUE for causal attention
 *
 * Since: 1.0
 */
gboolean
cp_attention_options_get_causal (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), FALSE);

  return self->causal;
}

/**
 * cp_attention_options_set_causal:
 * @self: options
 * @causal: %TRUE for causal attention (the default)
 *
 * Sets whether a query attends only to keys at or before its global
 * position. Either way, queries of a packed document see only keys of
 * the same document.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_causal (CpAttentionOptions *self,
                                 gboolean            causal)
{
  g_return_if_fail (IS_OPTIONS (self));

  set_int (self, &self->causal, !!causal, PROP_CAUSAL);
}

/**
 * cp_attention_options_get_scale:
 * @self: options
 *
 * Gets the softmax scale; 0 stands for 1/√D.
 *
 * Returns: the scale
 *
 * Since: 1.0
 */
double
cp_attention_options_get_scale (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), 0.0);

  return self->scale;
}

/**
 * cp_attention_options_set_scale:
 * @self: options
 * @scale: the factor applied to Q·Kᵀ before the softmax, or 0 (the
 *   default) for 1/√D with D the head dimension
 *
 * Sets the softmax scale.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_scale (CpAttentionOptions *self,
                                double              scale)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (scale >= 0.0 && isfinite (scale));

  if (self->scale == scale)
    return;
  self->scale = scale;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_SCALE]);
}

/**
 * cp_attention_options_get_rotate_method:
 * @self: options
 *
 * Gets how keys and values move between ranks.
 *
 * Returns: the rotate method
 *
 * Since: 1.0
 */
CpRotateMethod
cp_attention_options_get_rotate_method (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), CP_ROTATE_METHOD_ALLGATHER);

  return self->rotate_method;
}

/**
 * cp_attention_options_set_rotate_method:
 * @self: options
 * @method: %CP_ROTATE_METHOD_ALLGATHER (the default: one all-gather of
 *   K and V) or %CP_ROTATE_METHOD_ALLTOALL (the ring)
 *
 * Sets how keys and values move between ranks.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_rotate_method (CpAttentionOptions *self,
                                        CpRotateMethod      method)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (method == CP_ROTATE_METHOD_ALLGATHER || method == CP_ROTATE_METHOD_ALLTOALL);

  set_int (self, (int *) &self->rotate_method, method, PROP_ROTATE_METHOD);
}

/**
 * cp_attention_options_get_load_balance:
 * @self: options
 *
 * Gets the layout of an unpacked sequence over the ranks.
 *
 * Returns: the load-balancing scheme
 *
 * Since: 1.0
 */
CpLoadBalance
cp_attention_options_get_load_balance (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), CP_LOAD_BALANCE_HEAD_TAIL);

  return self->balance;
}

/**
 * cp_attention_options_set_load_balance:
 * @self: options
 * @balance: the layout the local [B, H, S, D] pieces follow
 *
 * Sets the layout of an unpacked sequence over the ranks, as
 * [ctor@Cp.Layout.new] builds it. Packed documents always use the
 * per-document head-tail layout.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_load_balance (CpAttentionOptions *self,
                                       CpLoadBalance       balance)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (balance == CP_LOAD_BALANCE_HEAD_TAIL || balance == CP_LOAD_BALANCE_CONTIGUOUS);

  set_int (self, (int *) &self->balance, balance, PROP_LOAD_BALANCE);
}

/**
 * cp_attention_options_get_n_heads:
 * @self: options
 *
 * Gets the number of query heads the tensors must have; 0 takes it from
 * the query tensor.
 *
 * Returns: the query head count, or 0
 *
 * Since: 1.0
 */
int
cp_attention_options_get_n_heads (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), 0);

  return self->n_heads;
}

/**
 * cp_attention_options_get_n_kv_heads:
 * @self: options
 *
 * Gets the number of key/value heads the tensors must have; 0 takes it
 * from the key tensor.
 *
 * Returns: the key/value head count, or 0
 *
 * Since: 1.0
 */
int
cp_attention_options_get_n_kv_heads (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), 0);

  return self->n_kv_heads;
}

/**
 * cp_attention_options_set_heads:
 * @self: options
 * @n_heads: the number of query heads, or 0 to take it from the query
 * @n_kv_heads: the number of key/value heads, or 0 to take it from the
 *   keys; fewer than @n_heads is grouped-query attention (1 is
 *   multi-query attention)
 *
 * Declares the head counts, which the tensors are then checked against.
 * Query head h uses key/value head h / (@n_heads / @n_kv_heads); keys and
 * values are never expanded to @n_heads, neither in memory nor on the
 * wire.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_heads (CpAttentionOptions *self,
                                int                 n_heads,
                                int                 n_kv_heads)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (n_heads >= 0 && n_kv_heads >= 0);

  g_object_freeze_notify (G_OBJECT (self));
  set_int (self, &self->n_heads, n_heads, PROP_N_HEADS);
  set_int (self, &self->n_kv_heads, n_kv_heads, PROP_N_KV_HEADS);
  g_object_thaw_notify (G_OBJECT (self));
}

/**
 * cp_attention_options_get_n_threads:
 * @self: options
 *
 * Gets the number of threads each rank computes with; 0 is automatic.
 *
 * Returns: the thread count, or 0
 *
 * Since: 1.0
 */
int
cp_attention_options_get_n_threads (const CpAttentionOptions *self)
{
  g_return_val_if_fail (IS_OPTIONS (self), 0);

  return self->n_threads;
}

/**
 * cp_attention_options_set_n_threads:
 * @self: options
 * @n_threads: threads per rank, or 0 (the default) for the processors of
 *   the machine divided by the ranks that share them
 *
 * Sets how many threads each rank computes with. The ranks of an
 * in-process mesh are already threads, so the automatic count divides the
 * processors among them rather than oversubscribing the machine; ranks in
 * processes of their own divide them by the launcher's
 * `LOCAL_WORLD_SIZE` (or `OMPI_COMM_WORLD_LOCAL_SIZE`) when it is set.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_n_threads (CpAttentionOptions *self,
                                    int                 n_threads)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (n_threads >= 0);

  set_int (self, &self->n_threads, n_threads, PROP_N_THREADS);
}

static const gint64 *
lengths_data (GArray *array,
              gsize  *n)
{
  if (n != NULL)
    *n = array ? array->len : 0;
  return array ? (const gint64 *) array->data : NULL;
}

static void
replace_lengths (GArray       **slot,
                 const gint64  *values,
                 gsize          n)
{
  g_clear_pointer (slot, g_array_unref);
  if (values != NULL && n > 0)
    *slot = copy_lengths (values, n);
}

/**
 * cp_attention_options_get_seq_lens:
 * @self: options
 * @n_seq_lens: (out) (optional): the number of lengths
 *
 * Gets the real sequence length of each batch row.
 *
 * Returns: (array length=n_seq_lens) (nullable) (transfer none): the
 *   lengths, or %NULL when every position is real
 *
 * Since: 1.0
 */
const gint64 *
cp_attention_options_get_seq_lens (const CpAttentionOptions *self,
                                   gsize                    *n_seq_lens)
{
  g_return_val_if_fail (IS_OPTIONS (self), NULL);

  return lengths_data (self->seq_lens, n_seq_lens);
}

/**
 * cp_attention_options_set_seq_lens:
 * @self: options
 * @seq_lens: (array length=n_seq_lens) (nullable): the real length of
 *   each batch row of the global (padded) sequence, or %NULL
 * @n_seq_lens: the number of lengths: the batch size
 *
 * Marks the positions at or past each row's real length as padding, for
 * [B, H, S, D] inputs whose sequence was padded to a multiple of 2·C.
 * Padding keys are never attended; padding queries get a zero output,
 * an lse of −∞, and zero gradients, and padding keys and values get zero
 * gradients, whatever the padded rows of Q, K, V and dout hold.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_seq_lens (CpAttentionOptions *self,
                                   const gint64       *seq_lens,
                                   gsize               n_seq_lens)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (seq_lens != NULL || n_seq_lens == 0);

  replace_lengths (&self->seq_lens, seq_lens, n_seq_lens);
}

/**
 * cp_attention_options_get_cu_seqlens_padded:
 * @self: options
 * @n_bounds: (out) (optional): the number of entries
 *
 * Gets the padded document bounds of packed (THD) inputs.
 *
 * Returns: (array length=n_bounds) (nullable) (transfer none): the
 *   bounds, or %NULL for [B, H, S, D] inputs
 *
 * Since: 1.0
 */
const gint64 *
cp_attention_options_get_cu_seqlens_padded (const CpAttentionOptions *self,
                                            gsize                    *n_bounds)
{
  g_return_val_if_fail (IS_OPTIONS (self), NULL);

  return lengths_data (self->cu_seqlens_padded, n_bounds);
}

/**
 * cp_attention_options_set_cu_seqlens_padded:
 * @self: options
 * @cu_seqlens_padded: (array length=n_bounds) (nullable): 0, then the
 *   end of each document in the packed global sequence, every document
 *   padded to a multiple of 2·C; %NULL for [B, H, S, D] inputs
 * @n_bounds: the number of entries, one more than the documents
 *
 * Switches to packed inputs: Q, K, V are [T, H, D] with T the local
 * tokens of the per-document head-tail layout
 * ([ctor@Cp.Layout.new_thd]), and attention never crosses documents.
 *
 * Since: 1.0
 */
void
cp_attention_options_set_cu_seqlens_padded (CpAttentionOptions *self,
                                            const gint64       *cu_seqlens_padded,
                                            gsize               n_bounds)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (cu_seqlens_padded != NULL || n_bounds == 0);

  replace_lengths (&self->cu_seqlens_padded, cu_seqlens_padded, n_bounds);
}

/**
 * cp_attention_options_get_cu_seqlens:
 * @self: options
 * @n_bounds: (out) (optional): the number of entries
 *
 * Gets the real document bounds of packed inputs.
 *
 * Returns: (array length=n_bounds) (nullable) (transfer none): the
 *   bounds, or %NULL when no document is padded
 *
 * Since: 1.0
 */
const gint64 *
cp_attention_options_get_cu_seqlens (const CpAttentionOptions *self,
                                     gsize                    *n_bounds)
{
  g_return_val_if_fail (IS_OPTIONS (self), NULL);

  return lengths_data (self->cu_seqlens, n_bounds);
}

/**
 * cp_attention_options_set_cu_seqlens:
 * @self: options
 * @cu_seqlens: (array length=n_bounds) (nullable): 0, then the cumulative
 *   real document lengths, as Transformer Engine's `cu_seqlens`; %NULL
 *   when no document carries padding
 * @n_bounds: the number of entries, the same as for the padded bounds
 *
 * Marks the tail of each packed document past its real length as
 * padding: document i's real tokens are the first
 * `cu_seqlens[i+1] − cu_seqlens[i]` of its padded slot. Padding gets the
 * treatment described at [method@Cp.AttentionOptions.set_seq_lens].
 *
 * Since: 1.0
 */
void
cp_attention_options_set_cu_seqlens (CpAttentionOptions *self,
                                     const gint64       *cu_seqlens,
                                     gsize               n_bounds)
{
  g_return_if_fail (IS_OPTIONS (self));
  g_return_if_fail (cu_seqlens != NULL || n_bounds == 0);

  replace_lengths (&self->cu_seqlens, cu_seqlens, n_bounds);
}

gboolean
_cp_attention_options_check (const CpAttentionOptions  *options,
                             GError                   **error)
{
  GArray *padded = options->cu_seqlens_padded;
  GArray *real = options->cu_seqlens;

  if (real == NULL)
    return TRUE;
  if (padded == NULL)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "cu_seqlens was given without cu_seqlens_padded; packed inputs need both");
      return FALSE;
    }
  if (real->len != padded->len)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "cu_seqlens has %u entries, cu_seqlens_padded has %u", real->len, padded->len);
      return FALSE;
    }
  for (guint i = 0; i + 1 < real->len; i++)
    {
      gint64 length = g_array_index (real, gint64, i + 1) - g_array_index (real, gint64, i);
      gint64 slot = g_array_index (padded, gint64, i + 1) - g_array_index (padded, gint64, i);

      if (length < 0 || length > slot)
        {
          g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                       "document %u has real length %" G_GINT64_FORMAT " (cu_seqlens) but a padded "
                       "length of %" G_GINT64_FORMAT " (cu_seqlens_padded)", i, length, slot);
          return FALSE;
        }
    }
  return TRUE;
}
