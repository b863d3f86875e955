/* cp-tensor.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "cp-dtype-private.h"
#include "cp-enum-types.h"
#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-storage-private.h"
#include "cp-tensor-private.h"

/**
 * CpTensor:
 *
 * An n-dimensional, contiguous, row-major typed buffer.
 *
 * A tensor is a view — element type, shape and a byte offset — over a
 * reference-counted [struct@Cp.Storage], so several tensors can share one
 * allocation and a tensor can wrap memory it does not own (a #GBytes, a
 * numpy array, a memory file another process maps) without copying.
 *
 * Tensors have at most [const@Cp.TENSOR_MAX_DIMS] dimensions and are
 * always contiguous. When a context shards a registered buffer in place,
 * the same tensor object is made to view the smaller local layout, like
 * PyTorch's `resize_()`; code holding the object sees the new shape.
 *
 * Reading a tensor — its shape, its bytes, a copy, a narrowed view, a
 * shard or a numpy view of it — changes nothing in it, so any number of
 * threads may read one tensor at once (the ranks of an in-process mesh
 * sharding one shared input, for example). Writing its bytes from several
 * threads at once is the caller's business.
 *
 * Changing the object itself is reserved to whoever holds the tensor: a
 * [method@Cp.Batch.prepare] while it pads, and a [class@Cp.Context] from
 * [method@Cp.Context.enter] to [method@Cp.Context.exit]. A second holder
 * is refused with %CP_TENSOR_ERROR_IN_USE, naming the key, on every rank
 * of the call, before anything changes: one tensor put in the batches of
 * two ranks, or given in one [class@Cp.BatchOptions] shared by all ranks,
 * cannot be padded or sharded by both. While a context holds a tensor, no
 * other thread may read it either: its storage changes under the reader.
 *
 * Since: 1.0
 */
struct _CpTensor
{
  GObject parent_instance;

  CpDType dtype;
  guint n_dims;
  gint64 shape[CP_TENSOR_MAX_DIMS];
  gint64 numel;
  CpStorage *storage;
  gsize offset;
  gboolean requires_grad;

  /* Who may change the object in place (see _cp_tensor_claim()); NULL
   * when nobody does.  Set and cleared atomically: holders on different
   * threads race for it. */
  gpointer holder;
};

