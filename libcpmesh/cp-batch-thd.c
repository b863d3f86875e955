/* cp-batch-thd.c: the native make_cp_batch_for_te
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-batch-private.h"
#include "cp-context-private.h"
#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"
#include "kernels/cp-index-thd.h"

/* One chunk of consecutive batch rows, flattened: its documents as
 * cumulative bounds over the chunk's tokens. */
typedef struct
{
  gint64 first;          /* the chunk's first token in the flattened batch */
  gint64 n_tokens;
  GArray *real;          /* gint64 per document: its real length, as given */
  GArray *cu;            /* gint64 bounds of the real lengths, after absorption */
  GArray *cu_padded;     /* gint64 bounds of the padded lengths */
  gboolean emit_padded;  /* cu_padded differs from cu */
  CpLayout *layout;      /* the partition, when sharding */
} Chunk;

typedef struct
{
  const char *primary_key;
  CpTensor *primary;     /* the batch's tensors, borrowed */
  CpTensor *labels;
  CpTensor *positions;
  CpTensor *seq_lens;
  CpTensor *seq_lens_padded;
  CpTensor *cu_seqlens;  /* an already packed batch */
  CpTensor *cu_seqlens_padded;
  GPtrArray *held;       /* host copies of the lengths, read by the plan */
  CpDeviceKind device;   /* the primary's: where the outputs go */
  gboolean packed;
  gint64 rows;           /* B; 1 for a packed batch */
  gint64 seq_len;        /* S; T for a packed batch */
  int num_chunks;
  int cp_size;
  int cp_rank;
  gint64 sentinel;
  gint64 pad_id;
  CpPaddingMaskRule rule;
  Chunk *chunks;
} Thd;

static void
thd_clear (Thd *thd)
{
  for (int c = 0; thd->chunks != NULL && c < thd->num_chunks; c++)
    {
      g_clear_pointer (&thd->chunks[c].real, g_array_unref);
      g_clear_pointer (&thd->chunks[c].cu, g_array_unref);
      g_clear_pointer (&thd->chunks[c].cu_padded, g_array_unref);
      g_clear_pointer (&thd->chunks[c].layout, cp_layout_unref);
    }
  g_clear_pointer (&thd->chunks, g_free);
  g_clear_pointer (&thd->held, g_ptr_array_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Thd, thd_clear)

#define BOUND(array, i) g_array_index ((array), gint64, (i))

/* "" for one chunk, "chunk 2: " for several, so messages name the chunk. */
static char *
chunk_label (Thd *thd,
             int  c)
{
  return thd->num_chunks > 1 ? g_strdup_printf ("chunk %d: ", c) : g_strdup ("");
}

static gboolean
require (CpBatch     *batch,
         const char  *key,
         CpTensor   **tensor,
         GError     **error)
{
  *tensor = cp_batch_get (batch, key);
  if (*tensor != NULL)
    return TRUE;
  g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_MISSING_KEY,
               "to_thd: the batch has no '%s'", key);
  return FALSE;
}

/* Labels and position ids have the primary's leading dimensions: [B, S],
 * or [T] for a packed batch. */
static gboolean
check_like_primary (Thd         *thd,
                    const char  *key,
                    CpTensor    *tensor,
                    GError     **error)
{
  g_autofree char *need = thd->packed
    ? g_strdup_printf ("[%" G_GINT64_FORMAT "] like '%s'", thd->seq_len, thd->primary_key)
    : g_strdup_printf ("[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] like '%s'",
                       thd->rows, thd->seq_len, thd->primary_key);
  guint n_dims = thd->packed ? 1 : 2;

  if (cp_tensor_get_n_dims (tensor) != n_dims ||
      cp_tensor_get_dim (tensor, 0) != (thd->packed ? thd->seq_len : thd->rows) ||
      (!thd->packed && cp_tensor_get_dim (tensor, 1) != thd->seq_len))
    return _cp_batch_shape_error (error, "to_thd", key, tensor, need);
  return TRUE;
}

static gboolean
check_lengths_tensor (Thd         *thd,
                      const char  *key,
                      CpTensor    *tensor,
                      CpTensor    *like,
                      GError     **error)
{
  g_autofree char *description = cp_tensor_describe (tensor);
  CpDType dtype = cp_tensor_get_dtype (tensor);
  gboolean int32_only = thd->packed;

  if (dtype != CP_DTYPE_INT32 && (int32_only || dtype != CP_DTYPE_INT64))
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: '%s' is %s; it must be %s", key, description,
                   int32_only ? "int32, as Transformer Engine requires" : "int32 or int64");
      return FALSE;
    }
  if (thd->packed ? cp_tensor_get_n_dims (tensor) != 1
                  : cp_tensor_get_n_dims (tensor) != 2 || cp_tensor_get_dim (tensor, 0) != thd->rows ||
                    (like != NULL && !_cp_tensor_same_shape (tensor, like)))
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: '%s' is %s; it must be %s", key, description,
                   thd->packed ? "1-D" : "[B, N] with one row per batch row, like 'seq_lens'");
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_devices (Thd     *thd,
               GError **error)
{
  CpTensor *all[] = { thd->primary, thd->labels, thd->positions, thd->seq_lens,
                      thd->seq_lens_padded, thd->cu_seqlens, thd->cu_seqlens_padded };
  const char *keys[] = { thd->primary_key, "labels", "position_ids", "seq_lens",
                         "seq_lens_padded", "cu_seqlens", "cu_seqlens_padded" };

  for (guint i = 0; i < G_N_ELEMENTS (all); i++)
    {
      g_autofree char *label = g_strdup_printf ("'%s'", keys[i]);

      if (all[i] != NULL &&
          !_cp_tensor_require_device (all[i], "to_thd", label, CP_DEVICE_KINDS_REACHABLE, error))
        return FALSE;
    }
  return TRUE;
}

/* Replaces *@tensor (borrowed) by a host copy the plan holds: the lengths
 * are small and read one by one while planning, so they cross to the host
 * once (no copy at all when they are there already). */
static gboolean
hold_on_host (Thd       *thd,
              CpTensor **tensor,
              GError   **error)
{
  CpTensor *host;

  if (*tensor == NULL)
    return TRUE;
  host = cp_tensor_to_device (*tensor, CP_DEVICE_KIND_HOST, error);
  if (host == NULL)
    return FALSE;
  if (thd->held == NULL)
    thd->held = g_ptr_array_new_with_free_func (g_object_unref);
  g_ptr_array_add (thd->held, host);
  *tensor = host;
  return TRUE;
}

static gboolean
hold_lengths_on_host (Thd     *thd,
                      GError **error)
{
  return hold_on_host (thd, &thd->seq_lens, error) &&
         hold_on_host (thd, &thd->seq_lens_padded, error) &&
         hold_on_host (thd, &thd->cu_seqlens, error) &&
         hold_on_host (thd, &thd->cu_seqlens_padded, error);
}

/* A padded batch [B, S] carries seq_lens and seq_lens_padded; a packed one
 * [T] carries cu_seqlens (and maybe cu_seqlens_padded) already. */
