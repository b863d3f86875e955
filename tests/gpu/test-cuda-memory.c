/* test-cuda-memory.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * CUDA memory behind the memory interface.  Everywhere: with no usable
 * device (no driver, none present), moving a tensor to CUDA memory or
 * allocating there, copying, filling, sharding or importing CUDA memory
 * is CP_TENSOR_ERROR_DEVICE with CUDA's own text up to the public call,
 * never a crash or a log line.  With a GPU: round trips, device-to-device
 * and strided copies, fills of every dtype and special value, offset and
 * unaligned views, tensors past 2^24 elements, pitches past the device's
 * limit, the device each allocation records, imports checked against the
 * runtime, and rank threads sharing one device, compared with the host.
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <libcpmesh.h>

#include "cp-memory-private.h"
#include "cp-storage-private.h"
#include "cp-tensor-private.h"
#include "kernels/cuda/cp-cuda-private.h"
#include "tests/cp-test-util.h"

/* The status cudaGetDeviceCount gives on this machine: cudaSuccess with
 * at least one device, or why not. */
static cudaError_t
device_status (void)
{
  int count = 0;
  cudaError_t status = cudaGetDeviceCount (&count);

  (void) cudaGetLastError ();
  if (status == cudaSuccess && count == 0)
    return cudaErrorNoDevice;
  return status;
}

static gboolean
skip_without_device (void)
{
  if (device_status () == cudaSuccess)
    return FALSE;
  g_test_skip ("no CUDA device");
  return TRUE;
}

static CpTensor *
patterned (CpDType dtype,
           gint64  rows,
           gint64  columns)
{
  const gint64 shape[] = { rows, columns };
  CpTensor *t = cp_tensor_new (dtype, shape, 2, NULL);
  guint8 *bytes = cp_tensor_get_data (t);

  for (gsize i = 0; i < cp_tensor_get_nbytes (t); i++)
    bytes[i] = (guint8) (i * 13 + 5);
  return t;
}

static void
test_no_device_to_device (void)
{
  cudaError_t status = device_status ();
  g_autoptr(CpTensor) t = patterned (CP_DTYPE_FLOAT32, 4, 4);
  g_autoptr(CpTensor) moved = NULL;
  g_autoptr(GError) error = NULL;

  if (status == cudaSuccess)
    {
      g_test_skip ("this machine has a CUDA device");
      return;
    }
  moved = cp_tensor_to_device (t, CP_DEVICE_KIND_CUDA, &error);
  g_assert_null (moved);
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "cudaGetDeviceCount"));
  if (status != cudaErrorNoDevice)
    g_assert_nonnull (strstr (error->message, cudaGetErrorString (status)));
}

static void
test_no_device_alloc (void)
{
  g_autoptr(GError) error = NULL;
  int device_id = -1;

  if (device_status () == cudaSuccess)
    {
      g_test_skip ("this machine has a CUDA device");
      return;
    }
  g_assert_null (_cp_memory_cuda_ops.alloc (64, TRUE, &device_id, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "64 bytes of CUDA memory"));
}

static void
test_round_trip (void)
{
  g_autoptr(CpTensor) host = patterned (CP_DTYPE_BFLOAT16, 37, 129);
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpTensor) copy = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;

  if (skip_without_device ())
    return;
  device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (device), ==, CP_DEVICE_KIND_CUDA);
  copy = cp_tensor_copy (device, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (copy), ==, CP_DEVICE_KIND_CUDA);
  back = cp_tensor_to_device (copy, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, host));
}

