/* cp-batch-options.h
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

#define CP_TYPE_BATCH_OPTIONS (cp_batch_options_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpBatchOptions, cp_batch_options, CP, BATCH_OPTIONS, GObject)

CP_AVAILABLE_IN_ALL
CpBatchOptions *cp_batch_options_new                   (void) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
CpTensor       *cp_batch_options_get_loss_mask         (CpBatchOptions  *self);
CP_AVAILABLE_IN_ALL
void            cp_batch_options_set_loss_mask         (CpBatchOptions  *self,
                                                        CpTensor        *loss_mask);
CP_AVAILABLE_IN_ALL
CpRotateMethod  cp_batch_options_get_rotate_method     (CpBatchOptions  *self);
CP_AVAILABLE_IN_ALL
void            cp_batch_options_set_rotate_method     (CpBatchOptions  *self,
                                                        CpRotateMethod   rotate_method);
CP_AVAILABLE_IN_ALL
void            cp_batch_options_set_rotate_method_name (CpBatchOptions *self,
                                                        const char      *name);
CP_AVAILABLE_IN_ALL
void            cp_batch_options_add_extra_buffer      (CpBatchOptions  *self,
                                                        const char      *key,
                                                        int              seq_dim);
CP_AVAILABLE_IN_ALL
guint           cp_batch_options_get_n_extra_buffers   (CpBatchOptions  *self);
CP_AVAILABLE_IN_ALL
const char     *cp_batch_options_get_extra_buffer      (CpBatchOptions  *self,
                                                        guint            index,
                                                        int             *seq_dim);

G_END_DECLS
