/* test-dlpack.c: tensors exchanged through DLPack, both ways
 *
 * White-box: a CUDA storage is made through the private constructor, so
 * that the device mapping is checked on machines without a GPU (nothing
 * ever dereferences its address).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include <dlpack/dlpack.h>

#include "cp-storage-private.h"
#include "cp-tensor-private.h"
#include "cp-test-util.h"

/* What DLPack calls each dtype, written out independently of the library's
 * table: bool is DLPack 0.8's code 6. */
static const struct {
  CpDType dtype;
  guint8 code;
  guint8 bits;
} dl_names[] = {
  { CP_DTYPE_BOOL, 6, 8 },
  { CP_DTYPE_UINT8, kDLUInt, 8 },
  { CP_DTYPE_INT32, kDLInt, 32 },
  { CP_DTYPE_INT64, kDLInt, 64 },
  { CP_DTYPE_FLOAT16, kDLFloat, 16 },
  { CP_DTYPE_BFLOAT16, kDLBfloat, 16 },
  { CP_DTYPE_FLOAT32, kDLFloat, 32 },
  { CP_DTYPE_FLOAT64, kDLFloat, 64 },
};

/* A DLPack tensor as another framework would hand it over: its own bytes,
 * shape and strides, and a deleter that counts its calls and frees it all. */
typedef struct
{
  DLManagedTensor managed;
  gint64 shape[CP_TENSOR_MAX_DIMS + 1];
  gint64 strides[CP_TENSOR_MAX_DIMS + 1];
  guint8 *bytes;
  guint *deleted;
} Foreign;

/* The thread the last deleter of a Foreign ran on. */
static GThread *deleter_thread;

static void
foreign_delete (DLManagedTensor *managed)
{
  Foreign *self = managed->manager_ctx;

  (*self->deleted)++;
  deleter_thread = g_thread_self ();
  g_free (self->bytes);
  g_free (self);
}

/* @nbytes of zeroed memory (g_malloc aligns to 16) described as @dtype of
 * @shape, compact row-major (strides NULL), on the CPU. */
static Foreign *
foreign_new (DLDataType    dtype,
             const gint64 *shape,
             int           ndim,
             gsize         nbytes,
             guint        *deleted)
{
  Foreign *self = g_new0 (Foreign, 1);

  self->bytes = g_malloc0 (MAX (nbytes, 1));
  if (ndim > 0)
    memcpy (self->shape, shape, (gsize) ndim * sizeof (gint64));
  self->managed.dl_tensor.data = self->bytes;
  self->managed.dl_tensor.device = (DLDevice) { kDLCPU, 0 };
  self->managed.dl_tensor.ndim = ndim;
  self->managed.dl_tensor.dtype = dtype;
  self->managed.dl_tensor.shape = self->shape;
  self->managed.manager_ctx = self;
  self->managed.deleter = foreign_delete;
  self->deleted = deleted;
  *deleted = 0;
  return self;
}

static Foreign *
foreign_float32 (const gint64 *shape,
                 int           ndim,
                 guint        *deleted)
{
  gsize numel = 1;

  for (int i = 0; i < ndim; i++)
    numel *= (gsize) shape[i];
  return foreign_new ((DLDataType) { kDLFloat, 32, 1 }, shape, ndim, numel * 4 + 64, deleted);
}

static void
count_release (gpointer user_data)
{
  (*(guint *) user_data)++;
}

/* Memory whose release is counted, and freed with it. */
typedef struct
{
  guint *released;
  gpointer memory;
} Counted;

static void
counted_release (gpointer user_data)
{
  Counted *counted = user_data;

  (*counted->released)++;
  g_free (counted->memory);
}

/* A host tensor of a pattern, over memory whose release is counted. */
static CpTensor *
counted_tensor (CpDType       dtype,
                const gint64 *shape,
                guint         n_dims,
                guint        *released)
{
  g_autoptr(CpTensor) pattern = cp_test_tensor_pattern (dtype, shape, n_dims, 3);
  gsize nbytes = cp_tensor_get_nbytes (pattern);
  Counted *counted = g_new (Counted, 1);
  g_autoptr(GError) error = NULL;
  CpTensor *tensor;

  *released = 0;
  counted->released = released;
  counted->memory = g_memdup2 (cp_tensor_get_data (pattern), MAX (nbytes, 1));
  tensor = cp_tensor_new_borrowed (dtype, shape, n_dims, GPOINTER_TO_SIZE (counted->memory), nbytes,
                                   counted_release, counted, g_free, &error);
  g_assert_no_error (error);
  return tensor;
}