/* Columns 3 … 3 + 50 of every row, host → device → device → host. */
static void
test_copy_2d (void)
{
  g_autoptr(CpTensor) host = patterned (CP_DTYPE_UINT8, 20, 100);
  g_autoptr(CpTensor) a = NULL;
  g_autoptr(CpTensor) b = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 shape[] = { 20, 100 };
  const guint8 *want = cp_tensor_get_data (host);
  const guint8 *got;

  if (skip_without_device ())
    return;
  a = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  b = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8, shape, 2, TRUE, &error);
  g_assert_no_error (error);
  g_assert_true (_cp_memory_copy_2d (b, 3, 100, a, 3, 100, 50, 20, FALSE, &error));
  g_assert_no_error (error);
  back = cp_tensor_to_device (b, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  got = cp_tensor_get_data (back);
  for (gsize row = 0; row < 20; row++)
    for (gsize column = 0; column < 100; column++)
      g_assert_cmpuint (got[row * 100 + column], ==,
                        column >= 3 && column < 53 ? want[row * 100 + column] : 0);
}

static void
test_fill (void)
{
  const gint64 shape[] = { 1000 };
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(CpTensor) want = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 2.5, NULL);
  g_autoptr(GError) error = NULL;

  if (skip_without_device ())
    return;
  device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_FLOAT32, shape, 1, FALSE, &error);
  g_assert_no_error (error);
  g_assert_true (_cp_memory_fill (device, 0, 1000, 2.5, &error));
  back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, want));
}

/* A CUDA tensor at a made-up address, as a DLPack import without the
 * runtime's check makes one: with no device, every operation on it must
 * fail with an error, not log and report success. */
static CpTensor *
unreachable_cuda_tensor (void)
{
  const gint64 shape[] = { 4, 8 };
  g_autoptr(CpStorage) storage = _cp_storage_new_dlpack (CP_DEVICE_KIND_CUDA, 0, 0x7f0000010000,
                                                         128, NULL, NULL);

  return cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 2, storage, 0, NULL);
}

static gboolean
skip_with_device (void)
{
  if (device_status () != cudaSuccess)
    return FALSE;
  g_test_skip ("this machine has a CUDA device");
  return TRUE;
}

static void
test_no_device_to_host (void)
{
  g_autoptr(CpTensor) cuda = unreachable_cuda_tensor ();
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(GError) error = NULL;

  if (skip_with_device ())
    return;
  host = cp_tensor_to_device (cuda, CP_DEVICE_KIND_HOST, &error);
  g_assert_null (host);
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_to_device from CUDA memory whose device fails");
  g_assert_nonnull (strstr (error->message, "on CUDA device 0"));
}

static void
test_no_device_shard (void)
{
  g_autoptr(CpTensor) cuda = unreachable_cuda_tensor ();
  g_autoptr(CpTensor) out = unreachable_cuda_tensor ();
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 1, NULL);
  g_autoptr(GError) error = NULL;

  if (skip_with_device ())
    return;
  g_assert_false (cp_layout_shard_into (layout, cuda, 1, 0, out, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpLayout",
                       "cp_layout_shard_into on CUDA memory whose device fails");
  g_assert_nonnull (strstr (error->message, "gather kernel"));
}

static void
test_no_device_fill (void)
{
  g_autoptr(CpTensor) cuda = unreachable_cuda_tensor ();
  g_autoptr(GError) error = NULL;

  if (skip_with_device ())
    return;
  g_assert_false (_cp_memory_fill (cuda, 0, 32, 1.0, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "fill kernel"));
}

static void
count_delete (DLManagedTensor *managed)
{
  (*(guint *) managed->manager_ctx)++;
}

