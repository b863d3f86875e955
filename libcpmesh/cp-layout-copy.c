/* cp-layout-copy.c: moving the bytes of tensors by a layout
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * cp-layout.c says which positions each rank holds; this file moves
 * tensor bytes accordingly (shard, its adjoint, unshard), a whole run per
 * copy, knowing the layout only through its accessors.
 */

#include "config.h"

#include <string.h>

#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"

gboolean
_cp_layout_transfer_runs (CpLayout  *self,
                          int        rank,
                          CpTensor  *full,
                          CpTensor  *local,
                          gsize      outer,
                          gsize      step,
                          gint64     local_row,
                          gint64     local_first,
                          gboolean   to_local,
                          GError   **error)
{
  guint n_runs;
  const cp_index_run *runs = _cp_layout_get_runs (self, rank, &n_runs);
  gsize local_bytes = (gsize) cp_layout_get_local_len (self, rank) * step;

  return _cp_memory_copy_runs (full, 0, (gsize) cp_layout_get_seq_len (self) * step,
                               _cp_layout_get_first_position (self), local,
                               (gsize) local_first * step, (gsize) local_row * step, runs, n_runs,
                               step, outer, to_local, _cp_copy_wants_streaming (outer * local_bytes),
                               error);
}

static gboolean
check_rank (CpLayout  *self,
            int        rank,
            GError   **error)
{
  if (rank < 0 || rank >= cp_layout_get_cp_size (self))
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "rank %d is outside [0, %d)", rank, cp_layout_get_cp_size (self));
      return FALSE;
    }
  return TRUE;
}

/* Checks that dimension @dim of @tensor has length @expected. */
static gboolean
check_seq_len (CpTensor    *tensor,
               const char  *what,
               guint        dim,
               gint64       expected,
               GError     **error)
{
  gint64 actual = cp_tensor_get_dim (tensor, (int) dim);

  if (actual != expected)
    {
      g_autofree char *description = cp_tensor_describe (tensor);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "%s: dimension %u of %s has length %" G_GINT64_FORMAT
                   ", the layout needs %" G_GINT64_FORMAT,
                   what, dim, description, actual, expected);
      return FALSE;
    }
  return TRUE;
}

/* Checks that @out has @template's dtype and shape, except @length along
 * @dim. */
static gboolean
check_output (CpTensor    *out,
              CpTensor    *template,
              const char  *what,
              guint        dim,
              gint64       length,
              GError     **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint n_dims;
  const gint64 *source_shape = cp_tensor_get_shape (template, &n_dims);

  memcpy (shape, source_shape, n_dims * sizeof (gint64));
  shape[dim] = length;
  if (cp_tensor_get_dtype (out) != cp_tensor_get_dtype (template) ||
      cp_tensor_get_n_dims (out) != n_dims ||
      memcmp (cp_tensor_get_shape (out, NULL), shape, n_dims * sizeof (gint64)) != 0)
    {
      g_autofree char *have = cp_tensor_describe (out);
      g_autofree char *want = _cp_shape_to_string (shape, n_dims);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "%s: the output is %s, it must be %s%s",
                   what, have, cp_dtype_get_name (cp_tensor_get_dtype (template)), want);
      return FALSE;
    }
  return _cp_tensor_require_device (out, what, "the output", CP_DEVICE_KINDS_REACHABLE, error) &&
         _cp_tensor_require_writable (out, what, "the output", error);
}

static gboolean
shard_validate (CpLayout  *self,
                CpTensor  *tensor,
                int        seq_dim,
                int        rank,
                guint     *dim,
                GError   **error)
{
  return check_rank (self, rank, error) &&
         _cp_tensor_require_device (tensor, "shard", "the tensor", CP_DEVICE_KINDS_REACHABLE, error) &&
         _cp_tensor_normalize_dim (tensor, "shard", seq_dim, dim, error) &&
         check_seq_len (tensor, "shard", *dim, cp_layout_get_seq_len (self), error);
}

static gboolean
shard_copy (CpLayout  *self,
            CpTensor  *tensor,
            guint      dim,
            int        rank,
            CpTensor  *out,
            GError   **error)
{
  gsize outer;
  gint64 length;
  gsize step;

  _cp_tensor_split_at (tensor, dim, &outer, &length, &step);
  return _cp_layout_transfer_runs (self, rank, tensor, out, outer, step,
                                   cp_layout_get_local_len (self, rank), 0, TRUE, error);
}

/* The shape of @tensor with @length along @dim. */
static void
shape_with (CpTensor *tensor,
            guint     dim,
            gint64    length,
            gint64   *shape)
{
  guint n_dims;
  const gint64 *source_shape = cp_tensor_get_shape (tensor, &n_dims);

  memcpy (shape, source_shape, n_dims * sizeof (gint64));
  shape[dim] = length;
}