static void
assert_same_element (CpTensor     *tensor,
                     const guint8 *bytes,
                     gint64        index,
                     double        value)
{
  CpDType dtype = cp_tensor_get_dtype (tensor);
  gsize size = cp_dtype_get_size (dtype);
  const gint64 one = 1;
  g_autoptr(CpTensor) reference = cp_tensor_new_full (dtype, &one, 1, value, NULL);

  g_assert_cmpmem (bytes + (gsize) index * size, size, cp_tensor_get_data (reference), size);
}

static void
test_import_every_dtype (void)
{
  const gint64 shape[] = { 2, 3 };

  for (guint i = 0; i < G_N_ELEMENTS (dl_names); i++)
    {
      CpDType dtype = dl_names[i].dtype;
      gsize size = cp_dtype_get_size (dtype);
      guint deleted;
      Foreign *foreign = foreign_new ((DLDataType) { dl_names[i].code, dl_names[i].bits, 1 },
                                      shape, 2, 6 * size, &deleted);
      guint8 *bytes = foreign->bytes;
      g_autoptr(GError) error = NULL;
      CpTensor *tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
      g_autoptr(CpTensor) one = NULL;

      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_dtype (tensor), ==, dtype);
      CP_TEST_ASSERT_SHAPE (tensor, 2, 3);
      g_assert_cmpint (cp_tensor_get_device (tensor), ==, CP_DEVICE_KIND_HOST);
      g_assert_cmpint (cp_storage_get_kind (cp_tensor_get_storage (tensor)), ==, CP_STORAGE_KIND_DLPACK);
      /* Not a copy: the tensor's elements are the producer's bytes. */
      g_assert_true (cp_tensor_get_data (tensor) == (gpointer) bytes);

      /* Written through the library, seen in the producer's memory... */
      cp_tensor_set_value (tensor, 4, 1.0);
      assert_same_element (tensor, bytes, 4, 1.0);
      /* ...and written by the producer, seen through the library. */
      one = cp_tensor_new_full (dtype, (const gint64[]) { 1 }, 1, 1.0, NULL);
      memcpy (bytes + 2 * size, cp_tensor_get_data (one), size);
      g_assert_cmpfloat (cp_tensor_get_value (tensor, 2), ==, 1.0);
      g_assert_cmpfloat (cp_tensor_get_value (tensor, 3), ==, 0.0);

      g_assert_cmpuint (deleted, ==, 0);
      g_object_unref (tensor);
      g_assert_cmpuint (deleted, ==, 1);
    }
}

/* Everything a DLTensor may say that still describes a contiguous
 * row-major tensor. */
