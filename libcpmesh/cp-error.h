/* cp-error.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib.h>

#include "cp-version-macros.h"

G_BEGIN_DECLS

/**
 * CP_TENSOR_ERROR:
 *
 * The error domain of tensor, storage and layout operations.
 *
 * Since: 1.0
 */
#define CP_TENSOR_ERROR (cp_tensor_error_quark ())

/**
 * CpTensorError:
 * @CP_TENSOR_ERROR_FAILED: an unclassified failure; callers treat unknown
 *   codes like this one
 * @CP_TENSOR_ERROR_SHAPE: a shape, dimension or length does not fit the
 *   operation (for example a sequence length that is not a multiple of 2·C)
 * @CP_TENSOR_ERROR_DTYPE: the element type does not fit the operation
 * @CP_TENSOR_ERROR_DEVICE: the memory is on a device this operation or this
 *   build cannot reach
 * @CP_TENSOR_ERROR_OUT_OF_MEMORY: an allocation failed
 * @CP_TENSOR_ERROR_OUT_OF_RANGE: an index, offset or rank is outside its
 *   valid range
 * @CP_TENSOR_ERROR_MISALIGNED: foreign memory is not aligned to the element
 *   size
 * @CP_TENSOR_ERROR_IN_USE: the tensor is being changed in place by another
 *   batch preparation or context (another rank's, or a context entered on
 *   this rank), so this one may not change it
 * @CP_TENSOR_ERROR_UNSEALED: a file descriptor to map could shrink under
 *   the mapping: it is neither a memfd sealed against shrinking nor a
 *   dma-buf
 * @CP_TENSOR_ERROR_READ_ONLY: the operation would write into a tensor
 *   whose memory is read-only (a tensor over a #GBytes, or a view of one),
 *   or hand that memory to a consumer that may write it
 * @CP_TENSOR_ERROR_BAD_FD: a file descriptor cannot be mapped at all: it
 *   is negative or closed, was opened with `O_PATH`, or was not opened
 *   for both reading and writing
 * @CP_TENSOR_ERROR_MOVED: the framework that lent the memory through DLPack
 *   has moved or freed it since (a PyTorch tensor resized after
 *   `Cp.Tensor.from_dlpack()`), so using the tensor would touch freed
 *   memory; the Python override reports it
 *
 * Errors of the [error@Cp.TensorError] domain.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_TENSOR_ERROR_FAILED,
  CP_TENSOR_ERROR_SHAPE,
  CP_TENSOR_ERROR_DTYPE,
  CP_TENSOR_ERROR_DEVICE,
  CP_TENSOR_ERROR_OUT_OF_MEMORY,
  CP_TENSOR_ERROR_OUT_OF_RANGE,
  CP_TENSOR_ERROR_MISALIGNED,
  CP_TENSOR_ERROR_IN_USE,
  CP_TENSOR_ERROR_UNSEALED,
  CP_TENSOR_ERROR_READ_ONLY,
  CP_TENSOR_ERROR_BAD_FD,
  CP_TENSOR_ERROR_MOVED,
} CpTensorError;

/**
 * CP_MESH_ERROR:
 *
 * The error domain of meshes and their transports.
 *
 * Since: 1.0
 */
#define CP_MESH_ERROR (cp_mesh_error_quark ())

