/* test-cuda-dlpack.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * DLPack's stream protocol on CUDA memory (cp_tensor_prepare_dlpack_stream):
 * the values it refuses, on any machine (a CUDA storage over a made-up
 * address, which nothing reads); and, with a GPU, an export read on the
 * consumer's own stream after libcpmesh wrote the memory.
 */

#include "config.h"

#include <stdint.h>

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <libcpmesh.h>

#include "cp-storage-private.h"
#include "cp-test-util.h"
#include "kernels/cuda/cp-cuda-private.h"

static CpTensor *
made_up_cuda_tensor (void)
{
  const gint64 shape[] = { 16 };
  g_autoptr(CpStorage) storage = _cp_storage_new_dlpack (CP_DEVICE_KIND_CUDA, 0, 0x7f0000010000, 64,
                                                         NULL, NULL);
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 1, storage, 0, &error);

  g_assert_no_error (error);
  return tensor;
}

/* 0 (either default stream) and values below -1 name nothing; -1 asks
 * for no ordering and touches no device. */
static void
test_stream_values (void)
{
  g_autoptr(CpTensor) cuda = made_up_cuda_tensor ();
  const gint64 refused[] = { 0, -2, G_MININT64 };

  for (gsize i = 0; i < G_N_ELEMENTS (refused); i++)
    {
      g_autoptr(GError) error = NULL;
      g_autofree char *what = g_strdup_printf ("stream %" G_GINT64_FORMAT, refused[i]);
      g_autofree char *text = g_strdup_printf ("DLPack stream %" G_GINT64_FORMAT
                                               " for a tensor in cuda memory: ", refused[i]);

      g_assert_false (cp_tensor_prepare_dlpack_stream (cuda, refused[i], &error));
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                           "cp_tensor_prepare_dlpack_stream of CUDA memory", what);
      g_assert_nonnull (strstr (error->message, text));
    }
  g_assert_true (cp_tensor_prepare_dlpack_stream (cuda, -1, NULL));
}

/* Host memory has no streams: -1 alone. */
static void
test_host_streams (void)
{
  const gint64 shape[] = { 4 };
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
  const gint64 refused[] = { 1, 2, 0x7f0000001000 };

  g_assert_true (cp_tensor_prepare_dlpack_stream (host, -1, NULL));
  for (gsize i = 0; i < G_N_ELEMENTS (refused); i++)
    {
      g_autoptr(GError) error = NULL;
      g_autofree char *what = g_strdup_printf ("stream %" G_GINT64_FORMAT, refused[i]);

      g_assert_false (cp_tensor_prepare_dlpack_stream (host, refused[i], &error));
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                           "cp_tensor_prepare_dlpack_stream of host memory", what);
      g_assert_nonnull (strstr (error->message, "which has no streams: it takes -1"));
    }
}

static gboolean
have_device (void)
{
  g_autoptr(GError) error = NULL;

  if (_cp_cuda_device_count (&error) >= 1)
    return TRUE;
  g_test_skip (error->message);
  return FALSE;
}

/* The consumer reads the export on its stream -- a stream of its own,
 * the legacy default, the per-thread default -- after libcpmesh wrote
 * it: every value it reads is libcpmesh's. */
static void
test_consumer_reads_on_its_stream (void)
{
  enum { N = 1 << 20 };
  const gint64 shape[] = { N };
  g_autoptr(CpTensor) host = NULL;
  g_autofree float *seen = NULL;
  cudaStream_t own = NULL;
  gint64 streams[3];

  if (!have_device ())
    return;
  host = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
  g_assert_cmpint (cudaStreamCreateWithFlags (&own, cudaStreamNonBlocking), ==, cudaSuccess);
  seen = g_new (float, N);
  streams[0] = (gint64) (intptr_t) own;
  streams[1] = 1;
  streams[2] = 2;
  for (gsize s = 0; s < G_N_ELEMENTS (streams); s++)
    {
      cudaStream_t stream = streams[s] == 1 ? cudaStreamLegacy :
                            streams[s] == 2 ? cudaStreamPerThread : own;
      g_autoptr(CpTensor) cuda = NULL;
      g_autoptr(GError) error = NULL;
      DLManagedTensor *managed;

      /* libcpmesh writes the memory just before the export. */
      for (gsize i = 0; i < N; i++)
        ((float *) cp_tensor_get_data (host))[i] = (float) (i + s);
      cuda = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
      g_assert_no_error (error);
      g_assert_true (cp_tensor_prepare_dlpack_stream (cuda, streams[s], &error));
      g_assert_no_error (error);
      managed = cp_tensor_to_dlpack (cuda, &error);
      g_assert_no_error (error);
      memset (seen, 0, N * sizeof (float));
      g_assert_cmpint (cudaMemcpyAsync (seen, managed->dl_tensor.data, N * sizeof (float),
                                        cudaMemcpyDeviceToHost, stream), ==, cudaSuccess);
      g_assert_cmpint (cudaStreamSynchronize (stream), ==, cudaSuccess);
      for (gsize i = 0; i < N; i += 4099)
        g_assert_cmpfloat (seen[i], ==, (float) (i + s));
      g_assert_cmpfloat (seen[N - 1], ==, (float) (N - 1 + s));
      managed->deleter (managed);
    }
  g_assert_cmpint (cudaStreamDestroy (own), ==, cudaSuccess);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/dlpack/stream/values", test_stream_values);
  g_test_add_func ("/Cp/Cuda/dlpack/stream/host", test_host_streams);
  g_test_add_func ("/Cp/Cuda/dlpack/stream/consumer-reads", test_consumer_reads_on_its_stream);

  return g_test_run ();
}
