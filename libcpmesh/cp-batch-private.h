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

/* The primary buffer: exactly one of input_ids and inputs_embeds, or
 * CP_BATCH_ERROR_CONFLICTING_KEYS / MISSING_KEY; @what prefixes the
 * message. */
CpTensor   *_cp_batch_get_primary      (CpBatch     *self,
                                        const char  *what,
                                        const char **key,
                                        GError     **error);

/* Sets CP_TENSOR_ERROR_SHAPE "@what: '@key' is <tensor>; it must be
 * @need" and returns FALSE. */
gboolean    _cp_batch_shape_error      (GError     **error,
                                        const char  *what,
                                        const char  *key,
                                        CpTensor    *tensor,
                                        const char  *need);

/* The layouts to_thd used, one per chunk; takes @layouts. */
void        _cp_batch_set_layouts      (CpBatch     *self,
                                        GPtrArray   *layouts);

G_END_DECLS