static void
test_import_layouts (void)
{
  const gint64 two_three[] = { 2, 3 };
  const gint64 with_one[] = { 2, 1, 3 };
  const gint64 empty[] = { 0, 5 };
  guint deleted;
  Foreign *foreign;
  CpTensor *tensor;
  g_autoptr(GError) error = NULL;

  /* Explicit row-major strides. */
  foreign = foreign_float32 (two_three, 2, &deleted);
  foreign->strides[0] = 3;
  foreign->strides[1] = 1;
  foreign->managed.dl_tensor.strides = foreign->strides;
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (tensor, 2, 3);
  g_object_unref (tensor);
  g_assert_cmpuint (deleted, ==, 1);

  /* A dimension of size 1 is never stepped along: any stride will do. */
  foreign = foreign_float32 (with_one, 3, &deleted);
  memcpy (foreign->strides, (const gint64[]) { 3, 99, 1 }, 3 * sizeof (gint64));
  foreign->managed.dl_tensor.strides = foreign->strides;
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (tensor, 2, 1, 3);
  g_object_unref (tensor);

  /* An empty tensor has no element to step to. */
  foreign = foreign_float32 (empty, 2, &deleted);
  memcpy (foreign->strides, (const gint64[]) { 1, 7 }, 2 * sizeof (gint64));
  foreign->managed.dl_tensor.strides = foreign->strides;
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_numel (tensor), ==, 0);
  g_object_unref (tensor);

  /* A scalar. */
  foreign = foreign_float32 (NULL, 0, &deleted);
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (cp_tensor_get_n_dims (tensor), ==, 0);
  g_assert_cmpint (cp_tensor_get_numel (tensor), ==, 1);
  g_object_unref (tensor);

  /* The first element is at data + byte_offset. */
  foreign = foreign_float32 (two_three, 2, &deleted);
  foreign->managed.dl_tensor.byte_offset = 16;
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_get_data (tensor) == (gpointer) (foreign->bytes + 16));
  g_assert_cmpuint (cp_storage_get_size (cp_tensor_get_storage (tensor)), ==, 24);
  g_object_unref (tensor);
  g_assert_cmpuint (deleted, ==, 1);
}

/* DLPack lets a producer give no deleter at all. */
static void
test_import_without_deleter (void)
{
  const gint64 shape[] = { 4 };
  guint deleted;
  Foreign *foreign = foreign_float32 (shape, 1, &deleted);
  g_autoptr(GError) error = NULL;
  CpTensor *tensor;

  foreign->managed.deleter = NULL;
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_no_error (error);
  cp_tensor_set_value (tensor, 3, 2.5);
  g_object_unref (tensor);
  g_assert_cmpfloat (((float *) foreign->bytes)[3], ==, 2.5f);
  g_free (foreign->bytes);
  g_free (foreign);
}

static gpointer
unref_on_thread (gpointer tensor)
{
  g_object_unref (tensor);
  return NULL;
}

/* The deleter runs where the last reference goes, exactly once. */
static void
test_import_deleter_on_last_thread (void)
{
  const gint64 shape[] = { 8 };
  guint deleted;
  Foreign *foreign = foreign_float32 (shape, 1, &deleted);
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_autoptr(CpTensor) view = NULL;
  GThread *thread;

  g_assert_no_error (error);
  view = cp_tensor_narrow (tensor, 0, 2, 4, &error);
  g_assert_no_error (error);
  g_object_unref (tensor);
  g_assert_cmpuint (deleted, ==, 0); /* the view still holds the storage */
  thread = g_thread_new ("last-ref", unref_on_thread, g_steal_pointer (&view));
  g_assert_null (g_thread_join (thread));
  g_assert_cmpuint (deleted, ==, 1);
  g_assert_true (deleter_thread == thread);
}

/* What a refusal must be: recorded as @what, with @code, naming @needle. */
typedef struct
{
  const char *what;
  int code;
  const char *needle;
} Refusal;

/* Every refusal names the values, creates nothing and gives the tensor
 * back: the deleter has run exactly once when the call returns. */
static void
assert_refused (Foreign       *foreign,
                guint         *deleted,
                const Refusal *refusal)
{
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_from_dlpack (&foreign->managed, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, refusal->code, "CpTensor", refusal->what);
  if (strstr (error->message, refusal->needle) == NULL)
    g_error ("%s: \"%s\" does not say \"%s\"", refusal->what, error->message, refusal->needle);
  g_assert_cmpuint (*deleted, ==, 1);
}

static const gint64 two_by_three[] = { 2, 3 };

static const struct {
  Refusal refusal;
  DLDataType dtype;
} bad_dtypes[] = {
  { { "cp_tensor_new_from_dlpack of an int8 tensor", CP_TENSOR_ERROR_DTYPE,
      "int8 (code 0, 8 bits, 1 lanes)" }, { kDLInt, 8, 1 } },
  { { "cp_tensor_new_from_dlpack of a uint16 tensor", CP_TENSOR_ERROR_DTYPE,
      "uint16 (code 1, 16 bits" }, { kDLUInt, 16, 1 } },
  { { "cp_tensor_new_from_dlpack of a complex64 tensor", CP_TENSOR_ERROR_DTYPE,
      "complex64 (code 5" }, { kDLComplex, 64, 1 } },
  { { "cp_tensor_new_from_dlpack of a float32 tensor with 4 lanes", CP_TENSOR_ERROR_DTYPE,
      "float32x4 (code 2, 32 bits, 4 lanes)" }, { kDLFloat, 32, 4 } },
  { { "cp_tensor_new_from_dlpack of a 32-bit bfloat tensor", CP_TENSOR_ERROR_DTYPE,
      "bfloat32 (code 4, 32 bits" }, { kDLBfloat, 32, 1 } },
};