G_DEFINE_FINAL_TYPE (CpTensor, cp_tensor, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_DTYPE,
  PROP_DEVICE,
  PROP_N_DIMS,
  PROP_NUMEL,
  PROP_REQUIRES_GRAD,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
cp_tensor_finalize (GObject *object)
{
  CpTensor *self = (CpTensor *) object;

  g_clear_pointer (&self->storage, cp_storage_unref);

  G_OBJECT_CLASS (cp_tensor_parent_class)->finalize (object);
}

static void
cp_tensor_get_property (GObject    *object,
                        guint       prop_id,
                        GValue     *value,
                        GParamSpec *pspec)
{
  CpTensor *self = CP_TENSOR (object);

  switch (prop_id)
    {
    case PROP_DTYPE:
      g_value_set_enum (value, self->dtype);
      break;
    case PROP_DEVICE:
      g_value_set_enum (value, cp_tensor_get_device (self));
      break;
    case PROP_N_DIMS:
      g_value_set_uint (value, self->n_dims);
      break;
    case PROP_NUMEL:
      g_value_set_int64 (value, self->numel);
      break;
    case PROP_REQUIRES_GRAD:
      g_value_set_boolean (value, self->requires_grad);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_tensor_set_property (GObject      *object,
                        guint         prop_id,
                        const GValue *value,
                        GParamSpec   *pspec)
{
  CpTensor *self = CP_TENSOR (object);

  switch (prop_id)
    {
    case PROP_REQUIRES_GRAD:
      cp_tensor_set_requires_grad (self, g_value_get_boolean (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_tensor_class_init (CpTensorClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = cp_tensor_finalize;
  object_class->get_property = cp_tensor_get_property;
  object_class->set_property = cp_tensor_set_property;

  /**
   * CpTensor:dtype:
   *
   * The element type.
   *
   * Since: 1.0
   */
  properties[PROP_DTYPE] =
    g_param_spec_enum ("dtype", NULL, NULL,
                       CP_TYPE_DTYPE, CP_DTYPE_FLOAT32,
                       G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpTensor:device:
   *
   * The kind of memory that holds the elements.
   *
   * Since: 1.0
   */
  properties[PROP_DEVICE] =
    g_param_spec_enum ("device", NULL, NULL,
                       CP_TYPE_DEVICE_KIND, CP_DEVICE_KIND_HOST,
                       G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpTensor:n-dims:
   *
   * The number of dimensions.
   *
   * Since: 1.0
   */
  properties[PROP_N_DIMS] =
    g_param_spec_uint ("n-dims", NULL, NULL,
                       0, CP_TENSOR_MAX_DIMS, 0,
                       G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpTensor:numel:
   *
   * The number of elements; notified when a context shards or restores
   * the tensor in place.
   *
   * Since: 1.0
   */
  properties[PROP_NUMEL] =
    g_param_spec_int64 ("numel", NULL, NULL,
                        0, G_MAXINT64, 0,
                        G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);

  /**
   * CpTensor:requires-grad:
   *
   * Whether the tensor carries gradients. A context shards such a primary
   * buffer out of place, leaving the caller's tensor intact, because the
   * autograd graph of the caller refers to it (see
   * [method@Cp.Layout.shard]).
   *
   * Since: 1.0
   */
  properties[PROP_REQUIRES_GRAD] =
    g_param_spec_boolean ("requires-grad", NULL, NULL,
                          FALSE,
                          G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_tensor_init (CpTensor *self)
{
}

gboolean
_cp_shape_check (CpDType        dtype,
                 const gint64  *shape,
                 guint          n_dims,
                 gint64        *numel,
                 GError       **error)
{
  gint64 count = 1;
  gint64 limit = G_MAXINT64 / (gint64) cp_dtype_get_size (dtype);

  if (n_dims > CP_TENSOR_MAX_DIMS)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "a tensor has at most %d dimensions, %u were given",
                   CP_TENSOR_MAX_DIMS, n_dims);
      return FALSE;
    }
  for (guint i = 0; i < n_dims; i++)
    {
      if (shape[i] < 0)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "dimension %u has negative size %" G_GINT64_FORMAT, i, shape[i]);
          return FALSE;
        }
      if (shape[i] != 0 && count > limit / shape[i])
        {
          g_autofree char *text = _cp_shape_to_string (shape, n_dims);

          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "shape %s of %s overflows the addressable size", text,
                       cp_dtype_get_name (dtype));
          return FALSE;
        }
      count *= shape[i];
    }
  if (numel != NULL)
    *numel = count;
  return TRUE;
}

char *
_cp_shape_to_string (const gint64 *shape,
                     guint         n_dims)
{
  GString *text = g_string_new ("[");

  for (guint i = 0; i < n_dims; i++)
    g_string_append_printf (text, "%s%" G_GINT64_FORMAT, i ? ", " : "", shape[i]);
  g_string_append_c (text, ']');
  return g_string_free (text, FALSE);
}

/* The one place a tensor object is created: a shape already checked and a
 * storage large enough for it. Takes ownership of @storage. */
static CpTensor *
tensor_wrap (CpDType       dtype,
             const gint64 *shape,
             guint         n_dims,
             gint64        numel,
             CpStorage    *storage,
             gsize         offset)
{
  CpTensor *self = g_object_new (CP_TYPE_TENSOR, NULL);

  self->dtype = dtype;
  self->n_dims = n_dims;
  if (n_dims > 0)
    memcpy (self->shape, shape, n_dims * sizeof (gint64));
  self->numel = numel;
  self->storage = storage;
  self->offset = offset;
  return self;
}

CpTensor *
_cp_tensor_new_on_device (CpDeviceKind   device,
                          CpDType        dtype,
                          const gint64  *shape,
                          guint          n_dims,
                          gboolean       zeroed,
                          GError       **error)
{
  gint64 numel;
  CpStorage *storage;

  if (!_cp_shape_check (dtype, shape, n_dims, &numel, error))
    return NULL;
  storage = _cp_storage_new_on_device (device, (gsize) numel * cp_dtype_get_size (dtype), zeroed,
                                       error);
  if (storage == NULL)
    return NULL;
  return tensor_wrap (dtype, shape, n_dims, numel, storage, 0);
}

CpTensor *
_cp_tensor_new_uninit (CpDType        dtype,
                       const gint64  *shape,
                       guint          n_dims,
                       GError       **error)
{
  return _cp_tensor_new_on_device (CP_DEVICE_KIND_HOST, dtype, shape, n_dims, FALSE, error);
}

#define RETURN_IF_BAD_DTYPE(dtype, val) \
  g_return_val_if_fail ((guint) (dtype) <= CP_DTYPE_FLOAT64, val)

/**
 * cp_tensor_new:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions, at most [const@Cp.TENSOR_MAX_DIMS]
 * @error: return location for a #GError
 *
 * Creates a zero-filled tensor in host memory.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE for a bad shape or
 *   %CP_TENSOR_ERROR_OUT_OF_MEMORY
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new (CpDType        dtype,
               const gint64  *shape,
               guint          n_dims,
               GError       **error)
{
  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return _cp_tensor_new_on_device (CP_DEVICE_KIND_HOST, dtype, shape, n_dims, TRUE, error);
}

/**
 * cp_tensor_new_from_storage:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @storage: the storage to view
 * @offset: where the first element starts in @storage, in bytes
 * @error: return location for a #GError
 *
 * Creates a tensor that views part of @storage, sharing it with every
 * other tensor on it.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE when the view does not fit in @storage
 *   or %CP_TENSOR_ERROR_MISALIGNED when @offset is not a multiple of the
 *   element size
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_from_storage (CpDType        dtype,
                            const gint64  *shape,
                            guint          n_dims,
                            CpStorage     *storage,
                            gsize          offset,
                            GError       **error)
{
  gint64 numel;
  gsize nbytes;
  gsize elsize;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (storage != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_shape_check (dtype, shape, n_dims, &numel, error))
    return NULL;
  elsize = cp_dtype_get_size (dtype);
  nbytes = (gsize) numel * elsize;
  if (offset > cp_storage_get_size (storage) || nbytes > cp_storage_get_size (storage) - offset)
    {
      g_autofree char *text = _cp_shape_to_string (shape, n_dims);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "a %s tensor of shape %s needs %" G_GSIZE_FORMAT " bytes at offset %"
                   G_GSIZE_FORMAT ", but the storage holds %" G_GSIZE_FORMAT,
                   cp_dtype_get_name (dtype), text, nbytes, offset,
                   cp_storage_get_size (storage));
      return NULL;
    }
  if ((cp_storage_get_data_address (storage) + offset) % elsize != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED,
                   "%s elements need %" G_GSIZE_FORMAT "-byte alignment, but the data starts at "
                   "address %#" G_GINTPTR_MODIFIER "x",
                   cp_dtype_get_name (dtype), elsize,
                   cp_storage_get_data_address (storage) + offset);
      return NULL;
    }
  return tensor_wrap (dtype, shape, n_dims, numel, cp_storage_ref (storage), offset);
}

/* Wraps all of @storage, which must be exactly the tensor's size. Takes
 * ownership of @storage in every case. */
static CpTensor *
tensor_new_on_whole (CpDType        dtype,
                     const gint64  *shape,
                     guint          n_dims,
                     CpStorage     *storage,
                     GError       **error)
{
  g_autoptr(CpStorage) owned = storage;
  gint64 numel;

  if (!_cp_shape_check (dtype, shape, n_dims, &numel, error))
    return NULL;
  if ((gsize) numel * cp_dtype_get_size (dtype) != cp_storage_get_size (storage))
    {
      g_autofree char *text = _cp_shape_to_string (shape, n_dims);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "a %s tensor of shape %s needs %" G_GSIZE_FORMAT " bytes, but %"
                   G_GSIZE_FORMAT " were given",
                   cp_dtype_get_name (dtype), text,
                   (gsize) numel * cp_dtype_get_size (dtype), cp_storage_get_size (storage));
      return NULL;
    }
  return cp_tensor_new_from_storage (dtype, shape, n_dims, storage, 0, error);
}

/**
 * cp_tensor_new_from_bytes:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @bytes: exactly the bytes of the tensor, row-major
 * @error: return location for a #GError
 *
 * Creates a tensor over the contents of @bytes without copying them.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE when the size of @bytes does not match the shape
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_from_bytes (CpDType        dtype,
                          const gint64  *shape,
                          guint          n_dims,
                          GBytes        *bytes,
                          GError       **error)
{
  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (bytes != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  return tensor_new_on_whole (dtype, shape, n_dims, cp_storage_new_from_bytes (bytes), error);
}

/**
 * cp_tensor_new_borrowed:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @address: the address of the first element
 * @size: the number of bytes at @address, exactly the tensor's size
 * @release: (scope notified) (closure user_data) (destroy destroy) (nullable):
 *   called once when no tensor uses the memory any more
 * @user_data: data for @release
 * @destroy: (nullable): frees @user_data after @release ran
 * @error: return location for a #GError
 *
 * Creates a tensor over foreign memory without copying it. Reads and
 * writes through the tensor go straight to that memory. On error, @release
 * has already been called. From Python, where a release callback may not
 * run while an exception is pending, use `Cp.Tensor.from_numpy()`, built on
 * [ctor@Cp.Storage.new_with_owner], instead.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE when @size does not match the shape or
 *   %CP_TENSOR_ERROR_MISALIGNED when @address is not aligned to the
 *   element size
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_borrowed (CpDType         dtype,
                        const gint64   *shape,
                        guint           n_dims,
                        guintptr        address,
                        gsize           size,
                        CpReleaseFunc   release,
                        gpointer        user_data,
                        GDestroyNotify  destroy,
                        GError        **error)
{
  CpStorage *storage;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (address != 0 || size == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  storage = cp_storage_new_borrowed (address, size, release, user_data, destroy);
  return tensor_new_on_whole (dtype, shape, n_dims, storage, error);
}

/**
 * cp_tensor_new_shared:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @error: return location for a #GError
 *
 * Creates a zero-filled tensor in a memory file another process can map:
 * pass [method@Cp.Tensor.get_fd] to it and have it call
 * [ctor@Cp.Tensor.new_from_fd]; both then see the same bytes. The file is
 * sealed against resizing ([ctor@Cp.Storage.new_shared]), so no holder of
 * the descriptor can shrink it under another's mapping.
 *
 * Returns: (transfer full): a new tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_shared (CpDType        dtype,
                      const gint64  *shape,
                      guint          n_dims,
                      GError       **error)
{
  gint64 numel;
  CpStorage *storage;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_shape_check (dtype, shape, n_dims, &numel, error))
    return NULL;
  storage = cp_storage_new_shared ((gsize) numel * cp_dtype_get_size (dtype), error);
  if (storage == NULL)
    return NULL;
  return tensor_wrap (dtype, shape, n_dims, numel, storage, 0);
}

/**
 * cp_tensor_new_from_fd:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @fd: a memfd sealed against shrinking, or a dma-buf, open for reading
 *   and writing; it is duplicated, not taken
 * @offset: where the tensor starts in the file, in bytes
 * @error: return location for a #GError
 *
 * Creates a tensor over a mapping of @fd, sharing its bytes with every
 * other process that maps the same file. A file another holder could
 * shrink is refused (see [ctor@Cp.Storage.new_from_fd]).
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_BAD_FD when @fd cannot be mapped (negative, closed,
 *   `O_PATH`, not open for reading and writing),
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE when the file is too short or
 *   %CP_TENSOR_ERROR_UNSEALED when it could shrink
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_from_fd (CpDType        dtype,
                       const gint64  *shape,
                       guint          n_dims,
                       int            fd,
                       goffset        offset,
                       GError       **error)
{
  gint64 numel;
  CpStorage *storage;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_shape_check (dtype, shape, n_dims, &numel, error))
    return NULL;
  if (offset < 0 || offset % (goffset) cp_dtype_get_size (dtype) != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED,
                   "offset %" G_GOFFSET_FORMAT " is not a non-negative multiple of the %s "
                   "element size %" G_GSIZE_FORMAT, offset, cp_dtype_get_name (dtype),
                   cp_dtype_get_size (dtype));
      return NULL;
    }
  storage = cp_storage_new_from_fd (fd, offset, (gsize) numel * cp_dtype_get_size (dtype), error);
  if (storage == NULL)
    return NULL;
  return tensor_wrap (dtype, shape, n_dims, numel, storage, 0);
}

/* ceil ((end - start) / step), computed in unsigned arithmetic so that no
 * pair of bounds overflows. */
static gint64
arange_length (gint64 start,
               gint64 end,
               gint64 step)
{
  guint64 span;
  guint64 stride;

  if (step > 0 && end > start)
    {
      span = (guint64) end - (guint64) start;
      stride = (guint64) step;
    }
  else if (step < 0 && end < start)
    {
      span = (guint64) start - (guint64) end;
      stride = (guint64) 0 - (guint64) step;
    }
  else
    return 0;
  return (gint64) MIN ((span - 1) / stride + 1, (guint64) G_MAXINT64);
}

/* int64 values are computed in integers: a double holds them exactly only
 * up to 2^53.  They cannot overflow, every one lies between start and end.
 * Other dtypes convert from double as every writer does. */
static void
arange_fill (CpTensor *self,
             gint64    start,
             gint64    step,
             gint64    count)
{
  gpointer data = _cp_memory_kernel_address (self);
  CpDType dtype = cp_tensor_get_dtype (self);

  for (gint64 i = 0; i < count; i++)
    {
      gint64 value = (gint64) ((guint64) start + (guint64) i * (guint64) step);

      if (dtype == CP_DTYPE_INT64)
        ((gint64 *) data)[i] = value;
      else
        _cp_dtype_write (dtype, data, (gsize) i, (double) value);
    }
}

/**
 * cp_tensor_new_arange:
 * @dtype: the element type
 * @start: the first value
 * @end: the bound, not included
 * @step: the difference between neighbours, not zero
 * @error: return location for a #GError
 *
 * Creates the 1-D tensor `[start, start + step, …]` up to, not including,
 * @end, like `torch.arange`.
 *
 * Returns: (transfer full): a new tensor, or %NULL with
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE when @step is zero
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_arange (CpDType   dtype,
                      gint64    start,
                      gint64    end,
                      gint64    step,
                      GError  **error)
{
  gint64 count = 0;
  CpTensor *self;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (step == 0)
    {
      g_set_error_literal (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                           "arange step must not be zero");
      return NULL;
    }
  count = arange_length (start, end, step);
  self = _cp_tensor_new_uninit (dtype, &count, 1, error);
  if (self == NULL)
    return NULL;
  arange_fill (self, start, step, count);
  return self;
}

/**
 * cp_tensor_new_full:
 * @dtype: the element type
 * @shape: (array length=n_dims): the size of each dimension
 * @n_dims: the number of dimensions
 * @value: the value of every element, converted to @dtype (saturating for
 *   integers, rounding to nearest even for 16-bit floats)
 * @error: return location for a #GError
 *
 * Creates a host tensor with every element set to @value.
 *
 * Returns: (transfer full): a new tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_full (CpDType        dtype,
                    const gint64  *shape,
                    guint          n_dims,
                    double         value,
                    GError       **error)
{
  CpTensor *self;

  RETURN_IF_BAD_DTYPE (dtype, NULL);
  g_return_val_if_fail (shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  self = _cp_tensor_new_uninit (dtype, shape, n_dims, error);
  if (self != NULL && !_cp_memory_fill (self, 0, (gsize) self->numel, value, error))
    g_clear_object (&self);
  return self;
}

/**
 * cp_tensor_get_dtype:
 * @self: a tensor
 *
 * Gets the element type of @self.
 *
 * Returns: the element type
 *
 * Since: 1.0
 */
CpDType
cp_tensor_get_dtype (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), CP_DTYPE_FLOAT32);

  return self->dtype;
}

/**
 * cp_tensor_get_shape:
 * @self: a tensor
 * @n_dims: (out) (optional): the number of dimensions
 *
 * Gets the size of each dimension.
 *
 * Returns: (array length=n_dims) (transfer none): the shape, valid until
 *   the tensor is changed in place or freed
 *
 * Since: 1.0
 */
const gint64 *
cp_tensor_get_shape (CpTensor *self,
                     guint    *n_dims)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);

  if (n_dims != NULL)
    *n_dims = self->n_dims;
  return self->shape;
}

/**
 * cp_tensor_get_n_dims:
 * @self: a tensor
 *
 * Gets the number of dimensions of @self.
 *
 * Returns: the number of dimensions
 *
 * Since: 1.0
 */
guint
cp_tensor_get_n_dims (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);

  return self->n_dims;
}

/**
 * cp_tensor_get_dim:
 * @self: a tensor
 * @dim: a dimension; negative values count from the last
 *
 * Gets the size of one dimension.
 *
 * Returns: the size of dimension @dim
 *
 * Since: 1.0
 */
gint64
cp_tensor_get_dim (CpTensor *self,
                   int       dim)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);
  g_return_val_if_fail (dim < (int) self->n_dims && dim >= -(int) self->n_dims, 0);

  return self->shape[dim < 0 ? dim + (int) self->n_dims : dim];
}

