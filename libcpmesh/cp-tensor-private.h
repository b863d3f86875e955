/* cp-tensor-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-features.h"
#include "cp-region-private.h"
#include "cp-tensor.h"

G_BEGIN_DECLS

/* Validates a shape (at most CP_TENSOR_MAX_DIMS dimensions, none negative,
 * element count and byte size without overflow) and returns its element
 * count in @numel. */
gboolean  _cp_shape_check            (CpDType        dtype,
                                      const gint64  *shape,
                                      guint          n_dims,
                                      gint64        *numel,
                                      GError       **error);

/* "[2, 8, 64]" */
char     *_cp_shape_to_string        (const gint64  *shape,
                                      guint          n_dims);

/* A host tensor whose bytes are about to be overwritten, so they are not
 * zero-filled. */
CpTensor *_cp_tensor_new_uninit      (CpDType        dtype,
                                      const gint64  *shape,
                                      guint          n_dims,
                                      GError       **error);

/* A tensor in the memory of @device, which must be reachable
 * (_cp_memory_ops_for_kind), zero-filled when @zeroed. */
CpTensor *_cp_tensor_new_on_device   (CpDeviceKind   device,
                                      CpDType        dtype,
                                      const gint64  *shape,
                                      guint          n_dims,
                                      gboolean       zeroed,
                                      GError       **error);

/* Device kinds as a set, for _cp_tensor_require_device(). */
#define CP_DEVICE_KINDS_HOST      (1u << CP_DEVICE_KIND_HOST)
#define CP_DEVICE_KINDS_TEST      (1u << CP_DEVICE_KIND_TEST)
/* Every kind the memory interface reaches in this build. */
#define CP_DEVICE_KINDS_CUDA      (CP_HAS_CUDA ? 1u << CP_DEVICE_KIND_CUDA : 0u)
#define CP_DEVICE_KINDS_REACHABLE (CP_DEVICE_KINDS_HOST | CP_DEVICE_KINDS_TEST | CP_DEVICE_KINDS_CUDA)

/* The one check that a tensor lives where an operation can reach it:
 * in one of @kinds, and in memory this build reaches at all.  Otherwise
 * sets CP_TENSOR_ERROR_DEVICE, naming @what (the operation), @label (the
 * tensor, as the caller names it), its device and the kinds accepted. */
gboolean  _cp_tensor_require_device  (CpTensor      *self,
                                      const char    *what,
                                      const char    *label,
                                      guint          kinds,
                                      GError       **error);

/* The one check that an operation may write the bytes of @self: its
 * storage is not read-only (cp_storage_get_read_only).  Otherwise sets
 * CP_TENSOR_ERROR_READ_ONLY, naming @what (the operation) and @label (the
 * tensor, as the caller names it).  Every operation that writes into a
 * tensor the caller gave calls it before it writes anything. */
gboolean  _cp_tensor_require_writable (CpTensor     *self,
                                       const char   *what,
                                       const char   *label,
                                       GError      **error);

/* Makes @region name @self's bytes in its storage (a reference on the
 * storage, not on @self, whose storage a context may swap). */
void      _cp_tensor_get_region      (CpTensor      *self,
                                      CpRegion      *region);

/* "host", "cuda", … */
const char *_cp_device_kind_get_name (CpDeviceKind   kind);

/* In-place changes of a tensor object (prepare's padding, enter's
 * sharding, exit's restoring) are reserved to one holder at a time — a
 * prepare under way or an entered context, given as any unique pointer.
 * claim() makes @holder the holder and returns TRUE when nobody held the
 * tensor, and returns FALSE otherwise (another rank's batch or context
 * got it first: CP_TENSOR_ERROR_IN_USE for the caller).  release() gives
 * it back; only the holder may. */
gboolean  _cp_tensor_claim           (CpTensor      *self,
                                      gconstpointer  holder);
void      _cp_tensor_release         (CpTensor      *self,
                                      gconstpointer  holder);

/* Sets CP_TENSOR_ERROR_IN_USE for a failed claim: "@what: @label is being
 * changed in place by another batch or context…". */
void      _cp_tensor_set_in_use_error (GError      **error,
                                       const char   *what,
                                       const char   *label);

/* Makes @self view @storage at @offset with a new shape, in place: the
 * same object now holds other bytes, as PyTorch's resize_() + copy_() do
 * when a context shards a registered buffer.  @holder must hold @self. */
void      _cp_tensor_replace         (CpTensor      *self,
                                      gconstpointer  holder,
                                      CpStorage     *storage,
                                      gsize          offset,
                                      const gint64  *shape,
                                      guint          n_dims);

/* Moves the bytes and shape of @source into @self and leaves @source
 * untouched; equivalent to replace() with @source's storage. */
void      _cp_tensor_assign          (CpTensor      *self,
                                      gconstpointer  holder,
                                      CpTensor      *source);

/* The sizes around @dim: @outer elements before it, its own length, and
 * the bytes of one step along it (the product of the later dimensions
 * times the element size). */
void      _cp_tensor_split_at        (CpTensor      *self,
                                      guint          dim,
                                      gsize         *outer,
                                      gint64        *length,
                                      gsize         *step_bytes);

/* Checks that @dim is a dimension of @self (negative counts from the end)
 * and returns it normalised, setting CP_TENSOR_ERROR_SHAPE otherwise.
 * @what names the tensor in the message. */
gboolean  _cp_tensor_normalize_dim   (CpTensor      *self,
                                      const char    *what,
                                      int            dim,
                                      guint         *normalized,
                                      GError       **error);

gboolean  _cp_tensor_same_shape      (CpTensor      *a,
                                      CpTensor      *b);

G_END_DECLS
