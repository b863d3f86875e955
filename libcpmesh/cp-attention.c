/* cp-attention.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "cp-attention.h"
#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-mesh-private.h"
#include "cp-task-private.h"
#include "cp-tensor-private.h"
#include "kernels/cp-kernel-private.h"

/* The largest head dimension: K, V and score tiles of 128 rows then still
 * fit a core's L2 cache. */
#define MAX_HEAD_DIM 256

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
 * Since: 1.0
 */
struct _CpAttentionOptions
{
  gboolean causal;
  double scale;
  CpRotateMethod rotate_method;
  CpLoadBalance balance;
  int n_heads;
  int n_kv_heads;
  int n_threads;
  GArray *seq_lens;           /* gint64, or NULL */
  GArray *cu_seqlens_padded;  /* gint64, or NULL: BSHD */
  GArray *cu_seqlens;         /* gint64, or NULL */
};

G_DEFINE_BOXED_TYPE (CpAttentionOptions, cp_attention_options,
                     cp_attention_options_copy, cp_attention_options_free)

/**
 * cp_attention_options_new:
 *
 * Creates options with the defaults listed in [struct@Cp.AttentionOptions].
 *
 * Returns: (transfer full): new options
 *
 * Since: 1.0
 */
CpAttentionOptions *
cp_attention_options_new (void)
{
  CpAttentionOptions *self = g_new0 (CpAttentionOptions, 1);

  self->causal = TRUE;
  self->rotate_method = CP_ROTATE_METHOD_ALLGATHER;
  self->balance = CP_LOAD_BALANCE_HEAD_TAIL;
  return self;
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
 * Copies @self.
 *
 * Returns: (transfer full): a copy
 *
 * Since: 1.0
 */
CpAttentionOptions *
cp_attention_options_copy (const CpAttentionOptions *self)
{
  CpAttentionOptions *copy;

  g_return_val_if_fail (self != NULL, NULL);

  copy = g_memdup2 (self, sizeof *self);
  copy->seq_lens = dup_lengths (self->seq_lens);
  copy->cu_seqlens_padded = dup_lengths (self->cu_seqlens_padded);
  copy->cu_seqlens = dup_lengths (self->cu_seqlens);
  return copy;
}

/**
 * cp_attention_options_free:
 * @self: (transfer full): options
 *
 * Frees @self.
 *
 * Since: 1.0
 */
void
cp_attention_options_free (CpAttentionOptions *self)
{
  g_return_if_fail (self != NULL);

  g_clear_pointer (&self->seq_lens, g_array_unref);
  g_clear_pointer (&self->cu_seqlens_padded, g_array_unref);
  g_clear_pointer (&self->cu_seqlens, g_array_unref);
  g_free (self);
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
  g_return_val_if_fail (self != NULL, FALSE);

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
  g_return_if_fail (self != NULL);

  self->causal = !!causal;
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
  g_return_val_if_fail (self != NULL, 0.0);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (scale >= 0.0 && isfinite (scale));

  self->scale = scale;
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
  g_return_val_if_fail (self != NULL, CP_ROTATE_METHOD_ALLGATHER);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (method == CP_ROTATE_METHOD_ALLGATHER || method == CP_ROTATE_METHOD_ALLTOALL);

  self->rotate_method = method;
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
  g_return_val_if_fail (self != NULL, CP_LOAD_BALANCE_HEAD_TAIL);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (balance == CP_LOAD_BALANCE_HEAD_TAIL || balance == CP_LOAD_BALANCE_CONTIGUOUS);

  self->balance = balance;
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
  g_return_val_if_fail (self != NULL, 0);

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
  g_return_val_if_fail (self != NULL, 0);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (n_heads >= 0 && n_kv_heads >= 0);

  self->n_heads = n_heads;
  self->n_kv_heads = n_kv_heads;
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
  g_return_val_if_fail (self != NULL, 0);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (n_threads >= 0);

  self->n_threads = n_threads;
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
  g_return_val_if_fail (self != NULL, NULL);

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
  g_return_if_fail (self != NULL);
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
  g_return_val_if_fail (self != NULL, NULL);

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
  g_return_if_fail (self != NULL);
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
  g_return_val_if_fail (self != NULL, NULL);

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
  g_return_if_fail (self != NULL);
  g_return_if_fail (cu_seqlens != NULL || n_bounds == 0);

  replace_lengths (&self->cu_seqlens, cu_seqlens, n_bounds);
}

/**
 * CpAttention:
 *
 * Context-parallel scaled-dot-product attention over sharded Q, K, V.
 *
 * Every rank of the mesh holds the query, key and value rows of its local
 * layout — head-tail (or contiguous) pieces of [B, H, S, D] tensors, or
 * the per-document head-tail tokens of packed [T, H, D] tensors — and
 * [method@Cp.Attention.forward] returns what single-device attention on
 * the full sequence returns, restricted to this rank's rows, with the
 * log-sum-exp of every row; [method@Cp.Attention.backward] returns the
 * matching dQ, dK and dV.
 *
 * With %CP_ROTATE_METHOD_ALLGATHER, the ranks gather every key and value
 * once and each computes its queries against all of them; backward sends
 * the dK, dV partials back to their owners with one all-to-all. With
 * %CP_ROTATE_METHOD_ALLTOALL, key/value shards travel around the ring,
 * one step per rank, each transfer posted before the previous shard is
 * computed; backward sends float32 dK, dV partials around the ring with
 * them. Keys and values travel in their own dtype and with their own head
 * count.
 *
 * The local kernel is blocked (no S × S matrix), keeps the softmax
 * statistics and every partial result in float32 and merges blocks with a
 * running log-sum-exp. Key blocks a causal mask hides entirely are
 * skipped, so under head-tail every rank does the same work at every
 * step. See `attention.md` for the design and measured speed.
 *
 * Before computing, the ranks compare what they were called with; a rank
 * whose inputs are wrong makes every rank fail with its error.
 *
 * An attention object belongs to one rank and is used from one thread at
 * a time.
 *
 * Since: 1.0
 */
struct _CpAttention
{
  GObject parent_instance;

  CpMesh *mesh;
  CpAttentionOptions *options;
  CpLayout *thd_layout;   /* packed inputs only */
  int n_threads;
};

G_DEFINE_FINAL_TYPE (CpAttention, cp_attention, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_MESH,
  PROP_N_THREADS,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

/* Tags of the ring's point-to-point messages. */
#define TAG_KV  CP_MESH_INTERNAL_TAG (0x4b56)
#define TAG_DKV CP_MESH_INTERNAL_TAG (0x644b56)

static void
cp_attention_finalize (GObject *object)
{
  CpAttention *self = CP_ATTENTION (object);

  g_clear_object (&self->mesh);
  g_clear_pointer (&self->options, cp_attention_options_free);
  g_clear_pointer (&self->thd_layout, cp_layout_unref);

  G_OBJECT_CLASS (cp_attention_parent_class)->finalize (object);
}

static void
cp_attention_get_property (GObject    *object,
                           guint       prop_id,
                           GValue     *value,
                           GParamSpec *pspec)
{
  CpAttention *self = CP_ATTENTION (object);

  switch (prop_id)
    {
    case PROP_MESH:
      g_value_set_object (value, self->mesh);
      break;
    case PROP_N_THREADS:
      g_value_set_int (value, self->n_threads);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_attention_set_property (GObject      *object,
                           guint         prop_id,
                           const GValue *value,
                           GParamSpec   *pspec)
{
  CpAttention *self = CP_ATTENTION (object);

  switch (prop_id)
    {
    case PROP_MESH:
      self->mesh = g_value_dup_object (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_attention_class_init (CpAttentionClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = cp_attention_finalize;
  object_class->get_property = cp_attention_get_property;
  object_class->set_property = cp_attention_set_property;

  /**
   * CpAttention:mesh:
   *
   * The context-parallel mesh: its ranks hold the pieces of the sequence.
   *
   * Since: 1.0
   */
  properties[PROP_MESH] =
    g_param_spec_object ("mesh", NULL, NULL, CP_TYPE_MESH,
                         G_PARAM_READWRITE | G_PARAM_CONSTRUCT_ONLY | G_PARAM_STATIC_STRINGS);

  /**
   * CpAttention:n-threads:
   *
   * The number of threads this rank computes with.
   *
   * Since: 1.0
   */
  properties[PROP_N_THREADS] =
    g_param_spec_int ("n-threads", NULL, NULL, 1, G_MAXINT, 1,
                      G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_attention_init (CpAttention *self)
{
  self->n_threads = 1;
}

static CpComm *
attention_comm (CpAttention *self)
{
  return _cp_mesh_get_comm (self->mesh);
}

/* The ranks that share this machine's processors: the ranks of an
 * in-process mesh are threads of this process; ranks in processes of
 * their own count as the launcher's local world size (torchrun, Open MPI). */
static int
ranks_in_process (CpAttention *self)
{
  CpTransport *transport = attention_comm (self)->transport;
  const char *names[] = { "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE" };

  if (g_strcmp0 (transport->ops->name, "local") == 0)
    return transport->world_size;
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      guint64 value;

      if (g_getenv (names[i]) != NULL &&
          g_ascii_string_to_unsigned (g_getenv (names[i]), 10, 1, G_MAXINT, &value, NULL))
        return (int) value;
    }
  return 1;
}

static gboolean
check_thd_options (const CpAttentionOptions  *options,
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

static gboolean
configure (CpAttention               *self,
           const CpAttentionOptions  *options,
           GError                   **error)
{
  int size = attention_comm (self)->size;
  g_autoptr(GError) local_error = NULL;

  if (!check_thd_options (options, error))
    return FALSE;
  if (options->n_heads > 0 && options->n_kv_heads > 0 && options->n_heads % options->n_kv_heads != 0)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "n_heads %d is not divisible by n_kv_heads %d", options->n_heads, options->n_kv_heads);
      return FALSE;
    }
  if (options->cu_seqlens_padded != NULL)
    {
      self->thd_layout = cp_layout_new_thd ((const gint64 *) options->cu_seqlens_padded->data,
                                            options->cu_seqlens_padded->len, size, &local_error);
      if (self->thd_layout == NULL)
        {
          g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                       "cu_seqlens_padded: %s", local_error->message);
          return FALSE;
        }
    }
  self->options = cp_attention_options_copy (options);
  /* Threads are the host's, whichever device computes. */
  self->n_threads = options->n_threads > 0
    ? options->n_threads
    : _cp_kernel_for_device (CP_DEVICE_KIND_HOST)->default_threads (ranks_in_process (self));
  return TRUE;
}

/**
 * cp_attention_new:
 * @mesh: the context-parallel mesh (a 1-D mesh, or the submesh of the
 *   `cp` dimension); its world size is C
 * @options: (nullable): the settings, copied; %NULL for the defaults
 * @error: return location for a #GError
 *
 * Creates the attention operator of one rank. Every rank of @mesh creates
 * its own with the same options.
 *
 * Returns: (transfer full): the operator, or %NULL with
 *   %CP_ATTENTION_ERROR_SHAPE when the document bounds do not fit C or
 *   the head counts do not divide
 *
 * Since: 1.0
 */
CpAttention *
cp_attention_new (CpMesh                    *mesh,
                  const CpAttentionOptions  *options,
                  GError                   **error)
{
  g_autoptr(CpAttention) self = NULL;
  g_autoptr(CpAttentionOptions) defaults = NULL;

  g_return_val_if_fail (CP_IS_MESH (mesh), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (options == NULL)
    options = defaults = cp_attention_options_new ();
  self = g_object_new (CP_TYPE_ATTENTION, "mesh", mesh, NULL);
  if (!configure (self, options, error))
    return NULL;
  return g_steal_pointer (&self);
}

/**
 * cp_attention_get_mesh:
 * @self: an attention operator
 *
 * Gets the mesh the operator runs over.
 *
 * Returns: (transfer none): the mesh
 *
 * Since: 1.0
 */
CpMesh *
cp_attention_get_mesh (CpAttention *self)
{
  g_return_val_if_fail (CP_IS_ATTENTION (self), NULL);

  return self->mesh;
}

/**
 * cp_attention_dup_options:
 * @self: an attention operator
 *
 * Gets a copy of the options the operator was created with.
 *
 * Returns: (transfer full): the options
 *
 * Since: 1.0
 */
CpAttentionOptions *
cp_attention_dup_options (CpAttention *self)
{
  g_return_val_if_fail (CP_IS_ATTENTION (self), NULL);

  return cp_attention_options_copy (self->options);
}

/**
 * cp_attention_get_n_threads:
 * @self: an attention operator
 *
 * Gets the number of threads this rank computes with: the option, or the
 * automatic count.
 *
 * Returns: the thread count
 *
 * Since: 1.0
 */
int
cp_attention_get_n_threads (CpAttention *self)
{
  g_return_val_if_fail (CP_IS_ATTENTION (self), 1);

  return self->n_threads;
}

/* What one call computes, once its inputs are checked. */
typedef struct
{
  gboolean thd;
  CpDType dtype;
  int batch;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  gint64 local_len;
  int rank;
  int size;
  CpAttnType type;          /* what the kernel multiplies */
  CpDeviceKind device;      /* of every operand */
  const CpKernel *kernel;   /* of that device */
  CpLayout *layout;
  gint64 bshd_bounds[2];
  const gint64 *bounds;     /* document bounds: n_docs + 1 */
  guint n_docs;
  GArray *q_runs;           /* CpAttnRun */
  GArray *real_end;         /* gint64, batch × n_docs */
  CpAttnProblem problem;
} Plan;

static void
plan_clear (Plan *plan)
{
  g_clear_pointer (&plan->layout, cp_layout_unref);
  g_clear_pointer (&plan->q_runs, g_array_unref);
  g_clear_pointer (&plan->real_end, g_array_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Plan, plan_clear)

static const char *
layout_name (const Plan *plan)
{
  return plan->thd ? "[T, H, D]" : "[B, H, S, D]";
}

static gboolean
check_tensor (const Plan   *plan,
              CpTensor     *tensor,
              const char   *name,
              CpDType       dtype,
              const gint64 *shape,
              guint         n_dims,
              GError      **error)
{
  g_autofree char *have = cp_tensor_describe (tensor);
  g_autofree char *want = _cp_shape_to_string (shape, n_dims);

  if (cp_tensor_get_device (tensor) != plan->device)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "%s (%s) is not on q's device; CpAttention computes where q is", name, have);
      return FALSE;
    }
  if (cp_tensor_get_dtype (tensor) != dtype)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "%s is %s, it must be %s like q", name, have, cp_dtype_get_name (dtype));
      return FALSE;
    }
  if (cp_tensor_get_n_dims (tensor) != n_dims ||
      memcmp (cp_tensor_get_shape (tensor, NULL), shape, n_dims * sizeof (gint64)) != 0)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "%s is %s, it must be %s%s", name, have, cp_dtype_get_name (dtype), want);
      return FALSE;
    }
  return TRUE;
}

/* The shape of a query-like (@heads = H) or key-like tensor. */
static guint
operand_shape (const Plan *plan,
               int         heads,
               gint64     *shape)
{
  if (plan->thd)
    {
      shape[0] = plan->local_len;
      shape[1] = heads;
      shape[2] = plan->head_dim;
      return 3;
    }
  shape[0] = plan->batch;
  shape[1] = heads;
  shape[2] = plan->local_len;
  shape[3] = plan->head_dim;
  return 4;
}

static guint
lse_shape (const Plan *plan,
           gint64     *shape)
{
  if (plan->thd)
    {
      shape[0] = plan->n_heads;
      shape[1] = plan->local_len;
      return 2;
    }
  shape[0] = plan->batch;
  shape[1] = plan->n_heads;
  shape[2] = plan->local_len;
  return 3;
}

/* Reads B, H, S (or T) and D from q. */
static gboolean
read_query (Plan      *plan,
            CpTensor  *q,
            GError   **error)
{
  guint want_dims = plan->thd ? 3 : 4;
  g_autofree char *have = cp_tensor_describe (q);
  const gint64 *shape = cp_tensor_get_shape (q, NULL);

  plan->dtype = cp_tensor_get_dtype (q);
  plan->device = cp_tensor_get_device (q);
  plan->kernel = _cp_kernel_for_device (plan->device);
  if (plan->kernel == NULL)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "q (%s) is in memory no attention kernel of this build computes on", have);
      return FALSE;
    }
  if (plan->dtype != CP_DTYPE_FLOAT32 && plan->dtype != CP_DTYPE_BFLOAT16)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "q is %s; attention supports float32 and bfloat16", have);
      return FALSE;
    }
  if (cp_tensor_get_n_dims (q) != want_dims)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "q is %s, it must be %s", have, layout_name (plan));
      return FALSE;
    }
  plan->batch = plan->thd ? 1 : (int) MIN (shape[0], G_MAXINT);
  plan->n_heads = (int) MIN (shape[1], G_MAXINT);
  plan->local_len = shape[plan->thd ? 0 : 2];
  plan->head_dim = (int) MIN (shape[want_dims - 1], G_MAXINT);
  if (plan->head_dim < 1 || plan->head_dim > MAX_HEAD_DIM)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "q has head dimension %d; attention supports 1 to %d", plan->head_dim, MAX_HEAD_DIM);
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_heads (CpAttention  *self,
             Plan         *plan,
             CpTensor     *q,
             CpTensor     *k,
             GError      **error)
{
  const CpAttentionOptions *options = self->options;

  if (cp_tensor_get_n_dims (k) != cp_tensor_get_n_dims (q))
    {
      g_autofree char *have = cp_tensor_describe (k);

      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "k is %s, it must be %s like q", have,
                   plan->thd ? "[T, H_kv, D]" : "[B, H_kv, S, D]");
      return FALSE;
    }
  plan->n_kv_heads = (int) MIN (cp_tensor_get_dim (k, 1), G_MAXINT);
  if (options->n_heads > 0 && options->n_heads != plan->n_heads)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "q has %d heads (dimension 1) but the options say n_heads = %d",
                   plan->n_heads, options->n_heads);
      return FALSE;
    }
  if (options->n_kv_heads > 0 && options->n_kv_heads != plan->n_kv_heads)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "k has %d heads (dimension 1) but the options say n_kv_heads = %d",
                   plan->n_kv_heads, options->n_kv_heads);
      return FALSE;
    }
  if (plan->n_kv_heads < 1 || plan->n_heads % plan->n_kv_heads != 0)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "n_heads %d (q) is not divisible by n_kv_heads %d (k)",
                   plan->n_heads, plan->n_kv_heads);
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_operands (Plan      *plan,
                CpTensor  *k,
                CpTensor  *v,
                CpTensor  *dout,
                CpTensor  *out,
                CpTensor  *lse,
                GError   **error)
{
  gint64 kv_shape[4], q_shape[4], l_shape[3];
  guint kv_dims = operand_shape (plan, plan->n_kv_heads, kv_shape);
  guint q_dims = operand_shape (plan, plan->n_heads, q_shape);
  guint l_dims = lse_shape (plan, l_shape);

  return check_tensor (plan, k, "k", plan->dtype, kv_shape, kv_dims, error) &&
         check_tensor (plan, v, "v", plan->dtype, kv_shape, kv_dims, error) &&
         (dout == NULL || check_tensor (plan, dout, "dout", plan->dtype, q_shape, q_dims, error)) &&
         (out == NULL || check_tensor (plan, out, "out", plan->dtype, q_shape, q_dims, error)) &&
         (lse == NULL || check_tensor (plan, lse, "lse", CP_DTYPE_FLOAT32, l_shape, l_dims, error));
}

