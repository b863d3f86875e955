/* dump-device-properties.c: a GPU's properties, kept as test data
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * dump-device-properties DIR
 *
 * Writes, for every CUDA device, DIR/device-N.json (what
 * cudaGetDeviceProperties and a few cudaDeviceGetAttribute calls report,
 * with the runtime and driver versions) and, where cuDNN is found,
 * DIR/cudnn-device-N.json: cuDNN's own serialised device-properties
 * descriptor, against which cuDNN graphs can be built and finalised on
 * machines without that GPU.  Exits 77 (skipped) without a device, 1 when
 * a file could not be written; a cuDNN failure is reported and does not
 * fail the dump, since the CUDA properties are the primary record.
 */

#include "config.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>
#if CP_TEST_HAVE_CUDNN_GRAPH_H
#include <cudnn_graph.h>
#endif

#include <glib.h>

#include "kernels/cuda/cp-cuda-private.h"

static void
add_int (GString    *json,
         const char *key,
         long long   value)
{
  g_string_append_printf (json, ",\n  \"%s\": %lld", key, value);
}

static void
add_ints (GString    *json,
          const char *key,
          const int  *values,
          int         n)
{
  g_string_append_printf (json, ",\n  \"%s\": [", key);
  for (int i = 0; i < n; i++)
    g_string_append_printf (json, "%s%d", i > 0 ? ", " : "", values[i]);
  g_string_append (json, "]");
}

static char *
uuid_text (const cudaUUID_t *uuid)
{
  GString *text = g_string_new (NULL);

  for (int i = 0; i < 16; i++)
    g_string_append_printf (text, "%s%02x", i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "",
                            (unsigned char) uuid->bytes[i]);
  return g_string_free (text, FALSE);
}

/* Attributes cudaDeviceProp no longer carries in CUDA 13 (clock rates)
 * and a few that attention kernels size themselves by. */
static const struct
{
  const char *key;
  enum cudaDeviceAttr attr;
} attributes[] = {
  { "clockRateKHz", cudaDevAttrClockRate },
  { "memoryClockRateKHz", cudaDevAttrMemoryClockRate },
  { "maxPitch", cudaDevAttrMaxPitch },
  { "maxSharedMemoryPerBlockOptin", cudaDevAttrMaxSharedMemoryPerBlockOptin },
  { "maxSharedMemoryPerMultiprocessor", cudaDevAttrMaxSharedMemoryPerMultiprocessor },
  { "computeMode", cudaDevAttrComputeMode },
  { "singleToDoublePrecisionPerfRatio", cudaDevAttrSingleToDoublePrecisionPerfRatio },
  { "memoryPoolsSupported", cudaDevAttrMemoryPoolsSupported },
};

