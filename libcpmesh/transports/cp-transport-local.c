/* cp-transport-local.c: ranks that are threads of one process
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-error.h"
#include "cp-fault-private.h"
#include "cp-memory-private.h"
#include "cp-mesh-config-private.h"
#include "cp-sync-private.h"
#include "cp-transport-private.h"

/* Ranks share an address space, so a collective is a rendezvous followed
 * by each rank copying straight out of its peers' buffers: every byte
 * moves once, like a memcpy.  A rendezvous is a generation-counted sync
 * point under one group-wide lock; the last rank to arrive advances the
 * generation and wakes the others.
 *
 * A rank that waits past its deadline at the entry of a collective marks
 * the communicator broken with the timeout error, which every rank
 * waiting there gets too, and records it as the group's first failure
 * (cp-transport-private.h): from then on every collective and message of
 * every communicator of the group fails at once, naming it, instead of
 * waiting for a round that will never complete, as a NCCL communicator
 * is aborted after a timeout.  The group lock makes the verdict one: a
 * round either completes for every rank or for none.  Once every rank
 * has entered, the rest of the round only waits for peers doing bounded
 * copies, so later sync points need no deadline and nothing breaks them.
 *
 * A rank whose transport goes away (every mesh of that rank was freed)
 * has left the group: peers waiting for it fail at once with PEER_LOST
 * instead of waiting for the timeout, and that failure breaks the group
 * as a timeout does.  So does a rank whose asynchronous call is cancelled
 * while it waits at the entry of a collective or for a message: the
 * cancellation wakes the group (interrupt), and the rank fails with
 * CANCELLED and breaks the group. */

typedef struct
{
  gatomicrefcount ref_count;
  CpMutex lock;
  CpCond cond;
  GHashTable *comms;  /* label:members → SharedComm, not owned */
  GQueue mailbox;     /* Envelope*, oldest first */
  gboolean *left;     /* per world rank: it left the group */
  GError *broken;     /* the first failure of any rank */
} LocalGroup;

typedef struct
{
  int users;          /* LocalComms using it, under the group lock */
  char *key;
  int size;
  int *members;

  guint64 generation;
  int waiting;
  gboolean *arrived;
  const CpCollective **posted;
  gpointer *scratch;
  GError *broken;
} SharedComm;

typedef struct
{
  CpTransport parent;
  LocalGroup *group;
} LocalTransport;

typedef struct
{
  CpComm parent;
  LocalGroup *group;
  SharedComm *shared;
  guint64 calls;           /* collectives started */
  guint fault_operation;   /* the running one, as fault injection counts */
  char operation[64];      /* the running one, as a first failure names it */
} LocalComm;

typedef enum { POSTED, TAKEN, DONE } EnvelopeState;

/* A posted send: the receiver copies straight from the sender's buffer. */
typedef struct
{
  SharedComm *comm;
  int src;
  int dst;
  guint64 tag;
  const CpMessage *message;
  EnvelopeState state;
  GError *error;
} Envelope;

struct _CpRequest
{
  gboolean is_send;
  Envelope *envelope;      /* sends */
  int peer;
  guint64 tag;
  CpMessage *message;
  guint fault_operation;
  GError *killed;          /* an injected fault killed the rank as it posted */
};

static LocalGroup *
group_ref (LocalGroup *group)
{
  g_atomic_ref_count_inc (&group->ref_count);
  return group;
}

static void
group_unref (LocalGroup *group)
{
  if (!g_atomic_ref_count_dec (&group->ref_count))
    return;
  g_assert (g_hash_table_size (group->comms) == 0);
  g_hash_table_unref (group->comms);
  g_free (group->left);
  g_clear_error (&group->broken);
  _cp_mutex_clear (&group->lock);
  _cp_cond_clear (&group->cond);
  g_free (group);
}

/* Peers waiting for @rank fail from now on. */
static void
leave_group (LocalGroup *group,
             int         rank)
{
  _cp_mutex_lock (&group->lock);
  group->left[rank] = TRUE;
  _cp_cond_broadcast (&group->cond);
  _cp_mutex_unlock (&group->lock);
}

static void
local_transport_free (CpTransport *transport)
{
  LocalTransport *self = (LocalTransport *) transport;

  leave_group (self->group, transport->rank);
  group_unref (self->group);
  _cp_transport_clear (transport);
  g_free (self);
}

static SharedComm *
shared_comm_new (char      *key,
                 const int *members,
                 int        n)
{
  SharedComm *shared = g_new0 (SharedComm, 1);

  shared->key = key;
  shared->size = n;
  shared->members = g_memdup2 (members, (gsize) n * sizeof (int));
  shared->arrived = g_new0 (gboolean, n);
  shared->posted = g_new0 (const CpCollective *, n);
  shared->scratch = g_new0 (gpointer, n);
  return shared;
}