static gboolean
collect_shapes (Thd      *thd,
                CpBatch  *batch,
                GError  **error)
{
  guint n_dims = cp_tensor_get_n_dims (thd->primary);

  thd->packed = !cp_batch_contains (batch, "seq_lens") && cp_batch_contains (batch, "cu_seqlens");
  if (thd->packed ? n_dims != 1 && n_dims != 2 : n_dims != 2 && n_dims != 3)
    return _cp_batch_shape_error (error, "to_thd", thd->primary_key, thd->primary,
                        thd->packed ? "[T] or [T, H]" : "[B, S] or [B, S, H]");
  thd->rows = thd->packed ? 1 : cp_tensor_get_dim (thd->primary, 0);
  thd->seq_len = cp_tensor_get_dim (thd->primary, thd->packed ? 0 : 1);
  if (!check_like_primary (thd, "labels", thd->labels, error) ||
      !check_like_primary (thd, "position_ids", thd->positions, error))
    return FALSE;
  if (thd->packed)
    {
      thd->cu_seqlens = cp_batch_get (batch, "cu_seqlens");
      thd->cu_seqlens_padded = cp_batch_get (batch, "cu_seqlens_padded");
      return check_lengths_tensor (thd, "cu_seqlens", thd->cu_seqlens, NULL, error) &&
             (thd->cu_seqlens_padded == NULL ||
              check_lengths_tensor (thd, "cu_seqlens_padded", thd->cu_seqlens_padded, NULL, error));
    }
  return require (batch, "seq_lens", &thd->seq_lens, error) &&
         require (batch, "seq_lens_padded", &thd->seq_lens_padded, error) &&
         check_lengths_tensor (thd, "seq_lens", thd->seq_lens, NULL, error) &&
         check_lengths_tensor (thd, "seq_lens_padded", thd->seq_lens_padded, thd->seq_lens, error);
}

static gboolean
check_extras (CpBatch  *batch,
              GError  **error)
{
  g_autoptr(GPtrArray) marked = _cp_batch_dup_marked_keys (batch);

  if (marked->len == 0)
    return TRUE;
  g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_UNSUPPORTED_FORMAT,
               "to_thd: extra sequence buffers are not supported by the THD path ('%s')",
               (const char *) marked->pdata[0]);
  return FALSE;
}

static gboolean
collect_options (Thd           *thd,
                 CpThdOptions  *options,
                 GError       **error)
{
  const char *format = cp_thd_options_get_qkv_format (options);

  if (g_strcmp0 (format, "thd") != 0)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_UNSUPPORTED_FORMAT,
                   "to_thd: currently only 'thd' format is supported, got: %s", format);
      return FALSE;
    }
  thd->num_chunks = cp_thd_options_get_num_chunks (options);
  thd->sentinel = cp_thd_options_get_seq_lens_padding_value (options);
  thd->pad_id = cp_thd_options_get_padding_token_id (options);
  thd->rule = cp_thd_options_get_padding_mask_rule (options);
  if (thd->sentinel < G_MININT32 || thd->sentinel > G_MAXINT32)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_OPTION,
                   "to_thd: the sentinel %" G_GINT64_FORMAT " does not fit the int32 cu_seqlens",
                   thd->sentinel);
      return FALSE;
    }
  return TRUE;
}

/* Integer ids, [B, S] or packed [T]: no per-token dimensions. */
static gboolean
holds_token_ids (const Thd *thd)
{
  return !cp_dtype_is_floating (cp_tensor_get_dtype (thd->primary)) &&
         cp_tensor_get_n_dims (thd->primary) == (thd->packed ? 1u : 2u);
}

static gboolean
collect (Thd           *thd,
         CpBatch       *batch,
         CpThdOptions  *options,
         GError       **error)
{
  if (!collect_options (thd, options, error) || !check_extras (batch, error))
    return FALSE;
  thd->primary = _cp_batch_get_primary (batch, "to_thd", &thd->primary_key, error);
  if (thd->primary == NULL ||
      !require (batch, "labels", &thd->labels, error) ||
      !require (batch, "position_ids", &thd->positions, error) ||
      !collect_shapes (thd, batch, error) ||
      !check_devices (thd, error) ||
      !hold_lengths_on_host (thd, error))
    return FALSE;
  thd->device = cp_tensor_get_device (thd->primary);
  if (thd->rule == CP_PADDING_MASK_RULE_TOKEN_ID && !holds_token_ids (thd))
    {
      g_autofree char *description = cp_tensor_describe (thd->primary);

      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_OPTION,
                   "to_thd: the token-id padding rule needs one integer id per token, and '%s' is %s",
                   thd->primary_key, description);
      return FALSE;
    }
  if (thd->rows == 0 && thd->num_chunks != 1)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INDIVISIBLE,
                   "to_thd: num_chunks %d splits the batch rows, and the batch has none",
                   thd->num_chunks);
      return FALSE;
    }
  if (thd->rows % thd->num_chunks != 0)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INDIVISIBLE,
                   "to_thd: num_chunks %d does not divide the %" G_GINT64_FORMAT " batch rows",
                   thd->num_chunks, thd->rows);
      return FALSE;
    }
  if (thd->rows / thd->num_chunks * thd->seq_len > G_MAXINT32)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: a chunk of %" G_GINT64_FORMAT " tokens overflows the int32 cu_seqlens",
                   thd->rows / thd->num_chunks * thd->seq_len);
      return FALSE;
    }
  return TRUE;
}

static gint64
read_length (CpTensor *tensor,
             gint64    index)
{
  gconstpointer data = cp_tensor_get_data (tensor);

  return cp_tensor_get_dtype (tensor) == CP_DTYPE_INT32
    ? ((const gint32 *) data)[index]
    : ((const gint64 *) data)[index];
}

/* The sentinel must mark the same entries in both tensors; real lengths
 * are non-negative and at most their padded lengths. */
static gboolean
check_entry (Thd      *thd,
             gint64    row,
             gint64    j,
             gint64    real,
             gint64    padded,
             GError  **error)
{
  if ((real == thd->sentinel) != (padded == thd->sentinel))
    g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                 "to_thd: seq_lens[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %" G_GINT64_FORMAT
                 " but seq_lens_padded[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %" G_GINT64_FORMAT
                 "; the sentinel %" G_GINT64_FORMAT " must mark the same entries in both",
                 row, j, real, row, j, padded, thd->sentinel);
  else if (real != thd->sentinel && (real < 0 || padded < 0))
    g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                 "to_thd: negative length at [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]: seq_lens %"
                 G_GINT64_FORMAT ", seq_lens_padded %" G_GINT64_FORMAT, row, j, real, padded);
  else if (real > padded)
    g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                 "to_thd: seq_lens[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %" G_GINT64_FORMAT
                 " exceeds seq_lens_padded[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %" G_GINT64_FORMAT,
                 row, j, real, row, j, padded);
  else
    return TRUE;
  return FALSE;
}

static void
append_document (Chunk  *chunk,
                 gint64  real,
                 gint64  padded)
{
  gint64 cu = BOUND (chunk->cu, chunk->cu->len - 1) + real;
  gint64 cu_padded = BOUND (chunk->cu_padded, chunk->cu_padded->len - 1) + padded;

  g_array_append_val (chunk->real, real);
  g_array_append_val (chunk->cu, cu);
  g_array_append_val (chunk->cu_padded, cu_padded);
}