static void
test_import_refused_dtypes (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (bad_dtypes); i++)
    {
      guint deleted;
      Foreign *foreign = foreign_float32 (two_by_three, 2, &deleted);

      foreign->managed.dl_tensor.dtype = bad_dtypes[i].dtype;
      assert_refused (foreign, &deleted, &bad_dtypes[i].refusal);
    }
}

static const struct {
  Refusal refusal;
  DLDevice device;
} bad_devices[] = {
  { { "cp_tensor_new_from_dlpack of a CUDA tensor in a build without CUDA", CP_TENSOR_ERROR_DEVICE,
      "CUDA device 1 (device type 2)" }, { kDLCUDA, 1 } },
  { { "cp_tensor_new_from_dlpack of an OpenCL tensor", CP_TENSOR_ERROR_DEVICE,
      "OpenCL device 0 (device type 4)" }, { kDLOpenCL, 0 } },
  { { "cp_tensor_new_from_dlpack of CUDA pinned host memory", CP_TENSOR_ERROR_DEVICE,
      "CUDA pinned host device 0 (device type 3)" }, { kDLCUDAHost, 0 } },
};

static void
test_import_refused_devices (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (bad_devices); i++)
    {
      guint deleted;
      Foreign *foreign = foreign_float32 (two_by_three, 2, &deleted);

      /* A build with the GPU path takes CUDA tensors (test_import_cuda). */
      if (CP_HAS_CUDA && bad_devices[i].device.device_type == kDLCUDA)
        {
          foreign_delete (&foreign->managed);
          continue;
        }
      foreign->managed.dl_tensor.device = bad_devices[i].device;
      assert_refused (foreign, &deleted, &bad_devices[i].refusal);
    }
}

/* DLPack's CPU is device 0 and CUDA devices count from 0: a tensor that
 * claims another id says its memory is somewhere it is not. */
static const struct {
  Refusal refusal;
  DLDevice device;
} bad_device_ids[] = {
  { { "cp_tensor_new_from_dlpack of a CPU tensor on device -1", CP_TENSOR_ERROR_DEVICE,
      "CPU device -1 (device type 1) names a device that does not exist: the CPU is "
      "device 0" }, { kDLCPU, -1 } },
  { { "cp_tensor_new_from_dlpack of a CPU tensor on device 99", CP_TENSOR_ERROR_DEVICE,
      "CPU device 99 (device type 1) names a device that does not exist" }, { kDLCPU, 99 } },
  { { "cp_tensor_new_from_dlpack of a CUDA tensor on device -1", CP_TENSOR_ERROR_DEVICE,
      "CUDA device -1 (device type 2)" }, { kDLCUDA, -1 } },
};

static void
test_import_refused_device_ids (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (bad_device_ids); i++)
    {
      guint deleted;
      Foreign *foreign = foreign_float32 (two_by_three, 2, &deleted);

      foreign->managed.dl_tensor.device = bad_device_ids[i].device;
      assert_refused (foreign, &deleted, &bad_device_ids[i].refusal);
    }
}

/* Layouts and addresses, spoilt in a [2, 3] float32 tensor; @strides is
 * spare room for strides. */
static void
spoil_transposed (DLTensor *t,
                  gint64   *strides)
{
  t->shape[0] = 3;
  t->shape[1] = 2;
  strides[0] = 1;
  strides[1] = 3;
  t->strides = strides;
}

static void
spoil_every_other (DLTensor *t,
                   gint64   *strides)
{
  strides[0] = 6;
  strides[1] = 2;
  t->strides = strides;
}