/**
 * cp_tensor_get_numel:
 * @self: a tensor
 *
 * Gets the number of elements of @self.
 *
 * Returns: the product of the shape
 *
 * Since: 1.0
 */
gint64
cp_tensor_get_numel (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);

  return self->numel;
}

/**
 * cp_tensor_get_nbytes:
 * @self: a tensor
 *
 * Gets the number of bytes the elements of @self take.
 *
 * Returns: the size in bytes
 *
 * Since: 1.0
 */
gsize
cp_tensor_get_nbytes (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);

  return (gsize) self->numel * cp_dtype_get_size (self->dtype);
}

/**
 * cp_tensor_get_device:
 * @self: a tensor
 *
 * Gets the kind of memory that holds the elements.
 *
 * Returns: the device kind
 *
 * Since: 1.0
 */
CpDeviceKind
cp_tensor_get_device (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), CP_DEVICE_KIND_HOST);

  return cp_storage_get_device (self->storage);
}

/**
 * cp_tensor_get_storage:
 * @self: a tensor
 *
 * Gets the storage @self views. Two tensors share memory exactly when
 * they view the same storage at overlapping offsets.
 *
 * Returns: (transfer none): the storage
 *
 * Since: 1.0
 */
CpStorage *
cp_tensor_get_storage (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);

  return self->storage;
}

