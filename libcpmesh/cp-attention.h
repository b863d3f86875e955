/* cp-attention.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-mesh.h"
#include "cp-tensor.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_ATTENTION_OPTIONS (cp_attention_options_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpAttentionOptions, cp_attention_options, CP, ATTENTION_OPTIONS, GObject)

CP_AVAILABLE_IN_ALL
CpAttentionOptions *cp_attention_options_new                 (void) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpAttentionOptions *cp_attention_options_copy                (const CpAttentionOptions *self) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
gboolean            cp_attention_options_get_causal          (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_causal          (CpAttentionOptions       *self,
                                                              gboolean                  causal);
CP_AVAILABLE_IN_ALL
double              cp_attention_options_get_scale           (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_scale           (CpAttentionOptions       *self,
                                                              double                    scale);
CP_AVAILABLE_IN_ALL
CpRotateMethod      cp_attention_options_get_rotate_method   (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_rotate_method   (CpAttentionOptions       *self,
                                                              CpRotateMethod            method);
CP_AVAILABLE_IN_ALL
CpLoadBalance       cp_attention_options_get_load_balance    (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_load_balance    (CpAttentionOptions       *self,
                                                              CpLoadBalance             balance);
CP_AVAILABLE_IN_ALL
int                 cp_attention_options_get_n_heads         (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
int                 cp_attention_options_get_n_kv_heads      (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_heads           (CpAttentionOptions       *self,
                                                              int                       n_heads,
                                                              int                       n_kv_heads);
CP_AVAILABLE_IN_ALL
int                 cp_attention_options_get_n_threads       (const CpAttentionOptions *self);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_n_threads       (CpAttentionOptions       *self,
                                                              int                       n_threads);
CP_AVAILABLE_IN_ALL
const gint64       *cp_attention_options_get_seq_lens        (const CpAttentionOptions *self,
                                                              gsize                    *n_seq_lens);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_seq_lens        (CpAttentionOptions       *self,
                                                              const gint64             *seq_lens,
                                                              gsize                     n_seq_lens);
CP_AVAILABLE_IN_ALL
const gint64       *cp_attention_options_get_cu_seqlens_padded (const CpAttentionOptions *self,
                                                                gsize                    *n_bounds);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_cu_seqlens_padded (CpAttentionOptions       *self,
                                                                const gint64             *cu_seqlens_padded,
                                                                gsize                     n_bounds);
CP_AVAILABLE_IN_ALL
const gint64       *cp_attention_options_get_cu_seqlens      (const CpAttentionOptions *self,
                                                              gsize                    *n_bounds);
CP_AVAILABLE_IN_ALL
void                cp_attention_options_set_cu_seqlens      (CpAttentionOptions       *self,
                                                              const gint64             *cu_seqlens,
                                                              gsize                     n_bounds);

#define CP_TYPE_ATTENTION (cp_attention_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpAttention, cp_attention, CP, ATTENTION, GObject)

CP_AVAILABLE_IN_ALL
CpAttention        *cp_attention_new                         (CpMesh                   *mesh,
                                                              const CpAttentionOptions *options,
                                                              GError                  **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpMesh             *cp_attention_get_mesh                    (CpAttention              *self);
CP_AVAILABLE_IN_ALL
CpAttentionOptions *cp_attention_dup_options                 (CpAttention              *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
int                 cp_attention_get_n_threads               (CpAttention              *self);
CP_AVAILABLE_IN_ALL
gboolean            cp_attention_forward                     (CpAttention              *self,
                                                              CpTensor                 *q,
                                                              CpTensor                 *k,
                                                              CpTensor                 *v,
                                                              CpTensor                **out,
                                                              CpTensor                **lse,
                                                              GError                  **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_attention_backward                    (CpAttention              *self,
                                                              CpTensor                 *dout,
                                                              CpTensor                 *q,
                                                              CpTensor                 *k,
                                                              CpTensor                 *v,
                                                              CpTensor                 *out,
                                                              CpTensor                 *lse,
                                                              CpTensor                **dq,
                                                              CpTensor                **dk,
                                                              CpTensor                **dv,
                                                              GError                  **error);

CP_AVAILABLE_IN_ALL
void                cp_attention_forward_async               (CpAttention              *self,
                                                              CpTensor                 *q,
                                                              CpTensor                 *k,
                                                              CpTensor                 *v,
                                                              GCancellable             *cancellable,
                                                              GAsyncReadyCallback       callback,
                                                              gpointer                  user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_attention_forward_finish              (CpAttention              *self,
                                                              GAsyncResult             *result,
                                                              CpTensor                **out,
                                                              CpTensor                **lse,
                                                              GError                  **error);
CP_AVAILABLE_IN_ALL
void                cp_attention_backward_async              (CpAttention              *self,
                                                              CpTensor                 *dout,
                                                              CpTensor                 *q,
                                                              CpTensor                 *k,
                                                              CpTensor                 *v,
                                                              CpTensor                 *out,
                                                              CpTensor                 *lse,
                                                              GCancellable             *cancellable,
                                                              GAsyncReadyCallback       callback,
                                                              gpointer                  user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_attention_backward_finish             (CpAttention              *self,
                                                              GAsyncResult             *result,
                                                              CpTensor                **dq,
                                                              CpTensor                **dk,
                                                              CpTensor                **dv,
                                                              GError                  **error);

G_END_DECLS