/* A kDLCUDA tensor the runtime cannot vouch for is refused at import. */
static void
import_refused (int          device_id,
                gpointer     data,
                const char  *needle,
                const char  *what)
{
  int64_t shape[] = { 4 };
  guint deleted = 0;
  DLManagedTensor managed = {
    .dl_tensor = { .data = data, .device = { kDLCUDA, device_id }, .ndim = 1,
                   .dtype = { kDLFloat, 32, 1 }, .shape = shape },
    .manager_ctx = &deleted,
    .deleter = count_delete,
  };
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_from_dlpack (&managed, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor", what);
  if (strstr (error->message, needle) == NULL)
    g_error ("\"%s\" does not contain \"%s\"", error->message, needle);
  g_assert_cmpuint (deleted, ==, 1);
}

static void
test_no_device_import (void)
{
  if (skip_with_device ())
    return;
  import_refused (0, GSIZE_TO_POINTER (0x7f0000010000), "cudaGetDeviceCount",
                  "cp_tensor_new_from_dlpack of CUDA memory without a CUDA device");
}

static void
test_unloading (void)
{
  g_assert_true (_cp_cuda_status_is_unloading (cudaErrorCudartUnloading));
  g_assert_false (_cp_cuda_status_is_unloading (cudaSuccess));
  g_assert_false (_cp_cuda_status_is_unloading (cudaErrorInvalidValue));
}

/* Imports of host memory, of another device's memory and of a device
 * that does not exist. */
static void
test_import_checked (void)
{
  const gint64 shape[] = { 4 };
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(GError) error = NULL;
  float host[4] = { 0 };
  int count = 0;

  if (skip_without_device ())
    return;
  g_assert_cmpint (cudaGetDeviceCount (&count), ==, cudaSuccess);
  device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_FLOAT32, shape, 1, TRUE, &error);
  g_assert_no_error (error);
  import_refused (0, host, "not device memory", "cp_tensor_new_from_dlpack of host memory as CUDA");
  import_refused (count, cp_tensor_get_data (device), "this machine has CUDA devices",
                  "cp_tensor_new_from_dlpack naming a CUDA device that does not exist");
  if (count > 1)
    import_refused (1, cp_tensor_get_data (device), "is on CUDA device 0",
                    "cp_tensor_new_from_dlpack naming another CUDA device than the memory's");
}

/* Every dtype and special value, filled on the device, is bit for bit
 * what the host's fill gives. */
static void
test_fill_values (void)
{
  const CpDType dtypes[] = { CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT16, CP_DTYPE_FLOAT32,
                             CP_DTYPE_FLOAT64, CP_DTYPE_INT64, CP_DTYPE_INT32, CP_DTYPE_UINT8 };
  const double values[] = { 1.5, -2.25, INFINITY, -INFINITY, NAN, 0.0, -0.0, 65504.0 };
  const gint64 shape[] = { 1031 };

  if (skip_without_device ())
    return;
  for (guint d = 0; d < G_N_ELEMENTS (dtypes); d++)
    for (guint v = 0; v < G_N_ELEMENTS (values); v++)
      {
        g_autoptr(GError) error = NULL;
        g_autoptr(CpTensor) want = NULL;
        g_autoptr(CpTensor) device = NULL;
        g_autoptr(CpTensor) back = NULL;

        /* Integers take the values they can hold. */
        if (!cp_dtype_is_floating (dtypes[d]) &&
            (!isfinite (values[v]) || fabs (values[v]) > 100 ||
             (dtypes[d] == CP_DTYPE_UINT8 && values[v] < 0)))
          continue;
        want = cp_tensor_new_full (dtypes[d], shape, 1, values[v], &error);
        g_assert_no_error (error);
        device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, dtypes[d], shape, 1, FALSE, &error);
        g_assert_no_error (error);
        g_assert_true (_cp_memory_fill (device, 0, 1031, values[v], &error));
        back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
        g_assert_no_error (error);
        g_assert_true (cp_tensor_equal (back, want));
      }
}

/* Fills that start at every byte offset of a float64 and an int32
 * tensor, so that most destinations are not aligned to the element. */
static void
test_fill_unaligned (void)
{
  const gint64 shape[] = { 64 };

  if (skip_without_device ())
    return;
  for (gsize offset = 0; offset < 16; offset++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_FLOAT64, shape, 1, NULL);
      g_autoptr(CpTensor) device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
      g_autoptr(CpTensor) back = NULL;

      g_assert_no_error (error);
      g_assert_true (_cp_memory_fill (host, offset, 50, -3.75, &error));
      g_assert_true (_cp_memory_fill (device, offset, 50, -3.75, &error));
      g_assert_no_error (error);
      back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (back, host));
    }
}