/**
 * cp_tensor_get_storage_offset:
 * @self: a tensor
 *
 * Gets where the first element of @self starts in its storage.
 *
 * Returns: the offset in bytes
 *
 * Since: 1.0
 */
gsize
cp_tensor_get_storage_offset (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);

  return self->offset;
}

/**
 * cp_tensor_get_data_address:
 * @self: a tensor
 *
 * Gets the address of the first element as an integer, for bindings that
 * hand it to numpy, ctypes or a device API. It stays valid while the
 * storage does; keep a reference on [method@Cp.Tensor.get_storage] rather
 * than on the tensor, whose storage a context may swap. Do not write
 * through it when the storage is read-only
 * ([method@Cp.Storage.get_read_only]).
 *
 * Returns: the address
 *
 * Since: 1.0
 */
guintptr
cp_tensor_get_data_address (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), 0);

  return cp_storage_get_data_address (self->storage) + self->offset;
}

/**
 * cp_tensor_get_data: (skip)
 * @self: a tensor
 *
 * Gets a pointer to the first element, for C callers. The elements of a
 * tensor over read-only memory ([method@Cp.Storage.get_read_only]) must
 * not be written through it.
 *
 * Returns: (transfer none): the elements
 *
 * Since: 1.0
 */
gpointer
cp_tensor_get_data (CpTensor *self)
{
  guint8 *data;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);

  data = cp_storage_get_data (self->storage);

  /* An empty GBytes has no data at all: there is nothing to offset. */
  return data != NULL ? data + self->offset : NULL;
}