/**
 * cp_layout_shard:
 * @self: a layout
 * @tensor: a host tensor whose dimension @seq_dim has the layout's length
 * @seq_dim: the sequence dimension; negative values count from the last
 * @rank: the rank whose piece is wanted
 * @error: return location for a #GError
 *
 * Copies @rank's positions of @tensor, in local order, into a new tensor:
 * the out-of-place shard used for gradient-bearing buffers, which leaves
 * @tensor intact. Works along any dimension; every copy moves whole
 * contiguous runs.
 *
 * Returns: (transfer full): the local piece, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE naming the dimension and lengths
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_shard (CpLayout  *self,
                 CpTensor  *tensor,
                 int        seq_dim,
                 int        rank,
                 GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint dim;
  CpTensor *out;

  g_return_val_if_fail (self != NULL, NULL);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!shard_validate (self, tensor, seq_dim, rank, &dim, error))
    return NULL;
  shape_with (tensor, dim, cp_layout_get_local_len (self, rank), shape);
  out = _cp_tensor_new_on_device (cp_tensor_get_device (tensor), cp_tensor_get_dtype (tensor),
                                  shape, cp_tensor_get_n_dims (tensor), FALSE, error);
  if (out != NULL && !shard_copy (self, tensor, dim, rank, out, error))
    g_clear_object (&out);
  return out;
}

/**
 * cp_layout_shard_into:
 * @self: a layout
 * @tensor: a host tensor whose dimension @seq_dim has the layout's length
 * @seq_dim: the sequence dimension; negative values count from the last
 * @rank: the rank whose piece is wanted
 * @out: where to write the piece: same dtype and shape as @tensor but the
 *   local length along @seq_dim
 * @error: return location for a #GError
 *
 * Like [method@Cp.Layout.shard], writing into a tensor the caller reuses,
 * which avoids faulting in fresh pages on every call.
 *
 * Returns: %TRUE on success
 *
 * Since: 1.0
 */
gboolean
cp_layout_shard_into (CpLayout  *self,
                      CpTensor  *tensor,
                      int        seq_dim,
                      int        rank,
                      CpTensor  *out,
                      GError   **error)
{
  guint dim;

  g_return_val_if_fail (self != NULL, FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (tensor), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (out), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!shard_validate (self, tensor, seq_dim, rank, &dim, error) ||
      !check_output (out, tensor, "shard", dim, cp_layout_get_local_len (self, rank), error))
    return FALSE;
  return shard_copy (self, tensor, dim, rank, out, error);
}

/**
 * cp_layout_shard_backward:
 * @self: a layout
 * @grad_local: the gradient of @rank's local piece
 * @seq_dim: the sequence dimension; negative values count from the last
 * @rank: the rank the piece belongs to
 * @error: return location for a #GError
 *
 * The adjoint of [method@Cp.Layout.shard]: scatters @grad_local into a
 * zero tensor of the full length, so positions @rank does not hold get a
 * zero gradient. For C = 2, S = 8 and rank 1, a gradient of ones gives
 * `[0, 0, 1, 1, 1, 1, 0, 0]`.
 *
 * Returns: (transfer full): the full-length gradient, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_shard_backward (CpLayout  *self,
                          CpTensor  *grad_local,
                          int        seq_dim,
                          int        rank,
                          GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  gsize outer;
  gint64 length;
  gsize step;
  guint dim;
  CpTensor *out;

  g_return_val_if_fail (self != NULL, NULL);
  g_return_val_if_fail (CP_IS_TENSOR (grad_local), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_rank (self, rank, error) ||
      !_cp_tensor_require_device (grad_local, "shard_backward", "the tensor",
                                  CP_DEVICE_KINDS_REACHABLE, error) ||
      !_cp_tensor_normalize_dim (grad_local, "shard_backward", seq_dim, &dim, error) ||
      !check_seq_len (grad_local, "shard_backward", dim, cp_layout_get_local_len (self, rank), error))
    return NULL;
  shape_with (grad_local, dim, cp_layout_get_seq_len (self), shape);
  out = _cp_tensor_new_on_device (cp_tensor_get_device (grad_local),
                                  cp_tensor_get_dtype (grad_local), shape,
                                  cp_tensor_get_n_dims (grad_local), TRUE, error);
  if (out == NULL)
    return NULL;
  _cp_tensor_split_at (grad_local, dim, &outer, &length, &step);
  if (!_cp_layout_transfer_runs (self, rank, out, grad_local, outer, step, length, 0, FALSE, error))
    g_clear_object (&out);
  return out;
}

/* Every piece must be a host tensor like pieces[0], with rank r's local
 * length along @dim. */
