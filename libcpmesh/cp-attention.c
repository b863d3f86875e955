/* cp-attention.c: the CpAttention object, its buffers and the calls into
 * the kernels
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "cp-attention-private.h"
#include "cp-memory-private.h"
#include "cp-error.h"
#include "cp-task-private.h"
#include "cp-tensor-private.h"

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
G_DEFINE_FINAL_TYPE (CpAttention, cp_attention, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_MESH,
  PROP_N_THREADS,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
cp_attention_finalize (GObject *object)
{
  CpAttention *self = CP_ATTENTION (object);

  g_clear_object (&self->mesh);
  g_clear_object (&self->options);
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

CpComm *
_cp_attention_get_comm (CpAttention *self)
{
  return _cp_mesh_get_comm (self->mesh);
}

/* The ranks that share this machine's processors: the ranks of an
 * in-process mesh are threads of this process; ranks in processes of
 * their own count as the launcher's local world size (torchrun, Open MPI). */
static int
ranks_in_process (CpAttention *self)
{
  CpTransport *transport = _cp_attention_get_comm (self)->transport;
  const char *names[] = { "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE" };

  if (_cp_transport_has_caps (transport, CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE))
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
configure (CpAttention               *self,
           const CpAttentionOptions  *options,
           GError                   **error)
{
  int size = _cp_attention_get_comm (self)->size;
  g_autoptr(GError) local_error = NULL;

  if (!_cp_attention_options_check (options, error))
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

/* A mesh of one rank for an operator made without one: C = 1, so
 * attention makes no collective and the operator behaves as on the only
 * rank of any one-rank mesh. */
static CpMesh *
new_single_rank_mesh (void)
{
  static const char * const names[] = { "cp", NULL };
  static const int sizes[] = { 1 };
  GList *meshes = cp_mesh_new_local_group (names, sizes, 1, NULL);
  CpMesh *mesh;

  g_assert (meshes != NULL && meshes->next == NULL);
  mesh = meshes->data;
  g_list_free (meshes);
  return mesh;
}

/**
 * cp_attention_new:
 * @mesh: (nullable): the context-parallel mesh (a 1-D mesh, or the
 *   submesh of the `cp` dimension), whose world size is C; %NULL for
 *   attention on one rank (C = 1) without a mesh
 * @options: (nullable): the settings, copied; %NULL for the defaults
 * @error: return location for a #GError
 *
 * Creates the attention operator of one rank. Every rank of @mesh creates
 * its own with the same options.
 *
 * Without a mesh the operator is the plain (not context-parallel)
 * attention of one process: it makes a one-rank mesh of its own
 * ([method@Cp.Attention.get_mesh] returns it), so it needs no
 * collective and no other rank, and computes exactly what the only rank
 * of any one-rank mesh computes. `Cp.Attention.new(None, options)` in
 * Python.
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
  g_autoptr(CpMesh) own_mesh = NULL;

  g_return_val_if_fail (mesh == NULL || CP_IS_MESH (mesh), NULL);
  g_return_val_if_fail (options == NULL || CP_IS_ATTENTION_OPTIONS ((gpointer) options), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (options == NULL)
    options = defaults = cp_attention_options_new ();
  if (mesh == NULL)
    mesh = own_mesh = new_single_rank_mesh ();
  self = g_object_new (CP_TYPE_ATTENTION, "mesh", mesh, NULL);
  if (!configure (self, options, error))
    return NULL;
  return g_steal_pointer (&self);
}

/**
 * cp_attention_get_mesh:
 * @self: an attention operator
 *
 * Gets the mesh the operator runs over: the one-rank mesh of its own for
 * an operator made without a mesh.
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
    return _cp_memory_kernel_address (tensor);
  g_assert (cp_tensor_get_dtype (tensor) == CP_DTYPE_BFLOAT16);
  g_assert (copy != NULL && (gsize) cp_tensor_get_numel (copy) >= n);
  values = _cp_memory_kernel_address (copy);
  plan->kernel->bfloat16_to_float32 (values, _cp_memory_kernel_address (tensor), n);
  return values;
}

/* Stores the float32 values at byte @offset of @source into @tensor, in
 * its dtype. */
static gboolean
store_float32 (const Plan  *plan,
               CpTensor    *tensor,
               CpTensor    *source,
               gsize        offset,
               GError     **error)
{
  gsize n = (gsize) cp_tensor_get_numel (tensor);
  const guint8 *values = _cp_memory_kernel_address (source);

  if (cp_tensor_get_dtype (tensor) == CP_DTYPE_FLOAT32)
    return (source == tensor && offset == 0) ||
           _cp_memory_copy (tensor, 0, source, offset, n * sizeof (float), FALSE, error);
  plan->kernel->float32_to_bfloat16 (_cp_memory_kernel_address (tensor),
                                     (const float *) (values + offset), n);
  return TRUE;
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
    return _cp_memory_kernel_address (tensor);
  return as_float32 (plan, tensor, copy);
}

/* The same for @n elements of the call's dtype at kernel address @data,
 * which may be a peer's memory read in place: never written. */
static gpointer
as_operand_at (const Plan    *plan,
               gconstpointer  data,
               gsize          n,
               CpTensor      *copy)
{
  float *values;

  if (!converts_operands (plan))
    return (gpointer) data;
  g_assert (plan->dtype == CP_DTYPE_BFLOAT16);
  g_assert (copy != NULL && (gsize) cp_tensor_get_numel (copy) >= n);
  values = _cp_memory_kernel_address (copy);
  plan->kernel->bfloat16_to_float32 (values, data, n);
  return values;
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

/* What the caller gets back lives where q is; the buffers the ring moves
 * stay in host memory, which every transport moves. */
static gboolean
result_new (CpTensor     **slot,
            const Plan    *plan,
            CpDType        dtype,
            const gint64  *shape,
            guint          n_dims,
            gboolean       zeroed,
            GError       **error)
{
  *slot = _cp_tensor_new_on_device (plan->device, dtype, shape, n_dims, zeroed, error);
  return *slot != NULL;
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
  guint n_dims = _cp_attention_operand_shape (plan, plan->n_kv_heads, shape + 1) + 1;

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

static gsize
pack_bytes (CpDType       dtype,
            const gint64 *shape,
            guint         n_dims)
{
  gsize n = cp_dtype_get_size (dtype);

  for (guint d = 0; d < n_dims; d++)
    n *= (gsize) shape[d];
  return n;
}

/* This rank's K/V pack, which the ring's peers read in place when they
 * can: in memory the transport can lend, if it proposes any. */
static gboolean
buffer_new_own_kv (CpAttention  *self,
                   const Plan   *plan,
                   CpTensor    **slot,
                   GError      **error)
{
  gint64 shape[5] = { 2 };
  guint n_dims = _cp_attention_operand_shape (plan, plan->n_kv_heads, shape + 1) + 1;
  g_autoptr(CpStorage) storage = NULL;
  GError *local_error = NULL;

  shape[kv_seq_dim (plan)] = plan->local_len;
  if (_cp_attention_reads_in_place (self, plan))
    storage = _cp_mesh_alloc_shared (self->mesh, CP_DEVICE_KIND_HOST,
                                     pack_bytes (plan->dtype, shape, n_dims), &local_error);
  if (local_error != NULL)
    {
      g_propagate_error (error, local_error);
      return FALSE;
    }
  if (storage == NULL)
    return buffer_new (slot, plan->dtype, shape, n_dims, FALSE, error);
  *slot = cp_tensor_new_from_storage (plan->dtype, shape, n_dims, storage, 0, error);
  return *slot != NULL;
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

  return buffer_new_own_kv (self, plan, &bufs->kv, error) &&
         (!uses_ring (self, plan) || _cp_attention_reads_in_place (self, plan) ||
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
  guint n_dims = _cp_attention_lse_shape (plan, shape);

  return buffers_new_common (self, plan, q, bufs, error) &&
         buffer_new_rows (&bufs->rows[1], plan, error) &&
         result_new (&bufs->results[0], plan, plan->dtype, cp_tensor_get_shape (q, NULL),
                     cp_tensor_get_n_dims (q), plan->dtype == CP_DTYPE_FLOAT32, error) &&
         result_new (&bufs->results[1], plan, CP_DTYPE_FLOAT32, shape, n_dims, FALSE, error) &&
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
  guint kv_dims = _cp_attention_operand_shape (plan, plan->n_kv_heads, kv_shape);

  return buffers_new_common (self, plan, q, bufs, error) &&
         (!converts_operands (plan) ||
          buffer_new_like (&bufs->dout32, q, CP_DTYPE_FLOAT32, FALSE, error)) &&
         buffer_new_like (&bufs->acc, q, CP_DTYPE_FLOAT32, TRUE, error) &&
         buffer_new_kv (&bufs->dkv, plan, CP_DTYPE_FLOAT32, plan->local_len, TRUE, error) &&
         buffers_new_partials (self, plan, bufs, error) &&
         result_new (&bufs->results[0], plan, plan->dtype, cp_tensor_get_shape (q, NULL),
                     cp_tensor_get_n_dims (q), FALSE, error) &&
         result_new (&bufs->results[1], plan, plan->dtype, kv_shape, kv_dims, FALSE, error) &&
         result_new (&bufs->results[2], plan, plan->dtype, kv_shape, kv_dims, FALSE, error);
}

/* K and V side by side in one buffer, so that every transfer moves both
 * at once, in their own dtype and head count.  Before the ranks agree to
 * go on, so that a rank whose memory fails here fails them all. */
static gboolean
pack_kv (CpTensor  *k,
         CpTensor  *v,
         CpTensor  *kv,
         GError   **error)
{
  gsize bytes = cp_tensor_get_nbytes (k);

  return _cp_memory_copy (kv, 0, k, 0, bytes, FALSE, error) &&
         _cp_memory_copy (kv, bytes, v, 0, bytes, FALSE, error);
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
    _cp_attention_append_rank_runs (plan, first_rank + i, plan->local_len * i, runs);
  keys->k = view_of (plan, kv, plan->n_kv_heads, rows);
  keys->v = view_of (plan, (guint8 *) kv + half * element_size, plan->n_kv_heads, rows);
  keys->runs = (const CpAttnRun *) runs->data;
  keys->n_runs = runs->len;
}

/* Forward. */

void
_cp_attention_forward_on (const Plan *plan,
                          Forward    *fwd,
                          CpTensor   *kv,
                          int         first_rank,
                          int         n_ranks)
{
  _cp_attention_forward_at (plan, fwd, _cp_memory_kernel_address (kv),
                            (gsize) cp_tensor_get_numel (kv), first_rank, n_ranks);
}

void
_cp_attention_forward_at (const Plan    *plan,
                          Forward       *fwd,
                          gconstpointer  kv,
                          gsize          kv_numel,
                          int            first_rank,
                          int            n_ranks)
{
  gpointer data = as_operand_at (plan, kv, kv_numel, fwd->kv32);
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
  _cp_attention_forward_on (plan, fwd, gathered, 0, plan->size);
  return TRUE;
}

/* @acc holds the float32 accumulator of @fwd's state. */
static gboolean
finish_forward (const Plan  *plan,
                Forward     *fwd,
                CpTensor    *acc,
                CpTensor    *out,
                CpTensor    *lse,
                GError     **error)
{
  plan->kernel->finalize (&plan->problem, &fwd->state, _cp_memory_kernel_address (lse));
  return store_float32 (plan, out, acc, 0, error);
}

/* The running maxima start at −∞ and the sums at 0; before the ranks
 * agree, as pack_kv. */
static gboolean
reset_rows (Buffers  *bufs,
            GError  **error)
{
  gsize n_rows = (gsize) cp_tensor_get_numel (bufs->rows[0]);

  return _cp_memory_fill (bufs->rows[0], 0, n_rows, -INFINITY, error) &&
         _cp_memory_fill (bufs->rows[1], 0, n_rows, 0.0, error);
}

/* A float32 output accumulates in place. */
static gboolean
forward_run (CpAttention  *self,
             const Plan   *plan,
             CpTensor     *q,
             Buffers      *bufs,
             GError      **error)
{
  CpTensor *acc = bufs->acc != NULL ? bufs->acc : bufs->results[0];
  gpointer q_data = as_operand (plan, q, bufs->q32);
  Forward fwd = {
    .q = view_of (plan, q_data, plan->n_heads, plan->local_len),
    .state = { view_of (plan, _cp_memory_kernel_address (acc), plan->n_heads, plan->local_len),
               _cp_memory_kernel_address (bufs->rows[0]), _cp_memory_kernel_address (bufs->rows[1]) },
    .kv32 = bufs->kv32,
  };
  gboolean ok = TRUE;

  if (plan->size == 1)
    _cp_attention_forward_on (plan, &fwd, bufs->kv, 0, 1);
  else if (uses_ring (self, plan))
    ok = _cp_attention_forward_ring (self, plan, &fwd, bufs, error);
  else
    ok = forward_gathered (self, plan, &fwd, bufs->kv, error);
  return ok && finish_forward (plan, &fwd, acc, bufs->results[0], bufs->results[1], error);
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

  _cp_attention_plan_build (self, &plan, q, k, v, NULL, NULL, NULL, &invalid);
  if (invalid == NULL && buffers_new_forward (self, &plan, q, &bufs, &invalid))
    (void) (pack_kv (k, v, bufs.kv, &invalid) && reset_rows (&bufs, &invalid));
  if (!_cp_attention_agree (self, &plan, FALSE, invalid, error))
    return FALSE;
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
  CpAttnView dout_view = view_of (plan, _cp_memory_kernel_address (dout), plan->n_heads, plan->local_len);
  CpAttnView out_view = view_of (plan, _cp_memory_kernel_address (out), plan->n_heads, plan->local_len);

  plan->kernel->row_deltas (&plan->problem, type, &dout_view, &out_view, delta);
}

/* Adds to @dkv the gradients of the keys of @kv, a K/V block of @n_ranks
 * ranks from @first_rank; @kv32 takes its float32 copy if the kernel
 * needs one. */
void
_cp_attention_backward_on (const Plan        *plan,
                           const CpAttnGrads *grads,
                           CpTensor          *kv,
                           CpTensor          *kv32,
                           int                first_rank,
                           int                n_ranks,
                           CpTensor          *dkv)
{
  _cp_attention_backward_at (plan, grads, _cp_memory_kernel_address (kv),
                             (gsize) cp_tensor_get_numel (kv), kv32, first_rank, n_ranks, dkv);
}

void
_cp_attention_backward_at (const Plan        *plan,
                           const CpAttnGrads *grads,
                           gconstpointer      kv,
                           gsize              kv_numel,
                           CpTensor          *kv32,
                           int                first_rank,
                           int                n_ranks,
                           CpTensor          *dkv)
{
  gpointer data = as_operand_at (plan, kv, kv_numel, kv32);
  g_autoptr(GArray) runs = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  g_autoptr(GArray) unused = g_array_new (FALSE, FALSE, sizeof (CpAttnRun));
  CpAttnKeys keys, dkeys;

  keys_init (plan, data, operand_size (plan), first_rank, n_ranks, runs, &keys);
  keys_init (plan, _cp_memory_kernel_address (dkv), sizeof (float), first_rank, n_ranks, unused, &dkeys);
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
  const float *src = _cp_memory_kernel_address (exchanged);
  float *dst = _cp_memory_kernel_address (dkv);
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
  _cp_attention_backward_on (plan, grads, gathered, bufs->kv32, 0, plan->size, bufs->partial[0]);
  g_clear_object (&gathered);  /* lowers the peak before the exchange */
  exchanged = cp_mesh_all_to_all (self->mesh, bufs->partial[0], kv_seq_dim (plan), error);
  if (exchanged == NULL)
    return FALSE;
  sum_pieces (plan, exchanged, bufs->dkv);
  return TRUE;
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
  float *delta = _cp_memory_kernel_address (bufs->rows[0]);
  float *dq = _cp_memory_kernel_address (bufs->acc);
  CpAttnGrads grads = {
    .q = view_of (plan, as_operand (plan, q, bufs->q32), plan->n_heads, plan->local_len),
    .dout = view_of (plan, as_operand (plan, dout, bufs->dout32), plan->n_heads, plan->local_len),
    .lse = _cp_memory_kernel_address (lse),
    .delta = delta,
    .dq = view_of (plan, dq, plan->n_heads, plan->local_len),
  };
  gboolean ok = TRUE;

  row_deltas (plan, dout, out, delta);
  if (plan->size == 1)
    _cp_attention_backward_on (plan, &grads, bufs->kv, bufs->kv32, 0, 1, bufs->dkv);
  else if (uses_ring (self, plan))
    ok = _cp_attention_backward_ring (self, plan, &grads, bufs, error);
  else
    ok = backward_gathered (self, plan, &grads, bufs, error);
  return ok &&
         store_float32 (plan, bufs->results[0], bufs->acc, 0, error) &&
         store_float32 (plan, bufs->results[1], bufs->dkv, 0, error) &&
         store_float32 (plan, bufs->results[2], bufs->dkv, cp_tensor_get_nbytes (bufs->dkv) / 2,
                        error);
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

  _cp_attention_plan_build (self, &plan, q, k, v, dout, out, lse, &invalid);
  if (invalid == NULL && buffers_new_backward (self, &plan, q, &bufs, &invalid))
    (void) pack_kv (k, v, bufs.kv, &invalid);
  if (!_cp_attention_agree (self, &plan, TRUE, invalid, error))
    return FALSE;
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