void
_cp_tensor_get_region (CpTensor *self,
                       CpRegion *region)
{
  _cp_region_init (region, self->storage, self->offset, cp_tensor_get_nbytes (self));
}

/**
 * cp_tensor_get_fd:
 * @self: a tensor
 *
 * Gets the file descriptor of a tensor made by [ctor@Cp.Tensor.new_shared]
 * or [ctor@Cp.Tensor.new_from_fd], for another process to map. The
 * tensor's bytes start at [method@Cp.Tensor.get_storage_offset] plus the
 * offset the storage was mapped at.
 *
 * Returns: the file descriptor, owned by the tensor, or -1 when its
 *   memory has none
 *
 * Since: 1.0
 */
int
cp_tensor_get_fd (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), -1);

  return cp_storage_get_fd (self->storage);
}

/**
 * cp_tensor_dup_bytes:
 * @self: a host tensor
 *
 * Gets the elements of @self as a #GBytes. For host memory this is a view
 * that keeps the storage alive, not a copy; gjs turns it into a typed
 * array without copying either.
 *
 * Returns: (transfer full): the bytes
 *
 * Since: 1.0
 */
GBytes *
cp_tensor_dup_bytes (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (cp_tensor_get_device (self) == CP_DEVICE_KIND_HOST, NULL);

  return g_bytes_new_with_free_func (cp_tensor_get_data (self), cp_tensor_get_nbytes (self),
                                     (GDestroyNotify) cp_storage_unref,
                                     cp_storage_ref (self->storage));
}

/**
 * cp_tensor_get_requires_grad:
 * @self: a tensor
 *
 * Gets the [property@Cp.Tensor:requires-grad] flag.
 *
 * Returns: whether @self carries gradients
 *
 * Since: 1.0
 */
gboolean
cp_tensor_get_requires_grad (CpTensor *self)
{
  g_return_val_if_fail (CP_IS_TENSOR (self), FALSE);

  return self->requires_grad;
}

/**
 * cp_tensor_set_requires_grad:
 * @self: a tensor
 * @requires_grad: whether @self carries gradients
 *
 * Sets the [property@Cp.Tensor:requires-grad] flag.
 *
 * Since: 1.0
 */
void
cp_tensor_set_requires_grad (CpTensor *self,
                             gboolean  requires_grad)
{
  g_return_if_fail (CP_IS_TENSOR (self));

  requires_grad = !!requires_grad;
  if (self->requires_grad == requires_grad)
    return;
  self->requires_grad = requires_grad;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_REQUIRES_GRAD]);
}

/**
 * cp_tensor_describe:
 * @self: a tensor
 *
 * Describes @self for messages, for example `int64[2, 8] on host`.
 *
 * Returns: (transfer full): the description
 *
 * Since: 1.0
 */
char *
cp_tensor_describe (CpTensor *self)
{
  g_autofree char *shape = NULL;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);

  shape = _cp_shape_to_string (self->shape, self->n_dims);
  return g_strdup_printf ("%s%s on %s", cp_dtype_get_name (self->dtype), shape,
                          _cp_device_kind_get_name (cp_tensor_get_device (self)));
}

/**
 * cp_tensor_get_value:
 * @self: a tensor in host or test memory
 * @index: a flat, row-major element index
 *
 * Reads one element as a double, for tests and small scripts (integers
 * above 2^53 lose precision). Use numpy or the data address for bulk
 * access. Device memory that fails to give the element back is reported
 * as a critical warning, since there is no error to return, and gives NaN.
 *
 * Returns: the element
 *
 * Since: 1.0
 */
double
cp_tensor_get_value (CpTensor *self,
                     gint64    index)
{
  gsize elsize = cp_dtype_get_size (self->dtype);
  guint64 element = 0;
  g_autoptr(GError) error = NULL;

  g_return_val_if_fail (CP_IS_TENSOR (self), 0.0);
  g_return_val_if_fail (index >= 0 && index < self->numel, 0.0);
  g_return_val_if_fail (_cp_storage_get_memory (self->storage) != NULL, 0.0);

  /* No error to return: a device that fails here is reported as the
   * broken state it is, and the value is NaN. */
  if (!_cp_memory_download (&element, self, (gsize) index * elsize, elsize, &error))
    {
      g_critical ("cp_tensor_get_value: %s", error->message);
      return NAN;
    }
  return _cp_dtype_read (self->dtype, &element, 0);
}

/**
 * cp_tensor_set_value:
 * @self: a tensor in host or test memory
 * @index: a flat, row-major element index
 * @value: the new value, converted as by [ctor@Cp.Tensor.new_full]
 *
 * Writes one element, for tests and small scripts. Writing into a tensor
 * over read-only memory ([method@Cp.Storage.get_read_only]) is a
 * programmer error: it is refused with a critical. Device memory that
 * fails to take the value is reported as a critical warning.
 *
 * Since: 1.0
 */
void
cp_tensor_set_value (CpTensor *self,
                     gint64    index,
                     double    value)
{
  guint64 element = 0;
  g_autoptr(GError) error = NULL;

  g_return_if_fail (CP_IS_TENSOR (self));
  g_return_if_fail (index >= 0 && index < self->numel);
  g_return_if_fail (_cp_storage_get_memory (self->storage) != NULL);
  g_return_if_fail (!cp_storage_get_read_only (self->storage));

  _cp_dtype_write (self->dtype, &element, 0, value);
  if (!_cp_memory_upload (self, (gsize) index * cp_dtype_get_size (self->dtype), &element,
                          cp_dtype_get_size (self->dtype), &error))
    g_critical ("cp_tensor_set_value: %s", error->message);
}