static char *
cuda_properties_json (int device)
{
  struct cudaDeviceProp p;
  GString *json = g_string_new (NULL);
  g_autofree char *uuid = NULL;
  g_autofree char *name = NULL;
  int runtime = 0, driver = 0;
  cudaError_t status;

  status = cudaGetDeviceProperties (&p, device);
  if (status != cudaSuccess)
    {
      g_string_free (json, TRUE);
      return g_strdup_printf ("{\"device\": %d, \"error\": \"%s\"}\n", device, cudaGetErrorName (status));
    }
  (void) cudaRuntimeGetVersion (&runtime);
  (void) cudaDriverGetVersion (&driver);
  uuid = uuid_text (&p.uuid);
  name = g_strescape (p.name, NULL);
  g_string_append_printf (json, "{\n  \"device\": %d,\n  \"name\": \"%s\",\n  \"uuid\": \"%s\"",
                          device, name, uuid);
  add_int (json, "runtimeVersion", runtime);
  add_int (json, "driverVersion", driver);
  add_int (json, "major", p.major);
  add_int (json, "minor", p.minor);
  add_int (json, "multiProcessorCount", p.multiProcessorCount);
  add_int (json, "totalGlobalMem", (long long) p.totalGlobalMem);
  add_int (json, "totalConstMem", (long long) p.totalConstMem);
  add_int (json, "sharedMemPerBlock", (long long) p.sharedMemPerBlock);
  add_int (json, "sharedMemPerBlockOptin", (long long) p.sharedMemPerBlockOptin);
  add_int (json, "sharedMemPerMultiprocessor", (long long) p.sharedMemPerMultiprocessor);
  add_int (json, "reservedSharedMemPerBlock", (long long) p.reservedSharedMemPerBlock);
  add_int (json, "regsPerBlock", p.regsPerBlock);
  add_int (json, "regsPerMultiprocessor", p.regsPerMultiprocessor);
  add_int (json, "warpSize", p.warpSize);
  add_int (json, "maxThreadsPerBlock", p.maxThreadsPerBlock);
  add_ints (json, "maxThreadsDim", p.maxThreadsDim, 3);
  add_ints (json, "maxGridSize", p.maxGridSize, 3);
  add_int (json, "maxThreadsPerMultiProcessor", p.maxThreadsPerMultiProcessor);
  add_int (json, "maxBlocksPerMultiProcessor", p.maxBlocksPerMultiProcessor);
  add_int (json, "l2CacheSize", p.l2CacheSize);
  add_int (json, "persistingL2CacheMaxSize", p.persistingL2CacheMaxSize);
  add_int (json, "accessPolicyMaxWindowSize", p.accessPolicyMaxWindowSize);
  add_int (json, "memoryBusWidth", p.memoryBusWidth);
  add_int (json, "memPitch", (long long) p.memPitch);
  add_int (json, "textureAlignment", (long long) p.textureAlignment);
  add_int (json, "asyncEngineCount", p.asyncEngineCount);
  add_int (json, "concurrentKernels", p.concurrentKernels);
  add_int (json, "ECCEnabled", p.ECCEnabled);
  add_int (json, "pciBusID", p.pciBusID);
  add_int (json, "pciDeviceID", p.pciDeviceID);
  add_int (json, "pciDomainID", p.pciDomainID);
  add_int (json, "unifiedAddressing", p.unifiedAddressing);
  add_int (json, "managedMemory", p.managedMemory);
  add_int (json, "concurrentManagedAccess", p.concurrentManagedAccess);
  add_int (json, "pageableMemoryAccess", p.pageableMemoryAccess);
  add_int (json, "cooperativeLaunch", p.cooperativeLaunch);
  add_int (json, "clusterLaunch", p.clusterLaunch);
  add_int (json, "streamPrioritiesSupported", p.streamPrioritiesSupported);
  add_int (json, "globalL1CacheSupported", p.globalL1CacheSupported);
  add_int (json, "localL1CacheSupported", p.localL1CacheSupported);
  add_int (json, "hostRegisterSupported", p.hostRegisterSupported);
  add_int (json, "gpuDirectRDMASupported", p.gpuDirectRDMASupported);
  add_int (json, "ipcEventSupported", p.ipcEventSupported);
  add_int (json, "unifiedFunctionPointers", p.unifiedFunctionPointers);
  for (gsize i = 0; i < G_N_ELEMENTS (attributes); i++)
    {
      int value = 0;

      if (cudaDeviceGetAttribute (&value, attributes[i].attr, device) == cudaSuccess)
        add_int (json, attributes[i].key, value);
      else
        (void) cudaGetLastError ();
    }
  g_string_append (json, "\n}\n");
  return g_string_free (json, FALSE);
}

#if CP_TEST_HAVE_CUDNN_GRAPH_H
/* cuDNN's serialised device-properties descriptor (cuDNN 9.8 and
 * later), through the library's own copy of cuDNN; NULL with @why set
 * when any step fails. */