static void
spoil_negative_dim (DLTensor *t,
                    gint64   *strides)
{
  t->shape[1] = -3;
}

static void
spoil_nine_dims (DLTensor *t,
                 gint64   *strides)
{
  for (int i = 0; i < 9; i++)
    t->shape[i] = 1;
  t->ndim = 9;
}

static void
spoil_negative_ndim (DLTensor *t,
                     gint64   *strides)
{
  t->ndim = -1;
}

static void
spoil_no_shape (DLTensor *t,
                gint64   *strides)
{
  t->shape = NULL;
}

static void
spoil_huge_shape (DLTensor *t,
                  gint64   *strides)
{
  t->shape[0] = G_MAXINT64 / 2;
}

static void
spoil_byte_offset (DLTensor *t,
                   gint64   *strides)
{
  t->byte_offset = 2;
}

static void
spoil_no_data (DLTensor *t,
               gint64   *strides)
{
  t->data = NULL;
}

static void
spoil_end_of_memory (DLTensor *t,
                     gint64   *strides)
{
  t->data = GSIZE_TO_POINTER (G_MAXSIZE - 15);
}

static void
spoil_wrapping_offset (DLTensor *t,
                       gint64   *strides)
{
  t->byte_offset = G_MAXUINT64 - 7;
}

static const struct {
  Refusal refusal;
  void (*spoil) (DLTensor *t, gint64 *strides);
} bad_layouts[] = {
  { { "cp_tensor_new_from_dlpack of a transposed (column-major) tensor", CP_TENSOR_ERROR_SHAPE,
      "shape [3, 2] with strides [1, 3] is not contiguous" }, spoil_transposed },
  { { "cp_tensor_new_from_dlpack of a tensor with a step of 2 elements", CP_TENSOR_ERROR_SHAPE,
      "shape [2, 3] with strides [6, 2]" }, spoil_every_other },
  { { "cp_tensor_new_from_dlpack with a dimension of negative size", CP_TENSOR_ERROR_SHAPE,
      "dimension 1 has negative size -3" }, spoil_negative_dim },
  { { "cp_tensor_new_from_dlpack with 9 dimensions (at most 8)", CP_TENSOR_ERROR_SHAPE,
      "at most 8 dimensions, 9 were given" }, spoil_nine_dims },
  { { "cp_tensor_new_from_dlpack with a negative number of dimensions", CP_TENSOR_ERROR_SHAPE,
      "negative number of dimensions (-1)" }, spoil_negative_ndim },
  { { "cp_tensor_new_from_dlpack without a shape array", CP_TENSOR_ERROR_SHAPE,
      "2 dimensions has no shape array" }, spoil_no_shape },
  { { "cp_tensor_new_from_dlpack whose element count × size overflows 64 bits", CP_TENSOR_ERROR_SHAPE,
      "overflows the addressable size" }, spoil_huge_shape },
  { { "cp_tensor_new_from_dlpack with a byte_offset not aligned to the element size",
      CP_TENSOR_ERROR_MISALIGNED, "byte_offset 2, which is not a multiple of its 4-byte" },
    spoil_byte_offset },
  { { "cp_tensor_new_from_dlpack of a tensor with elements and no data", CP_TENSOR_ERROR_OUT_OF_RANGE,
      "float32 tensor of 24 bytes has no data" }, spoil_no_data },
  { { "cp_tensor_new_from_dlpack of data that runs past the end of the address space",
      CP_TENSOR_ERROR_OUT_OF_RANGE, "runs past the end of the address space" }, spoil_end_of_memory },
  { { "cp_tensor_new_from_dlpack with a byte_offset that wraps the address around",
      CP_TENSOR_ERROR_OUT_OF_RANGE, "byte_offset 18446744073709551608" }, spoil_wrapping_offset },
};

static void
test_import_refused_layouts (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (bad_layouts); i++)
    {
      guint deleted;
      Foreign *foreign = foreign_float32 (two_by_three, 2, &deleted);

      bad_layouts[i].spoil (&foreign->managed.dl_tensor, foreign->strides);
      assert_refused (foreign, &deleted, &bad_layouts[i].refusal);
    }
}

