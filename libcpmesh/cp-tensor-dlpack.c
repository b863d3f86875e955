/* cp-tensor-dlpack.c: tensors exchanged with other frameworks through DLPack
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <dlpack/dlpack.h>

#include "cp-error.h"
#include "cp-features.h"
#include "cp-memory-private.h"
#include "cp-storage-private.h"
#include "cp-tensor-private.h"

/* The struct this file speaks is the legacy DLManagedTensor with DLDevice
 * (DLPack 0.6; 0.5 called it DLContext): what every producer of a
 * "dltensor" capsule hands over. */
G_STATIC_ASSERT (DLPACK_VERSION >= 60);

/* DLPack 0.8 added a boolean type code, which the 0.6 header lacks.
 * Exporting bool as uint8 would hand the consumer another type without
 * saying so; as kDLBool, a consumer too old to know it refuses it. */
#define CP_DL_BOOL 6u

/* Each element type as DLPack spells it, one lane. */
static const DLDataType dl_dtypes[] = {
  [CP_DTYPE_BOOL]     = { CP_DL_BOOL, 8, 1 },
  [CP_DTYPE_UINT8]    = { kDLUInt, 8, 1 },
  [CP_DTYPE_INT32]    = { kDLInt, 32, 1 },
  [CP_DTYPE_INT64]    = { kDLInt, 64, 1 },
  [CP_DTYPE_FLOAT16]  = { kDLFloat, 16, 1 },
  [CP_DTYPE_BFLOAT16] = { kDLBfloat, 16, 1 },
  [CP_DTYPE_FLOAT32]  = { kDLFloat, 32, 1 },
  [CP_DTYPE_FLOAT64]  = { kDLFloat, 64, 1 },
};

G_STATIC_ASSERT (G_N_ELEMENTS (dl_dtypes) == CP_DTYPE_FLOAT64 + 1);

/* What a checked DLTensor becomes. */
typedef struct
{
  CpDeviceKind device;
  CpDType dtype;
  gsize nbytes;
  guintptr address;
} Import;

/* An exported tensor: the consumer's DLManagedTensor, the storage it keeps
 * alive, and its own copy of the shape, since a context may reshape the
 * tensor in place while the consumer still reads the export. */
typedef struct
{
  DLManagedTensor managed;
  CpStorage *storage;
  gint64 shape[CP_TENSOR_MAX_DIMS];
  gint64 strides[CP_TENSOR_MAX_DIMS];
} Export;

static const char *
dl_code_name (guint code)
{
  static const char * const names[] = {
    "int", "uint", "float", "opaque", "bfloat", "complex", "bool",
  };

  return code < G_N_ELEMENTS (names) ? names[code] : "unknown";
}

static const char *
dl_device_name (int device_type)
{
  switch (device_type)
    {
    case kDLCPU: return "CPU";
    case kDLCUDA: return "CUDA";
    case kDLCUDAHost: return "CUDA pinned host";
    case kDLOpenCL: return "OpenCL";
    case kDLVulkan: return "Vulkan";
    case kDLMetal: return "Metal";
    case kDLVPI: return "VPI";
    case kDLROCM: return "ROCm";
    case kDLROCMHost: return "ROCm pinned host";
    case kDLExtDev: return "extension";
    case kDLCUDAManaged: return "CUDA managed";
    default: return "unknown";
    }
}

/* DLPack numbers the CPU as device 0, the only one there is, and CUDA
 * devices from 0; any other id names memory that is not where it says. */
static gboolean
check_device_id (DLDevice   device,
                 GError   **error)
{
  if (device.device_type == kDLCPU ? device.device_id == 0 : device.device_id >= 0)
    return TRUE;
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "a DLPack tensor on %s device %d (device type %d) names a device that does not "
               "exist: %s", dl_device_name (device.device_type), device.device_id,
               (int) device.device_type,
               device.device_type == kDLCPU ? "the CPU is device 0" : "device ids count from 0");
  return FALSE;
}

/* CPU memory always; CUDA memory in builds that have the GPU path. */
static gboolean
device_from_dl (DLDevice       device,
                CpDeviceKind  *kind,
                GError       **error)
{
  if (device.device_type == kDLCPU)
    {
      *kind = CP_DEVICE_KIND_HOST;
      return check_device_id (device, error);
    }
  if (device.device_type == kDLCUDA && CP_HAS_CUDA)
    {
      *kind = CP_DEVICE_KIND_CUDA;
      return check_device_id (device, error);
    }
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "a DLPack tensor on %s device %d (device type %d) is in memory this build of "
               "libcpmesh cannot use; it takes CPU memory (device type %d)%s",
               dl_device_name (device.device_type), device.device_id, (int) device.device_type,
               (int) kDLCPU, CP_HAS_CUDA ? " and CUDA memory (device type 2)" : "");
  return FALSE;
}