/* Appends the documents of batch row @row, which starts at @row_start of
 * the chunk.  Tokens the padded lengths leave at the end of the row are
 * padding of its last document: that keeps every later document's offset
 * true to the flattened tokens. */
static gboolean
read_row (Thd      *thd,
          Chunk    *chunk,
          gint64    row,
          gint64    row_start,
          GError  **error)
{
  gint64 n = cp_tensor_get_dim (thd->seq_lens, 1);
  guint before = chunk->real->len;

  for (gint64 j = 0; j < n; j++)
    {
      gint64 real = read_length (thd->seq_lens, row * n + j);
      gint64 padded = read_length (thd->seq_lens_padded, row * n + j);

      if (!check_entry (thd, row, j, real, padded, error))
        return FALSE;
      if (real == thd->sentinel)
        continue;
      if (padded > row_start + thd->seq_len - BOUND (chunk->cu_padded, chunk->cu_padded->len - 1))
        {
          g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                       "to_thd: the padded lengths of row %" G_GINT64_FORMAT " run past the row "
                       "length %" G_GINT64_FORMAT " at seq_lens_padded[%" G_GINT64_FORMAT ", %"
                       G_GINT64_FORMAT "] = %" G_GINT64_FORMAT,
                       row, thd->seq_len, row, j, padded);
          return FALSE;
        }
      append_document (chunk, real, padded);
    }
  if (chunk->real->len == before && thd->seq_len > 0)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: row %" G_GINT64_FORMAT " holds %" G_GINT64_FORMAT " tokens but no "
                   "document (every seq_lens entry is the sentinel %" G_GINT64_FORMAT ")",
                   row, thd->seq_len, thd->sentinel);
      return FALSE;
    }
  if (chunk->real->len > before)
    BOUND (chunk->cu_padded, chunk->cu_padded->len - 1) = row_start + thd->seq_len;
  return TRUE;
}

/* The reference's trailing-pad absorption: when only the last document
 * carries padding, it is absorbed into that document's real length. */
static void
absorb_trailing_padding (Chunk *chunk)
{
  chunk->emit_padded = cp_index_thd_absorb_trailing ((gint64 *) chunk->cu->data,
                                                     (gint64 *) chunk->cu_padded->data,
                                                     chunk->cu->len, chunk->cu_padded->len,
                                                     chunk->n_tokens);
}

static void
chunk_init (Chunk  *chunk,
            gint64  first,
            gint64  n_tokens)
{
  gint64 zero = 0;

  chunk->first = first;
  chunk->n_tokens = n_tokens;
  chunk->real = g_array_new (FALSE, FALSE, sizeof (gint64));
  chunk->cu = g_array_new (FALSE, FALSE, sizeof (gint64));
  chunk->cu_padded = g_array_new (FALSE, FALSE, sizeof (gint64));
  g_array_append_val (chunk->cu, zero);
  g_array_append_val (chunk->cu_padded, zero);
}

static gboolean
plan_padded_chunk (Thd      *thd,
                   int       c,
                   GError  **error)
{
  Chunk *chunk = &thd->chunks[c];
  gint64 rows = thd->rows / thd->num_chunks;

  chunk_init (chunk, c * rows * thd->seq_len, rows * thd->seq_len);
  for (gint64 i = 0; i < rows; i++)
    if (!read_row (thd, chunk, c * rows + i, i * thd->seq_len, error))
      return FALSE;
  absorb_trailing_padding (chunk);
  return TRUE;
}

/* The bounds of a packed batch, without the sentinels, as the reference
 * filters them. */
static void
read_bounds (Thd     *thd,
             CpTensor *tensor,
             GArray  *out)
{
  const gint32 *data = cp_tensor_get_data (tensor);

  g_array_set_size (out, 0);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    if (data[i] != thd->sentinel)
      {
        gint64 value = data[i];

        g_array_append_val (out, value);
      }
}

static gboolean
check_bounds (Thd         *thd,
              const char  *key,
              GArray      *bounds,
              GError     **error)
{
  if (bounds->len < 1 || BOUND (bounds, 0) != 0)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: '%s' must start at 0", key);
      return FALSE;
    }
  for (guint i = 1; i < bounds->len; i++)
    if (BOUND (bounds, i) < BOUND (bounds, i - 1) || BOUND (bounds, i) > thd->seq_len)
      {
        g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                     "to_thd: '%s' entry %u is %" G_GINT64_FORMAT " after %" G_GINT64_FORMAT
                     "; bounds must not decrease nor pass the %" G_GINT64_FORMAT " tokens",
                     key, i, BOUND (bounds, i), BOUND (bounds, i - 1), thd->seq_len);
        return FALSE;
      }
  return TRUE;
}

static gboolean
plan_packed_chunk (Thd      *thd,
                   GError  **error)
{
  Chunk *chunk = &thd->chunks[0];
  CpTensor *padded = thd->cu_seqlens_padded != NULL ? thd->cu_seqlens_padded : thd->cu_seqlens;

  chunk_init (chunk, 0, thd->seq_len);
  read_bounds (thd, thd->cu_seqlens, chunk->cu);
  read_bounds (thd, padded, chunk->cu_padded);
  if (!check_bounds (thd, "cu_seqlens", chunk->cu, error) ||
      !check_bounds (thd, "cu_seqlens_padded", chunk->cu_padded, error))
    return FALSE;
  if (chunk->cu->len != chunk->cu_padded->len)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: cu_seqlens has %u bounds and cu_seqlens_padded %u",
                   chunk->cu->len, chunk->cu_padded->len);
      return FALSE;
    }
  for (guint i = 1; i < chunk->cu->len; i++)
    {
      gint64 real = BOUND (chunk->cu, i) - BOUND (chunk->cu, i - 1);

      if (!check_entry (thd, 0, i - 1, real, BOUND (chunk->cu_padded, i) - BOUND (chunk->cu_padded, i - 1), error))
        return FALSE;
      g_array_append_val (chunk->real, real);
    }
  chunk->emit_padded = thd->cu_seqlens_padded != NULL;
  return TRUE;
}

/* Sharding needs every token in a document and every document a multiple
 * of 2·C long, as Transformer Engine's partition does. */
static gboolean
plan_partition (Thd      *thd,
                int       c,
                GError  **error)
{
  Chunk *chunk = &thd->chunks[c];
  g_autofree char *label = chunk_label (thd, c);
  gint64 divisor = 2 * (gint64) thd->cp_size;
  guint n = chunk->cu_padded->len;

  if (BOUND (chunk->cu_padded, n - 1) != chunk->n_tokens)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "to_thd: %sthe padded documents cover %" G_GINT64_FORMAT " of the %"
                   G_GINT64_FORMAT " tokens; sharding needs every token in a document",
                   label, BOUND (chunk->cu_padded, n - 1), chunk->n_tokens);
      return FALSE;
    }
  for (guint i = 1; i < n; i++)
    {
      gint64 length = BOUND (chunk->cu_padded, i) - BOUND (chunk->cu_padded, i - 1);

      if (length % divisor != 0)
        {
          g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INDIVISIBLE,
                       "to_thd: %sdocument %u has padded length %" G_GINT64_FORMAT
                       ", not a multiple of 2·C = %" G_GINT64_FORMAT,
                       label, i - 1, length, divisor);
          return FALSE;
        }
    }
  /* A chunk without documents (a batch of no rows) holds no tokens: every
   * rank's share is empty, which the plain layout of length 0 says. */
  if (n == 1)
    chunk->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 0, thd->cp_size, error);
  else
    chunk->layout = cp_layout_new_thd ((const gint64 *) chunk->cu_padded->data, n, thd->cp_size, error);
  return chunk->layout != NULL;
}