static char *
cudnn_properties_json (int    device,
                       char **why)
{
  const CpGpuLibraryInfo *cudnn = _cp_gpu_library_get (CP_GPU_LIBRARY_CUDNN);
  cudnnStatus_t (*create) (cudnnHandle_t *);
  cudnnStatus_t (*destroy) (cudnnHandle_t);
  cudnnStatus_t (*create_descriptor) (cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*destroy_descriptor) (cudnnBackendDescriptor_t);
  cudnnStatus_t (*set_attribute) (cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, const void *);
  cudnnStatus_t (*get_attribute) (cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
  cudnnStatus_t (*finalize) (cudnnBackendDescriptor_t);
  cudnnHandle_t handle = NULL;
  cudnnBackendDescriptor_t desc = NULL;
  int64_t count = 0;
  char *json = NULL;
  int status;
  const char *step;

  if (cudnn->handle == NULL)
    {
      *why = g_strdup (cudnn->reason);
      return NULL;
    }
#define LOOKUP(var, symbol) *(gpointer *) &var = dlsym (cudnn->handle, symbol)
  LOOKUP (create, "cudnnCreate");
  LOOKUP (destroy, "cudnnDestroy");
  LOOKUP (create_descriptor, "cudnnBackendCreateDescriptor");
  LOOKUP (destroy_descriptor, "cudnnBackendDestroyDescriptor");
  LOOKUP (set_attribute, "cudnnBackendSetAttribute");
  LOOKUP (get_attribute, "cudnnBackendGetAttribute");
  LOOKUP (finalize, "cudnnBackendFinalize");
#undef LOOKUP
  if (!create || !destroy || !create_descriptor || !destroy_descriptor || !set_attribute ||
      !get_attribute || !finalize)
    {
      *why = g_strdup_printf ("%s lacks the backend API", cudnn->path);
      return NULL;
    }
  if (cudaSetDevice (device) != cudaSuccess)
    {
      *why = g_strdup_printf ("cudaSetDevice (%d) failed", device);
      return NULL;
    }
  if ((status = create (&handle)) != 0)
    step = "cudnnCreate";
  else if ((status = create_descriptor (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &desc)) != 0)
    step = "cudnnBackendCreateDescriptor (DEVICEPROP)";
  else if ((status = set_attribute (desc, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                    &handle)) != 0)
    step = "setting CUDNN_ATTR_DEVICEPROP_HANDLE";
  else if ((status = finalize (desc)) != 0)
    step = "cudnnBackendFinalize (DEVICEPROP)";
  else if ((status = get_attribute (desc, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                    0, &count, NULL)) != 0 || count <= 0)
    step = "the size of CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION";
  else
    {
      json = g_malloc0 (count + 1);
      status = get_attribute (desc, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                              count, &count, json);
      step = "CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION";
      if (status != 0)
        g_clear_pointer (&json, g_free);
    }
  if (json == NULL)
    *why = g_strdup_printf ("%s failed with cuDNN status %d (cuDNN %s at %s)", step, status,
                            cudnn->version, cudnn->path);
  if (desc != NULL)
    destroy_descriptor (desc);
  if (handle != NULL)
    destroy (handle);
  return json;
}
#endif

static gboolean
write_file (const char *dir,
            const char *name,
            const char *contents)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autoptr(GError) error = NULL;

  if (!g_file_set_contents (path, contents, -1, &error))
    {
      fprintf (stderr, "dump-device-properties: %s\n", error->message);
      return FALSE;
    }
  printf ("wrote %s\n", path);
  return TRUE;
}

int
main (int   argc,
      char *argv[])
{
  int count = 0;
  cudaError_t status;
  gboolean ok = TRUE;

  if (argc != 2)
    {
      fprintf (stderr, "usage: %s DIR\n", argv[0]);
      return 2;
    }
  status = cudaGetDeviceCount (&count);
  if (status != cudaSuccess || count == 0)
    {
      printf ("SKIP no CUDA device: %s\n",
              status != cudaSuccess ? cudaGetErrorString (status) : "0 devices");
      return 77;
    }
  for (int device = 0; device < count; device++)
    {
      g_autofree char *name = g_strdup_printf ("device-%d.json", device);
      g_autofree char *json = cuda_properties_json (device);

      ok = write_file (argv[1], name, json) && ok;
#if CP_TEST_HAVE_CUDNN_GRAPH_H
      {
        g_autofree char *why = NULL;
        g_autofree char *cudnn_name = g_strdup_printf ("cudnn-device-%d.json", device);
        g_autofree char *cudnn_json = cudnn_properties_json (device, &why);

        if (cudnn_json != NULL)
          ok = write_file (argv[1], cudnn_name, cudnn_json) && ok;
        else
          printf ("cudnn device %d: no descriptor: %s\n", device, why);
      }
#else
      printf ("cudnn: this build had no cudnn_graph.h\n");
#endif
    }
  return ok ? 0 : 1;
}