static void
set_dtype_error (DLDataType   dl,
                 GError     **error)
{
  g_autofree char *lanes = dl.lanes == 1 ? g_strdup ("") : g_strdup_printf ("x%u", dl.lanes);

  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DTYPE,
               "DLPack element type %s%u%s (code %u, %u bits, %u lanes) has no libcpmesh "
               "dtype; it takes bool, uint8, int32, int64, float16, bfloat16, float32 and "
               "float64, one lane each",
               dl_code_name (dl.code), dl.bits, lanes, dl.code, dl.bits, dl.lanes);
}

static gboolean
dtype_from_dl (DLDataType  dl,
               CpDType    *dtype,
               GError    **error)
{
  for (guint i = 0; i < G_N_ELEMENTS (dl_dtypes); i++)
    {
      if (dl.code == dl_dtypes[i].code && dl.bits == dl_dtypes[i].bits && dl.lanes == 1)
        {
          *dtype = (CpDType) i;
          return TRUE;
        }
    }
  set_dtype_error (dl, error);
  return FALSE;
}

/* The shape array itself must exist before _cp_shape_check can read it. */
static gboolean
dl_has_shape (const DLTensor  *tensor,
              GError         **error)
{
  if (tensor->ndim < 0)
    g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                 "a DLPack tensor has a negative number of dimensions (%d)", tensor->ndim);
  else if (tensor->ndim > 0 && tensor->shape == NULL)
    g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                 "a DLPack tensor of %d dimensions has no shape array", tensor->ndim);
  else
    return TRUE;
  return FALSE;
}

/* DLPack strides count elements, and NULL means compact row-major. A
 * dimension of size 1 is never stepped along, so producers give it any
 * stride (PyTorch gives 1), and an empty tensor has nothing to step to. */
static gboolean
dl_is_row_major (const DLTensor *tensor,
                 gsize           numel)
{
  gint64 expected = 1;

  if (tensor->strides == NULL || numel == 0)
    return TRUE;
  for (int i = tensor->ndim - 1; i >= 0; i--)
    {
      if (tensor->shape[i] != 1 && tensor->strides[i] != expected)
        return FALSE;
      expected *= tensor->shape[i];
    }
  return TRUE;
}

static gboolean
check_row_major (const DLTensor  *tensor,
                 CpDType          dtype,
                 gsize            numel,
                 GError         **error)
{
  g_autofree char *shape = NULL;
  g_autofree char *strides = NULL;

  if (dl_is_row_major (tensor, numel))
    return TRUE;
  shape = _cp_shape_to_string (tensor->shape, (guint) tensor->ndim);
  strides = _cp_shape_to_string (tensor->strides, (guint) tensor->ndim);
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
               "a DLPack %s tensor of shape %s with strides %s is not contiguous and "
               "row-major; libcpmesh tensors always are, and it does not copy behind the "
               "caller's back: make it contiguous first (PyTorch: .contiguous(), numpy: "
               "numpy.ascontiguousarray())",
               cp_dtype_get_name (dtype), shape, strides);
  return FALSE;
}

/* The first element is at data + byte_offset; it must exist, fit in the
 * address space together with the elements, and be aligned for them. */
static gboolean
locate_first_element (const DLTensor  *tensor,
                      Import          *plan,
                      GError         **error)
{
  gsize elsize = cp_dtype_get_size (plan->dtype);
  guint64 address;
  guint64 end;

  if (tensor->data == NULL && plan->nbytes > 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "a DLPack %s tensor of %" G_GSIZE_FORMAT " bytes has no data (address 0)",
                   cp_dtype_get_name (plan->dtype), plan->nbytes);
      return FALSE;
    }
  if (__builtin_add_overflow ((guint64) GPOINTER_TO_SIZE (tensor->data), tensor->byte_offset, &address) ||
      __builtin_add_overflow (address, (guint64) plan->nbytes, &end) || end > G_MAXSIZE)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "a DLPack %s tensor at address %p + byte_offset %" G_GUINT64_FORMAT
                   " with %" G_GSIZE_FORMAT " bytes runs past the end of the address space",
                   cp_dtype_get_name (plan->dtype), tensor->data,
                   (guint64) tensor->byte_offset, plan->nbytes);
      return FALSE;
    }
  if (address % elsize != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED,
                   "a DLPack %s tensor starts at address %p + byte_offset %" G_GUINT64_FORMAT
                   ", which is not a multiple of its %" G_GSIZE_FORMAT "-byte element size",
                   cp_dtype_get_name (plan->dtype), tensor->data,
                   (guint64) tensor->byte_offset, elsize);
      return FALSE;
    }
  plan->address = (guintptr) address;
  return TRUE;
}