static gboolean
plan_chunks (Thd      *thd,
             GError  **error)
{
  thd->chunks = g_new0 (Chunk, thd->num_chunks);
  for (int c = 0; c < thd->num_chunks; c++)
    {
      if (!(thd->packed ? plan_packed_chunk (thd, error) : plan_padded_chunk (thd, c, error)))
        return FALSE;
      if (thd->cp_size > 1 && !plan_partition (thd, c, error))
        return FALSE;
    }
  return TRUE;
}

/* ---- outputs ---- */

static gsize
token_bytes (CpTensor *tensor,
             gboolean  packed)
{
  gsize bytes = cp_dtype_get_size (cp_tensor_get_dtype (tensor));

  for (guint d = packed ? 1 : 2; d < cp_tensor_get_n_dims (tensor); d++)
    bytes *= (gsize) cp_tensor_get_dim (tensor, (int) d);
  return bytes;
}

/* [tokens] or [chunks, tokens], then the per-token dimensions (H). */
static guint
token_shape (Thd      *thd,
             CpTensor *tensor,
             gint64    tokens,
             gint64   *shape)
{
  guint n = 0;
  guint first = thd->packed ? 1 : 2;

  if (thd->num_chunks > 1)
    shape[n++] = thd->num_chunks;
  shape[n++] = tokens;
  for (guint d = first; d < cp_tensor_get_n_dims (tensor); d++)
    shape[n++] = cp_tensor_get_dim (tensor, (int) d);
  return n;
}

/* Unsharded, the rows are already consecutive tokens: a view, no copy. */
static CpTensor *
flatten_view (Thd       *thd,
              CpTensor  *tensor,
              GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint n = token_shape (thd, tensor, thd->chunks[0].n_tokens, shape);

  return cp_tensor_new_from_storage (cp_tensor_get_dtype (tensor), shape, n,
                                     cp_tensor_get_storage (tensor),
                                     cp_tensor_get_storage_offset (tensor), error);
}

static void
widen_to_int64 (CpDType        dtype,
                gconstpointer  source,
                gint64        *out,
                gsize          n)
{
  if (dtype == CP_DTYPE_INT32)
    for (gsize i = 0; i < n; i++)
      out[i] = ((const gint32 *) source)[i];
  else
    for (gsize i = 0; i < n; i++)
      out[i] = (gint64) _cp_dtype_read (dtype, source, i);
}

/* Copies the runs this rank holds of chunk @c of @tensor, in order, to
 * @out from byte @offset on, through the memory of the two tensors. */
static gboolean
copy_chunk_runs (Thd       *thd,
                 int        c,
                 CpTensor  *tensor,
                 CpTensor  *out,
                 gsize      offset,
                 gsize      step,
                 GError   **error)
{
  CpLayout *layout = thd->chunks[c].layout;
  guint n_runs;
  const cp_index_run *runs = _cp_layout_get_runs (layout, thd->cp_rank, &n_runs);
  gsize local_bytes = (gsize) cp_layout_get_local_len (layout, thd->cp_rank) * step;

  return _cp_memory_copy_runs (tensor, (gsize) thd->chunks[c].first * step, 0,
                               _cp_layout_get_first_position (layout), out, offset, 0, runs,
                               n_runs, step, 1, TRUE, _cp_copy_wants_streaming (local_bytes),
                               error);
}

/* Integer ids narrower than int64 are gathered to the host, widened there
 * and sent back to the memory of @tensor in one copy. */
static CpTensor *
shard_and_widen (Thd           *thd,
                 CpTensor      *tensor,
                 const gint64  *shape,
                 guint          n_dims,
                 gint64         local,
                 gsize          step,
                 GError       **error)
{
  CpDType dtype = cp_tensor_get_dtype (tensor);
  gint64 per_chunk = local * (gint64) (step / cp_dtype_get_size (dtype));  /* elements */
  g_autoptr(CpTensor) scratch = _cp_tensor_new_uninit (dtype, &per_chunk, 1, error);
  g_autoptr(CpTensor) wide = NULL;

  if (scratch == NULL ||
      (wide = _cp_tensor_new_uninit (CP_DTYPE_INT64, shape, n_dims, error)) == NULL)
    return NULL;
  for (int c = 0; c < thd->num_chunks; c++)
    {
      if (!copy_chunk_runs (thd, c, tensor, scratch, 0, step, error))
        return NULL;
      widen_to_int64 (dtype, cp_tensor_get_data (scratch),
                      (gint64 *) cp_tensor_get_data (wide) + (gsize) (c * per_chunk),
                      (gsize) per_chunk);
    }
  return cp_tensor_to_device (wide, cp_tensor_get_device (tensor), error);
}

/* This rank's tokens of every chunk, whole runs at a time.  Integer
 * buffers come out as int64, as the reference casts them; floating ones
 * (embeddings) keep their dtype. */
static CpTensor *
shard_tokens (Thd       *thd,
              CpTensor  *tensor,
              GError   **error)
{
  CpDType dtype = cp_tensor_get_dtype (tensor);
  gint64 local = cp_layout_get_local_len (thd->chunks[0].layout, thd->cp_rank);
  gsize step = token_bytes (tensor, thd->packed);
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint n = token_shape (thd, tensor, local, shape);
  g_autoptr(CpTensor) out = NULL;

  if (!cp_dtype_is_floating (dtype) && dtype != CP_DTYPE_INT64)
    return shard_and_widen (thd, tensor, shape, n, local, step, error);
  out = _cp_tensor_new_on_device (cp_tensor_get_device (tensor), dtype, shape, n, FALSE, error);
  if (out == NULL)
    return NULL;
  for (int c = 0; c < thd->num_chunks; c++)
    if (!copy_chunk_runs (thd, c, tensor, out, (gsize) (c * local) * step, step, error))
      return NULL;
  return g_steal_pointer (&out);
}

static gboolean
add_tokens (Thd         *thd,
            CpBatch     *out,
            const char  *key,
            CpTensor    *tensor,
            GError     **error)
{
  g_autoptr(CpTensor) result = thd->cp_size > 1 ? shard_tokens (thd, tensor, error)
                                                : flatten_view (thd, tensor, error);

  if (result == NULL)
    return FALSE;
  cp_batch_set (out, key, result);
  return TRUE;
}

/* The small outputs (bounds, maxima, masks) are computed in host memory
 * and then go where the batch is: for a host batch that moves nothing.
 * Takes @host. */
static CpTensor *
to_batch_device (Thd       *thd,
                 CpTensor  *host,
                 GError   **error)
{
  CpTensor *out;

  if (host == NULL)
    return NULL;
  out = cp_tensor_to_device (host, thd->device, error);
  g_object_unref (host);
  return out;
}