static void
shared_comm_free (SharedComm *shared)
{
  g_free (shared->key);
  g_free (shared->members);
  g_free (shared->arrived);
  g_free (shared->posted);
  g_free (shared->scratch);
  g_clear_error (&shared->broken);
  g_free (shared);
}

static CpComm *
local_comm_new (CpTransport  *transport,
                const char   *label,
                const int    *members,
                int           n_members,
                int           my_index,
                GError      **error)
{
  LocalGroup *group = ((LocalTransport *) transport)->group;
  LocalComm *self = g_new0 (LocalComm, 1);
  char *key = _cp_comm_key (label, members, n_members);

  _cp_comm_init (&self->parent, transport, members, n_members, my_index);
  self->group = group_ref (group);

  _cp_mutex_lock (&group->lock);
  self->shared = g_hash_table_lookup (group->comms, key);
  if (self->shared == NULL)
    {
      self->shared = shared_comm_new (key, members, n_members);
      g_hash_table_insert (group->comms, self->shared->key, self->shared);
    }
  else
    g_free (key);
  self->shared->users++;
  _cp_mutex_unlock (&group->lock);

  return &self->parent;
}

static void
local_comm_free (CpComm *comm)
{
  LocalComm *self = (LocalComm *) comm;
  LocalGroup *group = self->group;

  _cp_mutex_lock (&group->lock);
  if (--self->shared->users == 0)
    {
      g_hash_table_remove (group->comms, self->shared->key);
      shared_comm_free (self->shared);
    }
  _cp_mutex_unlock (&group->lock);

  _cp_comm_clear (comm);
  group_unref (group);
  g_free (self);
}

static void
propagate_broken (SharedComm  *shared,
                  GError     **error)
{
  g_propagate_error (error, g_error_copy (shared->broken));
}

/* With the group lock held: records @failure, which world rank @rank
 * suffered in @operation, as the group's first failure unless it has
 * one, and wakes every rank waiting anywhere in the group. */
static void
record_failure (LocalGroup   *group,
                int           rank,
                const char   *operation,
                const GError *failure)
{
  if (group->broken == NULL)
    group->broken = _cp_transport_describe_failure (rank, operation, failure);
  _cp_cond_broadcast (&group->cond);
}

/* The same for a failure this rank suffered in its running operation. */
static void
break_group (LocalComm    *self,
             const GError *failure)
{
  record_failure (self->group, self->parent.transport->rank, self->operation, failure);
}

/* With the group lock held: fails @what when an earlier failure broke the
 * group. */
static gboolean
check_unbroken (LocalComm   *self,
                const char  *what,
                GError     **error)
{
  if (self->group->broken == NULL)
    return TRUE;
  _cp_transport_set_broken_error (error, what, self->group->broken);
  return FALSE;
}

static char *
list_missing (SharedComm *shared)
{
  GString *text = g_string_new (NULL);

  for (int i = 0; i < shared->size; i++)
    if (!shared->arrived[i])
      g_string_append_printf (text, "%s%d (mesh rank %d)", text->len ? ", " : "",
                              i, shared->members[i]);
  return g_string_free (text, FALSE);
}

static void
break_on_timeout (LocalComm  *self,
                  const char *what,
                  gint64      waited_us)
{
  SharedComm *shared = self->shared;
  g_autofree char *missing = list_missing (shared);

  g_set_error (&shared->broken, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
               "%s: rank %d waited %" G_GINT64_FORMAT " ms for communicator ranks %s, "
               "which never arrived", what, self->parent.index, waited_us / 1000, missing);
  break_group (self, shared->broken);
}

/* With the group lock held: breaks the communicator when a member that
 * has not arrived left the group. */
static gboolean
break_on_departure (LocalComm  *self,
                    const char *what)
{
  SharedComm *shared = self->shared;

  for (int i = 0; i < shared->size; i++)
    if (!shared->arrived[i] && self->group->left[shared->members[i]])
      {
        g_set_error (&shared->broken, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                     "%s: rank %d lost communicator rank %d (mesh rank %d), which left the group",
                     what, self->parent.index, i, shared->members[i]);
        break_group (self, shared->broken);
        return TRUE;
      }
  return FALSE;
}

/* With the group lock held: breaks the communicator when @cancellable,
 * the call's this rank waits in, was cancelled. */