static void
assert_row_major (const DLTensor *t,
                  CpTensor       *tensor)
{
  guint n_dims;
  const gint64 *shape = cp_tensor_get_shape (tensor, &n_dims);
  gint64 step = 1;

  g_assert_cmpint (t->ndim, ==, (int) n_dims);
  g_assert_cmpmem (t->shape, n_dims * sizeof (gint64), shape, n_dims * sizeof (gint64));
  g_assert_nonnull (t->strides);
  for (guint i = n_dims; i-- > 0;)
    {
      g_assert_cmpint (t->strides[i], ==, step);
      step *= shape[i];
    }
  g_assert_cmpuint (t->byte_offset, ==, 0);
}

static void
test_export_every_dtype (void)
{
  const gint64 shape[] = { 2, 3, 4 };

  for (guint i = 0; i < G_N_ELEMENTS (dl_names); i++)
    {
      CpDType dtype = dl_names[i].dtype;
      guint released;
      CpTensor *tensor = counted_tensor (dtype, shape, 3, &released);
      g_autoptr(CpTensor) copy = cp_tensor_copy (tensor, NULL);
      g_autoptr(GError) error = NULL;
      DLManagedTensor *managed = cp_tensor_to_dlpack (tensor, &error);
      DLTensor *t;

      g_assert_no_error (error);
      t = &managed->dl_tensor;
      g_assert_true (t->data == cp_tensor_get_data (tensor)); /* not a copy */
      g_assert_cmpint (t->device.device_type, ==, kDLCPU);
      g_assert_cmpint (t->device.device_id, ==, 0);
      g_assert_cmpuint (t->dtype.code, ==, dl_names[i].code);
      g_assert_cmpuint (t->dtype.bits, ==, dl_names[i].bits);
      g_assert_cmpuint (t->dtype.lanes, ==, 1);
      assert_row_major (t, tensor);

      /* Freeing the tensor first leaves the export whole. */
      g_object_unref (tensor);
      g_assert_cmpuint (released, ==, 0);
      g_assert_cmpint (t->shape[2], ==, 4);
      g_assert_cmpmem (t->data, cp_tensor_get_nbytes (copy),
                       cp_tensor_get_data (copy), cp_tensor_get_nbytes (copy));
      managed->deleter (managed);
      g_assert_cmpuint (released, ==, 1);
    }
}

/* An empty dimension is never stepped along, but the strides around it
 * are still those of the shape with it counted as 1: [2, 0, 3] row-major
 * is [3, 3, 1], as PyTorch writes it, not [0, 3, 1]. */
static void
test_export_empty_dimension_strides (void)
{
  const gint64 shape[] = { 2, 0, 3 };
  const gint64 strides[] = { 3, 3, 1 };
  g_autoptr(CpTensor) tensor = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL);
  g_autoptr(GError) error = NULL;
  DLManagedTensor *managed = cp_tensor_to_dlpack (tensor, &error);

  g_assert_no_error (error);
  g_assert_cmpint (managed->dl_tensor.ndim, ==, 3);
  g_assert_cmpmem (managed->dl_tensor.shape, sizeof shape, shape, sizeof shape);
  g_assert_cmpmem (managed->dl_tensor.strides, sizeof strides, strides, sizeof strides);
  managed->deleter (managed);
}

/* A tensor over a GBytes is read-only, and a DLPack consumer may write
 * what it gets (the legacy struct has no read-only flag): the export is
 * refused, as numpy refuses to export a read-only array, and a copy of
 * the tensor exports. */