/**
 * CpMeshError:
 * @CP_MESH_ERROR_FAILED: an unclassified failure
 * @CP_MESH_ERROR_TIMED_OUT: a peer did not arrive within the mesh timeout
 * @CP_MESH_ERROR_PEER_LOST: a peer process died or its link was cut
 * @CP_MESH_ERROR_TRANSPORT: the transport reported a failure
 * @CP_MESH_ERROR_AUTH: a peer failed to prove it knows the shared token
 * @CP_MESH_ERROR_INVALID_TOPOLOGY: ranks, sizes or dimensions do not form a
 *   valid mesh, or ranks disagree about the operation they are running
 * @CP_MESH_ERROR_UNSUPPORTED: the backend cannot do this
 * @CP_MESH_ERROR_NO_DEVICE: no device of the required kind is available
 * @CP_MESH_ERROR_CANCELLED: an asynchronous call was cancelled, on this
 *   rank or on another: cancelling breaks the mesh like any other failure,
 *   so every rank of the call fails with this code
 *
 * Errors of the [error@Cp.MeshError] domain.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_MESH_ERROR_FAILED,
  CP_MESH_ERROR_TIMED_OUT,
  CP_MESH_ERROR_PEER_LOST,
  CP_MESH_ERROR_TRANSPORT,
  CP_MESH_ERROR_AUTH,
  CP_MESH_ERROR_INVALID_TOPOLOGY,
  CP_MESH_ERROR_UNSUPPORTED,
  CP_MESH_ERROR_NO_DEVICE,
  CP_MESH_ERROR_CANCELLED,
} CpMeshError;

/**
 * CP_BATCH_ERROR:
 *
 * The error domain of batch preparation and conversion.
 *
 * Since: 1.0
 */
#define CP_BATCH_ERROR (cp_batch_error_quark ())

/**
 * CpBatchError:
 * @CP_BATCH_ERROR_FAILED: an unclassified failure
 * @CP_BATCH_ERROR_MISSING_KEY: a required key is absent
 * @CP_BATCH_ERROR_CONFLICTING_KEYS: keys that exclude each other are both
 *   present
 * @CP_BATCH_ERROR_INDIVISIBLE: a length is not a multiple of what the
 *   layout needs
 * @CP_BATCH_ERROR_INVALID_SEQ_LENS: sequence lengths are negative,
 *   decreasing or do not fit the row
 * @CP_BATCH_ERROR_UNSUPPORTED_FORMAT: the requested format is not supported
 * @CP_BATCH_ERROR_INVALID_OPTION: an option holds a value outside its range,
 *   for example an unknown rotate method
 * @CP_BATCH_ERROR_CONTEXT_STATE: the context is not in the state the call
 *   needs: entered twice, exited without being entered, or given a buffer
 *   while entered
 * @CP_BATCH_ERROR_DTYPE: a key holds a tensor of an element type it cannot
 *   have, for example floating-point `input_ids`
 *
 * Errors of the [error@Cp.BatchError] domain.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_BATCH_ERROR_FAILED,
  CP_BATCH_ERROR_MISSING_KEY,
  CP_BATCH_ERROR_CONFLICTING_KEYS,
  CP_BATCH_ERROR_INDIVISIBLE,
  CP_BATCH_ERROR_INVALID_SEQ_LENS,
  CP_BATCH_ERROR_UNSUPPORTED_FORMAT,
  CP_BATCH_ERROR_INVALID_OPTION,
  CP_BATCH_ERROR_CONTEXT_STATE,
  CP_BATCH_ERROR_DTYPE,
} CpBatchError;

/**
 * CP_ATTENTION_ERROR:
 *
 * The error domain of context-parallel attention.
 *
 * Since: 1.0
 */
#define CP_ATTENTION_ERROR (cp_attention_error_quark ())

/**
 * CpAttentionError:
 * @CP_ATTENTION_ERROR_FAILED: an unclassified failure
 * @CP_ATTENTION_ERROR_SHAPE: shapes, dtypes or devices of the inputs
 *   disagree with each other or with the layout
 * @CP_ATTENTION_ERROR_UNSUPPORTED: the combination of options is not
 *   supported
 *
 * Errors of the [error@Cp.AttentionError] domain.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_ATTENTION_ERROR_FAILED,
  CP_ATTENTION_ERROR_SHAPE,
  CP_ATTENTION_ERROR_UNSUPPORTED,
} CpAttentionError;

CP_AVAILABLE_IN_ALL
GQuark cp_tensor_error_quark    (void);
CP_AVAILABLE_IN_ALL
GQuark cp_mesh_error_quark      (void);
CP_AVAILABLE_IN_ALL
GQuark cp_batch_error_quark     (void);
CP_AVAILABLE_IN_ALL
GQuark cp_attention_error_quark (void);

G_END_DECLS