static gboolean
choose_layout (CpAttention  *self,
               Plan         *plan,
               GError      **error)
{
  g_autoptr(GError) local_error = NULL;
  const char *what = plan->thd ? "T" : "S";

  if (plan->thd)
    plan->layout = cp_layout_ref (self->thd_layout);
  else
    plan->layout = cp_layout_new (self->options->balance, plan->local_len * plan->size,
                                  plan->size, &local_error);
  if (plan->layout == NULL)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "q has local length %s = %" G_GINT64_FORMAT ", which no layout over %d ranks "
                   "gives: %s", what, plan->local_len, plan->size, local_error->message);
      return FALSE;
    }
  if (cp_layout_get_local_len (plan->layout, plan->rank) != plan->local_len)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "q has local length %s = %" G_GINT64_FORMAT " but cu_seqlens_padded gives rank %d "
                   "%" G_GINT64_FORMAT " tokens", what, plan->local_len, plan->rank,
                   cp_layout_get_local_len (plan->layout, plan->rank));
      return FALSE;
    }
  return TRUE;
}

/* Appends @rank's runs, cut at document bounds, numbering their rows
 * from @first_row. */
static void
append_rank_runs (const Plan *plan,
                  int         rank,
                  gint64      first_row,
                  GArray     *out)
{
  guint n_runs;
  const cp_index_run *runs = _cp_layout_get_runs (plan->layout, rank, &n_runs);
  gint64 row = first_row;
  guint doc = 0;

  for (guint i = 0; i < n_runs; i++)
    for (gint64 pos = runs[i].start, left = runs[i].length; left > 0;)
      {
        CpAttnRun piece;

        while (plan->bounds[doc + 1] <= pos)
          doc++;
        piece = (CpAttnRun) { row, pos, MIN (left, plan->bounds[doc + 1] - pos), doc };
        g_array_append_val (out, piece);
        row += piece.length;
        pos += piece.length;
        left -= piece.length;
      }
}

