/* cp-attention-gemm-private.h: the matrix products of the attention kernel
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "kernels/cp-kernel-private.h"

G_BEGIN_DECLS

/* C = alpha · op(A) · op(B) + beta · C, row-major, op given by 'N' or 'T'
 * as for BLAS; inputs of @type, C float32.  float32 inputs go to oneDNN's sgemm; bfloat16 inputs go
 * to oneDNN matmul primitives (AMX or AVX512-BF16 code), created once per
 * shape and cached.  Safe from any number of threads at once: each
 * executing thread has its own stream and scratchpad. */
void      _cp_attn_gemm               (CpAttnType     type,
                                       char           transa,
                                       char           transb,
                                       gint64         m,
                                       gint64         n,
                                       gint64         k,
                                       float          alpha,
                                       gconstpointer  a,
                                       gsize          lda,
                                       gconstpointer  b,
                                       gsize          ldb,
                                       float          beta,
                                       float         *c,
                                       gsize          ldc);

/* Whether oneDNN multiplies bfloat16 in hardware on this CPU (AMX or
 * AVX512-BF16).  Elsewhere oneDNN 2.6 has no bfloat16 matmul, or only an
 * emulation slower than converting to float32 once. */
gboolean  _cp_attn_gemm_has_bfloat16  (void);

/* Tests: sends float32 products through the matmul primitives too, so
 * that the path bfloat16 takes on AMX machines is exercised anywhere. */
void      _cp_attn_gemm_force_primitives (gboolean force);

/* Tests: what the primitives and their executions did between
 * _cp_attn_gemm_audit_start() and _cp_attn_gemm_audit_stop(), both called
 * while no product runs. */
typedef struct
{
  guint primitives;          /* cached so far */
  guint user_scratchpad;     /* of those, created with a user-managed
                              * scratchpad, as oneDNN reports it */
  gsize largest_scratchpad;  /* bytes, the most any cached primitive needs */
  guint64 executions;        /* of primitives, while auditing */
  guint64 with_scratchpad;   /* executions handed a scratchpad buffer */
  guint64 shared;            /* executions that found their thread's state
                              * or scratchpad held by another one */
  guint64 short_buffers;     /* executions given less scratchpad than needed */
  guint most_in_flight;      /* executions running at the same moment */
} CpAttnGemmAudit;

void      _cp_attn_gemm_audit_start   (void);
void      _cp_attn_gemm_audit_stop    (CpAttnGemmAudit *audit);

G_END_DECLS
