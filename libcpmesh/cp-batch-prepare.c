/* cp-batch-prepare.c: the native make_cp_batch_and_ctx
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-batch-options-private.h"
#include "cp-batch-private.h"
#include "cp-context-private.h"
#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-mesh-private.h"
#include "cp-task-private.h"
#include "cp-tensor-private.h"

/* Prepare runs in phases so that a bad batch is never half modified:
 * claim (hold every tensor prepare may read or change, so that no other
 * rank's prepare or context changes it meanwhile), collect (validate and
 * choose the buffers), materialize (allocate every padded tensor), agree
 * (every rank learns whether all could), commit (swap them in; cannot
 * fail). */

typedef struct
{
  char *key;
  CpTensor *tensor;      /* the caller's object; NULL for synthesized position ids */
  guint dim;
  double fill;
  gboolean restore;
  gboolean expand;       /* position ids [1, S] become [B, S] */
  gboolean out_of_place; /* a gradient-bearing primary buffer */
  gboolean extra;        /* an extra sequence buffer */
  CpTensor *prepared;    /* the padded (or sharded) data, when it changes */
} Item;

typedef struct
{
  GPtrArray *items;      /* of Item*, in registration order */
  int cp_size;
  int cp_rank;
  gint64 rows;           /* B */
  gint64 seq_len;        /* S */
  gint64 padded_len;     /* S rounded up to a multiple of 2·C */
  const char *primary_key;
  CpDeviceKind device;   /* the primary buffer's, for synthesized buffers */
  CpLayout *layout;
  GPtrArray *claimed;    /* of CpTensor*, held by this plan until it is cleared */
} Plan;

static void
item_free (gpointer data)
{
  Item *item = data;

  g_free (item->key);
  g_clear_object (&item->tensor);
  g_clear_object (&item->prepared);
  g_free (item);
}

static void
plan_clear (Plan *plan)
{
  for (guint i = 0; plan->claimed != NULL && i < plan->claimed->len; i++)
    _cp_tensor_release (plan->claimed->pdata[i], plan);
  g_clear_pointer (&plan->claimed, g_ptr_array_unref);
  g_clear_pointer (&plan->items, g_ptr_array_unref);
  g_clear_pointer (&plan->layout, cp_layout_unref);
}

/* Holds @tensor (which may be NULL) for this plan; the plan may name one
 * tensor several times (collect refuses that later, by key). */
static gboolean
claim_tensor (Plan        *plan,
              CpTensor    *tensor,
              const char  *key,
              GError     **error)
{
  g_autofree char *label = NULL;

  if (tensor == NULL || g_ptr_array_find (plan->claimed, tensor, NULL))
    return TRUE;
  if (_cp_tensor_claim (tensor, plan))
    {
      g_ptr_array_add (plan->claimed, g_object_ref (tensor));
      return TRUE;
    }
  label = g_strdup_printf ("'%s'", key);
  _cp_tensor_set_in_use_error (error, "prepare", label);
  return FALSE;
}

/* Every tensor prepare may read or pad, found by key alone: reading one
 * that another holder is changing would race with it. */
static gboolean
plan_claim (Plan            *plan,
            CpBatch         *batch,
            CpBatchOptions  *options,
            GError         **error)
{
  static const char * const standard[] = {
    "input_ids", "inputs_embeds", "labels", "position_ids", "loss_mask", "padding_mask",
  };
  g_autoptr(GPtrArray) marked = _cp_batch_dup_marked_keys (batch);
  guint n_extras = options != NULL ? cp_batch_options_get_n_extra_buffers (options) : 0;

  for (guint i = 0; i < G_N_ELEMENTS (standard); i++)
    if (!claim_tensor (plan, cp_batch_get (batch, standard[i]), standard[i], error))
      return FALSE;
  if (options != NULL &&
      !claim_tensor (plan, cp_batch_options_get_loss_mask (options), "loss_mask", error))
    return FALSE;
  for (guint i = 0; i < n_extras; i++)
    {
      const char *key = cp_batch_options_get_extra_buffer (options, i, NULL);

      if (!claim_tensor (plan, cp_batch_get (batch, key), key, error))
        return FALSE;
    }
  for (guint i = 0; i < marked->len; i++)
    if (!claim_tensor (plan, cp_batch_get (batch, marked->pdata[i]), marked->pdata[i], error))
      return FALSE;
  return TRUE;
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Plan, plan_clear)