static gboolean
fill_real_ends (CpAttention  *self,
                Plan         *plan,
                GError      **error)
{
  GArray *seq_lens = self->options->seq_lens;
  GArray *real = self->options->cu_seqlens;

  plan->real_end = g_array_sized_new (FALSE, FALSE, sizeof (gint64), plan->batch * plan->n_docs);
  if (plan->thd && seq_lens != NULL)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_UNSUPPORTED,
                   "seq_lens describes [B, H, S, D] inputs; packed inputs mark padding with cu_seqlens");
      return FALSE;
    }
  if (seq_lens != NULL && seq_lens->len != (guint) plan->batch)
    {
      g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                   "seq_lens has %u entries but q has batch size %d (dimension 0)",
                   seq_lens->len, plan->batch);
      return FALSE;
    }
  for (int b = 0; b < plan->batch; b++)
    for (guint d = 0; d < plan->n_docs; d++)
      {
        gint64 end = plan->bounds[d + 1];

        if (seq_lens != NULL)
          end = g_array_index (seq_lens, gint64, b);
        else if (real != NULL)
          end = plan->bounds[d] + g_array_index (real, gint64, d + 1) - g_array_index (real, gint64, d);
        if (end < plan->bounds[d] || end > plan->bounds[d + 1])
          {
            g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                         "seq_lens[%d] = %" G_GINT64_FORMAT " is outside the padded length [0, %"
                         G_GINT64_FORMAT "]", b, end, plan->bounds[d + 1]);
            return FALSE;
          }
        g_array_append_val (plan->real_end, end);
      }
  return TRUE;
}

static void
fill_problem (CpAttention *self,
              Plan        *plan)
{
  CpAttnProblem *p = &plan->problem;
  double scale = self->options->scale > 0.0 ? self->options->scale : 1.0 / sqrt (plan->head_dim);

  plan->q_runs = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  append_rank_runs (plan, plan->rank, 0, plan->q_runs);
  *p = (CpAttnProblem) {
    .batch = plan->batch,
    .n_heads = plan->n_heads,
    .n_kv_heads = plan->n_kv_heads,
    .head_dim = plan->head_dim,
    .causal = self->options->causal,
    .scale = (float) scale,
    .n_threads = self->n_threads,
    .type = plan->type,
    .n_docs = plan->n_docs,
    .real_end = (const gint64 *) plan->real_end->data,
    .q_runs = (const CpAttnRun *) plan->q_runs->data,
    .n_q_runs = plan->q_runs->len,
    .q_rows = plan->local_len,
  };
}

static void
set_documents (CpAttention *self,
               Plan        *plan)
{
  if (plan->thd)
    {
      plan->bounds = (const gint64 *) self->options->cu_seqlens_padded->data;
      plan->n_docs = cp_layout_get_n_documents (plan->layout);
      return;
    }
  plan->bshd_bounds[0] = 0;
  plan->bshd_bounds[1] = cp_layout_get_seq_len (plan->layout);
  plan->bounds = plan->bshd_bounds;
  plan->n_docs = 1;
}

/* Checks one call's inputs and plans it; @dout, @out and @lse are NULL
 * for forward. */
