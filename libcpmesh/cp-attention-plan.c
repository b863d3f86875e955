/* cp-attention-plan.c: checking and planning a call, and agreeing on it
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "cp-attention-private.h"
#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"

/* The largest head dimension: K, V and score tiles of 128 rows then still
 * fit a core's L2 cache. */
#define MAX_HEAD_DIM 256

void
_cp_attention_plan_clear (Plan *plan)
{
  g_clear_pointer (&plan->layout, cp_layout_unref);
  g_clear_pointer (&plan->q_runs, g_array_unref);
  g_clear_pointer (&plan->real_end, g_array_unref);
}

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

  /* CpAttention computes where q is. */
  if (!_cp_tensor_require_device (tensor, "attention", name, 1u << plan->device, error))
    return FALSE;
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
guint
_cp_attention_operand_shape (const Plan *plan,
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

guint
_cp_attention_lse_shape (const Plan *plan,
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

/* The memory kinds an attention kernel of this build computes on: every
 * kind the memory interface reaches (_cp_memory_ops_for_kind answers for
 * any value, and a kind set holds 32) that has a kernel table.  No kind
 * is named here, so a kind added to the memory interface and the kernel
 * table is considered without a change to this file. */
static guint
kernel_kinds (void)
{
  guint kinds = 0;

  for (guint kind = 0; kind < 32; kind++)
    if (_cp_memory_ops_for_kind ((CpDeviceKind) kind) != NULL &&
        _cp_kernel_for_device ((CpDeviceKind) kind) != NULL)
      kinds |= 1u << kind;
  return kinds;
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
  if (!_cp_tensor_require_device (q, "attention", "q", kernel_kinds (), error))
    return FALSE;
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
  guint kv_dims = _cp_attention_operand_shape (plan, plan->n_kv_heads, kv_shape);
  guint q_dims = _cp_attention_operand_shape (plan, plan->n_heads, q_shape);
  guint l_dims = _cp_attention_lse_shape (plan, l_shape);

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
void
_cp_attention_append_rank_runs (const Plan *plan,
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
  _cp_attention_append_rank_runs (plan, plan->rank, 0, plan->q_runs);
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

/* The ring reads its peers' K/V packs where they lie whenever the ranks
 * can lend each other memory; CPMESH_ATTENTION_IN_PLACE=0 makes it pass
 * shards instead, for comparison.  Part of the agreement, so ranks told
 * differently fail together instead of waiting for each other. */
static gboolean
reads_in_place (CpAttention *self,
                CpComm      *comm)
{
  const char *setting = g_getenv ("CPMESH_ATTENTION_IN_PLACE");

  if (comm->size == 1 || self->options->rotate_method == CP_ROTATE_METHOD_ALLGATHER)
    return FALSE;
  if (setting != NULL && g_str_equal (setting, "0"))
    return FALSE;
  /* The K/V packs the ring lends are host memory (buffer_new_own_kv). */
  return _cp_mesh_can_share (self->mesh, CP_DEVICE_KIND_HOST);
}

gboolean
_cp_attention_plan_build (CpAttention  *self,
                          Plan         *plan,
                          CpTensor     *q,
                          CpTensor     *k,
                          CpTensor     *v,
                          CpTensor     *dout,
                          CpTensor     *out,
                          CpTensor     *lse,
                          GError      **error)
{
  CpComm *comm = _cp_attention_get_comm (self);

  plan->thd = self->thd_layout != NULL;
  plan->rank = comm->index;
  plan->size = comm->size;
  plan->in_place = reads_in_place (self, comm);
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
  DESC_IN_PLACE,
  N_DESC
};

static const char * const desc_names[N_DESC] = {
  "the call (forward or backward)", "the dtype", "packed inputs ([T, H, D] or [B, H, S, D])",
  "the batch size", "n_heads", "n_kv_heads", "the head dimension", "the local length", "causal",
  "the scale", "the rotate method", "the layout (load balance, cu_seqlens_padded)",
  "the real lengths (seq_lens, cu_seqlens)",
  "whether the ring reads K/V in place (CPMESH_ATTENTION_IN_PLACE)",
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
  desc[DESC_IN_PLACE] = plan->in_place;
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
    case DESC_IN_PLACE:
      return g_strdup (value ? "true" : "false");
    case DESC_SCALE:
      memcpy (&scale, &value, sizeof scale);
      return g_strdup_printf ("%g", scale);
    case DESC_ROTATE:
      return g_strdup (value == CP_ROTATE_METHOD_ALLGATHER ? "allgather" : "alltoall");
    case DESC_LAYOUT:
    case DESC_PADDING:
      return g_strdup_printf ("hash " CP_FINGERPRINT_SHORT_FORMAT, CP_FINGERPRINT_SHORT (value));
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
gboolean
_cp_attention_agree (CpAttention  *self,
                     const Plan   *plan,
                     gboolean      backward,
                     GError       *invalid,
                     GError      **error)
{
  CpComm *comm = _cp_attention_get_comm (self);
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
  };
  gboolean ok;

  if (invalid == NULL)
    describe_call (self, plan, backward, desc);
  _cp_region_init_host (&coll.send, desc, sizeof desc);
  _cp_region_init_host (&coll.recv, all, (gsize) comm->size * sizeof desc);
  ok = _cp_comm_collective (comm, &coll, _cp_mesh_deadline (self->mesh),
                            _cp_mesh_cancellable (self->mesh), error);
  _cp_collective_clear (&coll);
  g_clear_error (&coll.invalid);
  return ok && compare_calls (all, comm->size, error);
}
