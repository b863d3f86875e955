/* cp-error.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-error.h"

/**
 * cp_tensor_error_quark:
 *
 * The quark of the [error@Cp.TensorError] domain.
 *
 * Returns: the error domain quark
 *
 * Since: 1.0
 */
G_DEFINE_QUARK (cp-tensor-error-quark, cp_tensor_error)

/**
 * cp_mesh_error_quark:
 *
 * The quark of the [error@Cp.MeshError] domain.
 *
 * Returns: the error domain quark
 *
 * Since: 1.0
 */
G_DEFINE_QUARK (cp-mesh-error-quark, cp_mesh_error)

/**
 * cp_batch_error_quark:
 *
 * The quark of the [error@Cp.BatchError] domain.
 *
 * Returns: the error domain quark
 *
 * Since: 1.0
 */
G_DEFINE_QUARK (cp-batch-error-quark, cp_batch_error)

/**
 * cp_attention_error_quark:
 *
 * The quark of the [error@Cp.AttentionError] domain.
 *
 * Returns: the error domain quark
 *
 * Since: 1.0
 */
G_DEFINE_QUARK (cp-attention-error-quark, cp_attention_error)