static gboolean
plan_import (const DLTensor  *tensor,
             Import          *plan,
             GError         **error)
{
  gint64 numel;

  if (!device_from_dl (tensor->device, &plan->device, error) ||
      !dtype_from_dl (tensor->dtype, &plan->dtype, error) ||
      !dl_has_shape (tensor, error) ||
      !_cp_shape_check (plan->dtype, tensor->shape, (guint) tensor->ndim, &numel, error) ||
      !check_row_major (tensor, plan->dtype, (gsize) numel, error))
    return FALSE;
  plan->nbytes = (gsize) numel * cp_dtype_get_size (plan->dtype);
  return locate_first_element (tensor, plan, error);
}

/* A storage's release callback, so that the deleter is called through a
 * pointer of its own type. */
static void
call_deleter (gpointer dlpack)
{
  DLManagedTensor *managed = dlpack;

  if (managed->deleter != NULL)
    managed->deleter (managed);
}

/**
 * cp_tensor_new_from_dlpack:
 * @dlpack: (type gpointer) (not nullable): a `DLManagedTensor *`, the
 *   struct of a DLPack `"dltensor"` capsule; the tensor takes it over
 * @error: return location for a #GError
 *
 * Creates a tensor over the memory of a tensor another framework exported
 * through DLPack — PyTorch's `torch.utils.dlpack.to_dlpack()`, numpy's
 * `ndarray.__dlpack__()` — without copying it: writes through either side
 * are seen by the other. The Python override's `Cp.Tensor.from_dlpack()`
 * is built on this.
 *
 * The tensor owns @dlpack from here on: its deleter is called exactly once,
 * when the last tensor on the memory is freed, on whichever thread drops
 * that reference (a deleter that needs a lock, such as Python's, takes it
 * itself) — or before this function returns when it fails. A caller that
 * took @dlpack from a capsule renames the capsule `"used_dltensor"`.
 *
 * Only what a [class@Cp.Tensor] can be is accepted, never silently copied:
 * compact row-major elements (strides %NULL or row-major; a dimension of
 * size 1 may have any stride), one lane of bool (DLPack 0.8's code 6),
 * uint8, int32, int64, float16, bfloat16, float32 or float64, on the CPU
 * (or a CUDA device in builds with [const@Cp.HAS_CUDA]), starting at an
 * address aligned to the element size. A device id that names no device
 * (not 0 for the CPU, negative for CUDA) is refused. CUDA memory must be
 * device memory of the device the tensor names, as the CUDA runtime sees it.
 *
 * DLPack's contract is that the memory stays where it is until the
 * deleter runs. PyTorch breaks it: `resize_()` or `set_()` on the
 * exported tensor (or on any tensor sharing its storage) frees or moves
 * the memory while the export still points at it, and every later use of
 * this tensor — a copy, a collective, a shard — reads or writes freed
 * memory. Do not resize a PyTorch tensor while a libcpmesh tensor views
 * it; copy it first if it must change. The Python override's
 * `Cp.Tensor.from_dlpack()` keeps the PyTorch tensor it was given and
 * refuses to use a tensor whose producer has moved its memory since.
 *
 * Returns: (transfer full): a new tensor whose storage is of kind
 *   %CP_STORAGE_KIND_DLPACK, or %NULL with %CP_TENSOR_ERROR_DEVICE,
 *   (also for a device id that names no device),
 *   %CP_TENSOR_ERROR_DTYPE, %CP_TENSOR_ERROR_SHAPE (a bad shape or strides
 *   that are not row-major), %CP_TENSOR_ERROR_MISALIGNED or
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE (no data, or data past the end of the
 *   address space)
 *
 * Since: 1.0
 */
