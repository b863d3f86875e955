/* cp-types.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-version-macros.h"

G_BEGIN_DECLS

/**
 * CP_TENSOR_MAX_DIMS:
 *
 * The largest number of dimensions a [class@Cp.Tensor] can have.
 *
 * Since: 1.0
 */
#define CP_TENSOR_MAX_DIMS 8

/**
 * CpDType:
 * @CP_DTYPE_BOOL: one byte, 0 or 1
 * @CP_DTYPE_UINT8: unsigned 8-bit integer
 * @CP_DTYPE_INT32: signed 32-bit integer
 * @CP_DTYPE_INT64: signed 64-bit integer
 * @CP_DTYPE_FLOAT16: IEEE 754 half precision
 * @CP_DTYPE_BFLOAT16: bfloat16 (the upper half of a float32)
 * @CP_DTYPE_FLOAT32: IEEE 754 single precision
 * @CP_DTYPE_FLOAT64: IEEE 754 double precision
 *
 * The element type of a [class@Cp.Tensor].
 *
 * Since: 1.0
 */
typedef enum
{
  CP_DTYPE_BOOL,
  CP_DTYPE_UINT8,
  CP_DTYPE_INT32,
  CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16,
  CP_DTYPE_BFLOAT16,
  CP_DTYPE_FLOAT32,
  CP_DTYPE_FLOAT64,
} CpDType;

/**
 * CpDeviceKind:
 * @CP_DEVICE_KIND_HOST: ordinary host memory
 * @CP_DEVICE_KIND_CUDA: memory of a CUDA device
 * @CP_DEVICE_KIND_TEST: test memory, for tests: host memory that the
 *   library reaches only through its memory interface, as it would a
 *   device's.  Its address (see [method@Cp.Tensor.get_data_address]) is
 *   not readable or writable from the host: any code that dereferences
 *   it crashes at once, which is how tests prove that nothing in the
 *   library takes a host shortcut.  Move tensors in and out with
 *   [method@Cp.Tensor.to_device].
 *
 * Where the bytes of a [class@Cp.Tensor] live.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_DEVICE_KIND_HOST,
  CP_DEVICE_KIND_CUDA,
  CP_DEVICE_KIND_TEST,
} CpDeviceKind;

/**
 * CpLoadBalance:
 * @CP_LOAD_BALANCE_HEAD_TAIL: the sequence is cut into 2·C equal chunks and
 *   rank r holds chunks r and 2·C−1−r, so every rank does the same causal
 *   attention work (the default)
 * @CP_LOAD_BALANCE_CONTIGUOUS: the sequence is cut into C equal chunks and
 *   rank r holds chunk r
 *
 * How a sequence is split across the C ranks of a context-parallel group.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_LOAD_BALANCE_HEAD_TAIL,
  CP_LOAD_BALANCE_CONTIGUOUS,
} CpLoadBalance;

/**
 * CpReduceOp:
 * @CP_REDUCE_OP_SUM: element-wise sum (logical or for booleans)
 * @CP_REDUCE_OP_MAX: element-wise maximum
 * @CP_REDUCE_OP_MIN: element-wise minimum
 *
 * The reduction applied by [method@Cp.Mesh.all_reduce].
 *
 * Since: 1.0
 */
typedef enum
{
  CP_REDUCE_OP_SUM,
  CP_REDUCE_OP_MAX,
  CP_REDUCE_OP_MIN,
} CpReduceOp;

/**
 * CpRotateMethod:
 * @CP_ROTATE_METHOD_ALLGATHER: gather all K/V shards once, then compute
 * @CP_ROTATE_METHOD_ALLTOALL: pass K/V shards around the ring, one step
 *   per rank, overlapping each transfer with the previous block's compute
 *
 * How context-parallel attention moves keys and values between ranks.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_ROTATE_METHOD_ALLGATHER,
  CP_ROTATE_METHOD_ALLTOALL,
} CpRotateMethod;

CP_AVAILABLE_IN_ALL
gsize        cp_dtype_get_size     (CpDType dtype);
CP_AVAILABLE_IN_ALL
const char  *cp_dtype_get_name     (CpDType dtype);
CP_AVAILABLE_IN_ALL
gboolean     cp_dtype_is_floating  (CpDType dtype);
CP_AVAILABLE_IN_ALL
gboolean     cp_dtype_from_name    (const char *name,
                                    CpDType    *dtype);

G_END_DECLS
