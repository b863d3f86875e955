/* cp-batch-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-batch.h"

G_BEGIN_DECLS

/* The keys marked with cp_batch_set_seq_dim(), in batch order. */
GPtrArray  *_cp_batch_dup_marked_keys  (CpBatch     *self);

void        _cp_batch_set_qkv_format   (CpBatch     *self,
                                        const char  *qkv_format);

G_END_DECLS