static gboolean
plan_build (CpAttention  *self,
            Plan         *plan,
            CpTensor     *q,
            CpTensor     *k,
            CpTensor     *v,
            CpTensor     *dout,
            CpTensor     *out,
            CpTensor     *lse,
            GError      **error)
{
  CpComm *comm = attention_comm (self);

  plan->thd = self->thd_layout != NULL;
  plan->rank = comm->index;
  plan->size = comm->size;
  if (!read_query (plan, q, error) ||
      !check_heads (self, plan, q, k, error) ||
      !check_operands (plan, k, v, dout, out, lse, error) ||
      !choose_layout (self, plan, error))
    return FALSE;
  set_documents (self, plan);
  if (!fill_real_ends (self, plan, error))
    return FALSE;
  /* bfloat16 is multiplied as such where the CPU does it in hardware,
   * and converted to float32 once everywhere else. */
  plan->type = plan->dtype == CP_DTYPE_BFLOAT16 && plan->kernel->multiplies_bfloat16 ()
    ? CP_ATTN_BFLOAT16 : CP_ATTN_FLOAT32;
  fill_problem (self, plan);
  return TRUE;
}

/* Agreement.  Before any K/V byte moves, the ranks all-gather a small
 * descriptor of the call, so that a rank with bad inputs, or ranks that
 * disagree, fail together with the same message instead of waiting for
 * each other until the mesh timeout. */

enum {
  DESC_CALL,
  DESC_DTYPE,
  DESC_PACKED,
  DESC_BATCH,
  DESC_HEADS,
  DESC_KV_HEADS,
  DESC_HEAD_DIM,
  DESC_LOCAL_LEN,
  DESC_CAUSAL,
  DESC_SCALE,
  DESC_ROTATE,
  DESC_LAYOUT,
  DESC_PADDING,
  N_DESC
};

static const char * const desc_names[N_DESC] = {
  "the call (forward or backward)", "the dtype", "packed inputs ([T, H, D] or [B, H, S, D])",
  "the batch size", "n_heads", "n_kv_heads", "the head dimension", "the local length", "causal",
  "the scale", "the rotate method", "the layout (load balance, cu_seqlens_padded)",
  "the real lengths (seq_lens, cu_seqlens)",
};

static guint64
hash_lengths (guint64  hash,
              GArray  *array)
{
  if (array == NULL)
    return hash * 31u + 7u;
  for (guint i = 0; i < array->len; i++)
    hash = hash * G_GUINT64_CONSTANT (0x100000001b3) ^ (guint64) g_array_index (array, gint64, i);
  return hash * 31u + array->len;
}

static void
describe_call (CpAttention *self,
               const Plan  *plan,
               gboolean     backward,
               gint64      *desc)
{
  double scale = plan->problem.scale;

  desc[DESC_CALL] = backward;
  desc[DESC_DTYPE] = plan->dtype;
  desc[DESC_PACKED] = plan->thd;
  desc[DESC_BATCH] = plan->batch;
  desc[DESC_HEADS] = plan->n_heads;
  desc[DESC_KV_HEADS] = plan->n_kv_heads;
  desc[DESC_HEAD_DIM] = plan->head_dim;
  desc[DESC_LOCAL_LEN] = plan->local_len;
  desc[DESC_CAUSAL] = self->options->causal;
  memcpy (&desc[DESC_SCALE], &scale, sizeof scale);
  desc[DESC_ROTATE] = self->options->rotate_method;
  desc[DESC_LAYOUT] = (gint64) cp_layout_fingerprint (plan->layout);
  desc[DESC_PADDING] = (gint64) hash_lengths (hash_lengths (17, self->options->seq_lens),
                                              self->options->cu_seqlens);
}

/* A descriptor field's value as the user would have written it; the
 * layout and real lengths are hashes. */
static char *
format_field (int    field,
              gint64 value)
{
  double scale;

  switch (field)
    {
    case DESC_CALL:
      return g_strdup (value ? "backward" : "forward");
    case DESC_DTYPE:
      if (value == CP_DTYPE_FLOAT32 || value == CP_DTYPE_BFLOAT16)
        return g_strdup (cp_dtype_get_name ((CpDType) value));
      break;
    case DESC_PACKED:
    case DESC_CAUSAL:
      return g_strdup (value ? "true" : "false");
    case DESC_SCALE:
      memcpy (&scale, &value, sizeof scale);
      return g_strdup_printf ("%g", scale);
    case DESC_ROTATE:
      return g_strdup (value == CP_ROTATE_METHOD_ALLGATHER ? "allgather" : "alltoall");
    case DESC_LAYOUT:
    case DESC_PADDING:
      return g_strdup_printf ("hash %016" G_GINT64_MODIFIER "x", value);
    default:
      break;
    }
  return g_strdup_printf ("%" G_GINT64_FORMAT, value);
}

static gboolean
compare_calls (const gint64  *all,
               int            size,
               GError       **error)
{
  for (int r = 1; r < size; r++)
    for (int f = 0; f < N_DESC; f++)
      if (all[r * N_DESC + f] != all[f])
        {
          g_autofree char *first = format_field (f, all[f]);
          g_autofree char *other = format_field (f, all[r * N_DESC + f]);

          g_set_error (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE,
                       "ranks disagree on %s: rank 0 has %s, rank %d has %s",
                       desc_names[f], first, r, other);
          return FALSE;
        }
  return TRUE;
}

/* Takes @invalid, this rank's own error or NULL. */
static gboolean
agree (CpAttention  *self,
       const Plan   *plan,
       gboolean      backward,
       GError       *invalid,
       GError      **error)
{
  CpComm *comm = attention_comm (self);
  gint64 desc[N_DESC] = { 0 };
  g_autofree gint64 *all = g_new0 (gint64, (gsize) N_DESC * comm->size);
  CpCollective coll = {
    .kind = CP_COLL_ALL_GATHER,
    .dtype = CP_DTYPE_INT64,
    .n_dims = 1,
    .shape = { N_DESC },
    .invalid = invalid,
    .outer = 1,
    .block = sizeof desc,
    .send = desc,
    .recv = all,
  };
  gboolean ok;

  if (invalid == NULL)
    describe_call (self, plan, backward, desc);
  ok = comm->transport->ops->collective (comm, &coll, _cp_mesh_deadline (self->mesh), error);
  g_clear_error (&coll.invalid);
  return ok && compare_calls (all, comm->size, error);
}

/* Float32 operands: the tensor's own memory, or @copy, a float32 buffer
 * of at least as many elements, converted into. */
static float *
as_float32 (const Plan *plan,
            CpTensor   *tensor,
            CpTensor   *copy)
{
  gsize n = (gsize) cp_tensor_get_numel (tensor);
  float *values;

  if (cp_tensor_get_dtype (tensor) == CP_DTYPE_FLOAT32)
    return cp_tensor_get_data (tensor);
  g_assert (cp_tensor_get_dtype (tensor) == CP_DTYPE_BFLOAT16);
  g_assert (copy != NULL && (gsize) cp_tensor_get_numel (copy) >= n);
  values = cp_tensor_get_data (copy);
  plan->kernel->bfloat16_to_float32 (values, cp_tensor_get_data (tensor), n);
  return values;
}

static void
store_float32 (const Plan  *plan,
               CpTensor    *tensor,
               const float *values)
{
  gsize n = (gsize) cp_tensor_get_numel (tensor);

  if (cp_tensor_get_dtype (tensor) == CP_DTYPE_FLOAT32)
    {
      if (cp_tensor_get_data (tensor) != values)
        memcpy (cp_tensor_get_data (tensor), values, n * sizeof (float));
      return;
    }
  plan->kernel->float32_to_bfloat16 (cp_tensor_get_data (tensor), values, n);
}

/* Whether the kernel multiplies float32 copies of the inputs: bfloat16
 * inputs on a machine without bfloat16 matmul. */
static gboolean
converts_operands (const Plan *plan)
{
  return plan->dtype != CP_DTYPE_FLOAT32 && plan->type != CP_ATTN_BFLOAT16;
}

/* What the kernel reads of an input: its own memory when the kernel
 * multiplies its dtype, @copy, converted into, otherwise. */
static gpointer
as_operand (const Plan *plan,
            CpTensor   *tensor,
            CpTensor   *copy)
{
  if (!converts_operands (plan))
    return cp_tensor_get_data (tensor);
  return as_float32 (plan, tensor, copy);
}

static gsize
operand_size (const Plan *plan)
{
  return plan->type == CP_ATTN_BFLOAT16 ? 2 : sizeof (float);
}

/* A view of @data holding a query-like (@heads = H) or key-like operand
 * of @rows rows per head. */