static gboolean
break_on_cancel (LocalComm    *self,
                 const char   *what,
                 GCancellable *cancellable)
{
  SharedComm *shared = self->shared;
  g_autofree char *missing = NULL;

  if (!g_cancellable_is_cancelled (cancellable))
    return FALSE;
  missing = list_missing (shared);
  g_set_error (&shared->broken, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED,
               "%s: rank %d was cancelled while it waited for communicator ranks %s",
               what, self->parent.index, missing);
  break_group (self, shared->broken);
  return TRUE;
}

/* Waits, with the group lock held, until every rank of the communicator
 * has reached this point.  @deadline 0 waits without limit, and nothing
 * breaks such a wait: it follows the arrival, when peers may be reading
 * this rank's buffers. */
static gboolean
sync_point (LocalComm     *self,
            const char    *what,
            gint64         deadline,
            GCancellable  *cancellable,
            GError       **error)
{
  SharedComm *shared = self->shared;
  CpMutex *lock = &self->group->lock;
  CpCond *cond = &self->group->cond;
  guint64 generation = shared->generation;
  gint64 started = g_get_monotonic_time ();
  gboolean breakable = deadline != 0;

  if (breakable && !check_unbroken (self, what, error))
    return FALSE;
  if (shared->broken != NULL)
    {
      propagate_broken (shared, error);
      return FALSE;
    }
  shared->arrived[self->parent.index] = TRUE;
  if (++shared->waiting == shared->size)
    {
      shared->waiting = 0;
      memset (shared->arrived, 0, (gsize) shared->size * sizeof (gboolean));
      shared->generation++;
      _cp_cond_broadcast (cond);
      return TRUE;
    }
  while (shared->generation == generation && shared->broken == NULL &&
         !(breakable && self->group->broken != NULL))
    {
      if (break_on_departure (self, what) || (breakable && break_on_cancel (self, what, cancellable)))
        break;
      if (!breakable)
        _cp_cond_wait (cond, lock);
      else if (!_cp_cond_wait_until (cond, lock, deadline) &&
               shared->generation == generation && shared->broken == NULL)
        break_on_timeout (self, what, g_get_monotonic_time () - started);
    }
  if (shared->generation != generation)
    return TRUE;
  /* Every rank waiting here gets this round's own failure; a failure
   * elsewhere in the group is named as the first one. */
  if (shared->broken != NULL)
    propagate_broken (shared, error);
  else
    check_unbroken (self, what, error);
  return FALSE;
}

static gboolean
locked_sync (LocalComm   *self,
             const char  *what,
             gint64       deadline,
             GError     **error)
{
  gboolean ok;

  _cp_mutex_lock (&self->group->lock);
  ok = sync_point (self, what, deadline, NULL, error);
  _cp_mutex_unlock (&self->group->lock);
  return ok;
}

/* Ranks share one address space: a peer's region is read and written
 * where its address is. */
static guint8 *
send_of (const CpCollective *coll)
{
  return _cp_region_get_address (&coll->send);
}

static guint8 *
recv_of (const CpCollective *coll)
{
  return _cp_region_get_address (&coll->recv);
}

/* What one rank writes in an all-gather or all-to-all: a block from
 * every rank for every outer index. */
static gboolean
exchange_wants_streaming (LocalComm          *self,
                          const CpCollective *coll)
{
  return _cp_copy_wants_streaming (coll->outer * (gsize) self->parent.size * coll->block);
}

/* A copy that fails (device memory) fails this rank's collective only:
 * the bytes of the others are in place. */
static gboolean
run_all_gather (LocalComm     *self,
                CpCollective  *coll,
                GError       **error)
{
  int n = self->parent.size;
  gboolean streaming = exchange_wants_streaming (self, coll);

  for (int r = 0; r < n; r++)
    if (!_cp_transport_copy_2d ((guint8 *) recv_of (coll) + (gsize) r * coll->block, coll->device,
                                (gsize) n * coll->block, send_of (self->shared->posted[r]),
                                coll->device, coll->block, coll->block, coll->outer, streaming,
                                error))
      return FALSE;
  return TRUE;
}

static gboolean
run_all_to_all (LocalComm     *self,
                CpCollective  *coll,
                GError       **error)
{
  int n = self->parent.size;
  gsize me = (gsize) self->parent.index;
  gboolean streaming = exchange_wants_streaming (self, coll);

  for (int r = 0; r < n; r++)
    if (!_cp_transport_copy_2d ((guint8 *) recv_of (coll) + (gsize) r * coll->block, coll->device,
                                (gsize) n * coll->block,
                                (const guint8 *) send_of (self->shared->posted[r]) + me * coll->block,
                                coll->device, (gsize) n * coll->block, coll->block, coll->outer,
                                streaming, error))
      return FALSE;
  return TRUE;
}

