/* cp-attention-private.h: what the files of CpAttention share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * CpAttention is four files: cp-attention-options.c (the settings),
 * cp-attention-plan.c (checking a call's inputs, planning it and the
 * agreement of every rank on it), cp-attention-ring.c (the ring's
 * point-to-point transfers) and cp-attention.c (the object, buffers and
 * the calls into the kernels, which kernels/cp-kernel-private.h picks by
 * device).
 */

#pragma once

#include "cp-attention.h"
#include "cp-layout-private.h"
#include "cp-mesh-private.h"
#include "kernels/cp-kernel-private.h"

G_BEGIN_DECLS

struct _CpAttentionOptions
{
  GObject parent_instance;

  gboolean causal;
  double scale;
  CpRotateMethod rotate_method;
  CpLoadBalance balance;
  int n_heads;
  int n_kv_heads;
  int n_threads;
  GArray *seq_lens;           /* gint64, or NULL */
  GArray *cu_seqlens_padded;  /* gint64, or NULL: BSHD */
  GArray *cu_seqlens;         /* gint64, or NULL */
};

struct _CpAttention
{
  GObject parent_instance;

  CpMesh *mesh;
  CpAttentionOptions *options;
  CpLayout *thd_layout;   /* packed inputs only */
  int n_threads;
};

/* What one call computes, once its inputs are checked. */
typedef struct
{
  gboolean thd;
  CpDType dtype;
  int batch;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  gint64 local_len;
  int rank;
  int size;
  CpAttnType type;          /* what the kernel multiplies */
  CpDeviceKind device;      /* of every operand */
  const CpKernel *kernel;   /* of that device */
  CpLayout *layout;
  gint64 bshd_bounds[2];
  const gint64 *bounds;     /* document bounds: n_docs + 1 */
  guint n_docs;
  GArray *q_runs;           /* CpAttnRun */
  GArray *real_end;         /* gint64, batch × n_docs */
  CpAttnProblem problem;
  gboolean in_place;        /* the ring reads peers' K/V where it lies */
} Plan;

void      _cp_attention_plan_clear       (Plan *plan);

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Plan, _cp_attention_plan_clear)

/* Every buffer a call needs beyond the kernel's small scratch and what
 * the collectives return.  They are allocated before the ranks agree to
 * go ahead, so that a rank short of memory makes every rank fail at
 * once, before any data moves, instead of leaving its ring neighbours
 * waiting for the timeout.  Tensors, so that their memory comes from the
 * host block cache: a fresh allocation of these sizes would spend more
 * time faulting pages in than the conversions spend. */
typedef struct
{
  CpTensor *kv;          /* this rank's K and V side by side */
  CpTensor *kv_next;     /* the ring's shard arriving */
  CpTensor *kv32;        /* float32 copy of the K/V block the kernel reads */
  CpTensor *q32;         /* float32 copies of bfloat16 inputs */
  CpTensor *dout32;
  CpTensor *rows[2];     /* per query row: forward's max and sum; backward's delta */
  CpTensor *acc;         /* float32: forward's output (bfloat16 only); backward's dQ */
  CpTensor *dkv;         /* float32 dK, dV of this rank's keys */
  CpTensor *partial[3];  /* float32 dK, dV partials of other ranks' keys */
  CpTensor *results[3];  /* forward: out, lse; backward: dq, dk, dv */
} Buffers;

typedef struct
{
  CpAttnView q;
  CpAttnState state;
  CpTensor *kv32;
} Forward;

/* cp-attention-options.c */

/* Checks the packed-input settings: real lengths need padded bounds of as
 * many entries, and no document is longer than its padded slot. */
gboolean  _cp_attention_options_check   (const CpAttentionOptions  *options,
                                          GError                   **error);

/* cp-attention.c */

CpComm   *_cp_attention_get_comm         (CpAttention        *self);

/* Merges the attention of the local queries over the keys of @n_ranks
 * ranks from @first_rank, held in the K/V pack @kv, into @fwd's state. */
void      _cp_attention_forward_on       (const Plan         *plan,
                                          Forward            *fwd,
                                          CpTensor           *kv,
                                          int                 first_rank,
                                          int                 n_ranks);

/* The same for @kv_numel elements of the call's dtype at kernel address
 * @kv, which may be a peer's memory, read in place and never written. */
void      _cp_attention_forward_at       (const Plan         *plan,
                                          Forward            *fwd,
                                          gconstpointer       kv,
                                          gsize               kv_numel,
                                          int                 first_rank,
                                          int                 n_ranks);

/* Adds to @dkv the gradients of the keys of @kv, a K/V block of @n_ranks
 * ranks from @first_rank; @kv32 takes its float32 copy if the kernel
 * needs one. */
void      _cp_attention_backward_on      (const Plan         *plan,
                                          const CpAttnGrads  *grads,
                                          CpTensor           *kv,
                                          CpTensor           *kv32,
                                          int                 first_rank,
                                          int                 n_ranks,
                                          CpTensor           *dkv);

void      _cp_attention_backward_at      (const Plan         *plan,
                                          const CpAttnGrads  *grads,
                                          gconstpointer       kv,
                                          gsize               kv_numel,
                                          CpTensor           *kv32,
                                          int                 first_rank,
                                          int                 n_ranks,
                                          CpTensor           *dkv);

/* cp-attention-plan.c */

/* Checks one call's inputs and plans it; @dout, @out and @lse are NULL
 * for forward. */
gboolean  _cp_attention_plan_build       (CpAttention        *self,
                                          Plan               *plan,
                                          CpTensor           *q,
                                          CpTensor           *k,
                                          CpTensor           *v,
                                          CpTensor           *dout,
                                          CpTensor           *out,
                                          CpTensor           *lse,
                                          GError            **error);

/* Every rank all-gathers a descriptor of its call and fails, with one
 * message, when any rank's inputs are wrong (@invalid, taken) or the
 * ranks disagree. */
gboolean  _cp_attention_agree            (CpAttention        *self,
                                          const Plan         *plan,
                                          gboolean            backward,
                                          GError             *invalid,
                                          GError            **error);

/* Appends @rank's runs, cut at document bounds, numbering their rows
 * from @first_row. */
void      _cp_attention_append_rank_runs (const Plan         *plan,
                                          int                 rank,
                                          gint64              first_row,
                                          GArray             *out);

/* The shape of a query-like (@heads = H) or key-like tensor, and of lse;
 * both return the number of dimensions. */
guint     _cp_attention_operand_shape    (const Plan         *plan,
                                          int                 heads,
                                          gint64             *shape);
guint     _cp_attention_lse_shape        (const Plan         *plan,
                                          gint64             *shape);

/* cp-attention-ring.c: K/V shards travel around the ring, each transfer
 * posted before the previous shard is computed. */

/* Whether the ring reads each peer's K/V where it lies, lent for the
 * call (_cp_comm_share()), instead of passing shards on: ranks that are
 * threads of one process, or processes whose transport maps each other's
 * memory.  The same answer on every rank. */
gboolean  _cp_attention_reads_in_place   (CpAttention        *self,
                                          const Plan         *plan);

gboolean  _cp_attention_forward_ring     (CpAttention        *self,
                                          const Plan         *plan,
                                          Forward            *fwd,
                                          Buffers            *bufs,
                                          GError            **error);
gboolean  _cp_attention_backward_ring    (CpAttention        *self,
                                          const Plan         *plan,
                                          const CpAttnGrads  *grads,
                                          Buffers            *bufs,
                                          GError            **error);

G_END_DECLS
