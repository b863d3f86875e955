/* cp-batch-options-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-batch-options.h"

G_BEGIN_DECLS

/* Checks the values a C caller or a configuration string may have put
 * out of range, with CP_BATCH_ERROR_INVALID_OPTION.  @self may be NULL
 * (the defaults). */
gboolean  _cp_batch_options_check  (CpBatchOptions  *self,
                                    GError         **error);

G_END_DECLS