static gboolean
run_broadcast (LocalComm     *self,
               CpCollective  *coll,
               GError       **error)
{
  const CpCollective *root = self->shared->posted[coll->root];

  gsize nbytes = coll->count * cp_dtype_get_size (coll->dtype);

  if (self->parent.index == coll->root)
    return TRUE;
  return _cp_transport_copy_2d (recv_of (coll), coll->device, nbytes, recv_of (root), coll->device, nbytes,
                                nbytes, 1, _cp_copy_wants_streaming (nbytes), error);
}

/* Rank i reduces slice i of every buffer into scratch, then every rank
 * copies all reduced slices into its own buffer.  The reduction order is
 * rank order, so every rank ends with identical bits. */
typedef struct
{
  guint8 *data;
  gsize size;
} Scratch;

static void
slice_bounds (LocalComm          *self,
              const CpCollective *coll,
              int                 r,
              gsize              *lo,
              gsize              *hi)
{
  *lo = _cp_collective_slice_start (coll, self->parent.size, r);
  *hi = _cp_collective_slice_start (coll, self->parent.size, r + 1);
}

/* Allocated before the rendezvous: a rank that cannot allocate fails the
 * collective on every rank, through its descriptor, before any data
 * moves. */
static gboolean
alloc_scratch (LocalComm    *self,
               CpCollective *coll,
               Scratch      *scratch)
{
  gsize lo, hi;

  if (coll->kind != CP_COLL_ALL_REDUCE || coll->invalid != NULL)
    return TRUE;
  slice_bounds (self, coll, self->parent.index, &lo, &hi);
  scratch->size = MAX (hi - lo, 1) * cp_dtype_get_size (coll->dtype);
  scratch->data = _cp_host_alloc (scratch->size, FALSE, &coll->invalid);
  return scratch->data != NULL;
}

/* Device memory the host cannot read: every rank's slice [@lo, @hi) is
 * brought to the host first, then reduced there. */
static gboolean
reduce_staged (LocalComm     *self,
               CpCollective  *coll,
               Scratch       *scratch,
               gsize          lo,
               gsize          hi,
               GError       **error)
{
  int n = self->parent.size;
  gsize elsize = cp_dtype_get_size (coll->dtype);
  gsize width = (hi - lo) * elsize;
  g_autofree guint8 *staging = g_malloc (MAX ((gsize) n * width, 1));
  g_autofree gconstpointer *srcs = g_new (gconstpointer, n);

  for (int r = 0; r < n; r++)
    {
      if (!_cp_transport_copy_2d (staging + (gsize) r * width, CP_DEVICE_KIND_HOST, 0,
                                  (const guint8 *) recv_of (self->shared->posted[r]) + lo * elsize,
                                  coll->device, 0, width, 1, FALSE, error))
        return FALSE;
      srcs[r] = staging + (gsize) r * width;
    }
  _cp_reduce_many (coll->dtype, coll->op, scratch->data, srcs, n, 0, hi - lo);
  return TRUE;
}

/* Every rank passes both sync points, also when one of its copies
 * failed: its peers read its scratch in between. */
static gboolean
run_all_reduce (LocalComm     *self,
                CpCollective  *coll,
                Scratch       *scratch,
                GError       **error)
{
  SharedComm *shared = self->shared;
  int n = self->parent.size;
  int me = self->parent.index;
  gsize elsize = cp_dtype_get_size (coll->dtype);
  gsize lo, hi;
  g_autofree gconstpointer *srcs = g_new (gconstpointer, n);
  gboolean ok = TRUE;

  slice_bounds (self, coll, me, &lo, &hi);
  if (coll->device == CP_DEVICE_KIND_HOST)
    {
      for (int r = 0; r < n; r++)
        srcs[r] = recv_of (shared->posted[r]);
      _cp_reduce_many (coll->dtype, coll->op, scratch->data, srcs, n, lo, hi - lo);
    }
  else
    ok = reduce_staged (self, coll, scratch, lo, hi, error);
  shared->scratch[me] = scratch->data;

  locked_sync (self, "all_reduce", 0, NULL);
  for (int r = 0; ok && r < n; r++)
    {
      gsize rlo, rhi;

      slice_bounds (self, coll, r, &rlo, &rhi);
      ok = _cp_transport_copy_2d ((guint8 *) recv_of (coll) + rlo * elsize, coll->device, 0,
                                  shared->scratch[r], CP_DEVICE_KIND_HOST, 0, (rhi - rlo) * elsize,
                                  1, FALSE, error);
    }
  locked_sync (self, "all_reduce", 0, NULL);
  shared->scratch[me] = NULL;
  return ok;
}