/* Views that start inside their storage: narrowed, copied, moved back. */
static void
test_offset_views (void)
{
  g_autoptr(CpTensor) host = patterned (CP_DTYPE_FLOAT16, 9, 33);
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(GError) error = NULL;

  if (skip_without_device ())
    return;
  device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  for (gint64 start = 0; start < 9; start += 2)
    for (int dim = 0; dim < 2; dim++)
      {
        gint64 length = dim == 0 ? 9 - start : 33 - start - 3;
        g_autoptr(CpTensor) want = cp_tensor_narrow (host, dim, start, length, &error);
        g_autoptr(CpTensor) view = cp_tensor_narrow (device, dim, start, length, &error);
        g_autoptr(CpTensor) copy = NULL;
        g_autoptr(CpTensor) back = NULL;

        g_assert_no_error (error);
        copy = cp_tensor_copy (view, &error);
        g_assert_no_error (error);
        back = cp_tensor_to_device (copy, CP_DEVICE_KIND_HOST, &error);
        g_assert_no_error (error);
        g_assert_true (cp_tensor_equal (back, want));
      }
}

/* More elements than a float32 counts exactly (2^24 + 3): fills, copies
 * and a shard index every one of them. */
static void
test_large (void)
{
  const gint64 n = ((gint64) 1 << 24) + 4;
  const gint64 shape[] = { 1, n, 1 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) flat = NULL;
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpLayout) layout = NULL;

  if (skip_without_device ())
    return;
  flat = cp_tensor_new_arange (CP_DTYPE_INT32, 0, n, 1, &error);
  g_assert_no_error (error);
  host = cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 3, cp_tensor_get_storage (flat), 0,
                                     &error);
  g_assert_no_error (error);
  device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, n, 2, &error);
  g_assert_no_error (error);
  for (int rank = 0; rank < 2; rank++)
    {
      g_autoptr(CpTensor) want = cp_layout_shard (layout, host, 1, rank, &error);
      g_autoptr(CpTensor) got = cp_layout_shard (layout, device, 1, rank, &error);
      g_autoptr(CpTensor) back = NULL;

      g_assert_no_error (error);
      back = cp_tensor_to_device (got, CP_DEVICE_KIND_HOST, &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (back, want));
    }
  g_assert_true (_cp_memory_fill (device, 0, (gsize) n, 7.0, &error));
  g_assert_cmpfloat (cp_tensor_get_value (device, n - 1), ==, 7.0);
  g_assert_cmpfloat (cp_tensor_get_value (device, (gint64) 1 << 24), ==, 7.0);
}

/* A [2, S] uint8 tensor whose rows are further apart than
 * cudaDevAttrMaxPitch, sharded from host memory into device memory: the
 * 2-D copies go a row at a time. */
static void
test_pitch_above_limit (void)
{
  int max_pitch = 0;
  gint64 seq_len;
  gint64 shape[2];
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpTensor) want = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(CpLayout) layout = NULL;
  guint8 *bytes;

  if (skip_without_device ())
    return;
  g_assert_cmpint (cudaDeviceGetAttribute (&max_pitch, cudaDevAttrMaxPitch, 0), ==, cudaSuccess);
  seq_len = ((gint64) max_pitch + 4096) / 4 * 4;
  shape[0] = 2;
  shape[1] = seq_len;
  host = cp_tensor_new (CP_DTYPE_UINT8, shape, 2, &error);
  g_assert_no_error (error);
  bytes = cp_tensor_get_data (host);
  for (gint64 i = 0; i < 4096; i++)
    {
      bytes[i] = (guint8) (i * 7 + 1);
      bytes[seq_len - 1 - i] = (guint8) (i * 5 + 2);
      bytes[seq_len + i] = (guint8) (i * 3 + 3);
      bytes[2 * seq_len - 1 - i] = (guint8) (i * 11 + 4);
    }
  layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, 2, &error);
  g_assert_no_error (error);
  shape[1] = cp_layout_get_local_len (layout, 0);
  device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8, shape, 2, FALSE, &error);
  g_assert_no_error (error);
  g_assert_true (cp_layout_shard_into (layout, host, 1, 0, device, &error));
  g_assert_no_error (error);
  want = cp_layout_shard (layout, host, 1, 0, &error);
  g_assert_no_error (error);
  back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, want));
}