static Item *
plan_add (Plan       *plan,
          const char *key,
          CpTensor   *tensor,
          guint       dim,
          double      fill)
{
  Item *item = g_new0 (Item, 1);

  item->key = g_strdup (key);
  item->tensor = tensor != NULL ? g_object_ref (tensor) : NULL;
  item->dim = dim;
  /* The reference pads floating buffers with zeros whatever their key. */
  item->fill = tensor != NULL && cp_dtype_is_floating (cp_tensor_get_dtype (tensor)) ? 0.0 : fill;
  g_ptr_array_add (plan->items, item);
  return item;
}

static Item *
plan_find (Plan       *plan,
           const char *key)
{
  for (guint i = 0; i < plan->items->len; i++)
    {
      Item *item = g_ptr_array_index (plan->items, i);

      if (strcmp (item->key, key) == 0)
        return item;
    }
  return NULL;
}

/* Token ids index a vocabulary: integers.  A floating or boolean tensor
 * under 'input_ids' is a mistake here (embeddings belong under
 * 'inputs_embeds'), and padding it with the token fill would hide it.
 * (to_thd, after the reference's packing, takes embeddings under either
 * key.) */
static gboolean
check_token_ids (CpTensor  *ids,
                 GError   **error)
{
  CpDType dtype = cp_tensor_get_dtype (ids);
  g_autofree char *description = NULL;

  if (dtype == CP_DTYPE_INT64 || dtype == CP_DTYPE_INT32 || dtype == CP_DTYPE_UINT8)
    return TRUE;
  description = cp_tensor_describe (ids);
  g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_DTYPE,
               "prepare: 'input_ids' is %s, but token ids are integers (int64, int32 or uint8), "
               "not %s; embeddings belong under 'inputs_embeds'", description,
               cp_dtype_get_name (dtype));
  return FALSE;
}

static gboolean
collect_primary (Plan     *plan,
                 CpBatch  *batch,
                 GError  **error)
{
  CpTensor *primary = _cp_batch_get_primary (batch, "prepare", &plan->primary_key, error);
  Item *item;

  if (primary == NULL)
    return FALSE;
  if (strcmp (plan->primary_key, "input_ids") == 0 && !check_token_ids (primary, error))
    return FALSE;
  if (cp_tensor_get_n_dims (primary) < 2)
    return _cp_batch_shape_error (error, "prepare", plan->primary_key, primary,
                                  "[B, S] or [B, S, H]");
  plan->device = cp_tensor_get_device (primary);
  plan->rows = cp_tensor_get_dim (primary, 0);
  plan->seq_len = cp_tensor_get_dim (primary, 1);
  item = plan_add (plan, plan->primary_key, primary, 1, 0.0);
  item->out_of_place = cp_tensor_get_requires_grad (primary);
  return TRUE;
}

/* Every [B, S] buffer has the primary buffer's rows: padding and sharding
 * would run, and the loss would read rows that do not belong together. */
static gboolean
check_rows (Plan        *plan,
            const char  *key,
            CpTensor    *tensor,
            guint        batch_dim,
            const char  *form,
            GError     **error)
{
  g_autofree char *need = NULL;

  if (cp_tensor_get_dim (tensor, (int) batch_dim) == plan->rows)
    return TRUE;
  need = g_strdup_printf ("%s with B = %" G_GINT64_FORMAT " like '%s'", form, plan->rows,
                          plan->primary_key);
  return _cp_batch_shape_error (error, "prepare", key, tensor, need);
}

static gboolean
collect_labels (Plan     *plan,
                CpBatch  *batch,
                GError  **error)
{
  CpTensor *labels = cp_batch_get (batch, "labels");

  if (labels == NULL)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_MISSING_KEY,
                   "prepare: the batch has no 'labels'");
      return FALSE;
    }
  if (cp_tensor_get_n_dims (labels) < 2)
    return _cp_batch_shape_error (error, "prepare", "labels", labels, "[B, S]");
  if (!check_rows (plan, "labels", labels, 0, "[B, S]", error))
    return FALSE;
  plan_add (plan, "labels", labels, 1, -100.0);
  return TRUE;
}

