/* cp-task.c: the asynchronous twins of calls that wait on other ranks
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <stdarg.h>
#include <string.h>

#include "cp-error.h"
#include "cp-mesh-private.h"
#include "cp-task-private.h"

#if defined(__SANITIZE_THREAD__)
# include <sanitizer/tsan_interface.h>
#endif

/* An asynchronous call runs its blocking twin on a worker thread and
 * reports through a GTask to the main context of its caller.
 *
 * The workers are one process-wide GThreadPool without a limit on its
 * threads.  The ranks of an in-process mesh wait for each other inside
 * their calls, so no call may wait in a queue for a free worker: the
 * calls holding every worker would wait for it until they time out.
 * GTask's own pool has ten threads and grows by one only after its tasks
 * have blocked for a while (about ten more in the first second), so the
 * last of sixteen ranks started together there would start about a
 * second late, and later still behind other blocked work of the
 * program; and the long waits of ranks would hold up the I/O GIO queues
 * there.
 * An unbounded GThreadPool starts a thread whenever none is idle and
 * keeps finished ones for the next calls, as GLib does for unused
 * threads, so a burst of ranks costs thread starts only the first time.
 *
 * Cancellation is a failure of this rank, like a timeout.  The worker
 * makes the task's cancellable this thread's current one while the call
 * runs, and the mesh hands it to every wait of its transports
 * (_cp_mesh_cancellable; cp-transport-private.h): a cancelled wait fails with
 * CP_MESH_ERROR_CANCELLED and breaks the mesh on every rank, so the peers
 * of the call fail too instead of waiting out their timeout.  A
 * cancellation wakes the waits of the transport at once.  A call whose
 * cancellable is cancelled before it begins does nothing but break the
 * mesh.  GTask's own check is off: a call that completed before the
 * cancellation keeps its result, as the ranks that completed it with it
 * do.
 *
 * ThreadSanitizer cannot see the hand-offs of GThreadPool and GMainContext
 * (GLib's futexes), so a ThreadSanitizer build tells it of them: the
 * thread that hands a call on releases it, the one that takes it over
 * acquires it (hand_off, take_over; nothing in other builds). */

typedef struct
{
  CpTaskFunc func;
  const char *what;
  CpMesh *mesh;
  CpTaskArgs args;
} Call;

static GPrivate current_cancellable = G_PRIVATE_INIT (NULL);

static void
hand_off (Call *call)
{
#if defined(__SANITIZE_THREAD__)
  __tsan_release (call);
#endif
}

static void
take_over (Call *call)
{
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire (call);
#endif
}

static void
clear_objects (gpointer *objects,
               gsize     n)
{
  for (gsize i = 0; i < n; i++)
    g_clear_object (&objects[i]);
}

static void
call_free (Call *call)
{
  take_over (call);
  clear_objects (call->args.objects, G_N_ELEMENTS (call->args.objects));
  clear_objects (call->args.results, G_N_ELEMENTS (call->args.results));
  g_clear_pointer (&call->args.layout, cp_layout_unref);
  g_clear_object (&call->mesh);
  g_free (call);
}

static Call *
call_new (CpMesh           *mesh,
          const char       *what,
          CpTaskFunc        func,
          const CpTaskArgs *args)
{
  Call *call = g_new0 (Call, 1);

  call->func = func;
  call->what = what;
  call->mesh = mesh ? g_object_ref (mesh) : NULL;
  call->args = *args;
  for (gsize i = 0; i < G_N_ELEMENTS (call->args.objects); i++)
    if (call->args.objects[i] != NULL)
      g_object_ref (call->args.objects[i]);
  if (call->args.layout != NULL)
    cp_layout_ref (call->args.layout);
  memset (call->args.results, 0, sizeof call->args.results);
  return call;
}

gboolean
_cp_task_run_plain (gpointer     source,
                    CpTaskArgs  *args,
                    GError     **error)
{
  gboolean (*blocking) (gpointer, GError **) = (gpointer) args->blocking;

  return blocking (source, error);
}

gboolean
_cp_task_run_tensor (gpointer     source,
                     CpTaskArgs  *args,
                     GError     **error)
{
  CpTensor *(*blocking) (gpointer, CpTensor *, int, GError **) = (gpointer) args->blocking;

  args->results[0] = blocking (source, args->objects[0], (int) args->values[0], error);
  return args->results[0] != NULL;
}

GCancellable *
_cp_task_get_cancellable (void)
{
  return g_private_get (&current_cancellable);
}

static void
interrupt_transport (CpTransport *transport,
                     gpointer     unused)
{
  _cp_transport_interrupt (transport);
}

static void
wake_waits (GCancellable *cancellable,
            gpointer      mesh)
{
  _cp_mesh_foreach_transport (mesh, interrupt_transport, NULL);
}

static void
note_interruptible (CpTransport *transport,
                    gpointer     any)
{
  *(gboolean *) any |= _cp_transport_can_interrupt (transport);
}

/* Whether a transport of @mesh has waits that sleep, which a
 * cancellation must wake; those that poll see it by themselves. */