static void
test_export_refuses_read_only (void)
{
  static const float values[] = { 1, 2, 3, 4 };
  const gint64 shape[] = { 4 };
  g_autoptr(GBytes) bytes = g_bytes_new_static (values, sizeof values);
  g_autoptr(CpTensor) tensor = cp_tensor_new_from_bytes (CP_DTYPE_FLOAT32, shape, 1, bytes, NULL);
  g_autoptr(CpTensor) copy = cp_tensor_copy (tensor, NULL);
  g_autoptr(GError) error = NULL;
  DLManagedTensor *managed;

  g_assert_null (cp_tensor_to_dlpack (tensor, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_READ_ONLY, "CpTensor",
                       "cp_tensor_to_dlpack of a tensor over a GBytes (read-only)");
  cp_test_assert_message (error, "to_dlpack: the tensor (float32[4] on host) is over read-only "
                                 "memory");
  g_clear_error (&error);
  managed = cp_tensor_to_dlpack (copy, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (((float *) managed->dl_tensor.data)[3], ==, 4.0f);
  managed->deleter (managed);
}

/* Freeing the consumer's side first leaves the tensor whole. */
static void
test_export_deleter_first (void)
{
  const gint64 shape[] = { 5 };
  guint released;
  g_autoptr(CpTensor) tensor = counted_tensor (CP_DTYPE_INT64, shape, 1, &released);
  DLManagedTensor *managed = cp_tensor_to_dlpack (tensor, NULL);

  ((gint64 *) managed->dl_tensor.data)[4] = -9;
  managed->deleter (managed);
  g_assert_cmpuint (released, ==, 0);
  g_assert_cmpfloat (cp_tensor_get_value (tensor, 4), ==, -9.0);
  cp_tensor_set_value (tensor, 0, 7.0);
  g_assert_cmpfloat (cp_tensor_get_value (tensor, 0), ==, 7.0);
}

/* A context reshapes a registered tensor in place: an export made before
 * keeps the shape and the bytes it was given. */
static void
test_export_survives_reshape (void)
{
  const gint64 shape[] = { 4, 6 };
  const gint64 smaller[] = { 3 };
  guint released;
  g_autoptr(CpTensor) tensor = counted_tensor (CP_DTYPE_FLOAT32, shape, 2, &released);
  g_autoptr(CpStorage) other = cp_storage_new (12, NULL);
  gpointer before = cp_tensor_get_data (tensor);
  DLManagedTensor *managed = cp_tensor_to_dlpack (tensor, NULL);

  g_assert_true (_cp_tensor_claim (tensor, &released));
  _cp_tensor_replace (tensor, &released, other, 0, smaller, 1);
  _cp_tensor_release (tensor, &released);
  g_assert_cmpuint (released, ==, 0);
  g_assert_cmpint (managed->dl_tensor.ndim, ==, 2);
  g_assert_cmpint (managed->dl_tensor.shape[0], ==, 4);
  g_assert_cmpint (managed->dl_tensor.shape[1], ==, 6);
  g_assert_true (managed->dl_tensor.data == before);
  g_assert_cmpfloat (((float *) managed->dl_tensor.data)[23], ==, (float) ((23 * 7 + 39) % 201));
  managed->deleter (managed);
  g_assert_cmpuint (released, ==, 1);
}

/* Out through DLPack and back in: the same memory, kept until both sides
 * are gone. */
static void
test_round_trip (void)
{
  const gint64 shape[] = { 3, 5 };

  for (guint i = 0; i < G_N_ELEMENTS (dl_names); i++)
    {
      guint released;
      CpTensor *tensor = counted_tensor (dl_names[i].dtype, shape, 2, &released);
      g_autoptr(GError) error = NULL;
      CpTensor *back = cp_tensor_new_from_dlpack (cp_tensor_to_dlpack (tensor, NULL), &error);

      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (back, tensor));
      g_assert_true (cp_tensor_get_data (back) == cp_tensor_get_data (tensor));
      g_object_unref (tensor);
      g_assert_cmpuint (released, ==, 0);
      g_object_unref (back);
      g_assert_cmpuint (released, ==, 1);
    }
}

/* CUDA memory goes out as kDLCUDA with its device index; no GPU is needed
 * since nothing reads the (made-up) address. */
static void
test_device_mapping (void)
{
  const gint64 shape[] = { 16 };
  guint released = 0;
  g_autoptr(CpStorage) storage = _cp_storage_new_dlpack (CP_DEVICE_KIND_CUDA, 3, 0x7f0000010000, 64,
                                                         count_release, &released);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) cuda = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 1, storage, 0, &error);
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
  DLManagedTensor *managed;
  int device_type = -1;
  int device_id = -1;

  g_assert_no_error (error);
  g_clear_pointer (&storage, cp_storage_unref);
  g_assert_cmpint (cp_tensor_get_device (cuda), ==, CP_DEVICE_KIND_CUDA);
  g_assert_true (cp_tensor_get_dlpack_device (cuda, &device_type, &device_id, &error));
  g_assert_cmpint (device_type, ==, kDLCUDA);
  g_assert_cmpint (device_id, ==, 3);
  g_assert_true (cp_tensor_get_dlpack_device (host, &device_type, &device_id, &error));
  g_assert_cmpint (device_type, ==, kDLCPU);
  g_assert_cmpint (device_id, ==, 0);

  managed = cp_tensor_to_dlpack (cuda, &error);
  g_assert_no_error (error);
  g_assert_cmpint (managed->dl_tensor.device.device_type, ==, kDLCUDA);
  g_assert_cmpint (managed->dl_tensor.device.device_id, ==, 3);
  g_assert_true (managed->dl_tensor.data == GSIZE_TO_POINTER (0x7f0000010000));
  g_clear_object (&cuda);
  g_assert_cmpuint (released, ==, 0);
  managed->deleter (managed);
  g_assert_cmpuint (released, ==, 1);
}