CpTensor *
cp_tensor_new_from_dlpack (gpointer   dlpack,
                           GError   **error)
{
  DLManagedTensor *managed = dlpack;
  DLTensor *tensor;
  g_autoptr(CpStorage) storage = NULL;
  Import plan;

  g_return_val_if_fail (dlpack != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  tensor = &managed->dl_tensor;
  if (!plan_import (tensor, &plan, error) ||
      !_cp_memory_check_import (plan.device, tensor->device.device_id, plan.address, plan.nbytes,
                                error))
    {
      call_deleter (managed);
      return NULL;
    }
  storage = _cp_storage_new_dlpack (plan.device, tensor->device.device_id, plan.address,
                                    plan.nbytes, call_deleter, managed);
  /* The tensor copies the shape: the producer's array goes with the deleter. */
  return cp_tensor_new_from_storage (plan.dtype, tensor->shape, (guint) tensor->ndim,
                                     storage, 0, error);
}

/* Every kind of memory a tensor can be in, as DLPack names it. */
static gboolean
dl_device_of (CpTensor  *self,
              DLDevice  *device,
              GError   **error)
{
  CpStorage *storage = cp_tensor_get_storage (self);
  CpDeviceKind kind = cp_storage_get_device (storage);

  switch (kind)
    {
    case CP_DEVICE_KIND_HOST:
      *device = (DLDevice) { kDLCPU, 0 };
      return TRUE;
    case CP_DEVICE_KIND_CUDA:
      *device = (DLDevice) { kDLCUDA, _cp_storage_get_device_id (storage) };
      return TRUE;
    default:
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "a %s tensor in %s memory has no DLPack device type",
                   cp_dtype_get_name (cp_tensor_get_dtype (self)), _cp_device_kind_get_name (kind));
      return FALSE;
    }
}

static void
export_delete (DLManagedTensor *managed)
{
  Export *export = managed->manager_ctx;

  cp_storage_unref (export->storage);
  g_free (export);
}

/* Row-major strides in elements; an empty dimension counts as 1 so that
 * no stride is 0, as PyTorch writes them. */
static void
export_set_shape (Export   *export,
                  CpTensor *self)
{
  guint n_dims;
  const gint64 *shape = cp_tensor_get_shape (self, &n_dims);
  gint64 step = 1;

  for (guint i = n_dims; i-- > 0;)
    {
      export->shape[i] = shape[i];
      export->strides[i] = step;
      step *= MAX (shape[i], 1);
    }
}

/**
 * cp_tensor_to_dlpack:
 * @self: a tensor
 * @error: return location for a #GError
 *
 * Exports @self through DLPack without copying it, for PyTorch's
 * `torch.utils.dlpack.from_dlpack()` or any other consumer of a
 * `"dltensor"` capsule; the Python override's `Cp.Tensor.__dlpack__()` is
 * built on this. Writes through either side are seen by the other.
 *
 * The result keeps the storage of @self alive, and its shape with it,
 * until its deleter is called — exactly once, by whoever consumed it, on
 * any thread. It stays valid when @self is freed or a context later swaps
 * its storage in place; it then still shows the bytes and shape @self had
 * when it was exported.
 *
 * The elements are described as compact row-major (explicit strides,
 * `byte_offset` 0). bool goes out as DLPack 0.8's boolean code 6, which
 * older consumers refuse. DLPack's legacy struct cannot mark memory
 * read-only, and a consumer may write through what it gets, so a tensor
 * over read-only memory (a #GBytes, see [method@Cp.Storage.get_read_only])
 * is refused, as numpy refuses to export a read-only array: export a copy
 * ([method@Cp.Tensor.copy]) instead.
 *
 * Returns: (transfer full) (type gpointer): a new `DLManagedTensor *`, or
 *   %NULL with %CP_TENSOR_ERROR_DEVICE when the memory of @self has no
 *   DLPack device type, or %CP_TENSOR_ERROR_READ_ONLY when it is
 *   read-only
 *
 * Since: 1.0
 */
gpointer
cp_tensor_to_dlpack (CpTensor  *self,
                     GError   **error)
{
  Export *export;
  DLTensor *tensor;
  DLDevice device;

  g_return_val_if_fail (CP_IS_TENSOR (self), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!dl_device_of (self, &device, error) ||
      !_cp_tensor_require_writable (self, "to_dlpack", "the tensor", error))
    return NULL;
  export = g_new0 (Export, 1);
  export->storage = cp_storage_ref (cp_tensor_get_storage (self));
  export_set_shape (export, self);
  export->managed.manager_ctx = export;
  export->managed.deleter = export_delete;
  tensor = &export->managed.dl_tensor;
  tensor->data = GSIZE_TO_POINTER (cp_tensor_get_data_address (self));
  tensor->device = device;
  tensor->ndim = (int) cp_tensor_get_n_dims (self);
  tensor->dtype = dl_dtypes[cp_tensor_get_dtype (self)];
  tensor->shape = export->shape;
  tensor->strides = export->strides;
  tensor->byte_offset = 0;
  return &export->managed;
}