/**
 * cp_tensor_copy:
 * @self: a tensor
 * @error: return location for a #GError
 *
 * Copies @self into new memory of the same kind.
 *
 * Returns: (transfer full): the copy, or %NULL with
 *   %CP_TENSOR_ERROR_OUT_OF_MEMORY, or %CP_TENSOR_ERROR_DEVICE when this
 *   build cannot reach the memory of @self
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_copy (CpTensor  *self,
                GError   **error)
{
  CpTensor *copy;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_tensor_require_device (self, "copy", "the tensor", CP_DEVICE_KINDS_REACHABLE, error))
    return NULL;
  copy = _cp_tensor_new_on_device (cp_tensor_get_device (self), self->dtype, self->shape,
                                   self->n_dims, FALSE, error);
  if (copy == NULL)
    return NULL;
  if (!_cp_memory_copy (copy, 0, self, 0, cp_tensor_get_nbytes (self), FALSE, error))
    {
      g_object_unref (copy);
      return NULL;
    }
  copy->requires_grad = self->requires_grad;
  return copy;
}

gboolean
_cp_tensor_same_shape (CpTensor *a,
                       CpTensor *b)
{
  return a->n_dims == b->n_dims &&
         memcmp (a->shape, b->shape, a->n_dims * sizeof (gint64)) == 0;
}

/**
 * cp_tensor_equal:
 * @self: a tensor
 * @other: another tensor
 *
 * Compares two tensors bit for bit: same element type, same shape, same
 * bytes. Floating-point values compare by representation, so a NaN equals
 * the same NaN and 0.0 differs from -0.0. Device memory that cannot be
 * read is reported as a critical warning and compares unequal.
 *
 * Returns: %TRUE when the tensors are identical
 *
 * Since: 1.0
 */
gboolean
cp_tensor_equal (CpTensor *self,
                 CpTensor *other)
{
  g_autoptr(GError) error = NULL;
  gboolean equal;

  g_return_val_if_fail (CP_IS_TENSOR (self), FALSE);
  g_return_val_if_fail (CP_IS_TENSOR (other), FALSE);

  if (self->dtype != other->dtype || !_cp_tensor_same_shape (self, other) ||
      cp_tensor_get_device (self) != cp_tensor_get_device (other))
    return FALSE;
  equal = _cp_memory_equal (self, other, cp_tensor_get_nbytes (self), &error);
  /* No error to return: bytes that cannot be read are not equal. */
  if (error != NULL)
    g_critical ("cp_tensor_equal: %s", error->message);
  return equal;
}

gboolean
_cp_tensor_normalize_dim (CpTensor    *self,
                          const char  *what,
                          int          dim,
                          guint       *normalized,
                          GError     **error)
{
  int n = (int) self->n_dims;

  if (dim >= n || dim < -n)
    {
      g_autofree char *description = cp_tensor_describe (self);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "%s: dimension %d does not exist in %s", what, dim, description);
      return FALSE;
    }
  *normalized = (guint) (dim < 0 ? dim + n : dim);
  return TRUE;
}

void
_cp_tensor_split_at (CpTensor *self,
                     guint     dim,
                     gsize    *outer,
                     gint64   *length,
                     gsize    *step_bytes)
{
  gsize before = 1;
  gsize after = cp_dtype_get_size (self->dtype);

  g_assert (dim < self->n_dims);
  for (guint i = 0; i < dim; i++)
    before *= (gsize) self->shape[i];
  for (guint i = dim + 1; i < self->n_dims; i++)
    after *= (gsize) self->shape[i];
  /* An empty tensor moves nothing: no outer rows, so no copy loop walks
   * the (possibly astronomical) product of its other dimensions. */
  *outer = self->numel == 0 ? 0 : before;
  *length = self->shape[dim];
  *step_bytes = after;
}

/* Narrowing dimension @dim stays contiguous when every earlier dimension
 * has size 1 (or the narrowed range is the whole dimension). */
static gboolean
narrow_is_contiguous (CpTensor *self,
                      guint     dim,
                      gint64    length)
{
  if (length == self->shape[dim])
    return TRUE;
  for (guint i = 0; i < dim; i++)
    if (self->shape[i] != 1)
      return FALSE;
  return TRUE;
}

static gboolean
copy_narrowed (CpTensor  *self,
               guint      dim,
               gint64     start,
               CpTensor  *out,
               GError   **error)
{
  gsize outer;
  gint64 length;
  gsize step;
  gsize run;

  _cp_tensor_split_at (self, dim, &outer, &length, &step);
  run = (gsize) out->shape[dim] * step;
  return _cp_memory_copy_2d (out, 0, run, self, (gsize) start * step, (gsize) length * step, run,
                             outer, FALSE, error);
}

/* The message names the range as [start, end) when that end exists;
 * extreme arguments would overflow it. */
static void
set_narrow_range_error (GError **error,
                        gint64   start,
                        gint64   length,
                        guint    dim,
                        gint64   size)
{
  gint64 end;

  if (__builtin_add_overflow (start, length, &end))
    g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                 "narrow: start %" G_GINT64_FORMAT " with length %" G_GINT64_FORMAT
                 " is outside dimension %u of size %" G_GINT64_FORMAT,
                 start, length, dim, size);
  else
    g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                 "narrow: range [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT ") is outside "
                 "dimension %u of size %" G_GINT64_FORMAT,
                 start, end, dim, size);
}