/* Missing position ids are synthesized as arange(S) per row; [1, S] is
 * expanded to [B, S]; mRoPE [3, B, S] carries its sequence on dim 2. */
static gboolean
collect_position_ids (Plan     *plan,
                      CpBatch  *batch,
                      GError  **error)
{
  CpTensor *positions = cp_batch_get (batch, "position_ids");
  guint n_dims;
  Item *item;

  if (positions == NULL)
    {
      item = plan_add (plan, "position_ids", NULL, 1, 0.0);
      item->restore = TRUE;
      return TRUE;
    }
  n_dims = cp_tensor_get_n_dims (positions);
  if (n_dims != 2 && n_dims != 3)
    return _cp_batch_shape_error (error, "prepare", "position_ids", positions,
                                  "[B, S], [1, S] or [3, B, S]");
  if (n_dims == 2 && cp_tensor_get_dim (positions, 0) != 1 &&
      cp_tensor_get_dim (positions, 0) != plan->rows)
    {
      g_autofree char *need = g_strdup_printf ("[%" G_GINT64_FORMAT ", S] or [1, S] like the "
                                               "primary buffer", plan->rows);

      return _cp_batch_shape_error (error, "prepare", "position_ids", positions, need);
    }
  if (n_dims == 3 && cp_tensor_get_dim (positions, 0) != 3)
    return _cp_batch_shape_error (error, "prepare", "position_ids", positions, "[3, B, S]");
  if (n_dims == 3 && !check_rows (plan, "position_ids", positions, 1, "[3, B, S]", error))
    return FALSE;
  item = plan_add (plan, "position_ids", positions, n_dims == 3 ? 2 : 1, 0.0);
  item->restore = TRUE;
  item->expand = n_dims == 2 && cp_tensor_get_dim (positions, 0) == 1 && plan->rows > 1;
  return TRUE;
}

/* The options' loss mask, or else a `loss_mask` batch entry: both are
 * padded and sharded in place, so the caller's object is the one the
 * loss sees. */
static gboolean
collect_loss_mask (Plan            *plan,
                   CpBatch         *batch,
                   CpBatchOptions  *options,
                   GError         **error)
{
  CpTensor *given = options != NULL ? cp_batch_options_get_loss_mask (options) : NULL;
  CpTensor *entry = cp_batch_get (batch, "loss_mask");
  Item *item;

  if (given != NULL && entry != NULL && given != entry)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONFLICTING_KEYS,
                   "prepare: the options carry a loss mask and the batch a different "
                   "'loss_mask'; give one of them");
      return FALSE;
    }
  if (given == NULL && entry == NULL)
    return TRUE;
  item = plan_add (plan, "loss_mask", given != NULL ? given : entry, 1, 0.0);
  if (cp_tensor_get_n_dims (item->tensor) < 2)
    return _cp_batch_shape_error (error, "prepare", "loss_mask", item->tensor, "[B, S]");
  return check_rows (plan, "loss_mask", item->tensor, 0, "[B, S]", error);
}

static gboolean
collect_padding_mask (Plan     *plan,
                      CpBatch  *batch,
                      GError  **error)
{
  CpTensor *mask = cp_batch_get (batch, "padding_mask");

  if (mask == NULL)
    return TRUE;
  if (cp_tensor_get_n_dims (mask) < 2)
    return _cp_batch_shape_error (error, "prepare", "padding_mask", mask, "[B, S]");
  if (!check_rows (plan, "padding_mask", mask, 0, "[B, S]", error))
    return FALSE;
  plan_add (plan, "padding_mask", mask, 1, 1.0);
  return TRUE;
}

