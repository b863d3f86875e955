/* test-task.c: the cancellation of an async call, on rank threads
 *
 * White-box: each rank runs its call on its own thread the way an async
 * call's worker runs it (_cp_task_run), without GTask, GThreadPool or a
 * main loop, whose hand-offs ThreadSanitizer cannot see.  So the
 * ThreadSanitizer stage checks what a cancellation does to the
 * transport's waits: the wake-up from the cancelling thread, the first
 * failure, and the ranks that fail with it.  test-async checks the async
 * calls themselves.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-task-private.h"
#include "cp-test-util.h"

#define RANKS 4
#define TIMEOUT_MS 30000

typedef enum { ALL_GATHER, RECV, PREPARE } Family;

typedef struct
{
  Family family;
  gboolean before;     /* cancelled before the call, else while it waits */
  const char *path;
  const char *what;
} Case;

typedef struct
{
  const Case *c;
  GCancellable *cancellable;
  int cancelled;       /* the rank whose call has the cancellable */
  int late;            /* the rank that calls once the others failed */
  int failed;          /* ranks done with the call, atomic */
  GError *errors[RANKS];
} Scene;

static gboolean
run_all_gather (gpointer     mesh,
                CpTaskArgs  *args,
                GError     **error)
{
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (mesh, args->objects[0], 0, error);

  return gathered != NULL;
}

/* Every rank waits for a message from the next one, which never sends. */
static gboolean
run_recv (gpointer     mesh,
          CpTaskArgs  *args,
          GError     **error)
{
  int next = (cp_mesh_get_rank (mesh) + 1) % cp_mesh_get_world_size (mesh);

  return cp_mesh_recv (mesh, args->objects[0], next, 5, error);
}

static gboolean
run_prepare (gpointer     batch,
             CpTaskArgs  *args,
             GError     **error)
{
  g_autoptr(CpContext) context = cp_batch_prepare (batch, args->objects[0], NULL, error);

  return context != NULL;
}

static CpTensor *
row (int length)
{
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT64, (const gint64[]) { 1, length }, 2, NULL);

  for (int i = 0; i < length; i++)
    cp_tensor_set_value (tensor, i, i);
  return cp_test_on_device (tensor);
}

/* The rank's call, as an async call's worker runs it; the cancelled rank
 * gets the cancellable. */
static gboolean
run_call (Scene   *scene,
          CpMesh  *mesh,
          GError **error)
{
  int rank = cp_mesh_get_rank (mesh);
  GCancellable *cancellable = rank == scene->cancelled ? scene->cancellable : NULL;
  g_autoptr(CpTensor) tensor = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 2, 1, NULL));
  g_autoptr(CpBatch) batch = cp_batch_new ();
  CpTaskArgs args = { .objects = { tensor } };

  switch (scene->c->family)
    {
    case ALL_GATHER:
      return _cp_task_run (mesh, mesh, "all_gather", run_all_gather, &args, cancellable, error);
    case RECV:
      return _cp_task_run (mesh, mesh, "recv", run_recv, &args, cancellable, error);
    case PREPARE:
      cp_test_batch_take (batch, "input_ids", row (7));
      cp_test_batch_take (batch, "labels", row (7));
      args.objects[0] = mesh;
      return _cp_task_run (batch, mesh, "prepare", run_prepare, &args, cancellable, error);
    default:
      g_assert_not_reached ();
    }
}

static void
rank_main (CpMesh   *mesh,
           gpointer  data)
{
  Scene *scene = data;
  int rank = cp_mesh_get_rank (mesh);

  cp_mesh_set_timeout_ms (mesh, TIMEOUT_MS * cp_test_time_factor ());
  if (rank == scene->late)
    {
      /* Cancels from a thread other than the waiting one, once the
       * others wait; calls once they all failed. */
      g_usleep (100 * G_TIME_SPAN_MILLISECOND);
      g_cancellable_cancel (scene->cancellable);
      while (g_atomic_int_get (&scene->failed) < RANKS - 1)
        g_usleep (G_TIME_SPAN_MILLISECOND);
    }
  g_assert_false (run_call (scene, mesh, &scene->errors[rank]));
  g_atomic_int_inc (&scene->failed);
}

static void
test_cancel (gconstpointer data)
{
  const Case *c = data;
  Scene scene = { c, g_cancellable_new (), c->before ? RANKS / 2 : 0, c->before ? -1 : RANKS - 1 };

  if (c->before)
    g_cancellable_cancel (scene.cancellable);
  /* Well within the timeout, or the test fails. */
  cp_test_run_group_within ("cp", RANKS, rank_main, &scene, 5000);
  for (int r = 0; r < RANKS; r++)
    {
      g_autofree char *fragment = g_strdup_printf ("rank %d was cancelled", scene.cancelled);

      g_assert_error (scene.errors[r], CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
      if (strstr (scene.errors[r]->message, fragment) == NULL)
        g_error ("rank %d: \"%s\" does not say \"%s\"", r, scene.errors[r]->message, fragment);
      if (r == scene.cancelled || r == scene.late)
        cp_test_record_error (c->family == PREPARE ? "CpBatch" : "CpMesh",
                              r == scene.cancelled ? c->what : "the call of a rank that comes after a "
                              "cancelled call broke the mesh", scene.errors[r]);
      g_clear_error (&scene.errors[r]);
    }
  g_object_unref (scene.cancellable);
}

static const Case cases[] = {
  { ALL_GATHER, TRUE, "/Cp/Task/cancel/before/all-gather",
    "a worker's all_gather whose cancellable was cancelled before it began" },
  { ALL_GATHER, FALSE, "/Cp/Task/cancel/waiting/all-gather",
    "a worker's all_gather cancelled from another thread while it waits" },
  { RECV, FALSE, "/Cp/Task/cancel/waiting/recv",
    "a worker's recv cancelled from another thread while it waits" },
  { PREPARE, FALSE, "/Cp/Task/cancel/waiting/prepare",
    "a worker's prepare cancelled from another thread while it waits" },
};

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    g_test_add_data_func (cases[i].path, &cases[i], test_cancel);

  return g_test_run ();
}