static CpAttnView
view_of (const Plan *plan,
         gpointer    data,
         int         heads,
         gint64      rows)
{
  gsize d = (gsize) plan->head_dim;

  if (plan->thd)
    return (CpAttnView) { data, 0, d, (gsize) heads * d };
  return (CpAttnView) { data, (gsize) heads * (gsize) rows * d, (gsize) rows * d, d };
}

/* The sequence dimension of a [2, ...] K/V pack. */
static int
kv_seq_dim (const Plan *plan)
{
  return plan->thd ? 1 : 3;
}

static gboolean
uses_ring (CpAttention *self,
           const Plan  *plan)
{
  return plan->size > 1 && self->options->rotate_method != CP_ROTATE_METHOD_ALLGATHER;
}

/* The rows of K/V the kernel reads at once: every rank's after the
 * all-gather, one rank's on the ring. */
static gint64
kv_block_rows (CpAttention *self,
               const Plan  *plan)
{
  if (plan->size == 1 || uses_ring (self, plan))
    return plan->local_len;
  return plan->local_len * plan->size;
}

/* Buffers. */

/* Every buffer a call needs beyond the kernel's small scratch and what
 * the collectives return.  They are allocated before the ranks agree to
 * go ahead, so that a rank short of memory makes every rank fail at
 * once, before any data moves, instead of leaving its ring neighbours
 * waiting for the timeout.  Tensors, so that their memory comes from the
 * host block cache: a fresh allocation of these sizes would spend more
 * time faulting pages in than the conversions spend. */
typedef struct
{
  CpTensor *kv;          /* this rank's K and V side by side */
  CpTensor *kv_next;     /* the ring's shard arriving */
  CpTensor *kv32;        /* float32 copy of the K/V block the kernel reads */
  CpTensor *q32;         /* float32 copies of bfloat16 inputs */
  CpTensor *dout32;
  CpTensor *rows[2];     /* per query row: forward's max and sum; backward's delta */
  CpTensor *acc;         /* float32: forward's output (bfloat16 only); backward's dQ */
  CpTensor *dkv;         /* float32 dK, dV of this rank's keys */
  CpTensor *partial[3];  /* float32 dK, dV partials of other ranks' keys */
  CpTensor *results[3];  /* forward: out, lse; backward: dq, dk, dv */
} Buffers;

static void
clear_tensors (CpTensor **tensors,
               guint      n)
{
  for (guint i = 0; i < n; i++)
    g_clear_object (&tensors[i]);
}

static void
buffers_clear (Buffers *bufs)
{
  g_clear_object (&bufs->kv);
  g_clear_object (&bufs->kv_next);
  g_clear_object (&bufs->kv32);
  g_clear_object (&bufs->q32);
  g_clear_object (&bufs->dout32);
  clear_tensors (bufs->rows, G_N_ELEMENTS (bufs->rows));
  g_clear_object (&bufs->acc);
  g_clear_object (&bufs->dkv);
  clear_tensors (bufs->partial, G_N_ELEMENTS (bufs->partial));
  clear_tensors (bufs->results, G_N_ELEMENTS (bufs->results));
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Buffers, buffers_clear)

static gboolean
buffer_new (CpTensor     **slot,
            CpDType        dtype,
            const gint64  *shape,
            guint          n_dims,
            gboolean       zeroed,
            GError       **error)
{
  if (zeroed)
    *slot = cp_tensor_new (dtype, shape, n_dims, error);
  else
    *slot = _cp_tensor_new_uninit (dtype, shape, n_dims, error);
  return *slot != NULL;
}

static gboolean
buffer_new_like (CpTensor **slot,
                 CpTensor  *tensor,
                 CpDType    dtype,
                 gboolean   zeroed,
                 GError   **error)
{
  return buffer_new (slot, dtype, cp_tensor_get_shape (tensor, NULL),
                     cp_tensor_get_n_dims (tensor), zeroed, error);
}

/* A [2, ...] K/V pack of @rows rows per head. */
static gboolean
buffer_new_kv (CpTensor   **slot,
               const Plan  *plan,
               CpDType      dtype,
               gint64       rows,
               gboolean     zeroed,
               GError     **error)
{
  gint64 shape[5] = { 2 };
  guint n_dims = operand_shape (plan, plan->n_kv_heads, shape + 1) + 1;

  shape[kv_seq_dim (plan)] = rows;
  return buffer_new (slot, dtype, shape, n_dims, zeroed, error);
}

/* One float32 per query row. */
static gboolean
buffer_new_rows (CpTensor   **slot,
                 const Plan  *plan,
                 GError     **error)
{
  gint64 n_rows = MAX ((gint64) plan->batch * plan->n_heads * plan->local_len, 1);

  return buffer_new (slot, CP_DTYPE_FLOAT32, &n_rows, 1, FALSE, error);
}

/* What forward and backward both need. */
static gboolean
buffers_new_common (CpAttention  *self,
                    const Plan   *plan,
                    CpTensor     *q,
                    Buffers      *bufs,
                    GError      **error)
{
  gboolean convert = converts_operands (plan);

  return buffer_new_kv (&bufs->kv, plan, plan->dtype, plan->local_len, FALSE, error) &&
         (!uses_ring (self, plan) ||
          buffer_new_kv (&bufs->kv_next, plan, plan->dtype, plan->local_len, FALSE, error)) &&
         (!convert ||
          buffer_new_kv (&bufs->kv32, plan, CP_DTYPE_FLOAT32, kv_block_rows (self, plan), FALSE, error)) &&
         (!convert || buffer_new_like (&bufs->q32, q, CP_DTYPE_FLOAT32, FALSE, error)) &&
         buffer_new_rows (&bufs->rows[0], plan, error);
}

/* A float32 output starts zeroed: it accumulates in place. */
static gboolean
buffers_new_forward (CpAttention  *self,
                     const Plan   *plan,
                     CpTensor     *q,
                     Buffers      *bufs,
                     GError      **error)
{
  gint64 shape[3];
  guint n_dims = lse_shape (plan, shape);

  return buffers_new_common (self, plan, q, bufs, error) &&
         buffer_new_rows (&bufs->rows[1], plan, error) &&
         buffer_new_like (&bufs->results[0], q, plan->dtype, plan->dtype == CP_DTYPE_FLOAT32, error) &&
         buffer_new (&bufs->results[1], CP_DTYPE_FLOAT32, shape, n_dims, FALSE, error) &&
         (plan->dtype == CP_DTYPE_FLOAT32 ||
          buffer_new_like (&bufs->acc, q, CP_DTYPE_FLOAT32, TRUE, error));
}

/* The partials of dK, dV: every rank's keys at once after an all-gather,
 * or three of one rank's travelling the ring. */
static gboolean
buffers_new_partials (CpAttention  *self,
                      const Plan   *plan,
                      Buffers      *bufs,
                      GError      **error)
{
  guint n = uses_ring (self, plan) ? 3 : 1;

  if (plan->size == 1)
    return TRUE;
  for (guint i = 0; i < n; i++)
    if (!buffer_new_kv (&bufs->partial[i], plan, CP_DTYPE_FLOAT32, kv_block_rows (self, plan),
                        FALSE, error))
      return FALSE;
  return TRUE;
}

static gboolean
buffers_new_backward (CpAttention  *self,
                      const Plan   *plan,
                      CpTensor     *q,
                      Buffers      *bufs,
                      GError      **error)
{
  gint64 kv_shape[4];
  guint kv_dims = operand_shape (plan, plan->n_kv_heads, kv_shape);

  return buffers_new_common (self, plan, q, bufs, error) &&
         (!converts_operands (plan) ||
          buffer_new_like (&bufs->dout32, q, CP_DTYPE_FLOAT32, FALSE, error)) &&
         buffer_new_like (&bufs->acc, q, CP_DTYPE_FLOAT32, TRUE, error) &&
         buffer_new_kv (&bufs->dkv, plan, CP_DTYPE_FLOAT32, plan->local_len, TRUE, error) &&
         buffers_new_partials (self, plan, bufs, error) &&
         buffer_new_like (&bufs->results[0], q, plan->dtype, FALSE, error) &&
         buffer_new (&bufs->results[1], plan->dtype, kv_shape, kv_dims, FALSE, error) &&
         buffer_new (&bufs->results[2], plan->dtype, kv_shape, kv_dims, FALSE, error);
}

/* K and V side by side in one buffer, so that every transfer moves both
 * at once, in their own dtype and head count. */