static gboolean
collect_extra (Plan        *plan,
               CpBatch     *batch,
               const char  *key,
               int          seq_dim,
               GError     **error)
{
  CpTensor *tensor = cp_batch_get (batch, key);
  Item *existing = plan_find (plan, key);
  guint dim;

  if (tensor == NULL)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_MISSING_KEY,
                   "prepare: extra sequence buffer '%s' is missing from the batch", key);
      return FALSE;
    }
  if (!_cp_tensor_normalize_dim (tensor, key, seq_dim, &dim, error))
    return FALSE;
  if (existing != NULL && (!existing->extra || existing->dim != dim))
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONFLICTING_KEYS,
                   "prepare: '%s' is already registered%s along dimension %u; it cannot "
                   "also be an extra buffer along dimension %u",
                   key, existing->extra ? " as an extra buffer" : " as a standard buffer",
                   existing->dim, dim);
      return FALSE;
    }
  if (existing == NULL)
    plan_add (plan, key, tensor, dim, 0.0)->extra = TRUE;
  return TRUE;
}

/* The options' extras in their order, then the keys marked on the batch:
 * the reference registers extra_seq_buffers in argument order. */
static gboolean
collect_extras (Plan            *plan,
                CpBatch         *batch,
                CpBatchOptions  *options,
                GError         **error)
{
  g_autoptr(GPtrArray) marked = _cp_batch_dup_marked_keys (batch);
  guint n = options != NULL ? cp_batch_options_get_n_extra_buffers (options) : 0;

  for (guint i = 0; i < n; i++)
    {
      int seq_dim;
      const char *key = cp_batch_options_get_extra_buffer (options, i, &seq_dim);

      if (!collect_extra (plan, batch, key, seq_dim, error))
        return FALSE;
    }
  for (guint i = 0; i < marked->len; i++)
    {
      int seq_dim = 0;

      cp_batch_get_seq_dim (batch, marked->pdata[i], &seq_dim);
      if (!collect_extra (plan, batch, marked->pdata[i], seq_dim, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
check_item (Plan     *plan,
            Item     *item,
            GError  **error)
{
  g_autofree char *label = g_strdup_printf ("'%s'", item->key);
  gint64 length;

  if (!_cp_tensor_require_device (item->tensor, "prepare", label, CP_DEVICE_KINDS_REACHABLE,
                                  error))
    return FALSE;
  length = cp_tensor_get_dim (item->tensor, (int) item->dim);
  if (length != plan->seq_len)
    {
      g_autofree char *description = cp_tensor_describe (item->tensor);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "prepare: '%s' (%s) has length %" G_GINT64_FORMAT " along its sequence "
                   "dimension %u, but '%s' has sequence length %" G_GINT64_FORMAT,
                   item->key, description, length, item->dim, plan->primary_key, plan->seq_len);
      return FALSE;
    }
  return TRUE;
}

/* Sharding one object twice in place would corrupt it. */
static gboolean
check_distinct (Plan     *plan,
                guint     i,
                GError  **error)
{
  Item *item = g_ptr_array_index (plan->items, i);

  for (guint j = 0; j < i; j++)
    {
      Item *other = g_ptr_array_index (plan->items, j);

      if (other->tensor == item->tensor)
        {
          g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_CONFLICTING_KEYS,
                       "prepare: '%s' and '%s' are the same tensor; each buffer must be its "
                       "own tensor", other->key, item->key);
          return FALSE;
        }
    }
  return TRUE;
}

static gboolean
check_items (Plan     *plan,
             GError  **error)
{
  for (guint i = 0; i < plan->items->len; i++)
    {
      Item *item = g_ptr_array_index (plan->items, i);

      if (item->tensor != NULL &&
          (!check_item (plan, item, error) || !check_distinct (plan, i, error)))
        return FALSE;
    }
  return TRUE;
}

static gboolean
plan_collect (Plan            *plan,
              CpBatch         *batch,
              CpBatchOptions  *options,
              GError         **error)
{
  gint64 divisor = 2 * (gint64) plan->cp_size;

  if (!collect_primary (plan, batch, error) ||
      !collect_labels (plan, batch, error) ||
      !collect_position_ids (plan, batch, error) ||
      !collect_loss_mask (plan, batch, options, error) ||
      !collect_padding_mask (plan, batch, error) ||
      !collect_extras (plan, batch, options, error) ||
      !check_items (plan, error))
    return FALSE;
  plan->padded_len = plan->seq_len + (divisor - plan->seq_len % divisor) % divisor;
  return TRUE;
}

/* arange(S) in every row, then zeros over the padding: what the
 * reference builds and pads.  One host row is repeated into every row of
 * the batch's memory by a 2-D copy whose source rows do not advance
 * (pitch 0), which the memory interface issues as one copy a row: a
 * device's 2-D copy takes no pitch below the width. */
static CpTensor *
synthesize_positions (Plan     *plan,
                      GError  **error)
{
  const gint64 shape[2] = { plan->rows, plan->padded_len };
  g_autoptr(CpTensor) positions = _cp_tensor_new_on_device (plan->device, CP_DTYPE_INT64, shape,
                                                            2, TRUE, error);
  g_autoptr(CpTensor) row = NULL;

  if (positions == NULL)
    return NULL;
  row = cp_tensor_new_arange (CP_DTYPE_INT64, 0, plan->seq_len, 1, error);
  if (row == NULL)
    return NULL;
  if (!_cp_memory_copy_2d (positions, 0, (gsize) plan->padded_len * sizeof (gint64), row, 0, 0,
                           cp_tensor_get_nbytes (row), (gsize) plan->rows, FALSE, error))
    return NULL;
  return g_steal_pointer (&positions);
}

/* Copies @source with its sequence dimension right-padded to the padded
 * length with @item's fill value, one whole row at a time; an expanded
 * [1, S] source is repeated for every row (a source pitch of 0, see
 * synthesize_positions). */
static CpTensor *
pad_item (Plan     *plan,
          Item     *item,
          GError  **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  CpDType dtype = cp_tensor_get_dtype (item->tensor);
  guint n_dims;
  const gint64 *source_shape = cp_tensor_get_shape (item->tensor, &n_dims);
  gsize outer, step, row, padded_row, fill_count;
  gint64 length;
  g_autoptr(CpTensor) out = NULL;

  memcpy (shape, source_shape, n_dims * sizeof (gint64));
  shape[item->dim] = plan->padded_len;
  if (item->expand)
    shape[0] = plan->rows;
  out = _cp_tensor_new_on_device (cp_tensor_get_device (item->tensor), dtype, shape, n_dims, FALSE,
                                  error);
  if (out == NULL)
    return NULL;
  _cp_tensor_split_at (out, item->dim, &outer, &length, &step);
  row = (gsize) plan->seq_len * step;
  padded_row = (gsize) plan->padded_len * step;
  fill_count = (padded_row - row) / cp_dtype_get_size (dtype);
  if (!_cp_memory_copy_2d (out, 0, padded_row, item->tensor, 0, item->expand ? 0 : row, row, outer,
                           FALSE, error))
    return NULL;
  for (gsize o = 0; o < outer; o++)
    if (!_cp_memory_fill (out, o * padded_row + row, fill_count, item->fill, error))
      return NULL;
  return g_steal_pointer (&out);
}

static gboolean
materialize_item (Plan     *plan,
                  Item     *item,
                  GError  **error)
{
  g_autoptr(CpTensor) padded = NULL;

  if (item->tensor == NULL || item->expand || plan->padded_len != plan->seq_len)
    {
      padded = item->tensor == NULL ? synthesize_positions (plan, error) : pad_item (plan, item, error);
      if (padded == NULL)
        return FALSE;
    }
  if (!item->out_of_place)
    {
      item->prepared = g_steal_pointer (&padded);
      return TRUE;
    }
  /* The gradient-bearing primary is sharded now, out of place: the
   * caller's tensor (and whatever graph refers to it) stays intact. */
  item->prepared = cp_layout_shard (plan->layout, padded != NULL ? padded : item->tensor,
                                    (int) item->dim, plan->cp_rank, error);
  if (item->prepared == NULL)
    return FALSE;
  cp_tensor_set_requires_grad (item->prepared, TRUE);
  return TRUE;
}

static gboolean
plan_materialize (Plan     *plan,
                  GError  **error)
{
  plan->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, plan->padded_len, plan->cp_size, error);
  if (plan->layout == NULL)
    return FALSE;
  for (guint i = 0; i < plan->items->len; i++)
    if (!materialize_item (plan, g_ptr_array_index (plan->items, i), error))
      return FALSE;
  return TRUE;
}

/* Swaps the prepared data in: the caller's objects now hold the padded
 * buffers, new ones go into the batch. */
static CpContext *
plan_commit (Plan           *plan,
             CpBatch        *batch,
             CpMesh         *group,
             CpRotateMethod  rotate_method)
{
  CpContext *context = cp_context_new (group, rotate_method);

  cp_batch_remove (batch, "attention_mask");
  for (guint i = 0; i < plan->items->len; i++)
    {
      Item *item = g_ptr_array_index (plan->items, i);

      if (item->out_of_place)
        {
          cp_batch_set (batch, item->key, item->prepared);
          continue;
        }
      if (item->tensor == NULL)
        {
          cp_batch_set (batch, item->key, item->prepared);
          item->tensor = g_object_ref (item->prepared);
        }
      else if (item->prepared != NULL)
        _cp_tensor_assign (item->tensor, plan, item->prepared);
      _cp_context_register_named (context, item->key, item->tensor, (int) item->dim, item->restore);
    }
  _cp_context_set_layout (context, plan->layout);
  _cp_context_set_unpadded_length (context, plan->seq_len);
  return context;
}

static CpRotateMethod
rotate_method_of (CpBatchOptions *options)
{
  return options != NULL ? cp_batch_options_get_rotate_method (options) : CP_ROTATE_METHOD_ALLGATHER;
}

/**
 * cp_batch_prepare:
 * @self: a batch
 * @mesh: (nullable): the mesh: a 1-D context-parallel mesh, or one with a
 *   `cp` dimension; %NULL for no context parallelism
 * @options: (nullable): loss mask, rotate method and extra buffers, or
 *   %NULL for the defaults
 * @error: return location for a #GError
 *
 * Prepares a batch for context parallelism and returns the context whose
 * enter shards it: the native `make_cp_batch_and_ctx`.
 *
 * Without a mesh, or with a context-parallel size of 1, the batch is left
 * untouched and the context does nothing. Otherwise, in order:
 *
 * - `attention_mask` is dropped: a full mask does not fit sharded
 *   queries and keys;
 * - the primary buffer is `input_ids` `[B, S]` or `inputs_embeds`
 *   `[B, S, H]`, exactly one of them;
 * - missing `position_ids` become arange(S) in every row, `[B, S]` int64;
 *   `[1, S]` is expanded to `[B, S]`; mRoPE `[3, B, S]` keeps its shape;
 * - every sequence buffer is right-padded along its own sequence
 *   dimension to a multiple of 2·C: `labels` with −100, `padding_mask`
 *   with %TRUE, floating buffers with 0.0 whatever their key (floating
 *   `labels` and `padding_mask` too), anything else with 0 (the
 *   reference's fill values);
 * - buffers are registered in the reference's order: primary, `labels`,
 *   `position_ids`, the loss mask, `padding_mask`, then extra buffers. Only
 *   `position_ids` is restored by exit;
 * - a primary buffer with [property@Cp.Tensor:requires-grad] is sharded
 *   now, out of place, with [method@Cp.Layout.shard]: the batch gets the
 *   new local tensor and the caller's tensor stays intact; use
 *   [method@Cp.Layout.shard_backward] with [method@Cp.Context.get_layout]
 *   for its gradient.
 *
 * Padding happens in place, like sharding: every registered tensor object
 * — a loss mask given in @options included — is the padded one afterwards,
 * whether or not padding was needed.
 *
 * Everything is checked before anything changes: on error the batch and
 * its tensors are as they were. Every rank of the group calls prepare
 * together: after its own checks each rank tells the others, in one small
 * all-gather, whether it can go on, so an error on any rank is the same
 * error on every rank, and no rank changes anything. (The options are
 * checked first, on each rank alone, and enter compares the lengths and
 * layouts of the ranks.)
 *
 * While it runs, prepare holds every buffer it reads or pads: one tensor
 * in the batches of two ranks, or a loss mask in options every rank
 * shares, fails with %CP_TENSOR_ERROR_IN_USE on every rank; give each rank
 * its own tensors.
 *
 * Returns: (transfer full): the context, or %NULL with
 *   %CP_BATCH_ERROR_MISSING_KEY or %CP_BATCH_ERROR_CONFLICTING_KEYS (naming
 *   the keys), %CP_TENSOR_ERROR_SHAPE (naming the key, the dimension and
 *   the lengths), %CP_BATCH_ERROR_DTYPE (`input_ids` that are not
 *   integers), %CP_TENSOR_ERROR_IN_USE (naming the key),
 *   %CP_BATCH_ERROR_INVALID_OPTION, or %CP_MESH_ERROR_INVALID_TOPOLOGY for
 *   a mesh without a `cp` dimension
 *
 * Since: 1.0
 */
CpContext *
cp_batch_prepare (CpBatch         *self,
                  CpMesh          *mesh,
                  CpBatchOptions  *options,
                  GError         **error)
{
  static const char * const agreed_on[] = { "context-parallel size" };
  g_auto(Plan) plan = { 0 };
  CpMesh *group = NULL;
  GError *invalid = NULL;
  gint64 cp_size;

  g_return_val_if_fail (CP_IS_BATCH (self), NULL);
  g_return_val_if_fail (mesh == NULL || CP_IS_MESH (mesh), NULL);
  g_return_val_if_fail (options == NULL || CP_IS_BATCH_OPTIONS (options), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_batch_options_check (options, error))
    return NULL;
  if (mesh != NULL && (group = _cp_context_resolve_mesh (mesh, error)) == NULL)
    return NULL;
  if (group == NULL || cp_mesh_get_world_size (group) == 1)
    {
      /* Nothing to shard, pad or check against other ranks, as in the
       * reference; but token ids that are not integers are as wrong on
       * one rank as on many, and a program must not start failing only
       * when it is given a second rank. */
      CpTensor *ids = cp_batch_get (self, "input_ids");

      if (ids != NULL && !check_token_ids (ids, error))
        return NULL;
      return cp_context_new (group, rotate_method_of (options));
    }

  plan.items = g_ptr_array_new_with_free_func (item_free);
  plan.claimed = g_ptr_array_new_with_free_func (g_object_unref);
  plan.cp_size = cp_mesh_get_world_size (group);
  plan.cp_rank = cp_mesh_get_rank (group);
  cp_size = plan.cp_size;
  if (plan_claim (&plan, self, options, &invalid) && plan_collect (&plan, self, options, &invalid))
    plan_materialize (&plan, &invalid);
  /* One collective whatever happened here: a rank that cannot prepare
   * makes every rank fail, before any rank has changed anything. */
  if (!_cp_mesh_agree (group, "prepare", agreed_on, &cp_size, 1, invalid, error))
    return NULL;
  return plan_commit (&plan, self, group, rotate_method_of (options));
}

static gboolean
prepare_run (gpointer     self,
             CpTaskArgs  *args,
             GError     **error)
{
  args->results[0] = cp_batch_prepare (self, args->objects[0], args->objects[1], error);
  return args->results[0] != NULL;
}

/**
 * cp_batch_prepare_async:
 * @self: a batch
 * @mesh: (nullable): the mesh: a 1-D context-parallel mesh, or one with a
 *   `cp` dimension; %NULL for no context parallelism
 * @options: (nullable): loss mask, rotate method and extra buffers, or
 *   %NULL for the defaults
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Batch.prepare] on a worker thread, so that one main
 * loop can drive every in-process rank. The batch, its tensors, @mesh and
 * @options belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_batch_prepare_async (CpBatch             *self,
                        CpMesh              *mesh,
                        CpBatchOptions      *options,
                        GCancellable        *cancellable,
                        GAsyncReadyCallback  callback,
                        gpointer             user_data)
{
  g_return_if_fail (CP_IS_BATCH (self));
  g_return_if_fail (mesh == NULL || CP_IS_MESH (mesh));
  g_return_if_fail (options == NULL || CP_IS_BATCH_OPTIONS (options));

  _cp_task_start (self, mesh, "prepare", cp_batch_prepare_async, prepare_run,
                  &(CpTaskArgs) { .objects = { mesh, options } }, cancellable, callback, user_data);
}

/**
 * cp_batch_prepare_finish:
 * @self: a batch
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Batch.prepare_async].
 *
 * Returns: (transfer full): the context, or %NULL with the errors of
 *   [method@Cp.Batch.prepare], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
CpContext *
cp_batch_prepare_finish (CpBatch       *self,
                         GAsyncResult  *result,
                         GError       **error)
{
  return _cp_task_finish_object (self, result, cp_batch_prepare_async, error);
}