/* A build with the GPU path takes CUDA tensors only where the CUDA
 * runtime says the memory is on the device named: host memory claiming
 * to be on CUDA device 1 is refused, with or without a device (without
 * one, the runtime cannot vouch for any).  Without the GPU path,
 * test_import_refused_devices checks the refusal. */
static void
test_import_cuda (void)
{
  const gint64 shape[] = { 4 };
  guint deleted;
  Foreign *foreign;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) tensor = NULL;

  if (!CP_HAS_CUDA)
    {
      g_test_skip ("this build has no CUDA support");
      return;
    }
  foreign = foreign_float32 (shape, 1, &deleted);
  foreign->managed.dl_tensor.device = (DLDevice) { kDLCUDA, 1 };
  tensor = cp_tensor_new_from_dlpack (&foreign->managed, &error);
  g_assert_null (tensor);
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_new_from_dlpack of host memory that says it is on CUDA device 1");
  g_assert_nonnull (strstr (error->message, "CUDA device 1"));
  g_assert_cmpuint (deleted, ==, 1);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Tensor/dlpack/import/every-dtype", test_import_every_dtype);
  g_test_add_func ("/Cp/Tensor/dlpack/import/layouts", test_import_layouts);
  g_test_add_func ("/Cp/Tensor/dlpack/import/no-deleter", test_import_without_deleter);
  g_test_add_func ("/Cp/Tensor/dlpack/import/deleter-thread", test_import_deleter_on_last_thread);
  g_test_add_func ("/Cp/Tensor/dlpack/import/refused-dtypes", test_import_refused_dtypes);
  g_test_add_func ("/Cp/Tensor/dlpack/import/refused-devices", test_import_refused_devices);
  g_test_add_func ("/Cp/Tensor/dlpack/import/refused-layouts", test_import_refused_layouts);
  g_test_add_func ("/Cp/Tensor/dlpack/import/refused-device-ids", test_import_refused_device_ids);
  g_test_add_func ("/Cp/Tensor/dlpack/export/empty-dimension-strides",
                   test_export_empty_dimension_strides);
  g_test_add_func ("/Cp/Tensor/dlpack/export/read-only", test_export_refuses_read_only);
  g_test_add_func ("/Cp/Tensor/dlpack/import/cuda", test_import_cuda);
  g_test_add_func ("/Cp/Tensor/dlpack/export/every-dtype", test_export_every_dtype);
  g_test_add_func ("/Cp/Tensor/dlpack/export/deleter-first", test_export_deleter_first);
  g_test_add_func ("/Cp/Tensor/dlpack/export/reshaped", test_export_survives_reshape);
  g_test_add_func ("/Cp/Tensor/dlpack/round-trip/every-dtype", test_round_trip);
  g_test_add_func ("/Cp/Tensor/dlpack/device/mapping", test_device_mapping);

  return g_test_run ();
}