static gboolean
run_agreed (LocalComm     *self,
            CpCollective  *coll,
            Scratch       *scratch,
            GError       **error)
{
  switch (coll->kind)
    {
    case CP_COLL_BARRIER:
      return TRUE;
    case CP_COLL_ALL_GATHER:
      return run_all_gather (self, coll, error);
    case CP_COLL_ALL_TO_ALL:
      return run_all_to_all (self, coll, error);
    case CP_COLL_ALL_REDUCE:
      return run_all_reduce (self, coll, scratch, error);
    case CP_COLL_BROADCAST:
      return run_broadcast (self, coll, error);
    default:
      g_assert_not_reached ();
    }
}

/* An injected fault that keeps this rank from arriving: it waits, as its
 * peers do, until the communicator breaks or its own deadline passes. */
static gboolean
wait_without_arriving (LocalComm     *self,
                       const char    *what,
                       gint64         deadline,
                       GCancellable  *cancellable,
                       GError       **error)
{
  SharedComm *shared = self->shared;
  gint64 started = g_get_monotonic_time ();

  _cp_mutex_lock (&self->group->lock);
  while (shared->broken == NULL && self->group->broken == NULL && !break_on_cancel (self, what, cancellable) &&
         _cp_cond_wait_until (&self->group->cond, &self->group->lock, deadline))
    ;
  if (shared->broken == NULL && self->group->broken == NULL)
    break_on_timeout (self, what, g_get_monotonic_time () - started);
  if (shared->broken != NULL)
    propagate_broken (shared, error);
  else
    check_unbroken (self, what, error);
  _cp_mutex_unlock (&self->group->lock);
  return FALSE;
}

/* The fault the armed one makes this rank suffer at @step of its running
 * operation, after waiting out a delay. */
static CpFaultKind
strike (LocalComm   *self,
        guint        operation,
        CpFaultStep  step)
{
  guint delay_ms = 0;
  CpFaultKind fault = _cp_fault_strike ("local", self->parent.transport->rank, operation, step,
                                        &delay_ms);

  if (fault == CP_FAULT_DELAY)
    g_usleep ((gulong) delay_ms * G_TIME_SPAN_MILLISECOND);
  return fault;
}

/* Starts an operation as fault injection counts them. */
static guint
begin_fault_operation (LocalComm *self)
{
  return _cp_fault_begin_operation ("local", self->parent.transport->rank);
}

/* A rank told to die leaves its group, failing @what. */
static void
die (LocalComm   *self,
     const char  *what,
     GError     **error)
{
  leave_group (self->group, self->parent.transport->rank);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
               "%s: rank %d was killed by an injected fault", what, self->parent.index);
}

/* The faults an in-process rank can suffer at its arrival; FALSE when
 * the rank does not take part in the collective after all. */
static gboolean
suffer_fault (LocalComm     *self,
              const char    *what,
              gint64         deadline,
              GCancellable  *cancellable,
              GError       **error)
{
  switch (strike (self, self->fault_operation, CP_FAULT_STEP_DESCRIPTOR))
    {
    case CP_FAULT_NONE:
    case CP_FAULT_DELAY:
    case CP_FAULT_TRUNCATE: /* nothing crosses a wire here */
      return TRUE;
    case CP_FAULT_DROP:
      return wait_without_arriving (self, what, deadline, cancellable, error);
    case CP_FAULT_KILL:
      die (self, what, error);
      return FALSE;
    default:
      g_assert_not_reached ();
    }
}

/* The bytes a collective writes into on this rank, and reads from. */
static gsize
recv_bytes (const CpCollective *coll,
            int                 n)
{
  switch (coll->kind)
    {
    case CP_COLL_ALL_GATHER:
    case CP_COLL_ALL_TO_ALL:
      return coll->outer * (gsize) n * coll->block;
    case CP_COLL_ALL_REDUCE:
    case CP_COLL_BROADCAST:
      return coll->count * cp_dtype_get_size (coll->dtype);
    default:
      return 0;
    }
}

static gsize
send_bytes (const CpCollective *coll,
            int                 n)
{
  if (coll->kind == CP_COLL_ALL_GATHER)
    return coll->outer * coll->block;
  return coll->kind == CP_COLL_ALL_TO_ALL ? coll->outer * (gsize) n * coll->block : 0;
}

static gboolean
ranges_overlap (gconstpointer a,
                gsize         a_size,
                gconstpointer b,
                gsize         b_size)
{
  const guint8 *a0 = a, *b0 = b;

  return a_size > 0 && b_size > 0 && a0 < b0 + b_size && b0 < a0 + a_size;
}

/* Ranks that are threads of one process can hand one collective the same
 * memory — one tensor object passed by every rank, or views of one
 * storage — and would then write where a peer reads.  Every rank sees
 * every descriptor, so all of them refuse alike. */