typedef GArray *(*BoundsOf) (Chunk *chunk, Thd *thd);

/* An already packed batch keeps its sentinel entries where its input had
 * them, as the reference passes the packed cu_seqlens_padded through:
 * takes @bounds, the entries that are not the sentinel, and puts them
 * back between the sentinels of @given. */
static GArray *
restore_sentinels (Thd      *thd,
                   GArray   *bounds,
                   CpTensor *given)
{
  const gint32 *data = cp_tensor_get_data (given);
  gint64 n = cp_tensor_get_numel (given);
  GArray *out = g_array_sized_new (FALSE, FALSE, sizeof (gint64), (guint) n);
  guint next = 0;

  for (gint64 i = 0; i < n; i++)
    {
      gint64 value = data[i] == thd->sentinel ? thd->sentinel : BOUND (bounds, next++);

      g_array_append_val (out, value);
    }
  g_assert (next == bounds->len);
  g_array_unref (bounds);
  return out;
}

/* Per-chunk bounds as an int32 tensor: [n] for one chunk, [chunks, n]
 * right-padded with the sentinel otherwise.  @given is the packed input
 * whose sentinel positions the bounds keep, or NULL. */
static CpTensor *
bounds_tensor (Thd       *thd,
               BoundsOf   bounds_of,
               CpTensor  *given,
               GError   **error)
{
  g_autoptr(GPtrArray) arrays = g_ptr_array_new_with_free_func ((GDestroyNotify) g_array_unref);
  gint64 shape[2] = { thd->num_chunks, 0 };
  CpTensor *tensor;
  gint32 *data;

  for (int c = 0; c < thd->num_chunks; c++)
    {
      GArray *bounds = bounds_of (&thd->chunks[c], thd);

      if (given != NULL)
        bounds = restore_sentinels (thd, bounds, given);
      shape[1] = MAX (shape[1], (gint64) bounds->len);
      g_ptr_array_add (arrays, bounds);
    }
  tensor = _cp_tensor_new_uninit (CP_DTYPE_INT32, thd->num_chunks > 1 ? shape : shape + 1,
                                  thd->num_chunks > 1 ? 2 : 1, error);
  if (tensor == NULL)
    return NULL;
  data = cp_tensor_get_data (tensor);
  for (int c = 0; c < thd->num_chunks; c++)
    {
      GArray *bounds = arrays->pdata[c];

      for (gint64 i = 0; i < shape[1]; i++)
        data[c * shape[1] + i] = (gint32) (i < bounds->len ? BOUND (bounds, i) : thd->sentinel);
    }
  return to_batch_device (thd, tensor, error);
}

static GArray *
real_bounds (Chunk *chunk,
             Thd   *thd)
{
  return g_array_ref (chunk->cu);
}

static GArray *
padded_bounds (Chunk *chunk,
               Thd   *thd)
{
  return g_array_ref (chunk->emit_padded ? chunk->cu_padded : chunk->cu);
}

/* This rank's share of each document: its padded length over C, and the
 * real tokens among the positions it holds (tail padding counted
 * exactly, from the real lengths before absorption). */
static GArray *
local_real_bounds (Chunk *chunk,
                   Thd   *thd)
{
  GArray *bounds = g_array_new (FALSE, TRUE, sizeof (gint64));
  gint64 total = 0;

  g_array_append_val (bounds, total);
  for (guint i = 0; i < chunk->real->len; i++)
    {
      total += cp_index_thd_local_real (BOUND (chunk->real, i),
                                        BOUND (chunk->cu_padded, i + 1) - BOUND (chunk->cu_padded, i),
                                        thd->cp_size, thd->cp_rank);
      g_array_append_val (bounds, total);
    }
  return bounds;
}

static GArray *
local_padded_bounds (Chunk *chunk,
                     Thd   *thd)
{
  GArray *bounds = g_array_sized_new (FALSE, FALSE, sizeof (gint64), chunk->cu_padded->len);

  for (guint i = 0; i < chunk->cu_padded->len; i++)
    {
      gint64 value = cp_index_thd_local_bound (BOUND (chunk->cu_padded, i), thd->cp_size);

      g_array_append_val (bounds, value);
    }
  return bounds;
}

/* Sets @tensor (taken) under @key; FALSE when its maker could not
 * allocate it (NULL, with its error set). */
static gboolean
add_tensor (CpBatch     *out,
            const char  *key,
            CpTensor    *tensor)
{
  if (tensor == NULL)
    return FALSE;
  cp_batch_set (out, key, tensor);
  g_object_unref (tensor);
  return TRUE;
}

static gboolean
add_bounds (Thd         *thd,
            CpBatch     *out,
            const char  *key,
            BoundsOf     bounds_of,
            CpTensor    *given,
            GError     **error)
{
  return add_tensor (out, key, bounds_tensor (thd, bounds_of, given, error));
}

/* The widest document of each chunk, int32: 0-d for one chunk. */
static gboolean
add_max_seqlen (Thd      *thd,
                CpBatch  *out,
                gboolean  padded,
                GError  **error)
{
  gint64 shape[1] = { thd->num_chunks };
  g_autoptr(CpTensor) tensor = NULL;
  gint32 *data;

  for (int c = 0; c < thd->num_chunks; c++)
    if (thd->chunks[c].cu->len < 2)
      return TRUE; /* a chunk without documents has no maximum */
  tensor = cp_tensor_new (CP_DTYPE_INT32, shape, thd->num_chunks > 1 ? 1 : 0, error);
  if (tensor == NULL)
    return FALSE;
  data = cp_tensor_get_data (tensor);
  for (int c = 0; c < thd->num_chunks; c++)
    {
      GArray *bounds = padded ? thd->chunks[c].cu_padded : thd->chunks[c].cu;

      for (guint i = 1; i < bounds->len; i++)
        data[c] = (gint32) MAX (data[c], BOUND (bounds, i) - BOUND (bounds, i - 1));
    }
  return add_tensor (out, "max_seqlen", to_batch_device (thd, g_steal_pointer (&tensor), error));
}

static void
write_token_mask (Thd      *thd,
                  CpTensor *ids,
                  guint8   *mask)
{
  CpDType dtype = cp_tensor_get_dtype (ids);
  gconstpointer data = cp_tensor_get_data (ids);
  gint64 n = cp_tensor_get_numel (ids);

  for (gint64 i = 0; i < n; i++)
    mask[i] = (dtype == CP_DTYPE_INT64 ? ((const gint64 *) data)[i]
                                       : (gint64) _cp_dtype_read (dtype, data, (gsize) i)) == thd->pad_id;
}