static void
pack_kv (CpTensor *k,
         CpTensor *v,
         CpTensor *kv)
{
  gsize bytes = cp_tensor_get_nbytes (k);

  memcpy (cp_tensor_get_data (kv), cp_tensor_get_data (k), bytes);
  memcpy ((guint8 *) cp_tensor_get_data (kv) + bytes, cp_tensor_get_data (v), bytes);
}

/* Keys of @n_ranks consecutive ranks from @first_rank, held in @kv, a K/V
 * pack of @n_ranks × the local length with elements of @element_size
 * bytes. */
static void
keys_init (const Plan *plan,
           gpointer    kv,
           gsize       element_size,
           int         first_rank,
           int         n_ranks,
           GArray     *runs,
           CpAttnKeys *keys)
{
  gint64 rows = plan->local_len * n_ranks;
  gsize half = (gsize) plan->batch * plan->n_kv_heads * (gsize) rows * plan->head_dim;

  for (int i = 0; i < n_ranks; i++)
    append_rank_runs (plan, first_rank + i, plan->local_len * i, runs);
  keys->k = view_of (plan, kv, plan->n_kv_heads, rows);
  keys->v = view_of (plan, (guint8 *) kv + half * element_size, plan->n_kv_heads, rows);
  keys->runs = (const CpAttnRun *) runs->data;
  keys->n_runs = runs->len;
}

/* One posted point-to-point transfer with a ring neighbour. */
typedef struct
{
  CpMessage message;
  CpRequest *request;
} Transfer;

static void
transfer_post (CpAttention *self,
               Transfer    *transfer,
               CpTensor    *tensor,
               gboolean     send,
               guint64      tag)
{
  CpComm *comm = attention_comm (self);
  int next = (comm->index + 1) % comm->size;
  int previous = (comm->index + comm->size - 1) % comm->size;

  g_assert (transfer->request == NULL);
  _cp_message_from_tensor (&transfer->message, tensor);
  if (send)
    transfer->request = comm->transport->ops->isend (comm, next, tag, &transfer->message);
  else
    transfer->request = comm->transport->ops->irecv (comm, previous, tag, &transfer->message);
}

/* Completes every posted transfer of @transfers, in place (a posted
 * request points at its transfer's message), even after a failure,
 * so that no peer is left reading a buffer about to be freed; reports the
 * first error. */
static gboolean
transfers_wait (CpAttention     *self,
                Transfer * const *transfers,
                guint            n,
                GError         **error)
{
  CpComm *comm = attention_comm (self);
  gboolean ok = TRUE;

  for (guint i = 0; i < n; i++)
    {
      if (transfers[i]->request == NULL)
        continue;
      ok = comm->transport->ops->wait (comm, g_steal_pointer (&transfers[i]->request),
                                       _cp_mesh_deadline (self->mesh), ok ? error : NULL) && ok;
    }
  return ok;
}

static void
swap_tensors (CpTensor **a,
              CpTensor **b)
{
  CpTensor *swap = *a;

  *a = *b;
  *b = swap;
}

/* Forward. */

typedef struct
{
  CpAttnView q;
  CpAttnState state;
  CpTensor *kv32;
} Forward;

static void
forward_on (const Plan *plan,
            Forward    *fwd,
            CpTensor   *kv,
            int         first_rank,
            int         n_ranks)
{
  gpointer data = as_operand (plan, kv, fwd->kv32);
  g_autoptr(GArray) runs = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  CpAttnKeys keys;

  keys_init (plan, data, operand_size (plan), first_rank, n_ranks, runs, &keys);
  plan->kernel->forward_block (&plan->problem, &fwd->q, &keys, &fwd->state);
}

static gboolean
forward_gathered (CpAttention  *self,
                  const Plan   *plan,
                  Forward      *fwd,
                  CpTensor     *kv,
                  GError      **error)
{
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (self->mesh, kv, kv_seq_dim (plan), error);

  if (gathered == NULL)
    return FALSE;
  forward_on (plan, fwd, gathered, 0, plan->size);
  return TRUE;
}

/* The ring: at step i this rank holds the shard of rank (r − i) mod C and
 * has already posted its hand-over to the next rank, so the transfer of
 * the following shard runs while this one is computed. */
static gboolean
forward_ring (CpAttention  *self,
              const Plan   *plan,
              Forward      *fwd,
              Buffers      *bufs,
              GError      **error)
{
  CpTensor *current = bufs->kv;
  CpTensor *next = bufs->kv_next;

  for (int step = 0; step < plan->size; step++)
    {
      int source = (plan->rank - step + plan->size) % plan->size;
      Transfer transfers[2] = { { { 0 } } };
      gboolean last = step == plan->size - 1;

      if (!last)
        {
          transfer_post (self, &transfers[0], next, FALSE, TAG_KV);
          transfer_post (self, &transfers[1], current, TRUE, TAG_KV);
        }
      forward_on (plan, fwd, current, source, 1);
      if (!transfers_wait (self, (Transfer *[]) { &transfers[0], &transfers[1] }, 2, error))
        return FALSE;
      if (!last)
        swap_tensors (&current, &next);
    }
  return TRUE;
}

static void
finish_forward (const Plan *plan,
                Forward    *fwd,
                CpTensor   *out,
                CpTensor   *lse)
{
  plan->kernel->finalize (&plan->problem, &fwd->state, cp_tensor_get_data (lse));
  store_float32 (plan, out, fwd->state.acc.data);
}

/* A float32 output accumulates in place. */
static gboolean
forward_run (CpAttention  *self,
             const Plan   *plan,
             CpTensor     *q,
             Buffers      *bufs,
             GError      **error)
{
  gsize n_rows = (gsize) cp_tensor_get_numel (bufs->rows[0]);
  float *m = cp_tensor_get_data (bufs->rows[0]);
  float *l = cp_tensor_get_data (bufs->rows[1]);
  float *acc = cp_tensor_get_data (bufs->acc != NULL ? bufs->acc : bufs->results[0]);
  gpointer q_data = as_operand (plan, q, bufs->q32);
  Forward fwd = {
    .q = view_of (plan, q_data, plan->n_heads, plan->local_len),
    .state = { view_of (plan, acc, plan->n_heads, plan->local_len), m, l },
    .kv32 = bufs->kv32,
  };
  gboolean ok = TRUE;

  for (gsize i = 0; i < n_rows; i++)
    {
      m[i] = -INFINITY;
      l[i] = 0.0f;
    }
  if (plan->size == 1)
    forward_on (plan, &fwd, bufs->kv, 0, 1);
  else if (uses_ring (self, plan))
    ok = forward_ring (self, plan, &fwd, bufs, error);
  else
    ok = forward_gathered (self, plan, &fwd, bufs->kv, error);
  if (ok)
    finish_forward (plan, &fwd, bufs->results[0], bufs->results[1]);
  return ok;
}

/**
 * cp_attention_forward:
 * @self: an attention operator
 * @q: this rank's queries: [B, H, S, D], or [T, H, D] for packed inputs
 * @k: this rank's keys: [B, H_kv, S, D] or [T, H_kv, D], the dtype of @q
 * @v: this rank's values, shaped like @k
 * @out: (out) (transfer full): the attention output, shaped like @q
 * @lse: (out) (optional) (transfer full): the float32 log-sum-exp of the
 *   scaled scores of every query row: [B, H, S], or [H, T]; −∞ for
 *   padding rows
 * @error: return location for a #GError
 *
 * Computes softmax (scale · Q·Kᵀ) · V for this rank's queries over the
 * keys of every rank. Every rank of the mesh calls it at the same time
 * with its own pieces.
 *
 * Returns: (skip): %TRUE on success; %FALSE on every rank with
 *   %CP_ATTENTION_ERROR_SHAPE when shapes, dtypes, head counts or local
 *   lengths disagree with each other, with the layout or across ranks,
 *   %CP_ATTENTION_ERROR_UNSUPPORTED for other dtypes, head dimensions over
 *   256 or device memory, %CP_TENSOR_ERROR_OUT_OF_MEMORY when a rank
 *   cannot allocate its buffers (every buffer is allocated before any
 *   data moves), or a [error@Cp.MeshError] from the transport
 *
 * Since: 1.0
 */