static gboolean
check_buffers_apart (const CpCollective **posted,
                     int                    n,
                     GError               **error)
{
  for (int r = 0; r < n; r++)
    for (int s = 0; s < n; s++)
      {
        gsize written = recv_bytes (posted[r], n);

        if (r == s)
          continue;
        if ((s > r && ranges_overlap (recv_of (posted[r]), written, recv_of (posted[s]), recv_bytes (posted[s], n)))
            || ranges_overlap (recv_of (posted[r]), written, send_of (posted[s]), send_bytes (posted[s], n)))
          {
            g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE,
                         "%s: communicator ranks %d and %d passed overlapping memory (one tensor "
                         "object, or views of one storage); rank %d would write where rank %d "
                         "reads: give each rank a tensor of its own",
                         _cp_collective_name (posted[r]->kind), MIN (r, s), MAX (r, s), r, s);
            return FALSE;
          }
      }
  return TRUE;
}

static gboolean
local_collective (CpComm        *comm,
                  CpCollective  *coll,
                  gint64         deadline,
                  GCancellable  *cancellable,
                  GError       **error)
{
  LocalComm *self = (LocalComm *) comm;
  const char *what = _cp_collective_name (coll->kind);
  Scratch scratch = { NULL, 0 };
  gboolean agreed;

  _cp_collective_label (self->operation, sizeof self->operation, coll->kind, ++self->calls);
  self->fault_operation = begin_fault_operation (self);
  if (!suffer_fault (self, what, deadline, cancellable, error))
    return FALSE;
  alloc_scratch (self, coll, &scratch);
  _cp_mutex_lock (&self->group->lock);
  self->shared->posted[comm->index] = coll;
  if (!sync_point (self, what, deadline, cancellable, error))
    {
      _cp_mutex_unlock (&self->group->lock);
      _cp_host_free (scratch.data, scratch.size);
      return FALSE;
    }
  _cp_mutex_unlock (&self->group->lock);

  /* Every rank reaches the same verdict from the same descriptors, so all
   * of them take the same path through the sync points below. */
  agreed = _cp_collective_check_agreement (self->shared->posted, comm->size, comm->transport->rank, error)
           && check_buffers_apart (self->shared->posted, comm->size, error);
  strike (self, self->fault_operation, CP_FAULT_STEP_DATA);
  if (agreed)
    agreed = run_agreed (self, coll, &scratch, error);
  /* Nobody leaves while a peer may still read its buffers. */
  locked_sync (self, what, 0, NULL);
  _cp_host_free (scratch.data, scratch.size);
  return agreed;
}

static CpRequest *
local_isend (CpComm          *comm,
             int              peer,
             guint64          tag,
             const CpMessage *message)
{
  LocalComm *self = (LocalComm *) comm;
  CpRequest *request = g_new0 (CpRequest, 1);
  Envelope *envelope = g_new0 (Envelope, 1);
  CpFaultKind fault;

  envelope->comm = self->shared;
  envelope->src = comm->index;
  envelope->dst = peer;
  envelope->tag = tag;
  envelope->message = message;
  envelope->state = POSTED;
  request->is_send = TRUE;
  request->envelope = envelope;
  request->peer = peer;
  request->tag = tag;

  request->fault_operation = begin_fault_operation (self);
  fault = strike (self, request->fault_operation, CP_FAULT_STEP_DESCRIPTOR);
  if (fault == CP_FAULT_KILL)
    die (self, "send", &request->killed);
  /* A dropped message is one that never reaches the mailbox. */
  if (fault == CP_FAULT_KILL || fault == CP_FAULT_DROP)
    return request;
  _cp_mutex_lock (&self->group->lock);
  g_queue_push_tail (&self->group->mailbox, envelope);
  _cp_cond_broadcast (&self->group->cond);
  _cp_mutex_unlock (&self->group->lock);
  return request;
}

static CpRequest *
local_irecv (CpComm    *comm,
             int        peer,
             guint64    tag,
             CpMessage *message)
{
  LocalComm *self = (LocalComm *) comm;
  CpRequest *request = g_new0 (CpRequest, 1);

  request->peer = peer;
  request->tag = tag;
  request->message = message;
  request->fault_operation = begin_fault_operation (self);
  if (strike (self, request->fault_operation, CP_FAULT_STEP_DESCRIPTOR) == CP_FAULT_KILL)
    die (self, "recv", &request->killed);
  return request;
}

/* With the group lock held. */
static gboolean
peer_left (LocalComm *self,
           int        peer)
{
  return self->group->left[self->parent.members[peer]];
}

