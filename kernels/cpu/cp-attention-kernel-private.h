/* cp-attention-kernel-private.h: the blocked attention kernel on CPU
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "kernels/cp-kernel-private.h"
#include "cp-attention-gemm-private.h"

G_BEGIN_DECLS

/* The operand types and the meaning of each function are those of
 * kernels/cp-kernel-private.h; these are the CPU entries of its table. */

void  _cp_attn_forward_block  (const CpAttnProblem *problem,
                               const CpAttnView    *q,
                               const CpAttnKeys    *keys,
                               CpAttnState         *state);

void  _cp_attn_backward_block (const CpAttnProblem *problem,
                               const CpAttnGrads   *grads,
                               const CpAttnKeys    *keys,
                               const CpAttnView    *dk,
                               const CpAttnView    *dv);

int   _cp_attn_default_threads (int ranks_in_process);

G_END_DECLS
