/* cp-attention-kernel-private.h: the blocked attention kernel
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "cp-attention-gemm-private.h"

G_BEGIN_DECLS

/* The kernel works on operands addressed as [batch][head][row][d] with
 * arbitrary strides (in elements), so [B, H, S, D] tensors and packed
 * [T, H, D] tensors are both views without copies.  Q, K, V and dout are
 * float32 or bfloat16 (CpAttnProblem.type); outputs, accumulators and
 * softmax statistics are float32.  Every matrix product goes through
 * oneDNN; softmax, masking and rescaling are the kernel's own loops. */

/* Query and key tiles never cross a run: a run is a stretch of rows whose
 * global positions are consecutive and lie in one document. */
typedef struct
{
  gint64 row;      /* first row in the operand */
  gint64 pos;      /* global position of that row */
  gint64 length;
  guint doc;
} CpAttnRun;

typedef struct
{
  gpointer data;
  gsize batch_stride;
  gsize head_stride;
  gsize row_stride;
} CpAttnView;

typedef struct
{
  int batch;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  gboolean causal;
  float scale;
  int n_threads;
  CpAttnType type;      /* of Q, K, V and dout */

  /* Positions of document d of batch row b at or past
   * real_end[b * n_docs + d] are padding: never attended as keys, and as
   * queries they get no output and no gradient. */
  guint n_docs;
  const gint64 *real_end;

  /* The local queries: their runs and rows per (batch, head). */
  const CpAttnRun *q_runs;
  guint n_q_runs;
  gint64 q_rows;
} CpAttnProblem;

/* One block of keys and values (of the problem's type): the whole
 * gathered sequence, or one rank's shard during a ring step. */
typedef struct
{
  CpAttnView k;
  CpAttnView v;
  const CpAttnRun *runs;
  guint n_runs;
} CpAttnKeys;

/* The running forward state of the local queries, merged block after
 * block: an unnormalised output, and per row the running maximum and sum
 * of exponentials, so that lse = max + log (sum).  All float32; m and l
 * are laid out [batch][head][row]. */
typedef struct
{
  CpAttnView acc;
  float *m;
  float *l;
} CpAttnState;

/* What backward needs from the forward pass and the caller: q and dout
 * of the problem's type, the rest float32. */
typedef struct
{
  CpAttnView q;
  CpAttnView dout;
  const float *lse;    /* [batch][head][row] */
  const float *delta;  /* rowsum (dout ∘ out), same layout */
  CpAttnView dq;       /* accumulated into */
} CpAttnGrads;

/* Merges the attention of the local queries @q over @keys into @state. */
void  _cp_attn_forward_block  (const CpAttnProblem *problem,
                               const CpAttnView    *q,
                               const CpAttnKeys    *keys,
                               CpAttnState         *state);

/* Accumulates dQ into @grads->dq and writes dK, dV of @keys (every row,
 * zeros for padding) into @dk and @dv (float32, laid out like @keys),
 * recomputing probabilities from lse. */
void  _cp_attn_backward_block (const CpAttnProblem *problem,
                               const CpAttnGrads   *grads,
                               const CpAttnKeys    *keys,
                               const CpAttnView    *dk,
                               const CpAttnView    *dv);

/* The number of threads the kernel uses when the caller asks for 0:
 * the processors of this machine shared among @ranks_in_process ranks. */
int   _cp_attn_default_threads (int ranks_in_process);

G_END_DECLS