static gboolean
add_padding_mask (Thd       *thd,
                  CpBatch   *out,
                  CpTensor  *ids,
                  GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint n = token_shape (thd, thd->labels, cp_tensor_get_dim (ids, thd->num_chunks > 1 ? 1 : 0), shape);
  g_autoptr(CpTensor) mask = _cp_tensor_new_uninit (CP_DTYPE_BOOL, shape, n, error);
  guint8 *cursor;

  if (mask == NULL)
    return FALSE;
  cursor = cp_tensor_get_data (mask);
  if (thd->rule == CP_PADDING_MASK_RULE_TOKEN_ID)
    {
      g_autoptr(CpTensor) host_ids = cp_tensor_to_device (ids, CP_DEVICE_KIND_HOST, error);

      if (host_ids == NULL)
        return FALSE;
      write_token_mask (thd, host_ids, cursor);
    }
  else
    for (int c = 0; c < thd->num_chunks; c++)
      {
        cp_index_run whole = { 0, thd->chunks[c].n_tokens };
        guint n_runs = 1;
        const cp_index_run *runs = thd->cp_size > 1
          ? _cp_layout_get_runs (thd->chunks[c].layout, thd->cp_rank, &n_runs) : &whole;

        cursor = cp_index_thd_padding_mask ((const gint64 *) thd->chunks[c].cu_padded->data,
                                            (const gint64 *) thd->chunks[c].real->data,
                                            MAX (thd->chunks[c].cu_padded->len, 1) - 1,
                                            runs, n_runs, cursor);
      }
  return add_tensor (out, "padding_mask", to_batch_device (thd, g_steal_pointer (&mask), error));
}

/* A 0-d int64 tensor in the batch's memory. */
static CpTensor *
int64_scalar (Thd      *thd,
              gint64    value,
              GError  **error)
{
  return to_batch_device (thd, cp_tensor_new_full (CP_DTYPE_INT64, NULL, 0, (double) value, error),
                          error);
}

static gboolean
add_rank_info (Thd      *thd,
               CpBatch  *out,
               GError  **error)
{
  GPtrArray *layouts;

  if (!add_tensor (out, "cp_size", int64_scalar (thd, thd->cp_size, error)) ||
      !add_tensor (out, "cp_rank", int64_scalar (thd, thd->cp_rank, error)))
    return FALSE;
  layouts = g_ptr_array_new_with_free_func ((GDestroyNotify) cp_layout_unref);
  for (int c = 0; c < thd->num_chunks; c++)
    g_ptr_array_add (layouts, cp_layout_ref (thd->chunks[c].layout));
  _cp_batch_set_layouts (out, layouts);
  return TRUE;
}

static CpBatch *
build_output (Thd      *thd,
              GError  **error)
{
  g_autoptr(CpBatch) out = cp_batch_new ();
  gboolean sharded = thd->cp_size > 1;
  gboolean any_padded = FALSE;
  /* The packed input's bounds, whose sentinel entries the output keeps. */
  CpTensor *given_real = thd->packed ? thd->cu_seqlens : NULL;
  CpTensor *given_padded = thd->cu_seqlens_padded != NULL ? thd->cu_seqlens_padded : given_real;

  _cp_batch_set_qkv_format (out, "thd");
  if (!add_tokens (thd, out, thd->primary_key, thd->primary, error) ||
      !add_tokens (thd, out, "labels", thd->labels, error) ||
      !add_tokens (thd, out, "position_ids", thd->positions, error))
    return NULL;
  for (int c = 0; c < thd->num_chunks; c++)
    any_padded |= thd->chunks[c].emit_padded;
  /* Sharded, `cu_seqlens` is the global padded bounds, as Transformer
   * Engine's context-parallel attention expects. */
  if (!add_bounds (thd, out, "cu_seqlens", sharded ? padded_bounds : real_bounds,
                   sharded ? given_padded : given_real, error) ||
      (!sharded && any_padded &&
       !add_bounds (thd, out, "cu_seqlens_padded", padded_bounds, given_padded, error)) ||
      !add_max_seqlen (thd, out, sharded, error) ||
      !add_padding_mask (thd, out, cp_batch_get (out, thd->primary_key), error))
    return NULL;
  if (!sharded)
    return g_steal_pointer (&out);
  if (!add_rank_info (thd, out, error) ||
      !add_bounds (thd, out, "local_cu_seqlens", local_real_bounds, given_padded, error) ||
      !add_bounds (thd, out, "local_cu_seqlens_padded", local_padded_bounds, given_padded, error))
    return NULL;
  return g_steal_pointer (&out);
}

/**
 * cp_batch_to_thd:
 * @self: a padded batch `[B, S]` with `seq_lens` and `seq_lens_padded`
 *   `[B, N]`, or a packed one `[T]` with `cu_seqlens`
 * @mesh: (nullable): the mesh: a 1-D context-parallel mesh, or one with a
 *   `cp` dimension; %NULL for no sharding
 * @options: (nullable): format, chunks, sentinel and padding-mask rule, or
 *   %NULL for the defaults
 * @error: return location for a #GError
 *
 * Converts packed documents to the THD form Transformer Engine consumes
 * and gives this rank its share: the native `make_cp_batch_for_te`.
 *
 * `input_ids` (or `inputs_embeds` `[B, S, H]`, kept in its dtype),
 * `labels` and `position_ids` are flattened to `[T]` (`[T, H]`), T = B·S.
 * `cu_seqlens` (int32) accumulates the real lengths of `seq_lens` and
 * `cu_seqlens_padded` the padded ones, sentinel entries dropped; when only
 * the last document carries padding it is absorbed, and
 * `cu_seqlens_padded` is emitted only when it differs. `max_seqlen` is the
 * widest document. Tokens a row's padded lengths leave unused are padding
 * of the row's last document. With [property@Cp.ThdOptions:num-chunks]
 * above 1, consecutive rows are converted chunk by chunk and stacked,
 * `cu_seqlens` right-padded with the sentinel.
 *
 * With a context-parallel group of C > 1 ranks, every document i of padded
 * length L_i is split head-tail: rank r takes tokens
 * `[cu_i + r·h, cu_i + (r+1)·h)` and `[cu_i + (2C−1−r)·h, cu_i + (2C−r)·h)`
 * with h = L_i / (2·C), documents in order — Transformer Engine's
 * `thd_get_partitioned_indices`. The result then holds this rank's tokens
 * (integer buffers as int64), `cu_seqlens` = the global padded bounds,
 * `max_seqlen` from them, `padding_mask`, `cp_size` and `cp_rank` (0-d
 * int64), and two keys the reference lacks: `local_cu_seqlens`, the
 * bounds of the real tokens this rank holds of each document, and
 * `local_cu_seqlens_padded`, its padded share. [method@Cp.Batch.get_layout]
 * gives the layout of each chunk.
 *
 * An already packed batch is only partitioned, with the bounds that are
 * not the sentinel; its sentinel entries stay where they were in every
 * bounds output, as the reference passes a packed `cu_seqlens_padded`
 * through (sharded, `cu_seqlens` is that tensor's values exactly).
 *
 * `padding_mask` marks the positions between each document's real and
 * padded end ([enum@Cp.PaddingMaskRule]). Unsharded outputs view the input
 * memory without copying. Nothing is read or written out of bounds: every
 * length is checked first. The conversion does not communicate.
 *
 * Returns: (transfer full): the THD batch, or %NULL with
 *   %CP_BATCH_ERROR_UNSUPPORTED_FORMAT (a format other than `"thd"`, or
 *   extra sequence buffers), %CP_BATCH_ERROR_MISSING_KEY naming the key,
 *   %CP_BATCH_ERROR_INVALID_SEQ_LENS (negative, mismatched or overflowing
 *   lengths, or cu_seqlens that are not int32) or
 *   %CP_BATCH_ERROR_INDIVISIBLE (a document length not a multiple of 2·C,
 *   or num_chunks not dividing the batch), with the offending values
 *
 * Since: 1.0
 */
