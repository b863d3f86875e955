/* cp-context-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-context.h"

G_BEGIN_DECLS

/* Like cp_context_register_buffer(), with the batch key that error
 * messages name. */
void  _cp_context_register_named  (CpContext   *self,
                                   const char  *name,
                                   CpTensor    *tensor,
                                   int          seq_dim,
                                   gboolean     restore);

/* The layout prepare derived, reported by cp_context_get_layout() before
 * the first enter. */
void  _cp_context_set_layout      (CpContext   *self,
                                   CpLayout    *layout);

/* The sequence length of the batch prepare padded: enter checks that
 * every rank's is the same, since ranks whose lengths differ can still pad
 * to the same length and layout. */
void  _cp_context_set_unpadded_length (CpContext *self,
                                       gint64     length);

/* The context-parallel group of @mesh: @mesh itself when it is 1-D, its
 * "cp" dimension otherwise. */
CpMesh *_cp_context_resolve_mesh  (CpMesh      *mesh,
                                   GError     **error);

G_END_DECLS