/* With the group lock held: whether a message may still go through, as
 * far as this rank waits for it. */
static gboolean
still_deliverable (LocalComm    *self,
                   int           peer,
                   gboolean      timed_out,
                   GCancellable *cancellable)
{
  return !timed_out && !peer_left (self, peer) && !g_cancellable_is_cancelled (cancellable);
}

/* With the group lock held: PEER_LOST when @peer left the group,
 * CANCELLED when @cancellable, this rank's call's, was, TIMED_OUT
 * otherwise. */
static void
set_undelivered (LocalComm     *self,
                 GCancellable  *cancellable,
                 GError       **error,
                 int            src,
                 int            dst,
                 guint64        tag)
{
  int peer = src == self->parent.index ? dst : src;

  if (peer_left (self, peer))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                 "rank %d lost rank %d, which left the group, before its message from rank %d "
                 "to rank %d (tag %" G_GUINT64_FORMAT ") went through",
                 self->parent.index, peer, src, dst, tag);
  else if (g_cancellable_is_cancelled (cancellable))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED,
                 "rank %d was cancelled before the message from rank %d to rank %d (tag %"
                 G_GUINT64_FORMAT ") went through", self->parent.index, src, dst, tag);
  else
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                 "the message from rank %d to rank %d (tag %" G_GUINT64_FORMAT
                 ") did not go through in time", src, dst, tag);
}

/* With the group lock held: a message that did not go through fails
 * @error and breaks the group. */
static void
fail_undelivered (LocalComm     *self,
                  GCancellable  *cancellable,
                  GError       **error,
                  int            src,
                  int            dst,
                  guint64        tag)
{
  GError *failure = NULL;

  set_undelivered (self, cancellable, &failure, src, dst, tag);
  break_group (self, failure);
  g_propagate_error (error, failure);
}

static gboolean
wait_send (LocalComm     *self,
           Envelope      *envelope,
           gint64         deadline,
           GCancellable  *cancellable,
           GError       **error)
{
  LocalGroup *group = self->group;
  gboolean timed_out = FALSE;
  gboolean ok = TRUE;

  _cp_mutex_lock (&group->lock);
  while (ok && envelope->state != DONE)
    {
      /* Once taken, the receiver is copying: that ends without a deadline. */
      if (envelope->state == TAKEN)
        _cp_cond_wait (&group->cond, &group->lock);
      else if (!check_unbroken (self, "send", error))
        ok = FALSE;
      else if (!still_deliverable (self, envelope->dst, timed_out, cancellable))
        {
          fail_undelivered (self, cancellable, error, envelope->src, envelope->dst, envelope->tag);
          ok = FALSE;
        }
      else
        timed_out = !_cp_cond_wait_until (&group->cond, &group->lock, deadline);
    }
  if (!ok)
    g_queue_remove (&group->mailbox, envelope);
  _cp_mutex_unlock (&group->lock);
  if (ok && envelope->error != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&envelope->error));
      ok = FALSE;
    }
  g_free (envelope);
  return ok;
}

static Envelope *
take_envelope (LocalComm *self,
               int        peer,
               guint64    tag)
{
  for (GList *l = self->group->mailbox.head; l != NULL; l = l->next)
    {
      Envelope *envelope = l->data;

      if (envelope->comm == self->shared && envelope->dst == self->parent.index &&
          envelope->src == peer && envelope->tag == tag)
        {
          g_queue_delete_link (&self->group->mailbox, l);
          envelope->state = TAKEN;
          return envelope;
        }
    }
  return NULL;
}

static void
set_mismatch (GError         **error,
              const Envelope  *envelope,
              const CpMessage *expected)
{
  _cp_message_set_mismatch (error, envelope->message, envelope->src, envelope->tag, envelope->dst,
                            expected);
}

/* With the group lock held: takes the message @request waits for, or
 * fails. */
static Envelope *
await_envelope (LocalComm     *self,
                CpRequest     *request,
                gint64         deadline,
                GCancellable  *cancellable,
                GError       **error)
{
  Envelope *envelope = NULL;
  gboolean timed_out = FALSE;

  while (check_unbroken (self, "recv", error) &&
         (envelope = take_envelope (self, request->peer, request->tag)) == NULL)
    {
      if (!still_deliverable (self, request->peer, timed_out, cancellable))
        {
          fail_undelivered (self, cancellable, error, request->peer, self->parent.index,
                            request->tag);
          break;
        }
      timed_out = !_cp_cond_wait_until (&self->group->cond, &self->group->lock, deadline);
    }
  return envelope;
}