static gboolean
check_pieces (CpLayout   *self,
              CpTensor  **pieces,
              guint       n_pieces,
              int         seq_dim,
              guint      *dim,
              GError    **error)
{
  if (n_pieces != (guint) cp_layout_get_cp_size (self))
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "unshard_pieces: %u pieces were given for cp_size %d",
                   n_pieces, cp_layout_get_cp_size (self));
      return FALSE;
    }
  if (!_cp_tensor_normalize_dim (pieces[0], "unshard_pieces", seq_dim, dim, error))
    return FALSE;
  for (guint r = 0; r < n_pieces; r++)
    {
      g_autofree char *what = g_strdup_printf ("unshard_pieces: piece %u", r);

      gboolean ok = r == 0
        ? _cp_tensor_require_device (pieces[0], what, "the tensor", CP_DEVICE_KINDS_REACHABLE,
                                     error) &&
          check_seq_len (pieces[0], what, *dim, cp_layout_get_local_len (self, 0), error)
        : check_output (pieces[r], pieces[0], what, *dim, cp_layout_get_local_len (self, r), error);

      if (!ok)
        return FALSE;
    }
  return TRUE;
}

static gboolean
unshard_copy (CpLayout   *self,
              CpTensor  **pieces,
              guint       dim,
              CpTensor   *out,
              GError    **error)
{
  for (int r = 0; r < cp_layout_get_cp_size (self); r++)
    {
      gsize outer;
      gint64 length;
      gsize step;

      _cp_tensor_split_at (pieces[r], dim, &outer, &length, &step);
      if (!_cp_layout_transfer_runs (self, r, out, pieces[r], outer, step, length, 0, FALSE, error))
        return FALSE;
    }
  return TRUE;
}

/**
 * cp_layout_unshard_pieces:
 * @self: a layout
 * @pieces: (array length=n_pieces): every rank's local piece, in rank order
 * @n_pieces: the number of pieces, the layout's cp size
 * @seq_dim: the sequence dimension; negative values count from the last
 * @error: return location for a #GError
 *
 * Rebuilds the full tensor from every rank's piece, without a mesh: the
 * inverse of sharding for every rank.
 *
 * Returns: (transfer full): the full tensor, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE naming the piece, dimension and lengths
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_unshard_pieces (CpLayout   *self,
                          CpTensor  **pieces,
                          guint       n_pieces,
                          int         seq_dim,
                          GError    **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  guint dim;
  CpTensor *out;

  g_return_val_if_fail (self != NULL, NULL);
  g_return_val_if_fail (pieces != NULL || n_pieces == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);
  for (guint r = 0; r < n_pieces; r++)
    g_return_val_if_fail (CP_IS_TENSOR (pieces[r]), NULL);

  if (!check_pieces (self, pieces, n_pieces, seq_dim, &dim, error))
    return NULL;
  shape_with (pieces[0], dim, cp_layout_get_seq_len (self), shape);
  out = _cp_tensor_new_on_device (cp_tensor_get_device (pieces[0]), cp_tensor_get_dtype (pieces[0]),
                                  shape, cp_tensor_get_n_dims (pieces[0]), FALSE, error);
  if (out != NULL && !unshard_copy (self, pieces, dim, out, error))
    g_clear_object (&out);
  return out;
}

/**
 * cp_layout_unshard_pieces_into:
 * @self: a layout
 * @pieces: (array length=n_pieces): every rank's local piece, in rank order
 * @n_pieces: the number of pieces, the layout's cp size
 * @seq_dim: the sequence dimension; negative values count from the last
 * @out: the full tensor to write
 * @error: return location for a #GError
 *
 * Like [method@Cp.Layout.unshard_pieces], writing into a tensor the caller
 * reuses.
 *
 * Returns: %TRUE on success
 *
 * Since: 1.0
 */
gboolean
cp_layout_unshard_pieces_into (CpLayout   *self,
                               CpTensor  **pieces,
                               guint       n_pieces,
                               int         seq_dim,
                               CpTensor   *out,
                               GError    **error)
{
  guint dim;

  g_return_val_if_fail (self != NULL, FALSE);
  g_return_val_if_fail (pieces != NULL || n_pieces == 0, FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (out), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);
  for (guint r = 0; r < n_pieces; r++)
    g_return_val_if_fail (CP_IS_TENSOR (pieces[r]), FALSE);

  if (!check_pieces (self, pieces, n_pieces, seq_dim, &dim, error) ||
      !check_output (out, pieces[0], "unshard_pieces", dim, cp_layout_get_seq_len (self), error))
    return FALSE;
  return unshard_copy (self, pieces, dim, out, error);
}

CpTensor *
_cp_layout_restore_gathered (CpLayout  *self,
                             CpTensor  *gathered,
                             guint      dim,
                             GError   **error)
{
  CpTensor *out;
  gsize outer;
  gint64 length;
  gsize step;

  out = _cp_tensor_new_on_device (cp_tensor_get_device (gathered), cp_tensor_get_dtype (gathered),
                                  cp_tensor_get_shape (gathered, NULL),
                                  cp_tensor_get_n_dims (gathered), FALSE, error);
  if (out == NULL)
    return NULL;
  _cp_tensor_split_at (gathered, dim, &outer, &length, &step);
  for (int r = 0; r < cp_layout_get_cp_size (self); r++)
    if (!_cp_layout_transfer_runs (self, r, out, gathered, outer, step, length,
                                   _cp_layout_get_rank_offset (self, r), FALSE, error))
      {
        g_clear_object (&out);
        break;
      }
  return out;
}
