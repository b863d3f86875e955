/* cp-batch.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-batch-options.h"
#include "cp-context.h"
#include "cp-layout.h"
#include "cp-mesh.h"
#include "cp-tensor.h"
#include "cp-thd-options.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_BATCH (cp_batch_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpBatch, cp_batch, CP, BATCH, GObject)

CP_AVAILABLE_IN_ALL
CpBatch            *cp_batch_new            (void) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
void                cp_batch_set            (CpBatch         *self,
                                             const char      *key,
                                             CpTensor        *tensor);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_batch_get            (CpBatch         *self,
                                             const char      *key);
CP_AVAILABLE_IN_ALL
gboolean            cp_batch_remove         (CpBatch         *self,
                                             const char      *key);
CP_AVAILABLE_IN_ALL
gboolean            cp_batch_contains       (CpBatch         *self,
                                             const char      *key);
CP_AVAILABLE_IN_ALL
const char * const *cp_batch_get_keys       (CpBatch         *self);
CP_AVAILABLE_IN_ALL
char              **cp_batch_dup_keys       (CpBatch         *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
guint               cp_batch_get_n_keys     (CpBatch         *self);
CP_AVAILABLE_IN_ALL
void                cp_batch_set_seq_dim    (CpBatch         *self,
                                             const char      *key,
                                             int              seq_dim);
CP_AVAILABLE_IN_ALL
gboolean            cp_batch_get_seq_dim    (CpBatch         *self,
                                             const char      *key,
                                             int             *seq_dim);
CP_AVAILABLE_IN_ALL
const char         *cp_batch_get_qkv_format (CpBatch         *self);
CP_AVAILABLE_IN_ALL
CpLayout           *cp_batch_get_layout     (CpBatch         *self,
                                             guint            chunk);

CP_AVAILABLE_IN_ALL
CpContext          *cp_batch_prepare        (CpBatch         *self,
                                             CpMesh          *mesh,
                                             CpBatchOptions  *options,
                                             GError         **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
void                cp_batch_prepare_async  (CpBatch             *self,
                                             CpMesh              *mesh,
                                             CpBatchOptions      *options,
                                             GCancellable        *cancellable,
                                             GAsyncReadyCallback  callback,
                                             gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpContext          *cp_batch_prepare_finish (CpBatch             *self,
                                             GAsyncResult        *result,
                                             GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpBatch            *cp_batch_to_thd         (CpBatch         *self,
                                             CpMesh          *mesh,
                                             CpThdOptions    *options,
                                             GError         **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpBatch            *cp_batch_pad_documents  (CpBatch         *self,
                                             int              cp_size,
                                             CpThdOptions    *options,
                                             GError         **error) G_GNUC_WARN_UNUSED_RESULT;

G_END_DECLS