gboolean
cp_attention_forward (CpAttention  *self,
                      CpTensor     *q,
                      CpTensor     *k,
                      CpTensor     *v,
                      CpTensor    **out,
                      CpTensor    **lse,
                      GError      **error)
{
  g_auto(Plan) plan = { 0 };
  g_auto(Buffers) bufs = { 0 };
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_ATTENTION (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (q) && CP_IS_TENSOR (k) && CP_IS_TENSOR (v), FALSE);
  g_return_val_if_fail (out != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  plan_build (self, &plan, q, k, v, NULL, NULL, NULL, &invalid);
  if (invalid == NULL)
    buffers_new_forward (self, &plan, q, &bufs, &invalid);
  if (!agree (self, &plan, FALSE, invalid, error))
    return FALSE;
  pack_kv (k, v, bufs.kv);
  if (!forward_run (self, &plan, q, &bufs, error))
    return FALSE;
  *out = g_steal_pointer (&bufs.results[0]);
  if (lse != NULL)
    *lse = g_steal_pointer (&bufs.results[1]);
  return TRUE;
}

/* Backward. */

/* delta = rowsum (dout ∘ out), the softmax-gradient term of each row. */
static void
row_deltas (const Plan *plan,
            CpTensor   *dout,
            CpTensor   *out,
            float      *delta)
{
  CpAttnType type = plan->dtype == CP_DTYPE_FLOAT32 ? CP_ATTN_FLOAT32 : CP_ATTN_BFLOAT16;
  CpAttnView dout_view = view_of (plan, cp_tensor_get_data (dout), plan->n_heads, plan->local_len);
  CpAttnView out_view = view_of (plan, cp_tensor_get_data (out), plan->n_heads, plan->local_len);

  plan->kernel->row_deltas (&plan->problem, type, &dout_view, &out_view, delta);
}

/* Adds to @dkv the gradients of the keys of @kv, a K/V block of @n_ranks
 * ranks from @first_rank; @kv32 takes its float32 copy if the kernel
 * needs one. */
static void
backward_on (const Plan        *plan,
             const CpAttnGrads *grads,
             CpTensor          *kv,
             CpTensor          *kv32,
             int                first_rank,
             int                n_ranks,
             CpTensor          *dkv)
{
  gpointer data = as_operand (plan, kv, kv32);
  g_autoptr(GArray) runs = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  g_autoptr(GArray) unused = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  CpAttnKeys keys, dkeys;

  keys_init (plan, data, operand_size (plan), first_rank, n_ranks, runs, &keys);
  keys_init (plan, cp_tensor_get_data (dkv), sizeof (float), first_rank, n_ranks, unused, &dkeys);
  plan->kernel->backward_block (&plan->problem, grads, &keys, &dkeys.k, &dkeys.v);
}

/* Sums the pieces an all-to-all brought back: piece r holds rank r's
 * contribution to this rank's keys.  Summed in rank order, so the bits
 * do not depend on timing. */
static void
sum_pieces (const Plan *plan,
            CpTensor   *exchanged,
            CpTensor   *dkv)
{
  gsize outer, step;
  gint64 length;
  const float *src = cp_tensor_get_data (exchanged);
  float *dst = cp_tensor_get_data (dkv);
  gsize piece;

  _cp_tensor_split_at (exchanged, (guint) kv_seq_dim (plan), &outer, &length, &step);
  piece = (gsize) plan->local_len * step / sizeof (float);
  for (gsize o = 0; o < outer; o++)
    for (int r = 0; r < plan->size; r++)
      plan->kernel->add_float32 (dst + o * piece, src + (o * (gsize) plan->size + (gsize) r) * piece, piece);
}

static gboolean
backward_gathered (CpAttention        *self,
                   const Plan         *plan,
                   const CpAttnGrads  *grads,
                   Buffers            *bufs,
                   GError            **error)
{
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (self->mesh, bufs->kv, kv_seq_dim (plan), error);
  g_autoptr(CpTensor) exchanged = NULL;

  if (gathered == NULL)
    return FALSE;
  backward_on (plan, grads, gathered, bufs->kv32, 0, plan->size, bufs->partial[0]);
  g_clear_object (&gathered);  /* lowers the peak before the exchange */
  exchanged = cp_mesh_all_to_all (self->mesh, bufs->partial[0], kv_seq_dim (plan), error);
  if (exchanged == NULL)
    return FALSE;
  sum_pieces (plan, exchanged, bufs->dkv);
  return TRUE;
}

/* The ring backward: the K/V shard travels as in forward, and the float32
 * dK, dV partial of the shard travels with it, one step behind: at step
 * i this rank adds its contribution to the partial of shard (r − i) that
 * the previous rank sent, and hands the sum on.  After C steps the
 * partial of every shard has visited every rank and arrives, complete, at
 * the shard's owner. */
typedef struct
{
  CpTensor *kv[2];         /* current, next */
  CpTensor *kv32;
  CpTensor *partial[3];    /* computing, received, in flight */
  Transfer kv_moves[2];
  Transfer partial_in;
  Transfer partial_out;
} Ring;

static gboolean
ring_wait_all (CpAttention  *self,
               Ring         *ring,
               GError      **error)
{
  Transfer *all[] = { &ring->kv_moves[0], &ring->kv_moves[1], &ring->partial_in, &ring->partial_out };

  return transfers_wait (self, all, G_N_ELEMENTS (all), error);
}

/* Adds the partial the previous rank sent for the current shard, then
 * sends the sum on; the previous hand-over must be complete before its
 * buffer is reused. */
static gboolean
ring_pass_partial (CpAttention  *self,
                   const Plan   *plan,
                   Ring         *ring,
                   int           step,
                   GError      **error)
{
  if (step > 0)
    {
      Transfer *wait[] = { &ring->partial_in, &ring->partial_out };

      if (!transfers_wait (self, wait, G_N_ELEMENTS (wait), error))
        return FALSE;
      plan->kernel->add_float32 (cp_tensor_get_data (ring->partial[0]),
                                 cp_tensor_get_data (ring->partial[1]),
                                 (gsize) cp_tensor_get_numel (ring->partial[0]));
    }
  swap_tensors (&ring->partial[0], &ring->partial[2]);
  transfer_post (self, &ring->partial_out, ring->partial[2], TRUE, TAG_DKV);
  return TRUE;
}

static gboolean
ring_step (CpAttention        *self,
           const Plan         *plan,
           const CpAttnGrads  *grads,
           Ring               *ring,
           int                 step,
           GError            **error)
{
  int source = (plan->rank - step + plan->size) % plan->size;
  gboolean last = step == plan->size - 1;

  if (!last)
    {
      transfer_post (self, &ring->kv_moves[0], ring->kv[1], FALSE, TAG_KV);
      transfer_post (self, &ring->kv_moves[1], ring->kv[0], TRUE, TAG_KV);
    }
  if (step > 0)
    transfer_post (self, &ring->partial_in, ring->partial[1], FALSE, TAG_DKV);
  backward_on (plan, grads, ring->kv[0], ring->kv32, source, 1, ring->partial[0]);
  if (!ring_pass_partial (self, plan, ring, step, error))
    return FALSE;
  if (!last)
    {
      Transfer *wait[] = { &ring->kv_moves[0], &ring->kv_moves[1] };

      if (!transfers_wait (self, wait, G_N_ELEMENTS (wait), error))
        return FALSE;
      swap_tensors (&ring->kv[0], &ring->kv[1]);
    }
  return TRUE;
}

static gboolean
backward_ring (CpAttention        *self,
               const Plan         *plan,
               const CpAttnGrads  *grads,
               Buffers            *bufs,
               GError            **error)
{
  Ring ring = {
    .kv = { bufs->kv, bufs->kv_next },
    .kv32 = bufs->kv32,
    .partial = { bufs->partial[0], bufs->partial[1], bufs->partial[2] },
  };
  Transfer final = { { 0 } };
  gboolean ok = TRUE;

  for (int step = 0; ok && step < plan->size; step++)
    ok = ring_step (self, plan, grads, &ring, step, error);
  if (!ok)
    {
      ring_wait_all (self, &ring, NULL);
      return FALSE;
    }
  /* The last hand-over brings this rank's own shard home. */
  transfer_post (self, &final, bufs->dkv, FALSE, TAG_DKV);
  ok = transfers_wait (self, (Transfer *[]) { &final }, 1, error);
  return ring_wait_all (self, &ring, ok ? error : NULL) && ok;
}

static gboolean
backward_run (CpAttention  *self,
              const Plan   *plan,
              CpTensor     *dout,
              CpTensor     *q,
              CpTensor     *out,
              CpTensor     *lse,
              Buffers      *bufs,
              GError      **error)
{
  float *delta = cp_tensor_get_data (bufs->rows[0]);
  float *dq = cp_tensor_get_data (bufs->acc);
  const float *dkv = cp_tensor_get_data (bufs->dkv);
  CpAttnGrads grads = {
    .q = view_of (plan, as_operand (plan, q, bufs->q32), plan->n_heads, plan->local_len),
    .dout = view_of (plan, as_operand (plan, dout, bufs->dout32), plan->n_heads, plan->local_len),
    .lse = cp_tensor_get_data (lse),
    .delta = delta,
    .dq = view_of (plan, dq, plan->n_heads, plan->local_len),
  };
  gboolean ok = TRUE;

  row_deltas (plan, dout, out, delta);
  if (plan->size == 1)
    backward_on (plan, &grads, bufs->kv, bufs->kv32, 0, 1, bufs->dkv);
  else if (uses_ring (self, plan))
    ok = backward_ring (self, plan, &grads, bufs, error);
  else
    ok = backward_gathered (self, plan, &grads, bufs, error);
  if (!ok)
    return FALSE;
  store_float32 (plan, bufs->results[0], dq);
  store_float32 (plan, bufs->results[1], dkv);
  store_float32 (plan, bufs->results[2], dkv + cp_tensor_get_numel (bufs->dkv) / 2);
  return TRUE;
}

/**
 * cp_attention_backward:
 * @self: an attention operator
 * @dout: the gradient of the loss with respect to @out
 * @q: the queries given to [method@Cp.Attention.forward]
 * @k: the keys given to forward
 * @v: the values given to forward
 * @out: the output forward returned
 * @lse: the log-sum-exp forward returned
 * @dq: (out) (transfer full): the gradient with respect to @q
 * @dk: (out) (transfer full): the gradient with respect to @k, summed
 *   over the query heads that share each key/value head
 * @dv: (out) (transfer full): the gradient with respect to @v
 * @error: return location for a #GError
 *
 * Computes the gradients of attention for this rank's pieces, recomputing
 * the attention probabilities block by block from @lse. Every rank of the
 * mesh calls it at the same time. Padding positions get exactly zero
 * gradients.
 *
 * Returns: (skip): %TRUE on success; %FALSE on every rank with the errors of
 *   [method@Cp.Attention.forward], also when @dout, @out or @lse do not
 *   match
 *
 * Since: 1.0
 */
gboolean
cp_attention_backward (CpAttention  *self,
                       CpTensor     *dout,
                       CpTensor     *q,
                       CpTensor     *k,
                       CpTensor     *v,
                       CpTensor     *out,
                       CpTensor     *lse,
                       CpTensor    **dq,
                       CpTensor    **dk,
                       CpTensor    **dv,
                       GError      **error)
{
  g_auto(Plan) plan = { 0 };
  g_auto(Buffers) bufs = { 0 };
  GError *invalid = NULL;

  g_return_val_if_fail (CP_IS_ATTENTION (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (dout) && CP_IS_TENSOR (q) && CP_IS_TENSOR (k), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (v) && CP_IS_TENSOR (out) && CP_IS_TENSOR (lse), FALSE);
  g_return_val_if_fail (dq != NULL && dk != NULL && dv != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  plan_build (self, &plan, q, k, v, dout, out, lse, &invalid);
  if (invalid == NULL)
    buffers_new_backward (self, &plan, q, &bufs, &invalid);
  if (!agree (self, &plan, TRUE, invalid, error))
    return FALSE;
  pack_kv (k, v, bufs.kv);
  if (!backward_run (self, &plan, dout, q, out, lse, &bufs, error))
    return FALSE;
  *dq = g_steal_pointer (&bufs.results[0]);
  *dk = g_steal_pointer (&bufs.results[1]);
  *dv = g_steal_pointer (&bufs.results[2]);
  return TRUE;
}

static gboolean
run_forward (gpointer     self,
             CpTaskArgs  *args,
             GError     **error)
{
  return cp_attention_forward (self, args->objects[0], args->objects[1], args->objects[2],
                               (CpTensor **) &args->results[0], (CpTensor **) &args->results[1],
                               error);
}

/**
 * cp_attention_forward_async:
 * @self: an attention operator
 * @q: this rank's queries: [B, H, S, D], or [T, H, D] for packed inputs
 * @k: this rank's keys: [B, H_kv, S, D] or [T, H_kv, D], the dtype of @q
 * @v: this rank's values, shaped like @k
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Attention.forward] on a worker thread, so that one main
 * loop can drive every in-process rank. The operator and the tensors
 * belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_attention_forward_async (CpAttention         *self,
                            CpTensor            *q,
                            CpTensor            *k,
                            CpTensor            *v,
                            GCancellable        *cancellable,
                            GAsyncReadyCallback  callback,
                            gpointer             user_data)
{
  g_return_if_fail (CP_IS_ATTENTION (self));
  g_return_if_fail (CP_IS_TENSOR (q) && CP_IS_TENSOR (k) && CP_IS_TENSOR (v));

  _cp_task_start (self, self->mesh, "attention forward", cp_attention_forward_async, run_forward,
                  &(CpTaskArgs) { .objects = { q, k, v } }, cancellable, callback, user_data);
}

/**
 * cp_attention_forward_finish:
 * @self: an attention operator
 * @result: the result given to the callback
 * @out: (out) (transfer full): the attention output, shaped like the
 *   queries
 * @lse: (out) (optional) (transfer full): the float32 log-sum-exp of every
 *   query row
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Attention.forward_async].
 *
 * Returns: (skip): %TRUE on success; %FALSE with the errors of
 *   [method@Cp.Attention.forward], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
gboolean
cp_attention_forward_finish (CpAttention   *self,
                             GAsyncResult  *result,
                             CpTensor     **out,
                             CpTensor     **lse,
                             GError       **error)
{
  g_return_val_if_fail (out != NULL, FALSE);

  return _cp_task_finish (self, result, cp_attention_forward_async, error, 2, out, lse);
}

static gboolean
run_backward (gpointer     self,
              CpTaskArgs  *args,
              GError     **error)
{
  gpointer *in = args->objects;

  return cp_attention_backward (self, in[0], in[1], in[2], in[3], in[4], in[5],
                                (CpTensor **) &args->results[0], (CpTensor **) &args->results[1],
                                (CpTensor **) &args->results[2], error);
}

/**
 * cp_attention_backward_async:
 * @self: an attention operator
 * @dout: the gradient of the loss with respect to @out
 * @q: the queries given to [method@Cp.Attention.forward]
 * @k: the keys given to forward
 * @v: the values given to forward
 * @out: the output forward returned
 * @lse: the log-sum-exp forward returned
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Attention.backward] on a worker thread. The operator
 * and the tensors belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_attention_backward_async (CpAttention         *self,
                             CpTensor            *dout,
                             CpTensor            *q,
                             CpTensor            *k,
                             CpTensor            *v,
                             CpTensor            *out,
                             CpTensor            *lse,
                             GCancellable        *cancellable,
                             GAsyncReadyCallback  callback,
                             gpointer             user_data)
{
  g_return_if_fail (CP_IS_ATTENTION (self));
  g_return_if_fail (CP_IS_TENSOR (dout) && CP_IS_TENSOR (q) && CP_IS_TENSOR (k));
  g_return_if_fail (CP_IS_TENSOR (v) && CP_IS_TENSOR (out) && CP_IS_TENSOR (lse));

  _cp_task_start (self, self->mesh, "attention backward", cp_attention_backward_async, run_backward,
                  &(CpTaskArgs) { .objects = { dout, q, k, v, out, lse } },
                  cancellable, callback, user_data);
}

/**
 * cp_attention_backward_finish:
 * @self: an attention operator
 * @result: the result given to the callback
 * @dq: (out) (transfer full): the gradient with respect to the queries
 * @dk: (out) (transfer full): the gradient with respect to the keys
 * @dv: (out) (transfer full): the gradient with respect to the values
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Attention.backward_async].
 *
 * Returns: (skip): %TRUE on success; %FALSE with the errors of
 *   [method@Cp.Attention.backward], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
gboolean
cp_attention_backward_finish (CpAttention   *self,
                              GAsyncResult  *result,
                              CpTensor     **dq,
                              CpTensor     **dk,
                              CpTensor     **dv,
                              GError       **error)
{
  g_return_val_if_fail (dq != NULL && dk != NULL && dv != NULL, FALSE);

  return _cp_task_finish (self, result, cp_attention_backward_async, error, 3, dq, dk, dv);
}
