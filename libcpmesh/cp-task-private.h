/* cp-task-private.h: the asynchronous twins of calls that wait on other ranks
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>

#include "cp-layout.h"
#include "cp-mesh.h"

G_BEGIN_DECLS

/* What one asynchronous call reads and makes.  The objects (GObjects or
 * NULL) and the layout are held until the call has ended; the results are
 * GObjects the call made, which _cp_task_finish() hands over.  @blocking
 * is the blocking twin, for the run functions calls of one shape share. */
typedef struct
{
  GCallback blocking;
  gpointer objects[6];
  gint64 values[3];
  CpLayout *layout;
  gpointer results[3];
} CpTaskArgs;

/* Runs the blocking call on @source with @args; results go to
 * @args->results. */
typedef gboolean (*CpTaskFunc) (gpointer     source,
                                CpTaskArgs  *args,
                                GError     **error);

/* Run functions of the common shapes of @args->blocking:
 *   plain:  gboolean (*) (source, GError **)
 *   tensor: CpTensor * (*) (source, objects[0], (int) values[0], GError **) */
gboolean  _cp_task_run_plain  (gpointer     source,
                               CpTaskArgs  *args,
                               GError     **error);
gboolean  _cp_task_run_tensor (gpointer     source,
                               CpTaskArgs  *args,
                               GError     **error);

/* Runs @func on this thread as a worker runs it for _cp_task_start():
 * with @cancellable current, whose cancellation wakes the waits of @mesh
 * (nullable) and fails the call and the mesh; a @cancellable cancelled
 * already breaks @mesh without running @func. */
gboolean  _cp_task_run        (gpointer       source,
                               CpMesh        *mesh,
                               const char    *what,
                               CpTaskFunc     func,
                               CpTaskArgs    *args,
                               GCancellable  *cancellable,
                               GError       **error);

/* Runs @func on a worker thread and reports to @callback in the
 * thread-default main context of the caller, as GIO's asynchronous calls
 * do.  @mesh (nullable) is the mesh the call waits on: a cancellation of
 * @cancellable wakes its waits and breaks it on every rank.  @what names
 * the call in errors ("all_gather"); @source_tag is the public _async
 * function. */
void      _cp_task_start     (gpointer             source,
                              CpMesh              *mesh,
                              const char          *what,
                              gpointer             source_tag,
                              CpTaskFunc           func,
                              const CpTaskArgs    *args,
                              GCancellable        *cancellable,
                              GAsyncReadyCallback  callback,
                              gpointer             user_data);

/* Completes a call of _cp_task_start(): FALSE with its error, or TRUE
 * and its first @n_results results, in order, in the locations that
 * follow (each a pointer to a GObject pointer; NULL drops that result).
 * Programmer errors (the result of another call) are criticals. */
gboolean  _cp_task_finish    (gpointer             source,
                              GAsyncResult        *result,
                              gpointer             source_tag,
                              GError             **error,
                              guint                n_results,
                              ...);

/* The same for a call that makes one object: it, or NULL with @error. */
gpointer  _cp_task_finish_object (gpointer         source,
                                  GAsyncResult    *result,
                                  gpointer         source_tag,
                                  GError         **error);

/* The cancellable of the asynchronous call running on this thread, or
 * NULL: blocking calls made by the program itself have none.  The mesh
 * hands it to every wait of its transports, which fail with
 * CP_MESH_ERROR_CANCELLED once it is cancelled; transports never ask for
 * it themselves. */
GCancellable *_cp_task_get_cancellable (void);

G_END_DECLS