CpBatch *
cp_batch_to_thd (CpBatch       *self,
                 CpMesh        *mesh,
                 CpThdOptions  *options,
                 GError       **error)
{
  g_autoptr(CpThdOptions) defaults = NULL;
  g_auto(Thd) thd = { 0 };
  CpMesh *group = NULL;

  g_return_val_if_fail (CP_IS_BATCH (self), NULL);
  g_return_val_if_fail (mesh == NULL || CP_IS_MESH (mesh), NULL);
  g_return_val_if_fail (options == NULL || CP_IS_THD_OPTIONS (options), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (options == NULL)
    options = defaults = cp_thd_options_new ();
  if (mesh != NULL && (group = _cp_context_resolve_mesh (mesh, error)) == NULL)
    return NULL;
  thd.cp_size = group != NULL ? cp_mesh_get_world_size (group) : 1;
  thd.cp_rank = group != NULL ? cp_mesh_get_rank (group) : 0;
  if (!collect (&thd, self, options, error) || !plan_chunks (&thd, error))
    return NULL;
  return build_output (&thd, error);
}

/* ---- padding packed documents to a multiple of 2·C ---- */

typedef struct
{
  const char *primary_key;
  CpTensor *primary;
  CpTensor *labels;
  CpTensor *positions;   /* may be NULL: synthesized per document */
  CpTensor *seq_lens;
  CpTensor *host_lengths; /* seq_lens in host memory, owned */
  gint64 rows;
  gint64 seq_len;
  gint64 divisor;        /* 2·C */
  gint64 padded_len;     /* the new row length */
  gint64 sentinel;
  gint64 pad_id;
} Pad;

static void
pad_clear (Pad *pad)
{
  g_clear_object (&pad->host_lengths);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Pad, pad_clear)

/* Checks one row's lengths and returns the padded total in @padded. */
static gboolean
pad_measure_row (Pad      *pad,
                 gint64    row,
                 gint64   *padded,
                 GError  **error)
{
  gint64 n = cp_tensor_get_dim (pad->seq_lens, 1);
  gint64 real_total = 0;
  gboolean any = FALSE;

  *padded = 0;
  for (gint64 j = 0; j < n; j++)
    {
      gint64 real = read_length (pad->host_lengths, row * n + j);

      if (real == pad->sentinel)
        continue;
      /* Compared with the room left, so that the sum never overflows. */
      if (real < 0 || real > pad->seq_len - real_total)
        {
          g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                       "pad_documents: seq_lens[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %"
                       G_GINT64_FORMAT " is negative or runs past the row length %" G_GINT64_FORMAT,
                       row, j, real, pad->seq_len);
          return FALSE;
        }
      real_total += real;
      *padded += cp_index_thd_round_up (real, pad->divisor);
      any = TRUE;
    }
  if (!any)
    {
      g_set_error (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS,
                   "pad_documents: row %" G_GINT64_FORMAT " has no document", row);
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_pad_devices (Pad     *pad,
                   GError **error)
{
  g_autofree char *label = g_strdup_printf ("'%s'", pad->primary_key);

  return _cp_tensor_require_device (pad->primary, "pad_documents", label,
                                    CP_DEVICE_KINDS_REACHABLE, error) &&
         _cp_tensor_require_device (pad->labels, "pad_documents", "'labels'",
                                    CP_DEVICE_KINDS_REACHABLE, error) &&
         (pad->positions == NULL ||
          _cp_tensor_require_device (pad->positions, "pad_documents", "'position_ids'",
                                     CP_DEVICE_KINDS_REACHABLE, error)) &&
         _cp_tensor_require_device (pad->seq_lens, "pad_documents", "'seq_lens'",
                                    CP_DEVICE_KINDS_REACHABLE, error);
}

static gboolean
pad_collect (Pad           *pad,
             CpBatch       *batch,
             CpThdOptions  *options,
             GError       **error)
{
  Thd shapes = { .num_chunks = 1 };

  pad->primary = _cp_batch_get_primary (batch, "pad_documents", &pad->primary_key, error);
  if (pad->primary == NULL || !require (batch, "labels", &pad->labels, error) ||
      !require (batch, "seq_lens", &pad->seq_lens, error))
    return FALSE;
  pad->positions = cp_batch_get (batch, "position_ids");
  shapes.primary_key = pad->primary_key;
  shapes.rows = cp_tensor_get_n_dims (pad->primary) >= 2 ? cp_tensor_get_dim (pad->primary, 0) : 0;
  shapes.seq_len = cp_tensor_get_n_dims (pad->primary) >= 2 ? cp_tensor_get_dim (pad->primary, 1) : 0;
  shapes.primary = pad->primary;
  if (cp_tensor_get_n_dims (pad->primary) < 2 || cp_tensor_get_n_dims (pad->primary) > 3)
    return _cp_batch_shape_error (error, "pad_documents", pad->primary_key, pad->primary,
                                  "[B, S] or [B, S, H]");
  if (!check_like_primary (&shapes, "labels", pad->labels, error) ||
      (pad->positions != NULL && !check_like_primary (&shapes, "position_ids", pad->positions, error)) ||
      !check_lengths_tensor (&shapes, "seq_lens", pad->seq_lens, NULL, error) ||
      !check_pad_devices (pad, error))
    return FALSE;
  pad->host_lengths = cp_tensor_to_device (pad->seq_lens, CP_DEVICE_KIND_HOST, error);
  if (pad->host_lengths == NULL)
    return FALSE;
  pad->rows = shapes.rows;
  pad->seq_len = shapes.seq_len;
  pad->sentinel = cp_thd_options_get_seq_lens_padding_value (options);
  pad->pad_id = cp_thd_options_get_padding_token_id (options);
  for (gint64 row = 0; row < pad->rows; row++)
    {
      gint64 padded;

      if (!pad_measure_row (pad, row, &padded, error))
        return FALSE;
      pad->padded_len = MAX (pad->padded_len, padded);
    }
  return TRUE;
}

/* Lays one row's documents out again, each followed by its padding; the
 * row's last document also takes what is left of the new row.  Tokens
 * move and padding is filled through the memory of @dest; position ids,
 * which count on from their document's last one, are computed in place,
 * so for them @source and @dest are host tensors. */
static gboolean
pad_row (Pad       *pad,
         gint64     row,
         CpTensor  *source,
         CpTensor  *dest,
         gsize      step,
         double     fill,
         gboolean   positions,
         GError   **error)
{
  CpDType dtype = cp_tensor_get_dtype (dest);
  gint64 n = cp_tensor_get_dim (pad->seq_lens, 1);
  gint64 read = 0, written = 0, last = -1;
  gsize per_token = step / cp_dtype_get_size (dtype);
  gsize source_row = (gsize) (row * pad->seq_len) * step;
  gsize dest_row = (gsize) (row * pad->padded_len) * step;
  gsize first = dest_row / cp_dtype_get_size (dtype);  /* the row's first element */

  for (gint64 j = 0; j < n; j++)
    if (read_length (pad->host_lengths, row * n + j) != pad->sentinel)
      last = j;
  for (gint64 j = 0; j <= last; j++)
    {
      gint64 real = read_length (pad->host_lengths, row * n + j);
      gint64 end = j == last ? pad->padded_len : written + cp_index_thd_round_up (real, pad->divisor);
      double next = 0.0;

      if (real == pad->sentinel)
        continue;
      if (source != NULL &&
          !_cp_memory_copy (dest, dest_row + (gsize) written * step, source,
                            source_row + (gsize) read * step, (gsize) real * step, FALSE, error))
        return FALSE;
      if (positions)
        next = source != NULL && real > 0
          ? _cp_dtype_read (dtype, cp_tensor_get_data (source),
                            source_row / cp_dtype_get_size (dtype) + (gsize) (read + real - 1)) + 1
          : 0;
      for (gint64 p = source != NULL ? real : 0; positions && p < end - written; p++)
        _cp_dtype_write (dtype, cp_tensor_get_data (dest), first + (gsize) (written + p),
                         source != NULL ? next++ : (double) p);
      if (!positions &&
          !_cp_memory_fill (dest, dest_row + (gsize) (written + real) * step,
                            (gsize) (end - written - real) * per_token, fill, error))
        return FALSE;
      read += real;
      written = end;
    }
  return TRUE;
}

static CpTensor *
pad_buffer (Pad       *pad,
            CpTensor  *source,
            CpDType    dtype,
            double     fill,
            gboolean   positions,
            GError   **error)
{
  gint64 shape[3] = { pad->rows, pad->padded_len, 0 };
  guint n_dims = source != NULL ? cp_tensor_get_n_dims (source) : 2;
  gsize step = cp_dtype_get_size (dtype);
  CpDeviceKind device = cp_tensor_get_device (source != NULL ? source : pad->primary);
  g_autoptr(CpTensor) host_source = NULL;
  g_autoptr(CpTensor) out = NULL;

  if (n_dims == 3)
    {
      shape[2] = cp_tensor_get_dim (source, 2);
      step *= (gsize) shape[2];
    }
  if (positions && source != NULL &&
      (host_source = cp_tensor_to_device (source, CP_DEVICE_KIND_HOST, error)) == NULL)
    return NULL;
  out = _cp_tensor_new_on_device (positions ? CP_DEVICE_KIND_HOST : device, dtype, shape, n_dims,
                                  FALSE, error);
  if (out == NULL)
    return NULL;
  for (gint64 row = 0; row < pad->rows; row++)
    if (!pad_row (pad, row, positions ? host_source : source, out, step, fill, positions, error))
      return NULL;
  return positions ? cp_tensor_to_device (out, device, error) : g_steal_pointer (&out);
}

/* seq_lens_padded: each document rounded up to 2·C, the last one of each
 * row up to the new row length. */
static CpTensor *
pad_lengths (Pad     *pad,
             GError **error)
{
  g_autoptr(CpTensor) out = cp_tensor_copy (pad->host_lengths, error);
  gint64 n = cp_tensor_get_dim (pad->seq_lens, 1);

  if (out == NULL)
    return NULL;
  for (gint64 row = 0; row < pad->rows; row++)
    {
      gint64 total = 0, last = -1;

      for (gint64 j = 0; j < n; j++)
        {
          gint64 real = read_length (pad->host_lengths, row * n + j);

          if (real == pad->sentinel)
            continue;
          cp_tensor_set_value (out, row * n + j, (double) cp_index_thd_round_up (real, pad->divisor));
          total += cp_index_thd_round_up (real, pad->divisor);
          last = j;
        }
      cp_tensor_set_value (out, row * n + last, cp_tensor_get_value (out, row * n + last) +
                                                (double) (pad->padded_len - total));
    }
  return cp_tensor_to_device (out, cp_tensor_get_device (pad->seq_lens), error);
}

/**
 * cp_batch_pad_documents:
 * @self: a batch of packed documents: `input_ids` `[B, S]` (or
 *   `inputs_embeds` `[B, S, H]`), `labels`, optional `position_ids`, and
 *   `seq_lens` `[B, N]` whose documents follow each other from the start of
 *   each row
 * @cp_size: the context-parallel size C the documents must suit
 * @options: (nullable): the padding token id and the sentinel of unused
 *   `seq_lens` entries, or %NULL for the defaults
 * @error: return location for a #GError
 *
 * Pads every document to a multiple of 2·C, as
 * [method@Cp.Batch.to_thd] needs to split each document head-tail over C
 * ranks, and adds the matching `seq_lens_padded`. Token ids are padded
 * with [property@Cp.ThdOptions:padding-token-id], embeddings with 0,
 * labels with −100; position ids continue counting (or count from 0 in
 * each document when the batch has none). Rows take the length of the
 * longest padded row; the last document of a shorter row takes the rest
 * as padding, so every row is covered by its documents.
 *
 * Returns: (transfer full): a new padded batch, or %NULL with
 *   %CP_BATCH_ERROR_MISSING_KEY, %CP_BATCH_ERROR_INVALID_SEQ_LENS (negative
 *   lengths, lengths past the row, a row without documents) or
 *   %CP_TENSOR_ERROR_SHAPE
 *
 * Since: 1.0
 */
CpBatch *
cp_batch_pad_documents (CpBatch       *self,
                        int            cp_size,
                        CpThdOptions  *options,
                        GError       **error)
{
  g_autoptr(CpThdOptions) defaults = NULL;
  g_autoptr(CpBatch) out = cp_batch_new ();
  g_auto(Pad) pad = { 0 };
  CpDType ids_dtype, position_dtype;

  g_return_val_if_fail (CP_IS_BATCH (self), NULL);
  g_return_val_if_fail (cp_size >= 1, NULL);
  g_return_val_if_fail (options == NULL || CP_IS_THD_OPTIONS (options), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (options == NULL)
    options = defaults = cp_thd_options_new ();
  pad.divisor = 2 * (gint64) cp_size;
  if (!pad_collect (&pad, self, options, error))
    return NULL;
  ids_dtype = cp_tensor_get_dtype (pad.primary);
  position_dtype = pad.positions != NULL ? cp_tensor_get_dtype (pad.positions) : CP_DTYPE_INT64;
  if (!add_tensor (out, pad.primary_key, pad_buffer (&pad, pad.primary, ids_dtype,
                                                  cp_dtype_is_floating (ids_dtype) ? 0.0 : (double) pad.pad_id,
                                                  FALSE, error)) ||
      !add_tensor (out, "labels", pad_buffer (&pad, pad.labels, cp_tensor_get_dtype (pad.labels), -100, FALSE, error)) ||
      !add_tensor (out, "position_ids", pad_buffer (&pad, pad.positions, position_dtype, 0, TRUE, error)) ||
      !add_tensor (out, "seq_lens", cp_tensor_copy (pad.seq_lens, error)) ||
      !add_tensor (out, "seq_lens_padded", pad_lengths (&pad, error)))
    return NULL;
  return g_steal_pointer (&out);
}
