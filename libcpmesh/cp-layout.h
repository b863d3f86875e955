/* cp-layout.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-tensor.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_LAYOUT (cp_layout_get_type ())

typedef struct _CpLayout CpLayout;

CP_AVAILABLE_IN_ALL
GType          cp_layout_get_type             (void) G_GNUC_CONST;
CP_AVAILABLE_IN_ALL
CpLayout      *cp_layout_new                  (CpLoadBalance   balance,
                                               gint64          seq_len,
                                               int             cp_size,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpLayout      *cp_layout_new_thd              (const gint64   *cu_seqlens_padded,
                                               gsize           n_bounds,
                                               int             cp_size,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpLayout      *cp_layout_new_thd_from_tensor  (CpTensor       *cu_seqlens_padded,
                                               int             cp_size,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpLayout      *cp_layout_ref                  (CpLayout       *self);
CP_AVAILABLE_IN_ALL
void           cp_layout_unref                (CpLayout       *self);

CP_AVAILABLE_IN_ALL
CpLoadBalance  cp_layout_get_balance          (CpLayout       *self);
CP_AVAILABLE_IN_ALL
gint64         cp_layout_get_seq_len          (CpLayout       *self);
CP_AVAILABLE_IN_ALL
int            cp_layout_get_cp_size          (CpLayout       *self);
CP_AVAILABLE_IN_ALL
guint          cp_layout_get_n_documents      (CpLayout       *self);
CP_AVAILABLE_IN_ALL
gint64         cp_layout_get_local_len        (CpLayout       *self,
                                               int             rank);
CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_get_local_indices    (CpLayout       *self,
                                               int             rank) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_get_chunks           (CpLayout       *self,
                                               int             rank) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_get_restore_indices  (CpLayout       *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
double         cp_layout_get_cost             (CpLayout       *self,
                                               int             rank);
CP_AVAILABLE_IN_ALL
double         cp_layout_get_imbalance        (CpLayout       *self);
CP_AVAILABLE_IN_ALL
guint64        cp_layout_fingerprint          (CpLayout       *self);
CP_AVAILABLE_IN_ALL
char          *cp_layout_dup_fingerprint_hex  (CpLayout       *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean       cp_layout_equal                (CpLayout       *self,
                                               CpLayout       *other);
CP_AVAILABLE_IN_ALL
char          *cp_layout_to_svg               (CpLayout       *self) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_shard                (CpLayout       *self,
                                               CpTensor       *tensor,
                                               int             seq_dim,
                                               int             rank,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean       cp_layout_shard_into           (CpLayout       *self,
                                               CpTensor       *tensor,
                                               int             seq_dim,
                                               int             rank,
                                               CpTensor       *out,
                                               GError        **error);
CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_shard_backward       (CpLayout       *self,
                                               CpTensor       *grad_local,
                                               int             seq_dim,
                                               int             rank,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor      *cp_layout_unshard_pieces       (CpLayout       *self,
                                               CpTensor      **pieces,
                                               guint           n_pieces,
                                               int             seq_dim,
                                               GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean       cp_layout_unshard_pieces_into  (CpLayout       *self,
                                               CpTensor      **pieces,
                                               guint           n_pieces,
                                               int             seq_dim,
                                               CpTensor       *out,
                                               GError        **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (CpLayout, cp_layout_unref)

G_END_DECLS
