/* cp-copy-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Bulk copies for shard, unshard and the in-process collectives.
 *
 * An operation whose destination is larger than a core's share of the
 * last-level cache copies with non-temporal (streaming) stores: its bytes
 * will not stay cached anyway, and a streaming store skips the read for
 * ownership an ordinary store pays per cache line, which is a third of
 * the memory traffic.  glibc's memcpy makes the same choice, but per
 * call, so an operation made of many mid-sized runs would never stream
 * and would run at about half the speed of one large memcpy of the same
 * bytes.  Callers therefore decide once per operation, from its total
 * size, and pass the decision to every copy. */

/* Whether an operation writing @total_bytes should stream. */
gboolean  _cp_copy_wants_streaming (gsize          total_bytes);

/* memcpy, with streaming stores when @streaming.  Regions must not
 * overlap.  Streaming stores are fenced before this returns, so the bytes
 * are visible to whichever thread synchronises with this one next. */
void      _cp_copy                 (gpointer       dst,
                                    gconstpointer  src,
                                    gsize          n,
                                    gboolean       streaming);

G_END_DECLS