static gboolean
wait_recv (LocalComm     *self,
           CpRequest     *request,
           gint64         deadline,
           GCancellable  *cancellable,
           GError       **error)
{
  LocalGroup *group = self->group;
  Envelope *envelope;
  gboolean ok = TRUE;

  _cp_mutex_lock (&group->lock);
  envelope = await_envelope (self, request, deadline, cancellable, error);
  _cp_mutex_unlock (&group->lock);
  if (envelope == NULL)
    return FALSE;

  /* Late with the copy: the sender waits, as it does for any copy. */
  strike (self, request->fault_operation, CP_FAULT_STEP_DATA);
  if (_cp_message_matches (envelope->message, request->message))
    ok = _cp_transport_copy_2d (_cp_region_get_address (&request->message->data),
                                request->message->data.device, 0,
                                _cp_region_get_address (&envelope->message->data),
                                envelope->message->data.device, 0,
                                envelope->message->nbytes, 1,
                                _cp_copy_wants_streaming (envelope->message->nbytes), error);
  else
    {
      set_mismatch (&envelope->error, envelope, request->message);
      set_mismatch (error, envelope, request->message);
      ok = FALSE;
    }

  _cp_mutex_lock (&group->lock);
  envelope->state = DONE;
  _cp_cond_broadcast (&group->cond);
  _cp_mutex_unlock (&group->lock);
  return ok;
}

static gboolean
local_wait (CpComm        *comm,
            CpRequest     *request,
            gint64         deadline,
            GCancellable  *cancellable,
            GError       **error)
{
  LocalComm *self = (LocalComm *) comm;
  gboolean ok;

  _cp_message_label (self->operation, sizeof self->operation, request->is_send, request->peer,
                     request->tag);
  if (request->killed != NULL)
    {
      g_propagate_error (error, request->killed);
      if (request->is_send)
        g_free (request->envelope);
      ok = FALSE;
    }
  else if (request->is_send)
    ok = wait_send (self, request->envelope, deadline, cancellable, error);
  else
    ok = wait_recv (self, request, deadline, cancellable, error);
  g_free (request);
  return ok;
}

/* From any thread: the waits of every rank of the group look again at
 * what they wait for, and at their cancellables. */
static void
local_interrupt (CpTransport *transport)
{
  LocalGroup *group = ((LocalTransport *) transport)->group;

  _cp_mutex_lock (&group->lock);
  _cp_cond_broadcast (&group->cond);
  _cp_mutex_unlock (&group->lock);
}

static void
local_fail (CpTransport  *transport,
            const char   *operation,
            const GError *failure)
{
  LocalGroup *group = ((LocalTransport *) transport)->group;

  _cp_mutex_lock (&group->lock);
  record_failure (group, transport->rank, operation, failure);
  _cp_mutex_unlock (&group->lock);
}

static const CpTransportOps local_ops = {
  .name = "local",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST) | CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_TEST),
  .caps = CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE,
  .transport_free = local_transport_free,
  .comm_new = local_comm_new,
  .comm_free = local_comm_free,
  .collective = local_collective,
  .isend = local_isend,
  .irecv = local_irecv,
  .wait = local_wait,
  .interrupt = local_interrupt,
  .fail = local_fail,
};

CpTransport **
_cp_transport_local_new_group (int world_size)
{
  LocalGroup *group = g_new0 (LocalGroup, 1);
  CpTransport **transports = g_new0 (CpTransport *, world_size);

  g_atomic_ref_count_init (&group->ref_count);
  _cp_mutex_init (&group->lock);
  _cp_cond_init (&group->cond);
  group->comms = g_hash_table_new (g_str_hash, g_str_equal);
  g_queue_init (&group->mailbox);
  group->left = g_new0 (gboolean, world_size);

  for (int r = 0; r < world_size; r++)
    {
      LocalTransport *transport = g_new0 (LocalTransport, 1);

      _cp_transport_init (&transport->parent, &local_ops, r, world_size);
      transport->group = group_ref (group);
      transports[r] = &transport->parent;
    }
  group_unref (group);
  return transports;
}

/* Processes cannot share this backend's memory: as a backend that
 * connects processes, it makes the mesh of a lone process. */
CpTransport *
_cp_transport_local_connect (const CpMeshConfig  *config,
                             GCancellable        *cancellable,
                             GError             **error)
{
  g_autofree CpTransport **transports = NULL;

  if (config->world_size != 1)
    {
      g_autofree char *built = _cp_transport_backend_list ();

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "rank %d of %d: transport \"local\" joins the threads of one process, "
                   "not %d processes; this libcpmesh has %s (rebuild with -Ducx=enabled "
                   "for processes)", config->rank, config->world_size, config->world_size, built);
      return NULL;
    }
  transports = _cp_transport_local_new_group (1);
  return transports[0];
}