/**
 * cp_tensor_narrow:
 * @self: a tensor
 * @dim: the dimension to narrow; negative values count from the last
 * @start: the first index kept along @dim
 * @length: how many indices are kept
 * @error: return location for a #GError
 *
 * Selects `[start, start + length)` along one dimension.
 *
 * When the selection is contiguous in memory (narrowing the first
 * dimension, or any dimension whose earlier dimensions all have size 1)
 * the result is a view that shares storage with @self, so writes through
 * either are seen by both. Otherwise tensors must stay contiguous and the
 * result is a copy; [method@Cp.Tensor.get_storage] tells which.
 *
 * Returns: (transfer full): the narrowed tensor, or %NULL with
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_narrow (CpTensor  *self,
                  int        dim,
                  gint64     start,
                  gint64     length,
                  GError   **error)
{
  gint64 shape[CP_TENSOR_MAX_DIMS];
  gsize outer;
  gint64 size;
  gsize step;
  guint d;
  CpTensor *out;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!_cp_tensor_normalize_dim (self, "narrow", dim, &d, error))
    return NULL;
  if (start < 0 || length < 0 || start > self->shape[d] || length > self->shape[d] - start)
    {
      set_narrow_range_error (error, start, length, d, self->shape[d]);
      return NULL;
    }
  memcpy (shape, self->shape, sizeof shape);
  shape[d] = length;
  _cp_tensor_split_at (self, d, &outer, &size, &step);
  if (narrow_is_contiguous (self, d, length))
    return cp_tensor_new_from_storage (self->dtype, shape, self->n_dims, self->storage,
                                       self->offset + (gsize) start * step, error);
  if (!_cp_tensor_require_device (self, "narrow", "the tensor", CP_DEVICE_KINDS_REACHABLE, error))
    return NULL;
  out = _cp_tensor_new_on_device (cp_tensor_get_device (self), self->dtype, shape, self->n_dims,
                                  FALSE, error);
  if (out != NULL && !copy_narrowed (self, d, start, out, error))
    g_clear_object (&out);
  return out;
}

/* Resolves the one -1 of a reshape's @shape into @resolved, and checks
 * that the element count stays that of @self. */
static gboolean
resolve_reshape (CpTensor      *self,
                 const gint64  *shape,
                 guint          n_dims,
                 gint64        *resolved,
                 GError       **error)
{
  g_autofree char *have = _cp_shape_to_string (self->shape, self->n_dims);
  g_autofree char *want = _cp_shape_to_string (shape, MIN (n_dims, CP_TENSOR_MAX_DIMS));
  gint64 known = 1;
  int inferred = -1;

  if (n_dims > CP_TENSOR_MAX_DIMS)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "reshape: a tensor has at most %d dimensions, %u were given",
                   CP_TENSOR_MAX_DIMS, n_dims);
      return FALSE;
    }
  for (guint i = 0; i < n_dims; i++)
    {
      resolved[i] = shape[i];
      if (shape[i] == -1 && inferred < 0)
        {
          inferred = (int) i;
          continue;
        }
      if (shape[i] == -1)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "reshape: shape %s has -1 in dimensions %d and %u; only one size can "
                       "be inferred", want, inferred, i);
          return FALSE;
        }
      if (shape[i] < 0)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "reshape: dimension %u of shape %s has negative size %" G_GINT64_FORMAT
                       "; only -1 (inferred) is allowed", i, want, shape[i]);
          return FALSE;
        }
      /* Above the tensor's own count (or overflowing) it cannot match. */
      if (shape[i] != 0 && known > G_MAXINT64 / shape[i])
        known = G_MAXINT64;
      else
        known *= shape[i];
    }
  if (inferred >= 0)
    {
      if (known == 0 || self->numel % known != 0)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "reshape: a tensor of shape %s (%" G_GINT64_FORMAT " elements) cannot "
                       "be reshaped to %s: %s", have, self->numel, want,
                       known == 0 ? "the -1 dimension could be any size next to a 0"
                                  : "no size of the -1 dimension gives that many elements");
          return FALSE;
        }
      resolved[inferred] = self->numel / known;
      known = self->numel;
    }
  if (known != self->numel)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "reshape: a tensor of shape %s (%" G_GINT64_FORMAT " elements) cannot be "
                   "reshaped to %s, which holds another number of elements",
                   have, self->numel, want);
      return FALSE;
    }
  return TRUE;
}