/* The device an allocation was made on is the tensor's, for every later
 * operation and for DLPack, and no operation moves the caller's current
 * device. */
static void
test_device_recorded (void)
{
  int count = 0, current = -1;

  if (skip_without_device ())
    return;
  g_assert_cmpint (cudaGetDeviceCount (&count), ==, cudaSuccess);
  for (int d = 0; d < count && d < 2; d++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) host = patterned (CP_DTYPE_FLOAT32, 1, 256);
      g_autoptr(CpTensor) device = NULL;
      g_autoptr(CpTensor) back = NULL;
      int device_type = -1, device_id = -1;

      g_assert_cmpint (cudaSetDevice (d), ==, cudaSuccess);
      device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_get_dlpack_device (device, &device_type, &device_id, &error));
      g_assert_cmpint (device_type, ==, kDLCUDA);
      g_assert_cmpint (device_id, ==, d);
      /* Operated on from the other device. */
      g_assert_cmpint (cudaSetDevice (count > 1 ? 1 - d : d), ==, cudaSuccess);
      g_assert_true (_cp_memory_fill (device, 0, 16, 4.0, &error));
      back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
      g_assert_no_error (error);
      g_assert_cmpfloat (cp_tensor_get_value (back, 15), ==, 4.0);
      g_assert_cmpint (cudaGetDevice (&current), ==, cudaSuccess);
      g_assert_cmpint (current, ==, count > 1 ? 1 - d : d);
    }
  g_assert_cmpint (cudaSetDevice (0), ==, cudaSuccess);
}

/* Freed memory stays in the library's pool across synchronisations, up
 * to a quarter of the device, and the device's default pool, which other
 * libraries share, keeps its own threshold. */
static void
test_pool (void)
{
  const gint64 shape[] = { 64 << 20 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) device = NULL;
  cudaMemPool_t pool, default_pool;
  guint64 threshold = 0, reserved = 0, default_threshold = 1;
  size_t free_bytes = 0, total_bytes = 0;

  if (skip_without_device ())
    return;
  g_assert_cmpint (cudaSetDevice (0), ==, cudaSuccess);
  g_assert_cmpint (cudaDeviceGetDefaultMemPool (&default_pool, 0), ==, cudaSuccess);
  g_assert_cmpint (cudaMemPoolGetAttribute (default_pool, cudaMemPoolAttrReleaseThreshold,
                                            &default_threshold), ==, cudaSuccess);
  device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8, shape, 1, TRUE, &error);
  g_assert_no_error (error);
  pool = _cp_memory_cuda_pool (0);
  g_assert_nonnull (pool);
  g_assert_true (pool != default_pool);
  g_assert_cmpint (cudaMemGetInfo (&free_bytes, &total_bytes), ==, cudaSuccess);
  g_assert_cmpint (cudaMemPoolGetAttribute (pool, cudaMemPoolAttrReleaseThreshold, &threshold), ==,
                   cudaSuccess);
  g_assert_cmpuint (threshold, ==, total_bytes / 4);
  g_clear_object (&device);
  g_assert_true (_cp_memory_cuda_ops.synchronize (0, &error));
  g_assert_cmpint (cudaDeviceSynchronize (), ==, cudaSuccess);
  g_assert_cmpint (cudaMemPoolGetAttribute (pool, cudaMemPoolAttrReservedMemCurrent, &reserved), ==,
                   cudaSuccess);
  g_assert_cmpuint (reserved, >=, (guint64) 64 << 20);
  g_assert_cmpint (cudaMemPoolGetAttribute (default_pool, cudaMemPoolAttrReleaseThreshold,
                                            &threshold), ==, cudaSuccess);
  g_assert_cmpuint (threshold, ==, default_threshold);
}

