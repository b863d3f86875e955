/* cp-kernel-private.h: what CpAttention asks of a device's kernels
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * CpAttention plans a call, moves K/V between ranks and merges the
 * results; the arithmetic on the operands is done by the kernels of the
 * device that holds them, reached through the table below.  CpAttention
 * never names a device's kernels: it looks the table up by the operands'
 * device kind.  The CPU kernels (kernels/cpu/) serve host memory; a CUDA
 * table would be one more file and one more line in cp-kernel.c.
 */

#pragma once

#include <glib.h>

#include "cp-types.h"

G_BEGIN_DECLS

/* The element type of Q, K, V and dout as the kernels multiply them;
 * results are always float32. */
typedef enum
{
  CP_ATTN_FLOAT32,
  CP_ATTN_BFLOAT16,
} CpAttnType;

/* The kernel works on operands addressed as [batch][head][row][d] with
 * arbitrary strides (in elements), so [B, H, S, D] tensors and packed
 * [T, H, D] tensors are both views without copies.  Q, K, V and dout are
 * float32 or bfloat16 (CpAttnProblem.type); outputs, accumulators and
 * softmax statistics are float32.  Every pointer is an address the
 * device's kernels can use. */

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

typedef struct
{
  const char *name;

  /* Merges the attention of the local queries @q over @keys into
   * @state. */
  void      (*forward_block)       (const CpAttnProblem *problem,
                                    const CpAttnView    *q,
                                    const CpAttnKeys    *keys,
                                    CpAttnState         *state);

  /* Accumulates dQ into @grads->dq and writes dK, dV of @keys (every row,
   * zeros for padding) into @dk and @dv (float32, laid out like @keys),
   * recomputing probabilities from lse. */
  void      (*backward_block)      (const CpAttnProblem *problem,
                                    const CpAttnGrads   *grads,
                                    const CpAttnKeys    *keys,
                                    const CpAttnView    *dk,
                                    const CpAttnView    *dv);

  /* Ends the forward pass: normalises @state's accumulator in place into
   * the output and writes lse ([batch][head][row]); padding rows get 0
   * and −∞. */
  void      (*finalize)            (const CpAttnProblem *problem,
                                    const CpAttnState   *state,
                                    float               *lse);

  /* delta = rowsum (dout ∘ out) of every local query row, @dout and @out
   * of element type @type and laid out alike; the softmax-gradient term
   * backward needs. */
  void      (*row_deltas)          (const CpAttnProblem *problem,
                                    CpAttnType           type,
                                    const CpAttnView    *dout,
                                    const CpAttnView    *out,
                                    float               *delta);

  /* Dtype conversion of @n elements, rounding to nearest even. */
  void      (*bfloat16_to_float32) (float               *dst,
                                    const guint16       *src,
                                    gsize                n);
  void      (*float32_to_bfloat16) (guint16             *dst,
                                    const float         *src,
                                    gsize                n);

  /* dst += src over @n float32 elements: partial gradients summed. */
  void      (*add_float32)         (float               *dst,
                                    const float         *src,
                                    gsize                n);

  /* Whether the device multiplies bfloat16 as such; elsewhere bfloat16
   * operands are converted to float32 once per call. */
  gboolean  (*multiplies_bfloat16) (void);

  /* The threads a call uses when the caller asks for 0, with
   * @ranks_in_process ranks sharing this machine. */
  int       (*default_threads)     (int ranks_in_process);
} CpKernel;

/* The kernels of @device, or %NULL when none compute there. */
const CpKernel *_cp_kernel_for_device (CpDeviceKind device);

/* The tables of each device kind, one per kernels/<device>/ folder. */
extern const CpKernel _cp_kernel_cpu;

G_END_DECLS