/**
 * cp_tensor_get_dlpack_device:
 * @self: a tensor
 * @device_type: (out) (optional): the DLPack `DLDeviceType`: 1 (`kDLCPU`)
 *   for host memory, 2 (`kDLCUDA`) for CUDA memory
 * @device_id: (out) (optional): which device of that type: 0 for host
 *   memory
 * @error: return location for a #GError
 *
 * Tells where the elements of @self live, as DLPack names devices: the
 * pair Python's `__dlpack_device__()` returns, which consumers ask for
 * before they ask for the tensor itself.
 *
 * Returns: (skip): %TRUE, or %FALSE with %CP_TENSOR_ERROR_DEVICE when the
 *   memory of @self has no DLPack device type
 *
 * Since: 1.0
 */
gboolean
cp_tensor_get_dlpack_device (CpTensor  *self,
                             int       *device_type,
                             int       *device_id,
                             GError   **error)
{
  DLDevice device;

  g_return_val_if_fail (CP_IS_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!dl_device_of (self, &device, error))
    return FALSE;
  if (device_type != NULL)
    *device_type = (int) device.device_type;
  if (device_id != NULL)
    *device_id = device.device_id;
  return TRUE;
}

/* DLPack's stream values (the Python array API's __dlpack__(stream=)):
 * -1 asks for no ordering, 1 and 2 name CUDA's legacy and per-thread
 * default streams, larger values are cudaStream_t handles, and 0 is
 * refused because it could mean either default stream. */
#define DL_STREAM_NONE (-1)

/**
 * cp_tensor_prepare_dlpack_stream:
 * @self: a tensor about to be exported with cp_tensor_to_dlpack()
 * @stream: the consumer's stream as DLPack's stream protocol spells it:
 *   -1 for no ordering, 1 for CUDA's legacy default stream, 2 for the
 *   per-thread default stream, or a `cudaStream_t` as an integer
 * @error: return location for a #GError
 *
 * Makes the work a consumer puts on @stream after this returns run after
 * every operation libcpmesh started on the memory of @self: what
 * Python's `__dlpack__(stream=...)` asks of a producer before it hands
 * its tensor over.  libcpmesh waits for its own work on the memory's
 * device before returning, so whatever the consumer then enqueues, on
 * any stream, follows it; the consumer's stream itself is never touched,
 * and a value naming no stream does no harm.  -1 returns at once.
 *
 * Host memory has no streams: it takes -1 alone (Python's `stream=None`
 * there).
 *
 * Returns: %TRUE when the consumer may use the export on @stream; %FALSE
 *   with %CP_TENSOR_ERROR_OUT_OF_RANGE for 0 or a value below -1, or
 *   %CP_TENSOR_ERROR_DEVICE for a stream on memory that has none, or
 *   when the device fails the work pending on the memory
 *
 * Since: 1.0
 */
gboolean
cp_tensor_prepare_dlpack_stream (CpTensor  *self,
                                 gint64     stream,
                                 GError   **error)
{
  CpDeviceKind kind;

  g_return_val_if_fail (CP_IS_TENSOR (self), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  kind = cp_storage_get_device (cp_tensor_get_storage (self));
  if (stream == 0 || stream < DL_STREAM_NONE)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "DLPack stream %" G_GINT64_FORMAT " for a tensor in %s memory: a stream is -1 "
                   "(no ordering), 1 (legacy default), 2 (per-thread default) or a cudaStream_t; "
                   "0 is ambiguous", stream, _cp_device_kind_get_name (kind));
      return FALSE;
    }
  if (stream == DL_STREAM_NONE)
    return TRUE;
  if (kind != CP_DEVICE_KIND_CUDA)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "DLPack stream %" G_GINT64_FORMAT " for a tensor in %s memory, which has no "
                   "streams: it takes -1 (no stream) alone", stream, _cp_device_kind_get_name (kind));
      return FALSE;
    }
  /* The library's own pending work on the memory; a failure there is the
   * device's, and the consumer must not read the memory. */
  return _cp_memory_synchronize (self, error);
}