#define N_RANK_THREADS 4

/* What one rank thread does on the shared device: its own tensors, its
 * own shards, all at the same time as the others. */
static gpointer
rank_thread (gpointer data)
{
  int rank = GPOINTER_TO_INT (data);
  const gint64 shape[] = { 3, 4096, 8 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) flat = cp_tensor_new_arange (CP_DTYPE_INT32, rank, rank + 3 * 4096 * 8, 1,
                                                   &error);
  g_autoptr(CpTensor) host = cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 3,
                                                         cp_tensor_get_storage (flat), 0, &error);
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 4096, N_RANK_THREADS,
                                              &error);

  g_assert_no_error (error);
  for (int round = 0; round < 20; round++)
    {
      g_autoptr(CpTensor) device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
      g_autoptr(CpTensor) shard = NULL;
      g_autoptr(CpTensor) want = NULL;
      g_autoptr(CpTensor) back = NULL;

      g_assert_no_error (error);
      shard = cp_layout_shard (layout, device, 1, rank, &error);
      g_assert_no_error (error);
      want = cp_layout_shard (layout, host, 1, rank, &error);
      back = cp_tensor_to_device (shard, CP_DEVICE_KIND_HOST, &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (back, want));
    }
  return NULL;
}

static void
test_rank_threads (void)
{
  GThread *threads[N_RANK_THREADS];

  if (skip_without_device ())
    return;
  for (int r = 0; r < N_RANK_THREADS; r++)
    threads[r] = g_thread_new ("rank", rank_thread, GINT_TO_POINTER (r));
  for (int r = 0; r < N_RANK_THREADS; r++)
    g_thread_join (threads[r]);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/memory/no-device/to-device", test_no_device_to_device);
  g_test_add_func ("/Cp/Cuda/memory/no-device/alloc", test_no_device_alloc);
  g_test_add_func ("/Cp/Cuda/memory/round-trip", test_round_trip);
  g_test_add_func ("/Cp/Cuda/memory/copy-2d", test_copy_2d);
  g_test_add_func ("/Cp/Cuda/memory/fill", test_fill);
  g_test_add_func ("/Cp/Cuda/memory/no-device/to-host", test_no_device_to_host);
  g_test_add_func ("/Cp/Cuda/memory/no-device/shard", test_no_device_shard);
  g_test_add_func ("/Cp/Cuda/memory/no-device/fill", test_no_device_fill);
  g_test_add_func ("/Cp/Cuda/memory/no-device/import", test_no_device_import);
  g_test_add_func ("/Cp/Cuda/memory/unloading", test_unloading);
  g_test_add_func ("/Cp/Cuda/memory/import/checked", test_import_checked);
  g_test_add_func ("/Cp/Cuda/memory/fill/values", test_fill_values);
  g_test_add_func ("/Cp/Cuda/memory/fill/unaligned", test_fill_unaligned);
  g_test_add_func ("/Cp/Cuda/memory/views/offset", test_offset_views);
  g_test_add_func ("/Cp/Cuda/memory/large", test_large);
  g_test_add_func ("/Cp/Cuda/memory/pitch-above-limit", test_pitch_above_limit);
  g_test_add_func ("/Cp/Cuda/memory/device/recorded", test_device_recorded);
  g_test_add_func ("/Cp/Cuda/memory/device/rank-threads", test_rank_threads);
  g_test_add_func ("/Cp/Cuda/memory/pool", test_pool);

  return g_test_run ();
}