/**
 * cp_tensor_reshape:
 * @self: a tensor
 * @new_shape: (array length=n_dims): the new size of each dimension; one of
 *   them may be -1, inferred from the others and the element count
 * @n_dims: the number of dimensions, at most [const@Cp.TENSOR_MAX_DIMS]
 * @error: return location for a #GError
 *
 * Views the elements of @self with another shape of the same element
 * count, like PyTorch's `view()`: tensors are always contiguous and
 * row-major, so the result is never a copy. It shares the storage of
 * @self (writes through either are seen by both) and keeps its
 * [property@Cp.Tensor:requires-grad]. For a `[2, 3, 4]` tensor, `[6, -1]`
 * gives `[6, 4]`.
 *
 * The result views the storage @self has now: when a context later
 * shards @self in place, the view keeps the full bytes and shape.
 *
 * Returns: (transfer full): the view, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE when @new_shape holds another number of elements
 *   (the message names both shapes), has more than one -1, or has another
 *   negative size
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_reshape (CpTensor      *self,
                   const gint64  *new_shape,
                   guint          n_dims,
                   GError       **error)
{
  gint64 resolved[CP_TENSOR_MAX_DIMS];
  CpTensor *view;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (new_shape != NULL || n_dims == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!resolve_reshape (self, new_shape, n_dims, resolved, error))
    return NULL;
  view = cp_tensor_new_from_storage (self->dtype, resolved, n_dims, self->storage, self->offset,
                                     error);
  if (view != NULL)
    view->requires_grad = self->requires_grad;
  return view;
}

static gboolean
check_target_device (CpTensor      *self,
                     CpDeviceKind   device,
                     GError       **error)
{
  g_autofree char *description = NULL;

  if (_cp_memory_ops_for_kind (device) != NULL)
    return TRUE;
  description = cp_tensor_describe (self);
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "to_device: cannot move the tensor (%s) to %s memory: this build of libcpmesh "
               "%sreaches host and test memory only", description,
               _cp_device_kind_get_name (device),
               device == CP_DEVICE_KIND_CUDA ? "has no CUDA support; it " : "");
  return FALSE;
}

/**
 * cp_tensor_to_device:
 * @self: a tensor
 * @device: where the result should live
 * @error: return location for a #GError
 *
 * Returns @self in the memory of @device: @self itself when it is there
 * already, otherwise a copy (with the same [property@Cp.Tensor:requires-grad]).
 *
 * This is how tensors enter and leave %CP_DEVICE_KIND_TEST memory, whose
 * bytes the host cannot read directly.
 *
 * Returns: (transfer full): a tensor on @device, or %NULL with
 *   %CP_TENSOR_ERROR_DEVICE when this build or machine cannot reach the
 *   memory of @self or @device, or %CP_TENSOR_ERROR_OUT_OF_MEMORY
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_to_device (CpTensor      *self,
                     CpDeviceKind   device,
                     GError       **error)
{
  CpTensor *out;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (cp_tensor_get_device (self) == device)
    return g_object_ref (self);
  if (!check_target_device (self, device, error) ||
      !_cp_tensor_require_device (self, "to_device", "the tensor", CP_DEVICE_KINDS_REACHABLE,
                                  error))
    return NULL;
  out = _cp_tensor_new_on_device (device, self->dtype, self->shape, self->n_dims, FALSE, error);
  if (out == NULL)
    return NULL;
  if (!_cp_memory_copy (out, 0, self, 0, cp_tensor_get_nbytes (self), FALSE, error))
    {
      g_object_unref (out);
      return NULL;
    }
  out->requires_grad = self->requires_grad;
  return out;
}

const char *
_cp_device_kind_get_name (CpDeviceKind kind)
{
  switch (kind)
    {
    case CP_DEVICE_KIND_HOST:
      return "host";
    case CP_DEVICE_KIND_CUDA:
      return "cuda";
    case CP_DEVICE_KIND_TEST:
      return "test";
    default:
      return "unknown";
    }
}

/* "host or test" */
static char *
describe_kinds (guint kinds)
{
  g_autoptr(GString) text = g_string_new (NULL);

  for (guint kind = 0; kind < 32; kind++)
    if (kinds & (1u << kind))
      g_string_append_printf (text, "%s%s", text->len > 0 ? " or " : "",
                              _cp_device_kind_get_name ((CpDeviceKind) kind));
  return g_string_free (g_steal_pointer (&text), FALSE);
}

gboolean
_cp_tensor_require_device (CpTensor    *self,
                           const char  *what,
                           const char  *label,
                           guint        kinds,
                           GError     **error)
{
  CpDeviceKind device = cp_tensor_get_device (self);
  g_autofree char *description = NULL;
  g_autofree char *accepted = NULL;

  if ((kinds & (1u << device)) && _cp_storage_get_memory (self->storage) != NULL)
    return TRUE;
  description = cp_tensor_describe (self);
  accepted = describe_kinds (kinds & CP_DEVICE_KINDS_REACHABLE);
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "%s: %s (%s) is in %s memory, which this operation cannot reach; it works on %s "
               "memory", what, label, description, _cp_device_kind_get_name (device), accepted);
  return FALSE;
}

gboolean
_cp_tensor_require_writable (CpTensor    *self,
                             const char  *what,
                             const char  *label,
                             GError     **error)
{
  g_autofree char *description = NULL;

  if (!cp_storage_get_read_only (self->storage))
    return TRUE;
  description = cp_tensor_describe (self);
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_READ_ONLY,
               "%s: %s (%s) is over read-only memory (the contents of a GBytes), which this "
               "operation would write; write into a copy of it (cp_tensor_copy) instead",
               what, label, description);
  return FALSE;
}

void
_cp_tensor_set_in_use_error (GError     **error,
                             const char  *what,
                             const char  *label)
{
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE,
               "%s: %s is being changed in place by another batch or context (another rank's "
               "prepare or context, or another context entered on this rank); a tensor may be "
               "padded or sharded by one of them at a time: give each rank its own tensor",
               what, label);
}

gboolean
_cp_tensor_claim (CpTensor      *self,
                  gconstpointer  holder)
{
  g_assert (holder != NULL);

  return g_atomic_pointer_compare_and_exchange (&self->holder, NULL, (gpointer) holder);
}

void
_cp_tensor_release (CpTensor      *self,
                    gconstpointer  holder)
{
  gboolean released = g_atomic_pointer_compare_and_exchange (&self->holder, (gpointer) holder, NULL);

  g_assert (released);
}

void
_cp_tensor_replace (CpTensor      *self,
                    gconstpointer  holder,
                    CpStorage     *storage,
                    gsize          offset,
                    const gint64  *shape,
                    guint          n_dims)
{
  gint64 numel = 1;

  /* Another thread swapping the storage at the same time would unref the
   * old one twice: only the holder may. */
  g_assert (g_atomic_pointer_get (&self->holder) == holder);
  g_assert (n_dims <= CP_TENSOR_MAX_DIMS);
  for (guint i = 0; i < n_dims; i++)
    numel *= shape[i];
  g_assert ((gsize) numel * cp_dtype_get_size (self->dtype) + offset <= cp_storage_get_size (storage));

  cp_storage_ref (storage);
  g_clear_pointer (&self->storage, cp_storage_unref);
  self->storage = storage;
  self->offset = offset;
  memmove (self->shape, shape, n_dims * sizeof (gint64));
  self->n_dims = n_dims;
  if (self->numel != numel)
    {
      self->numel = numel;
      g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_NUMEL]);
    }
}

void
_cp_tensor_assign (CpTensor      *self,
                   gconstpointer  holder,
                   CpTensor      *source)
{
  g_assert (self->dtype == source->dtype);

  _cp_tensor_replace (self, holder, source->storage, source->offset, source->shape, source->n_dims);
}