static gboolean
mesh_can_interrupt (CpMesh *mesh)
{
  gboolean any = FALSE;

  _cp_mesh_foreach_transport (mesh, note_interruptible, &any);
  return any;
}

typedef struct
{
  const char *what;
  const GError *failure;
} Failure;

static void
fail_transport (CpTransport *transport,
                gpointer     data)
{
  const Failure *failure = data;

  _cp_transport_fail (transport, failure->what, failure->failure);
}

/* The call never runs: a peer may already wait in it, so the mesh breaks
 * (every transport of it) as it would had this rank been cancelled while
 * waiting, and this rank fails as every later call will, naming itself. */
static gboolean
fail_before_start (CpMesh      *mesh,
                   const char  *what,
                   GError     **error)
{
  g_autoptr(GError) failure = g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED,
                                                   "cancelled before it began");
  Failure broken = { what, failure };

  if (mesh == NULL)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED, "%s: %s", what, failure->message);
      return FALSE;
    }
  _cp_mesh_foreach_transport (mesh, fail_transport, &broken);
  g_propagate_error (error, _cp_transport_describe_failure (_cp_mesh_get_comm (mesh)->transport->rank,
                                                            what, failure));
  return FALSE;
}

gboolean
_cp_task_run (gpointer       source,
              CpMesh        *mesh,
              const char    *what,
              CpTaskFunc     func,
              CpTaskArgs    *args,
              GCancellable  *cancellable,
              GError       **error)
{
  gulong handler = 0;
  gboolean ok;

  if (g_cancellable_is_cancelled (cancellable))
    return fail_before_start (mesh, what, error);
  if (cancellable != NULL && mesh != NULL && mesh_can_interrupt (mesh))
    handler = g_cancellable_connect (cancellable, G_CALLBACK (wake_waits), mesh, NULL);
  g_private_set (&current_cancellable, cancellable);
  ok = func (source, args, error);
  g_private_set (&current_cancellable, NULL);
  /* Waits for a wake-up running in another thread: the mesh, and so its
   * transports, are still held. */
  g_cancellable_disconnect (cancellable, handler);
  return ok;
}

static void
run_call (gpointer task_data,
          gpointer unused)
{
  g_autoptr(GTask) task = task_data;
  Call *call = g_task_get_task_data (task);
  GError *error = NULL;
  gboolean ok;

  take_over (call);
  ok = _cp_task_run (g_task_get_source_object (task), call->mesh, call->what, call->func, &call->args,
                     g_task_get_cancellable (task), &error);
  hand_off (call);
  if (ok)
    g_task_return_boolean (task, TRUE);
  else
    g_task_return_error (task, error);
}

static GThreadPool *
get_workers (void)
{
  static GThreadPool *workers;

  if (g_once_init_enter (&workers))
    g_once_init_leave (&workers, g_thread_pool_new (run_call, NULL, -1, FALSE, NULL));
  return workers;
}

void
_cp_task_start (gpointer             source,
                CpMesh              *mesh,
                const char          *what,
                gpointer             source_tag,
                CpTaskFunc           func,
                const CpTaskArgs    *args,
                GCancellable        *cancellable,
                GAsyncReadyCallback  callback,
                gpointer             user_data)
{
  g_autofree char *name = g_strdup_printf ("[libcpmesh] %s", what);
  Call *call = call_new (mesh, what, func, args);
  GTask *task = g_task_new (source, cancellable, callback, user_data);

  g_task_set_source_tag (task, source_tag);
  g_task_set_name (task, name);
  g_task_set_check_cancellable (task, FALSE);
  g_task_set_task_data (task, call, (GDestroyNotify) call_free);
  hand_off (call);
  /* Never fails to take the call: when no thread can be started, it
   * waits for a worker to finish, and the mesh timeout bounds that. */
  g_thread_pool_push (get_workers (), task, NULL);
}

gboolean
_cp_task_finish (gpointer       source,
                 GAsyncResult  *result,
                 gpointer       source_tag,
                 GError       **error,
                 guint          n_results,
                 ...)
{
  Call *call;
  va_list locations;

  g_return_val_if_fail (g_task_is_valid (result, source), FALSE);
  g_return_val_if_fail (g_task_get_source_tag (G_TASK (result)) == source_tag, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  call = g_task_get_task_data (G_TASK (result));
  g_assert (n_results <= G_N_ELEMENTS (call->args.results));
  take_over (call);
  if (!g_task_propagate_boolean (G_TASK (result), error))
    return FALSE;
  va_start (locations, n_results);
  for (guint i = 0; i < n_results; i++)
    {
      gpointer *location = va_arg (locations, gpointer *);

      if (location != NULL)
        *location = g_steal_pointer (&call->args.results[i]);
    }
  va_end (locations);
  /* The worker may free the call, if it holds the last reference. */
  hand_off (call);
  return TRUE;
}

gpointer
_cp_task_finish_object (gpointer       source,
                        GAsyncResult  *result,
                        gpointer       source_tag,
                        GError       **error)
{
  gpointer object = NULL;

  _cp_task_finish (source, result, source_tag, error, 1, &object);
  return object;
}
