/* cp-transport-shm.c: ranks that are processes of one host, reading each
 * other's memory
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "cp-bootstrap-private.h"
#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-fault-private.h"
#include "cp-memory-private.h"
#include "cp-mesh-config-private.h"
#include "cp-shm-private.h"
#include "cp-region-private.h"
#include "cp-transport-private.h"

/* Ranks that share a host (one kernel boot, one PID, network and user
 * namespace, one uid) move bytes with process_vm_readv: a rank copies
 * what it needs straight out of the owner's buffer into its own, once,
 * as Open MPI's shared-memory transport does with CMA.  Every copy is a
 * pull into the reader's own memory; the addresses peers post are only
 * ever read from, so no rank can make another write anywhere but into
 * the buffers it passed itself.
 *
 * Ranks meet through the bootstrap (cp-bootstrap.c), whose blobs say
 * where each rank runs and name an abstract Unix socket it listens on.
 * Rank 0 then creates the control segment, a sealed memfd, and hands it
 * to every other rank over that socket with SCM_RIGHTS; a rank takes it
 * only from the process rank 0's authenticated blob names (SO_PEERCRED),
 * drops anyone else who connects, and checks the seals and the size
 * before it maps it.  Every rank opens a pidfd for every peer (or, where
 * the kernel has none, watches /proc), so that a dead peer is noticed
 * within one round of waiting.
 *
 * The control segment holds, for every communicator, a 64-bit ticket:
 * the number of arrivals at its sync points since it was created, and a
 * broken bit.  The s-th sync point of a communicator of n members
 * completes when the ticket reaches (s + 1)·n.  Arriving is a CAS that
 * the broken bit refuses; giving up (deadline, dead peer, cancellation,
 * the mesh broken elsewhere) is a CAS that sets the broken bit unless the
 * ticket has reached the target already, in which case the sync point
 * completed after all.  Both decisions are made on one word, so a sync
 * point completes for every member or for none: the verdict rule that
 * the in-process backend gets from its group lock.  A rank whose own
 * failure broke a sync point writes it into its failure record and names
 * itself in the segment's header (the first one to do so wins), so every
 * rank names the same first failure.
 *
 * A collective is: post this rank's descriptor (geometry and buffer
 * addresses) in the communicator's table, sync, check agreement, pull,
 * sync — the second sync keeps every rank's buffers in place while peers
 * read them.  All-reduce is a reduce-scatter, each rank reducing its
 * slice of every peer's buffer in chunks and in buffer order with
 * _cp_reduce_many (the bits of every other backend) into scratch, a
 * sync, an all-gather of the reduced slices and the final sync; small
 * ones reduce the whole buffer on every rank instead.  The in-place calls
 * (all-reduce, broadcast) write the caller's tensor only after the final
 * sync, so that a failed call leaves it as it was.  Point-to-point
 * messages are envelopes in a ring per ordered pair of ranks whose state
 * word decides, by CAS, whether a message went through, for both sides.
 * doc/mesh-shm.md has the layout and the reasons. */

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define SEGMENT_MAGIC G_GUINT64_CONSTANT (0x314d48535f504350)  /* "PCP_SHM1" */
#define SEGMENT_VERSION 1
#define N_COMM_SLOTS 64
#define RING_SIZE 16
#define TEXT_MAX 1024
#define DOMAIN_MAX 64
#define SESSION_SIZE 16
#define BROKEN_BIT (G_GUINT64_CONSTANT (1) << 63)
#define PROBE_MAGIC G_GUINT64_CONSTANT (0x43504d4553485052)
/* Rounds of sched_yield before a wait sleeps on a futex; every sleep is
 * short, so a peer's death or this rank's cancellation is seen soon.
 * Yielding hands the core to a runnable peer where ranks outnumber
 * cores, so a longer spin costs them nothing; with a core each, 512
 * rounds (some hundred microseconds) spare the futex's wake-up latency
 * at most sync points of a 1 MiB collective (4.3 → 5.1 GB/s bus
 * bandwidth for 2 processes' all_gather; 4 processes unchanged). */
#define SPIN_ROUNDS 512
#define SLEEP_MAX_US 5000
#define IOV_BATCH 512
#define DEFAULT_CHUNK (256 << 10)
#define DEFAULT_DIRECT (64 << 10)
#define CONNECT_KEY "cpmesh-shm-connect"

/* ---- the control segment ---- */

typedef struct
{
  guint64 magic;
  guint32 version;
  guint32 world_size;
  guint8 session[SESSION_SIZE];
  guint64 broken;          /* 0, or BROKEN_BIT | the world rank whose failure came first */
} SegmentHeader;

/* An error as it crosses between processes. */
typedef struct
{
  gint32 code;
  char domain[DOMAIN_MAX];
  char message[TEXT_MAX];
} Failure;

typedef struct
{
  guint32 pid;
  guint32 ready;           /* pid and probe_address written */
  guint32 left;            /* the rank freed its transport */
  guint32 bell;            /* futex: point-to-point news for this rank */
  guint64 probe_address;   /* a word holding PROBE_MAGIC ^ pid */
  Failure failure;         /* written before the rank names itself in the header */
} RankSlot;

typedef struct
{
  guint64 hash;            /* 0: free */
  guint32 ready;           /* digest written */
  guint32 bell;            /* futex: rung at every arrival and break */
  guint64 ticket;
  guint8 digest[32];       /* SHA-256 of the communicator's key */
} CommSlot;

typedef struct
{
  guint32 kind;
  guint32 dtype;
  guint32 n_dims;
  guint32 device;
  gint64 shape[CP_TENSOR_MAX_DIMS];
  gint32 dim;
  gint32 root;
  gint32 op;
  gint32 has_invalid;
  guint64 send;
  guint64 recv;
  guint64 scratch;         /* all-reduce: where its reduced slice lies */
  guint64 direct;          /* its CPMESH_SHM_DIRECT, which picks the algorithm */
  Failure invalid;
} Descriptor;

typedef struct
{
  guint32 dtype;
  guint32 n_dims;
  guint64 nbytes;
  gint64 shape[CP_TENSOR_MAX_DIMS];
} WireMessage;

/* EMPTY → POSTED (sender) → TAKEN (receiver) → DONE or MISMATCH
 * (receiver) → EMPTY (sender).  A sender that gives up turns POSTED back
 * into EMPTY (not delivered) or TAKEN into ABANDONED (the receiver then
 * fails and empties it); a receiver that cannot read the bytes turns
 * TAKEN into FAILED (the sender fails and empties it). */
enum { EMPTY, POSTED, TAKEN, DONE, MISMATCH, ABANDONED, FAILED };

typedef struct
{
  guint32 state;
  guint32 comm;            /* the communicator's slot */
  guint64 tag;
  guint64 sequence;        /* per ordered pair: messages of one tag go in order */
  guint64 address;         /* the sender's buffer */
  WireMessage sent;
  WireMessage expected;    /* what the receiver wanted, when MISMATCH */
} Envelope;

typedef struct
{
  gsize ranks;
  gsize comms;
  gsize arrivals;          /* [N_COMM_SLOTS][world]: sync points each member arrived at */
  gsize descriptors;       /* [N_COMM_SLOTS][2][world] */
  gsize envelopes;         /* [world][world][RING_SIZE] */
  gsize size;
} Layout;

static gsize
round_up (gsize size)
{
  return (size + 63) / 64 * 64;
}

static Layout
layout_for (int world)
{
  Layout layout;
  gsize w = (gsize) world;

  layout.ranks = round_up (sizeof (SegmentHeader));
  layout.comms = layout.ranks + round_up (w * sizeof (RankSlot));
  layout.arrivals = layout.comms + round_up (N_COMM_SLOTS * sizeof (CommSlot));
  layout.descriptors = layout.arrivals + round_up (N_COMM_SLOTS * w * sizeof (guint64));
  layout.envelopes = layout.descriptors + round_up (N_COMM_SLOTS * 2 * w * sizeof (Descriptor));
  layout.size = round_up (layout.envelopes + w * w * RING_SIZE * sizeof (Envelope));
  return layout;
}

gsize
_cp_shm_segment_size (int world_size)
{
  return layout_for (world_size).size;
}

/* ---- the transport ---- */

typedef struct
{
  CpTransport parent;
  guint8 *segment;
  Layout layout;
  int *pidfds;             /* per world rank; -1 for this one, or where pidfds are missing */
  guint32 *pids;
  gsize chunk;             /* bytes an all-reduce pulls from a peer at a time */
  gsize direct;            /* all-reduces up to this size skip the reduce-scatter */
  volatile guint64 probe_word;

  CpMutex lock;
  GError *first;           /* the first failure, once read from the segment */
  gboolean *reported;      /* peers whose loss was reported */
  guint64 *sequences;      /* of the last message to each world rank */
} ShmTransport;

typedef struct
{
  CpComm parent;
  ShmTransport *transport;
  guint slot;
  guint64 syncs;           /* sync points this rank arrived at */
  guint64 calls;           /* collectives started, as errors number them */
  guint operation;         /* the running one, as fault injection counts */
  guint logged;            /* the paths the debug log named, as bits */
  /* The peers' loans this rank maps, between share and unshare: per
   * member, the read-only mapping and its length (NULL: none). */
  guint8 **loan_maps;
  gsize *loan_lengths;
} ShmComm;

struct _CpRequest
{
  gboolean is_send;
  int peer;                /* a communicator index */
  guint64 tag;
  const CpMessage *sent;
  CpMessage *message;
  Envelope *envelope;      /* a send once posted */
  gboolean dropped;        /* an injected fault dropped the send */
  guint operation;
};

/* The operation a wait belongs to. */
typedef struct
{
  const char *what;        /* "all_gather" */
  char label[64];          /* "all_gather #12", "send to rank 1 with tag 5" */
  gint64 deadline;
  gint64 started;
  GCancellable *cancellable; /* of the call it runs for, or NULL */
} Operation;

static SegmentHeader *
header_of (ShmTransport *self)
{
  return (SegmentHeader *) self->segment;
}

static RankSlot *
rank_slot (ShmTransport *self,
           int           rank)
{
  return (RankSlot *) (self->segment + self->layout.ranks) + rank;
}

static CommSlot *
comm_slot (ShmTransport *self,
           guint         slot)
{
  return (CommSlot *) (self->segment + self->layout.comms) + slot;
}

static guint64 *
arrival_of (ShmTransport *self,
            guint         slot,
            int           index)
{
  return (guint64 *) (self->segment + self->layout.arrivals) +
         (gsize) slot * (gsize) self->parent.world_size + (gsize) index;
}

static Descriptor *
descriptor_of (ShmTransport *self,
               guint         slot,
               guint64       sync,
               int           index)
{
  gsize w = (gsize) self->parent.world_size;

  return (Descriptor *) (self->segment + self->layout.descriptors) +
         ((gsize) slot * 2 + (sync & 1)) * w + (gsize) index;
}

static Envelope *
ring_of (ShmTransport *self,
         int           src,
         int           dst)
{
  gsize w = (gsize) self->parent.world_size;

  return (Envelope *) (self->segment + self->layout.envelopes) +
         ((gsize) src * w + (gsize) dst) * RING_SIZE;
}

static int
world_rank (ShmComm *comm,
            int      index)
{
  return comm->parent.members[index];
}

/* ---- atomics and futexes ---- */

static guint64
load64 (guint64 *word)
{
  return __atomic_load_n (word, __ATOMIC_ACQUIRE);
}

static void
store64 (guint64 *word,
         guint64  value)
{
  __atomic_store_n (word, value, __ATOMIC_RELEASE);
}

static gboolean
cas64 (guint64 *word,
       guint64 *expected,
       guint64  desired)
{
  return __atomic_compare_exchange_n (word, expected, desired, FALSE, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static guint32
load32 (guint32 *word)
{
  return __atomic_load_n (word, __ATOMIC_ACQUIRE);
}

static void
store32 (guint32 *word,
         guint32  value)
{
  __atomic_store_n (word, value, __ATOMIC_RELEASE);
}

static gboolean
cas32 (guint32 *word,
       guint32  expected,
       guint32  desired)
{
  return __atomic_compare_exchange_n (word, &expected, desired, FALSE, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* The word is shared between processes: no FUTEX_PRIVATE_FLAG. */
static void
futex_wait (guint32 *word,
            guint32  value,
            gint64   timeout_us)
{
  struct timespec timeout = { timeout_us / G_USEC_PER_SEC, (timeout_us % G_USEC_PER_SEC) * 1000 };

  syscall (SYS_futex, word, FUTEX_WAIT, value, &timeout, NULL, 0);
}

static void
futex_wake (guint32 *word)
{
  syscall (SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void
ring_bell (guint32 *bell)
{
  __atomic_add_fetch (bell, 1, __ATOMIC_RELEASE);
  futex_wake (bell);
}

/* Every wait of every rank looks again at what it waits for. */
static void
ring_all (ShmTransport *self)
{
  for (guint i = 0; i < N_COMM_SLOTS; i++)
    if (load64 (&comm_slot (self, i)->hash) != 0)
      ring_bell (&comm_slot (self, i)->bell);
  for (int r = 0; r < self->parent.world_size; r++)
    ring_bell (&rank_slot (self, r)->bell);
}

/* One round of waiting: a yield at first, then a short sleep on @bell
 * unless it rang since it read @seen. */
static void
idle (guint32 *bell,
      guint32  seen,
      guint   *rounds,
      gint64   deadline)
{
  gint64 left = deadline - g_get_monotonic_time ();

  if ((*rounds)++ < SPIN_ROUNDS)
    sched_yield ();
  else
    futex_wait (bell, seen, CLAMP (left, 100, SLEEP_MAX_US));
}

/* ---- failures ---- */

static void
write_text (char        *dst,
            gsize        size,
            const char  *text)
{
  const char *end = NULL;
  gsize length = MIN (strlen (text), size - 1);

  /* Cut at a character boundary. */
  g_utf8_validate (text, (gssize) length, &end);
  length = (gsize) (end - text);
  memcpy (dst, text, length);
  dst[length] = '\0';
}

static void
write_failure (Failure      *record,
               const GError *error)
{
  record->code = error->code;
  write_text (record->domain, sizeof record->domain, g_quark_to_string (error->domain));
  write_text (record->message, sizeof record->message, error->message);
}

/* The library's error domains, or one this process knows already: a peer
 * never makes this process intern new strings. */
static GQuark
known_domain (const char *domain)
{
  const GQuark library[] = { CP_TENSOR_ERROR, CP_MESH_ERROR, CP_BATCH_ERROR, CP_ATTENTION_ERROR };

  for (guint i = 0; i < G_N_ELEMENTS (library); i++)
    if (g_str_equal (g_quark_to_string (library[i]), domain))
      return library[i];
  return g_quark_try_string (domain);
}

/* What another process wrote, as a GError: text in UTF-8 without control
 * characters, a known domain or CP_MESH_ERROR_FAILED. */
static GError *
read_failure (const Failure *shared)
{
  Failure record;
  g_autofree char *domain = NULL;
  g_autofree char *message = NULL;
  GQuark quark;

  memcpy (&record, shared, sizeof record);
  domain = g_strndup (record.domain, strnlen (record.domain, sizeof record.domain));
  message = _cp_mesh_escape_text (record.message, (gssize) strnlen (record.message, sizeof record.message));
  quark = known_domain (domain);
  if (quark != 0)
    return g_error_new_literal (quark, record.code, message);
  return g_error_new (CP_MESH_ERROR, CP_MESH_ERROR_FAILED, "%s (error %d of domain \"%s\")", message,
                      record.code, domain);
}

/* With the lock held: the mesh's first failure, as every rank reads it
 * from the segment, or NULL while there is none. */
static const GError *
first_failure (ShmTransport *self)
{
  guint64 broken = load64 (&header_of (self)->broken);
  int rank = (int) (broken & 0xffff);

  if (self->first != NULL || broken == 0)
    return self->first;
  if (rank >= self->parent.world_size)
    self->first = g_error_new (CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                               "the shm control segment names rank %d, which is not in the mesh", rank);
  else
    self->first = read_failure (&rank_slot (self, rank)->failure);
  return self->first;
}

/* "@what: mesh broken: …" when the mesh has a first failure. */
static gboolean
set_broken_error (ShmTransport  *self,
                  const char    *what,
                  GError       **error)
{
  const GError *first;

  _cp_mutex_lock (&self->lock);
  first = first_failure (self);
  if (first != NULL)
    _cp_transport_set_broken_error (error, what, first);
  _cp_mutex_unlock (&self->lock);
  return first != NULL;
}

/* @failure, which this rank suffered in @label, becomes the mesh's first
 * failure unless it has one; every wait of every rank then gives up. */
static void
break_mesh (ShmTransport *self,
            const char   *label,
            const GError *failure)
{
  g_autoptr(GError) described = _cp_transport_describe_failure (self->parent.rank, label, failure);
  SegmentHeader *header = header_of (self);

  _cp_mutex_lock (&self->lock);
  if (load64 (&header->broken) == 0)
    {
      guint64 none = 0;

      write_failure (&rank_slot (self, self->parent.rank)->failure, described);
      cas64 (&header->broken, &none, BROKEN_BIT | (guint64) self->parent.rank);
    }
  _cp_mutex_unlock (&self->lock);
  ring_all (self);
}

/* The error of @op once its communicator's ticket is broken: the first
 * failure, which the rank that broke it writes next. */
static void
fail_broken (ShmTransport     *self,
             const Operation  *op,
             GError          **error)
{
  gint64 give_up = g_get_monotonic_time () + G_TIME_SPAN_SECOND;

  while (!set_broken_error (self, op->what, error))
    {
      if (g_get_monotonic_time () > give_up)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                       "%s: rank %d found its communicator broken by a rank that did not say why",
                       op->what, self->parent.rank);
          return;
        }
      g_usleep (100);
    }
}

/* ---- peers ---- */

/* With the lock held: reports @rank's loss once. */
static gboolean
note_lost (ShmTransport *self,
           int           rank)
{
  gboolean first = !self->reported[rank];

  self->reported[rank] = TRUE;
  return first;
}

/* Without a pidfd (kernels before 5.3, valgrind): whether @pid is gone
 * or a zombie.  A recycled pid could fool it; a pidfd cannot be. */
static gboolean
process_gone (guint32 pid)
{
  g_autofree char *path = NULL;
  g_autofree char *stat = NULL;
  const char *end;

  if (kill ((pid_t) pid, 0) != 0 && errno == ESRCH)
    return TRUE;
  path = g_strdup_printf ("/proc/%u/stat", pid);
  if (!g_file_get_contents (path, &stat, NULL, NULL))
    return TRUE;
  /* "pid (comm) state …" */
  end = strrchr (stat, ')');
  return end != NULL && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

/* The first of world ranks @ranks (@n of them) that is gone, and why, or
 * -1.  A rank whose process exited or that freed its transport can take
 * no part any more. */
static int
find_lost (ShmTransport  *self,
           const int     *ranks,
           int            n,
           const char   **why)
{
  struct pollfd fds[CP_SHM_MAX_WORLD_SIZE];
  int map[CP_SHM_MAX_WORLD_SIZE];
  int n_fds = 0, lost = -1;

  for (int i = 0; i < n; i++)
    {
      int r = ranks[i];

      if (r == self->parent.rank)
        continue;
      if (load32 (&rank_slot (self, r)->left))
        {
          *why = "it left the mesh";
          lost = r;
          break;
        }
      if (self->pidfds[r] < 0 && process_gone (self->pids[r]))
        {
          *why = "its process exited";
          lost = r;
          break;
        }
      if (self->pidfds[r] < 0)
        continue;
      fds[n_fds] = (struct pollfd) { self->pidfds[r], POLLIN, 0 };
      map[n_fds++] = r;
    }
  if (lost < 0 && n_fds > 0 && poll (fds, (nfds_t) n_fds, 0) > 0)
    for (int i = 0; i < n_fds && lost < 0; i++)
      if (fds[i].revents != 0)
        {
          *why = "its process exited";
          lost = map[i];
        }
  if (lost >= 0)
    {
      gboolean report;
      g_autofree char *reason = NULL;

      _cp_mutex_lock (&self->lock);
      report = note_lost (self, lost);
      _cp_mutex_unlock (&self->lock);
      reason = g_strdup_printf ("rank %d: %s", lost, *why);
      if (report)
        _cp_transport_report_peer_lost (&self->parent, lost, reason);
    }
  return lost;
}

/* ---- sync points ---- */

static char *
list_missing (ShmComm *comm,
              guint64  sync)
{
  ShmTransport *self = comm->transport;
  GString *text = g_string_new (NULL);

  for (int i = 0; i < comm->parent.size; i++)
    if (load64 (arrival_of (self, comm->slot, i)) < sync + 1)
      g_string_append_printf (text, "%s%d", text->len ? ", " : "", world_rank (comm, i));
  if (text->len == 0)
    g_string_append (text, "(none)");
  return g_string_free (text, FALSE);
}

/* Why this rank gives up waiting for @ranks in @op, or NULL: the mesh
 * broke elsewhere (@elsewhere), a peer is gone, the call was cancelled or
 * @late.  @missing names whom it waits for. */
static GError *
reason_to_give_up (ShmTransport     *self,
                   const Operation  *op,
                   const int        *ranks,
                   int               n,
                   gboolean          late,
                   const char       *missing,
                   gboolean         *elsewhere)
{
  GError *reason = NULL;
  const char *why = NULL;
  int lost;

  *elsewhere = FALSE;
  if (load64 (&header_of (self)->broken) != 0 && set_broken_error (self, op->what, &reason))
    {
      *elsewhere = TRUE;
      return reason;
    }
  if ((lost = find_lost (self, ranks, n, &why)) >= 0)
    g_set_error (&reason, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, "%s: rank %d lost mesh rank %d: %s",
                 op->what, self->parent.rank, lost, why);
  else if (g_cancellable_is_cancelled (op->cancellable))
    g_set_error (&reason, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED,
                 "%s: rank %d was cancelled while it waited for mesh ranks %s", op->what,
                 self->parent.rank, missing);
  else if (late)
    g_set_error (&reason, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                 "%s: rank %d waited %" G_GINT64_FORMAT " ms for mesh ranks %s, which never arrived",
                 op->what, self->parent.rank, (g_get_monotonic_time () - op->started) / 1000, missing);
  return reason;
}

/* Counts this rank in at its communicator's next sync point, unless the
 * communicator or the mesh is broken. */
static gboolean
arrive (ShmComm          *comm,
        const Operation  *op,
        GError          **error)
{
  ShmTransport *self = comm->transport;
  CommSlot *slot = comm_slot (self, comm->slot);
  guint64 t = load64 (&slot->ticket);

  for (;;)
    {
      if (t & BROKEN_BIT)
        {
          fail_broken (self, op, error);
          return FALSE;
        }
      if (load64 (&header_of (self)->broken) != 0)
        {
          /* Peers waiting here must hear of it too. */
          if (!cas64 (&slot->ticket, &t, t | BROKEN_BIT))
            continue;
          ring_bell (&slot->bell);
          fail_broken (self, op, error);
          return FALSE;
        }
      if (cas64 (&slot->ticket, &t, t + 1))
        break;
    }
  comm->syncs++;
  store64 (arrival_of (self, comm->slot, comm->parent.index), comm->syncs);
  ring_bell (&slot->bell);
  return TRUE;
}

/* Waits until every member of @comm has reached its sync point number
 * @sync, or gives up, by the verdict rule: a wait that gives up breaks the
 * ticket unless it has reached the target, so that all members get the
 * same answer.  A rank that has not arrived (!@arrived: an injected
 * fault) can only give up. */
static gboolean
await_sync (ShmComm          *comm,
            const Operation  *op,
            guint64           sync,
            GError          **error)
{
  ShmTransport *self = comm->transport;
  CommSlot *slot = comm_slot (self, comm->slot);
  guint64 target = (sync + 1) * (guint64) comm->parent.size;
  guint rounds = 0;

  for (;;)
    {
      gboolean late = g_get_monotonic_time () >= op->deadline;
      guint32 bell = load32 (&slot->bell);
      guint64 t = load64 (&slot->ticket);
      g_autofree char *missing = NULL;
      gboolean elsewhere;
      GError *reason;

      if ((t & ~BROKEN_BIT) >= target)
        return TRUE;
      /* Named only where an error will say whom it waited for. */
      missing = late || g_cancellable_is_cancelled (op->cancellable) ? list_missing (comm, sync) : g_strdup ("");
      reason = reason_to_give_up (self, op, comm->parent.members, comm->parent.size, late, missing,
                                  &elsewhere);
      if (t & BROKEN_BIT)
        {
          /* Broken by a peer, which names its failure next; a reason of
           * this rank's own is the first failure only if it comes first. */
          if (reason != NULL && !elsewhere)
            break_mesh (self, op->label, reason);
          g_clear_error (&reason);
          fail_broken (self, op, error);
          return FALSE;
        }
      if (reason != NULL)
        {
          if (!cas64 (&slot->ticket, &t, t | BROKEN_BIT))
            {
              /* Someone arrived or broke it meanwhile: look again. */
              g_clear_error (&reason);
              continue;
            }
          if (!elsewhere)
            break_mesh (self, op->label, reason);
          else
            ring_bell (&slot->bell);
          g_propagate_error (error, reason);
          return FALSE;
        }
      idle (&slot->bell, bell, &rounds, op->deadline);
    }
}

static gboolean
sync_point (ShmComm          *comm,
            const Operation  *op,
            GError          **error)
{
  guint64 sync = comm->syncs;

  return arrive (comm, op, error) && await_sync (comm, op, sync, error);
}

/* A failure of this rank's own between sync points (a read that failed)
 * breaks its communicator's next sync point, which it cannot reach. */
static void
fail_between_syncs (ShmComm         *comm,
                    const Operation *op,
                    const GError    *failure)
{
  CommSlot *slot = comm_slot (comm->transport, comm->slot);
  guint64 t = load64 (&slot->ticket);

  break_mesh (comm->transport, op->label, failure);
  while (!(t & BROKEN_BIT) && !cas64 (&slot->ticket, &t, t | BROKEN_BIT))
    ;
  ring_bell (&slot->bell);
}

/* After this rank's own @failure between sync points: the error to
 * report.  A read that failed because a peer gave up first (and freed
 * its buffers: this rank was stopped, say) reports the first failure. */
static GError *
own_or_first (ShmTransport     *self,
              const Operation  *op,
              GError           *failure)
{
  guint64 broken = load64 (&header_of (self)->broken);
  GError *first = NULL;

  if (broken == 0 || (int) (broken & 0xffff) == self->parent.rank || !set_broken_error (self, op->what, &first))
    return failure;
  g_error_free (failure);
  return first;
}

/* Fails @op at once when the mesh broke. */
static gboolean
check_usable (ShmTransport     *self,
              const Operation  *op,
              GError          **error)
{
  return load64 (&header_of (self)->broken) == 0 || !set_broken_error (self, op->what, error);
}

/* ---- moving bytes ---- */

/* @count chunks of @chunk bytes, @stride apart, at @base in some
 * process's address space. */
typedef struct
{
  guintptr base;
  gsize chunk;
  gsize stride;
  gsize count;
} Region;

static Region
contiguous (guintptr base,
            gsize    size)
{
  return (Region) { base, size, size, 1 };
}

static gsize
region_size (const Region *region)
{
  return region->chunk * region->count;
}

/* The address of byte @offset of @region, and how many bytes of its
 * chunk follow. */
static guintptr
region_at (const Region *region,
           gsize         offset,
           gsize        *left)
{
  gsize index = offset / region->chunk, within = offset % region->chunk;

  *left = region->chunk - within;
  return region->base + index * region->stride + within;
}

static void
append_iov (struct iovec *iov,
            int          *n,
            guintptr      address,
            gsize         length)
{
  if (*n > 0 && (guintptr) iov[*n - 1].iov_base + iov[*n - 1].iov_len == address)
    iov[*n - 1].iov_len += length;
  else
    iov[(*n)++] = (struct iovec) { (void *) address, length };
}

static void
set_read_error (ShmTransport     *self,
                const Operation  *op,
                int               peer,
                const Region     *remote,
                int               errsv,
                GError          **error)
{
  if (errsv == ESRCH)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                 "%s: rank %d lost mesh rank %d: its process is gone (process_vm_readv: %s)", op->what,
                 self->parent.rank, peer, g_strerror (errsv));
  else
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "%s: rank %d could not read the %" G_GSIZE_FORMAT " bytes mesh rank %d posted at 0x%"
                 G_GINT64_MODIFIER "x: process_vm_readv: %s", op->what, self->parent.rank,
                 region_size (remote), peer, (guint64) remote->base, g_strerror (errsv));
}

/* Copies @remote, in the memory of world rank @peer, into @local, in this
 * process: the same number of bytes, in as few system calls as the
 * kernel's limit on vectors allows. */
static gboolean
read_from (ShmTransport     *self,
           const Operation  *op,
           int               peer,
           const Region     *local,
           const Region     *remote,
           GError          **error)
{
  gsize total = region_size (local), done = 0;

  g_assert (region_size (remote) == total);
  while (done < total)
    {
      struct iovec liov[IOV_BATCH], riov[IOV_BATCH];
      int ln = 0, rn = 0;
      gsize offset = done;
      ssize_t got;

      while (offset < total && ln < IOV_BATCH && rn < IOV_BATCH)
        {
          gsize lleft, rleft;
          guintptr l = region_at (local, offset, &lleft), r = region_at (remote, offset, &rleft);
          gsize piece = MIN (MIN (lleft, rleft), total - offset);

          append_iov (liov, &ln, l, piece);
          append_iov (riov, &rn, r, piece);
          offset += piece;
        }
      got = process_vm_readv ((pid_t) self->pids[peer], liov, (unsigned long) ln, riov, (unsigned long) rn, 0);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        {
          set_read_error (self, op, peer, remote, got < 0 ? errno : EFAULT, error);
          return FALSE;
        }
      done += (gsize) got;
    }
  return TRUE;
}

/* ---- injected faults (cp-fault-private.h; nothing in other builds) ---- */

static CpFaultKind
suffer_fault (ShmTransport *self,
              guint         operation,
              CpFaultStep   step)
{
  guint delay_ms = 0;
  CpFaultKind fault = _cp_fault_strike ("shm", self->parent.rank, operation, step, &delay_ms);

  if (fault == CP_FAULT_KILL)
    _cp_fault_kill_process ();
  if (fault == CP_FAULT_DELAY)
    g_usleep ((gulong) delay_ms * G_TIME_SPAN_MILLISECOND);
  return fault;
}

/* ---- communicators ---- */

static void
digest_key (const char *key,
            guint8      digest[32],
            guint64    *hash)
{
  g_autoptr(GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);
  gsize length = 32;

  g_checksum_update (checksum, (const guchar *) key, -1);
  g_checksum_get_digest (checksum, digest, &length);
  *hash = 0;
  for (guint i = 0; i < 8; i++)
    *hash = *hash << 8 | digest[i];
  *hash |= 1;
}

/* The slot of the communicator called @key, claimed by whichever member
 * comes first (CAS on its hash, linear probing); the digest of the whole
 * key tells two keys of one hash apart.  Slots are never freed: a
 * communicator created again continues where the last one stopped. */
static gboolean
claim_slot (ShmTransport  *self,
            const char    *key,
            guint         *found,
            GError       **error)
{
  guint8 digest[32];
  guint64 hash;

  digest_key (key, digest, &hash);
  for (guint probe = 0; probe < N_COMM_SLOTS; probe++)
    {
      guint i = (guint) ((hash + probe) % N_COMM_SLOTS);
      CommSlot *slot = comm_slot (self, i);
      guint64 seen = 0;

      if (cas64 (&slot->hash, &seen, hash))
        {
          memcpy (slot->digest, digest, sizeof digest);
          store32 (&slot->ready, 1);
          *found = i;
          return TRUE;
        }
      if (seen != hash)
        continue;
      for (gint64 give_up = g_get_monotonic_time () + G_TIME_SPAN_SECOND;
           !load32 (&slot->ready) && g_get_monotonic_time () < give_up;)
        sched_yield ();
      if (load32 (&slot->ready) && memcmp (slot->digest, digest, sizeof digest) == 0)
        {
          *found = i;
          return TRUE;
        }
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
               "communicator \"%s\": the shm control segment has room for %d communicators, and "
               "this mesh has used them all", key, N_COMM_SLOTS);
  return FALSE;
}

static ShmComm *
comm_new (ShmTransport  *self,
          const char    *key,
          const int     *members,
          int            n_members,
          int            my_index,
          GError       **error)
{
  ShmComm *comm;
  guint slot;

  if (!claim_slot (self, key, &slot, error))
    return NULL;
  comm = g_new0 (ShmComm, 1);
  _cp_comm_init (&comm->parent, &self->parent, members, n_members, my_index);
  comm->transport = self;
  comm->slot = slot;
  /* Members that came first may have arrived at the first sync point. */
  comm->syncs = (load64 (&comm_slot (self, slot)->ticket) & ~BROKEN_BIT) / (guint64) n_members;
  return comm;
}

static CpComm *
shm_comm_new (CpTransport  *transport,
              const char   *label,
              const int    *members,
              int           n_members,
              int           my_index,
              GError      **error)
{
  g_autofree char *key = _cp_comm_key (label, members, n_members);
  ShmComm *comm = comm_new ((ShmTransport *) transport, key, members, n_members, my_index, error);

  return comm != NULL ? &comm->parent : NULL;
}

static void unmap_loans (ShmComm *comm);

static void
shm_comm_free (CpComm *comm)
{
  unmap_loans ((ShmComm *) comm);
  _cp_comm_clear (comm);
  g_free (comm);
}

/* ---- descriptors ---- */

static void
post_descriptor (ShmComm            *comm,
                 const CpCollective *coll,
                 gconstpointer       scratch)
{
  Descriptor *desc = descriptor_of (comm->transport, comm->slot, comm->syncs, comm->parent.index);

  memset (desc, 0, sizeof *desc);
  desc->kind = coll->kind;
  desc->dtype = coll->dtype;
  desc->n_dims = coll->n_dims;
  desc->device = coll->device;
  memcpy (desc->shape, coll->shape, sizeof desc->shape);
  desc->dim = coll->dim;
  desc->root = coll->root;
  desc->op = coll->op;
  desc->send = (guintptr) _cp_region_get_address (&coll->send);
  desc->recv = (guintptr) _cp_region_get_address (&coll->recv);
  desc->scratch = (guintptr) scratch;
  desc->direct = comm->transport->direct;
  desc->has_invalid = coll->invalid != NULL;
  if (coll->invalid != NULL)
    write_failure (&desc->invalid, coll->invalid);
}

/* What member @index posted for sync point @sync, checked for range;
 * every rank reads the same bytes, its own included, and so reaches the
 * same verdict. */
static gboolean
read_descriptor (ShmComm       *comm,
                 guint64        sync,
                 int            index,
                 CpCollective  *coll,
                 guint64       *addresses,
                 GError       **error)
{
  Descriptor desc;

  memcpy (&desc, descriptor_of (comm->transport, comm->slot, sync, index), sizeof desc);
  memset (coll, 0, sizeof *coll);
  if (desc.kind > CP_COLL_BROADCAST || desc.dtype > CP_DTYPE_FLOAT64 || desc.n_dims > CP_TENSOR_MAX_DIMS ||
      desc.device > CP_DEVICE_KIND_TEST)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "communicator rank %d posted a descriptor out of range: collective %u, dtype %u, "
                   "%u dimensions, memory kind %u", index, desc.kind, desc.dtype, desc.n_dims, desc.device);
      return FALSE;
    }
  coll->kind = desc.kind;
  coll->dtype = desc.dtype;
  coll->n_dims = desc.n_dims;
  coll->device = desc.device;
  memcpy (coll->shape, desc.shape, sizeof coll->shape);
  coll->dim = desc.dim;
  coll->root = desc.root;
  coll->op = desc.op;
  if (desc.has_invalid)
    coll->invalid = read_failure (&desc.invalid);
  addresses[0] = desc.send;
  addresses[1] = desc.recv;
  addresses[2] = desc.scratch;
  addresses[3] = desc.direct;
  return TRUE;
}

static void
clear_descriptors (CpCollective *descs,
                   int           n)
{
  for (int r = 0; r < n; r++)
    g_clear_error (&descs[r].invalid);
}

/* ---- collectives ---- */

typedef struct
{
  ShmComm *comm;
  CpCollective *coll;
  Operation op;
  guint64 *sends;          /* every member's send, recv and scratch addresses */
  guint64 *recvs;
  guint64 *scratches;
  /* All-reduce: [count] of the result, then [n][chunk] of the peers'
   * elements; broadcast: [count] of the root's.  What the caller's tensor
   * becomes only once every rank succeeded, so that a failed call leaves
   * it as it was. */
  guint8 *scratch;
  gsize scratch_size;
  gboolean read_failed;    /* a pull failed, rather than a sync point */
} Call;

/* Pulls @remote of member @r into @local. */
static gboolean
pull (Call          *call,
      int            r,
      const Region  *local,
      const Region  *remote,
      GError       **error)
{
  ShmComm *comm = call->comm;

  if (read_from (comm->transport, &call->op, world_rank (comm, r), local, remote, error))
    return TRUE;
  call->read_failed = TRUE;
  return FALSE;
}

/* Piece r of a [outer][n][block] buffer at @base. */
static Region
piece_of (guintptr            base,
          const CpCollective *coll,
          int                 n,
          int                 r)
{
  return (Region) { base + (gsize) r * coll->block, coll->block, (gsize) n * coll->block, coll->outer };
}

/* Pulls, from every other member r in turn (starting after this one, so
 * that the ranks spread over their peers), @remote_of (r) into @local_of
 * (r). */
typedef Region (*RegionFunc) (Call *call,
                              int   r);

static gboolean
pull_from_all (Call       *call,
               RegionFunc  local_of,
               RegionFunc  remote_of,
               GError    **error)
{
  ShmComm *comm = call->comm;
  int n = comm->parent.size, me = comm->parent.index;

  for (int k = 1; k < n; k++)
    {
      int r = (me + k) % n;
      Region local = local_of (call, r), remote = remote_of (call, r);

      if (region_size (&local) == 0)
        continue;
      if (!pull (call, r, &local, &remote, error))
        return FALSE;
    }
  return TRUE;
}

static Region
gathered_piece (Call *call,
                int   r)
{
  return piece_of ((guintptr) _cp_region_get_address (&call->coll->recv), call->coll, call->comm->parent.size, r);
}

static Region
gather_source (Call *call,
               int   r)
{
  return (Region) { call->sends[r], call->coll->block, call->coll->block, call->coll->outer };
}

static Region
scatter_source (Call *call,
                int   r)
{
  return piece_of (call->sends[r], call->coll, call->comm->parent.size, call->comm->parent.index);
}

static gboolean
copy_own (Call          *call,
          gconstpointer  src,
          gsize          src_pitch,
          GError       **error)
{
  CpCollective *coll = call->coll;
  int n = call->comm->parent.size;

  return _cp_transport_copy_2d ((guint8 *) _cp_region_get_address (&coll->recv) + (gsize) call->comm->parent.index * coll->block,
                                CP_DEVICE_KIND_HOST, (gsize) n * coll->block, src, CP_DEVICE_KIND_HOST,
                                src_pitch, coll->block, coll->outer, FALSE, error);
}

static gboolean
run_all_gather (Call    *call,
                GError **error)
{
  return copy_own (call, _cp_region_get_address (&call->coll->send), call->coll->block, error) &&
         pull_from_all (call, gathered_piece, gather_source, error);
}

static gboolean
run_all_to_all (Call    *call,
                GError **error)
{
  CpCollective *coll = call->coll;
  gsize n = (gsize) call->comm->parent.size;

  return copy_own (call, (const guint8 *) _cp_region_get_address (&coll->send) + (gsize) call->comm->parent.index * coll->block,
                   n * coll->block, error) &&
         pull_from_all (call, gathered_piece, scatter_source, error);
}

static gboolean
run_broadcast (Call    *call,
               GError **error)
{
  ShmComm *comm = call->comm;
  CpCollective *coll = call->coll;
  gsize size = coll->count * cp_dtype_get_size (coll->dtype);
  Region local = contiguous ((guintptr) call->scratch, size);
  Region remote = contiguous (call->recvs[coll->root], size);

  if (comm->parent.index == coll->root || size == 0)
    return TRUE;
  return pull (call, coll->root, &local, &remote, error);
}

static gsize
slice_start (Call *call,
             int   r)
{
  return _cp_collective_slice_start (call->coll, call->comm->parent.size, r);
}

/* Elements of a reduction chunk: at most the chunk setting, and no more
 * than the longest range a rank reduces. */
static gsize
chunk_elements (Call *call)
{
  gsize size = call->coll->count * cp_dtype_get_size (call->coll->dtype);
  gsize longest = size <= call->comm->transport->direct ? call->coll->count
                                                         : call->coll->count / (gsize) call->comm->parent.size + 1;

  return MAX (MIN (call->comm->transport->chunk / cp_dtype_get_size (call->coll->dtype), longest), 1);
}

/* Where an all-reduce's chunks of peers' elements go: after the result. */
static guint8 *
chunk_area (Call *call)
{
  gsize result = call->coll->count * cp_dtype_get_size (call->coll->dtype);

  return call->scratch + round_up (result);
}

/* Elements [@lo, @hi) of every member's buffer, chunk by chunk, pulled
 * into scratch that stays in cache and reduced in buffer order into the
 * same elements of the result. */
static gboolean
reduce_range (Call    *call,
              gsize    lo,
              gsize    hi,
              GError **error)
{
  ShmComm *comm = call->comm;
  CpCollective *coll = call->coll;
  int n = comm->parent.size, me = comm->parent.index;
  gsize elsize = cp_dtype_get_size (coll->dtype), step = chunk_elements (call);
  guint8 *chunks = chunk_area (call);
  g_autofree gconstpointer *srcs = g_new (gconstpointer, n);

  for (gsize at = lo; at < hi; at += step)
    {
      gsize count = MIN (step, hi - at), bytes = count * elsize;

      for (int k = 1; k < n; k++)
        {
          int r = (me + k) % n;
          Region local = contiguous ((guintptr) (chunks + (gsize) r * step * elsize), bytes);
          Region remote = contiguous (call->recvs[r] + at * elsize, bytes);

          if (!pull (call, r, &local, &remote, error))
            return FALSE;
        }
      for (int r = 0; r < n; r++)
        srcs[r] = r == me ? (const guint8 *) _cp_region_get_address (&coll->recv) + at * elsize : chunks + (gsize) r * step * elsize;
      _cp_reduce_many (coll->dtype, coll->op, call->scratch + at * elsize, srcs, n, 0, count);
    }
  return TRUE;
}

static Region
reduced_slice (Call  *call,
               guint64 base,
               int    r)
{
  gsize elsize = cp_dtype_get_size (call->coll->dtype);
  gsize lo = slice_start (call, r), hi = slice_start (call, r + 1);

  return contiguous (base + lo * elsize, (hi - lo) * elsize);
}

static Region
own_reduced_slice (Call *call,
                   int   r)
{
  return reduced_slice (call, (guintptr) call->scratch, r);
}

static Region
peer_reduced_slice (Call *call,
                    int   r)
{
  return reduced_slice (call, call->scratches[r], r);
}

static gboolean
run_all_reduce (Call    *call,
                GError **error)
{
  ShmComm *comm = call->comm;

  gsize size = call->coll->count * cp_dtype_get_size (call->coll->dtype);

  /* Small: every rank reduces the whole buffer, one sync point fewer;
   * a fault of the result step strikes where the second half would be. */
  if (size <= comm->transport->direct)
    {
      if (!reduce_range (call, 0, call->coll->count, error))
        return FALSE;
      suffer_fault (comm->transport, comm->operation, CP_FAULT_STEP_RESULT);
      return TRUE;
    }
  /* Reduce-scatter, then all-gather. */
  if (!reduce_range (call, slice_start (call, comm->parent.index), slice_start (call, comm->parent.index + 1),
                     error))
    return FALSE;
  /* Every slice reduced before anyone gathers them. */
  if (!sync_point (comm, &call->op, error))
    return FALSE;
  suffer_fault (comm->transport, comm->operation, CP_FAULT_STEP_RESULT);
  return pull_from_all (call, own_reduced_slice, peer_reduced_slice, error);
}

/* Allocated before the descriptor goes out: a rank that cannot allocate
 * fails the collective on every rank, through its descriptor, before any
 * data moves. */
static void
alloc_scratch (Call *call)
{
  CpCollective *coll = call->coll;
  gsize elsize = cp_dtype_get_size (coll->dtype);

  if (coll->invalid != NULL)
    return;
  if (coll->kind == CP_COLL_ALL_REDUCE)
    call->scratch_size = round_up (coll->count * elsize) +
                         (gsize) call->comm->parent.size * chunk_elements (call) * elsize;
  else if (coll->kind == CP_COLL_BROADCAST && call->comm->parent.index != coll->root)
    call->scratch_size = coll->count * elsize;
  if (call->scratch_size > 0)
    call->scratch = _cp_host_alloc (call->scratch_size, FALSE, &coll->invalid);
}

/* Once every rank succeeded: the all-reduce's result, or the root's
 * broadcast, becomes the caller's tensor. */
static void
finish_in_place (Call *call)
{
  CpCollective *coll = call->coll;
  gsize size = coll->count * cp_dtype_get_size (coll->dtype);

  if (call->scratch != NULL && size > 0)
    _cp_transport_copy_2d (_cp_region_get_address (&coll->recv), CP_DEVICE_KIND_HOST, size, call->scratch, CP_DEVICE_KIND_HOST, size, size,
                           1, _cp_copy_wants_streaming (size), NULL);
}

static gboolean
run_data_phase (Call    *call,
                GError **error)
{
  switch (call->coll->kind)
    {
    case CP_COLL_ALL_GATHER:
      return run_all_gather (call, error);
    case CP_COLL_ALL_TO_ALL:
      return run_all_to_all (call, error);
    case CP_COLL_ALL_REDUCE:
      return run_all_reduce (call, error);
    case CP_COLL_BROADCAST:
      return run_broadcast (call, error);
    case CP_COLL_BARRIER:
    default:
      g_assert_not_reached ();
    }
}

/* The size up to which an all-reduce skips the reduce-scatter decides how
 * many sync points it has: ranks that set CPMESH_SHM_DIRECT differently
 * fail alike rather than fall out of step. */
static gboolean
check_same_algorithm (Call           *call,
                      const guint64  *directs,
                      GError        **error)
{
  if (call->coll->kind != CP_COLL_ALL_REDUCE)
    return TRUE;
  for (int r = 1; r < call->comm->parent.size; r++)
    if (directs[r] != directs[0])
      {
        g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                     "all_reduce: ranks disagree on CPMESH_SHM_DIRECT: communicator rank 0 has %"
                     G_GUINT64_FORMAT ", rank %d has %" G_GUINT64_FORMAT, directs[0], r, directs[r]);
        return FALSE;
      }
  return TRUE;
}

/* Every member's descriptor of the sync point just passed, checked for
 * agreement; a malformed one breaks the mesh. */
static gboolean
agree (Call     *call,
       guint64   sync,
       GError  **error)
{
  ShmComm *comm = call->comm;
  int n = comm->parent.size;
  g_autofree CpCollective *descs = g_new0 (CpCollective, n);
  g_autofree const CpCollective **pointers = g_new (const CpCollective *, n);
  g_autofree guint64 *directs = g_new0 (guint64, n);
  gboolean ok = TRUE;

  for (int r = 0; ok && r < n; r++)
    {
      GError *malformed = NULL;
      guint64 addresses[4];

      pointers[r] = &descs[r];
      if (!read_descriptor (comm, sync, r, &descs[r], addresses, &malformed))
        {
          fail_between_syncs (comm, &call->op, malformed);
          g_propagate_error (error, malformed);
          ok = FALSE;
          break;
        }
      call->sends[r] = addresses[0];
      call->recvs[r] = addresses[1];
      call->scratches[r] = addresses[2];
      directs[r] = addresses[3];
    }
  ok = ok && _cp_collective_check_agreement (pointers, n, comm->parent.transport->rank, error) &&
       check_same_algorithm (call, directs, error);
  clear_descriptors (descs, n);
  return ok;
}

static void
log_path (Call *call)
{
  ShmComm *comm = call->comm;
  CpCollective *coll = call->coll;
  gboolean direct = coll->count * cp_dtype_get_size (coll->dtype) <= comm->transport->direct;
  guint path = 1u << (coll->kind * 2 + (coll->kind == CP_COLL_ALL_REDUCE && direct));
  const char *how;

  if (comm->logged & path)
    return;
  comm->logged |= path;
  if (coll->kind == CP_COLL_BARRIER)
    how = "a sync point";
  else if (coll->kind == CP_COLL_ALL_REDUCE && direct)
    how = "every rank pulls every peer's whole buffer with process_vm_readv and reduces it (direct)";
  else if (coll->kind == CP_COLL_ALL_REDUCE)
    how = "reduce-scatter and all-gather, each rank pulling its peers' slices with process_vm_readv";
  else
    how = "each rank pulls its pieces straight out of its peers' buffers with process_vm_readv";
  g_debug ("shm: %s on communicator slot %u (%d ranks): %s", call->op.what, comm->slot, comm->parent.size, how);
}

static gboolean
shm_collective (CpComm        *parent,
                CpCollective  *coll,
                gint64         deadline,
                GCancellable  *cancellable,
                GError       **error)
{
  ShmComm *comm = (ShmComm *) parent;
  ShmTransport *self = comm->transport;
  g_autofree guint64 *addresses = g_new0 (guint64, 3 * (gsize) parent->size);
  Call call = { comm, coll, { 0 }, addresses, addresses + parent->size, addresses + 2 * parent->size, NULL, 0 };
  guint64 sync = comm->syncs;
  gboolean ok;

  call.op.what = _cp_collective_name (coll->kind);
  call.op.deadline = deadline;
  call.op.cancellable = cancellable;
  call.op.started = g_get_monotonic_time ();
  _cp_collective_label (call.op.label, sizeof call.op.label, coll->kind, ++comm->calls);
  comm->operation = _cp_fault_begin_operation ("shm", self->parent.rank);
  if (!check_usable (self, &call.op, error))
    return FALSE;
  log_path (&call);
  alloc_scratch (&call);
  if (suffer_fault (self, comm->operation, CP_FAULT_STEP_DESCRIPTOR) == CP_FAULT_DROP)
    {
      /* Never arrives: waits, as its peers do, until the mesh gives up. */
      ok = await_sync (comm, &call.op, sync, error);
      g_assert (!ok);
    }
  else
    {
      post_descriptor (comm, coll, call.scratch);
      ok = sync_point (comm, &call.op, error) && agree (&call, sync, error);
      if (ok && coll->kind != CP_COLL_BARRIER)
        {
          GError *failure = NULL;

          suffer_fault (self, comm->operation, CP_FAULT_STEP_DATA);
          if (!run_data_phase (&call, &failure))
            {
              /* A failed sync point broke the mesh already; a failed read
               * breaks it now. */
              if (call.read_failed)
                {
                  fail_between_syncs (comm, &call.op, failure);
                  failure = own_or_first (self, &call.op, failure);
                }
              g_propagate_error (error, failure);
              ok = FALSE;
            }
          /* Nobody returns, and reuses its buffers, while a peer reads them. */
          ok = ok && sync_point (comm, &call.op, error);
          if (ok)
            finish_in_place (&call);
        }
    }
  if (call.scratch != NULL)
    _cp_host_free (call.scratch, call.scratch_size);
  return ok;
}

/* ---- point-to-point ---- */

static void
wire_from_message (WireMessage     *wire,
                   const CpMessage *message)
{
  memset (wire, 0, sizeof *wire);
  wire->dtype = message->dtype;
  wire->n_dims = message->n_dims;
  wire->nbytes = message->nbytes;
  memcpy (wire->shape, message->shape, message->n_dims * sizeof (gint64));
}

/* Clamped into range, so that it can always be described. */
static void
message_from_wire (CpMessage         *message,
                   const WireMessage *shared)
{
  WireMessage wire;

  memcpy (&wire, shared, sizeof wire);
  memset (message, 0, sizeof *message);
  message->dtype = MIN (wire.dtype, CP_DTYPE_FLOAT64);
  message->n_dims = MIN (wire.n_dims, CP_TENSOR_MAX_DIMS);
  message->nbytes = wire.nbytes;
  memcpy (message->shape, wire.shape, message->n_dims * sizeof (gint64));
}

static void
name_message (Operation       *op,
              const CpRequest *request,
              gint64           deadline,
              GCancellable    *cancellable)
{
  op->what = request->is_send ? "send" : "recv";
  op->deadline = deadline;
  op->cancellable = cancellable;
  op->started = g_get_monotonic_time ();
  _cp_message_label (op->label, sizeof op->label, request->is_send, request->peer, request->tag);
}

/* Puts @request's envelope in the ring to its peer, if there is room; a
 * full ring leaves it for the wait to post. */
static void
try_post (ShmComm   *comm,
          CpRequest *request)
{
  ShmTransport *self = comm->transport;
  int me = self->parent.rank, to = world_rank (comm, request->peer);
  Envelope *ring = ring_of (self, me, to);

  if (load64 (&header_of (self)->broken) != 0)
    return;
  _cp_mutex_lock (&self->lock);
  for (guint i = 0; i < RING_SIZE && request->envelope == NULL; i++)
    if (load32 (&ring[i].state) == EMPTY)
      {
        Envelope *envelope = &ring[i];

        envelope->comm = comm->slot;
        envelope->tag = request->tag;
        envelope->sequence = ++self->sequences[to];
        envelope->address = (guintptr) _cp_region_get_address (&request->sent->data);
        wire_from_message (&envelope->sent, request->sent);
        store32 (&envelope->state, POSTED);
        request->envelope = envelope;
      }
  _cp_mutex_unlock (&self->lock);
  if (request->envelope != NULL)
    ring_bell (&rank_slot (self, to)->bell);
}

static CpRequest *
shm_isend (CpComm          *parent,
           int              peer,
           guint64          tag,
           const CpMessage *message)
{
  ShmComm *comm = (ShmComm *) parent;
  CpRequest *request = g_new0 (CpRequest, 1);

  request->is_send = TRUE;
  request->peer = peer;
  request->tag = tag;
  request->sent = message;
  request->operation = _cp_fault_begin_operation ("shm", comm->transport->parent.rank);
  /* A dropped message is one that never reaches the ring. */
  request->dropped = suffer_fault (comm->transport, request->operation, CP_FAULT_STEP_DESCRIPTOR) ==
                     CP_FAULT_DROP;
  if (!request->dropped)
    try_post (comm, request);
  return request;
}

static CpRequest *
shm_irecv (CpComm    *parent,
           int        peer,
           guint64    tag,
           CpMessage *message)
{
  ShmComm *comm = (ShmComm *) parent;
  CpRequest *request = g_new0 (CpRequest, 1);

  request->peer = peer;
  request->tag = tag;
  request->message = message;
  request->operation = _cp_fault_begin_operation ("shm", comm->transport->parent.rank);
  suffer_fault (comm->transport, request->operation, CP_FAULT_STEP_DESCRIPTOR);
  return request;
}

/* Why a message to or from @peer (a world rank) will not go through: the
 * mesh broke, the peer is gone, the call was cancelled or @late. */
static GError *
p2p_reason (ShmTransport     *self,
            const Operation  *op,
            const CpRequest  *request,
            int               peer,
            gboolean          late,
            gboolean         *elsewhere)
{
  g_autofree char *missing = g_strdup_printf ("%d", peer);
  GError *reason = reason_to_give_up (self, op, &peer, 1, FALSE, missing, elsewhere);

  if (reason == NULL && late)
    g_set_error (&reason, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                 "%s: rank %d waited %" G_GINT64_FORMAT " ms for mesh rank %d, which never %s the "
                 "message with tag %" G_GUINT64_FORMAT, op->what, self->parent.rank,
                 (g_get_monotonic_time () - op->started) / 1000, peer,
                 request->is_send ? "took" : "sent", request->tag);
  return reason;
}

/* A send or receive that gives up with @reason: the mesh's first failure
 * unless it broke elsewhere. */
static gboolean
give_up (ShmTransport     *self,
         const Operation  *op,
         GError           *reason,
         gboolean          elsewhere,
         GError          **error)
{
  if (!elsewhere)
    break_mesh (self, op->label, reason);
  g_propagate_error (error, reason);
  return FALSE;
}

static gboolean
wait_send (ShmComm          *comm,
           CpRequest        *request,
           const Operation  *op,
           GError          **error)
{
  ShmTransport *self = comm->transport;
  int to = world_rank (comm, request->peer);
  guint32 *bell = &rank_slot (self, self->parent.rank)->bell;
  guint rounds = 0;

  for (;;)
    {
      gboolean late = g_get_monotonic_time () >= op->deadline, elsewhere;
      guint32 seen = load32 (bell);
      Envelope *envelope;
      GError *reason;

      if (request->envelope == NULL && !request->dropped)
        try_post (comm, request);
      envelope = request->envelope;
      if (envelope != NULL)
        {
          guint32 state = load32 (&envelope->state);

          if (state == DONE)
            {
              store32 (&envelope->state, EMPTY);
              return TRUE;
            }
          if (state == MISMATCH)
            {
              CpMessage expected;

              message_from_wire (&expected, &envelope->expected);
              store32 (&envelope->state, EMPTY);
              _cp_message_set_mismatch (error, request->sent, comm->parent.index, request->tag,
                                        request->peer, &expected);
              return FALSE;
            }
          if (state == FAILED)
            {
              store32 (&envelope->state, EMPTY);
              fail_broken (self, op, error);
              return FALSE;
            }
        }
      reason = p2p_reason (self, op, request, to, late, &elsewhere);
      if (reason != NULL)
        {
          /* Taken back before the receiver took it, or left to the
           * receiver, which then fails too; a verdict it reached first
           * stands. */
          if (envelope != NULL && !cas32 (&envelope->state, POSTED, EMPTY) &&
              !cas32 (&envelope->state, TAKEN, ABANDONED))
            {
              g_clear_error (&reason);
              continue;
            }
          if (envelope != NULL)
            ring_bell (&rank_slot (self, to)->bell);
          return give_up (self, op, reason, elsewhere, error);
        }
      idle (bell, seen, &rounds, op->deadline);
    }
}

/* The oldest message of @tag from world rank @from on @comm, taken. */
static Envelope *
take_envelope (ShmComm *comm,
               int      from,
               guint64  tag)
{
  ShmTransport *self = comm->transport;
  Envelope *ring = ring_of (self, from, self->parent.rank), *oldest = NULL;

  for (guint i = 0; i < RING_SIZE; i++)
    if (load32 (&ring[i].state) == POSTED && ring[i].comm == comm->slot && ring[i].tag == tag &&
        (oldest == NULL || ring[i].sequence < oldest->sequence))
      oldest = &ring[i];
  if (oldest != NULL && cas32 (&oldest->state, POSTED, TAKEN))
    return oldest;
  return NULL;
}

/* Ends a taken message with @state, unless its sender gave up on it
 * meanwhile: then this side fails too. */
static gboolean
settle (ShmTransport     *self,
        Envelope         *envelope,
        int               from,
        guint32           state,
        const Operation  *op,
        GError          **error)
{
  gboolean settled = cas32 (&envelope->state, TAKEN, state);

  if (!settled)
    {
      store32 (&envelope->state, EMPTY);
      fail_broken (self, op, error);
    }
  ring_bell (&rank_slot (self, from)->bell);
  return settled;
}

static gboolean
receive_taken (ShmComm          *comm,
               CpRequest        *request,
               Envelope         *envelope,
               const Operation  *op,
               GError          **error)
{
  ShmTransport *self = comm->transport;
  int from = world_rank (comm, request->peer);
  CpMessage sent;
  Region local, remote;
  GError *failure = NULL;

  suffer_fault (self, request->operation, CP_FAULT_STEP_DATA);
  message_from_wire (&sent, &envelope->sent);
  if (!_cp_message_matches (&sent, request->message))
    {
      wire_from_message (&envelope->expected, request->message);
      if (!settle (self, envelope, from, MISMATCH, op, error))
        return FALSE;
      _cp_message_set_mismatch (error, &sent, request->peer, request->tag, comm->parent.index,
                                request->message);
      return FALSE;
    }
  local = contiguous ((guintptr) _cp_region_get_address (&request->message->data), sent.nbytes);
  remote = contiguous (envelope->address, sent.nbytes);
  if (sent.nbytes > 0 && !read_from (self, op, from, &local, &remote, &failure))
    {
      break_mesh (self, op->label, failure);
      if (!cas32 (&envelope->state, TAKEN, FAILED))
        store32 (&envelope->state, EMPTY);
      ring_bell (&rank_slot (self, from)->bell);
      g_propagate_error (error, own_or_first (self, op, failure));
      return FALSE;
    }
  return settle (self, envelope, from, DONE, op, error);
}

static gboolean
wait_recv (ShmComm          *comm,
           CpRequest        *request,
           const Operation  *op,
           GError          **error)
{
  ShmTransport *self = comm->transport;
  int from = world_rank (comm, request->peer);
  guint32 *bell = &rank_slot (self, self->parent.rank)->bell;
  guint rounds = 0;

  for (;;)
    {
      gboolean late = g_get_monotonic_time () >= op->deadline, elsewhere;
      guint32 seen = load32 (bell);
      Envelope *envelope = load64 (&header_of (self)->broken) == 0 ? take_envelope (comm, from, request->tag)
                                                                   : NULL;
      GError *reason;

      if (envelope != NULL)
        return receive_taken (comm, request, envelope, op, error);
      reason = p2p_reason (self, op, request, from, late, &elsewhere);
      if (reason != NULL)
        return give_up (self, op, reason, elsewhere, error);
      idle (bell, seen, &rounds, op->deadline);
    }
}

static gboolean
shm_wait (CpComm        *parent,
          CpRequest     *request,
          gint64         deadline,
          GCancellable  *cancellable,
          GError       **error)
{
  ShmComm *comm = (ShmComm *) parent;
  Operation op;
  gboolean ok;

  name_message (&op, request, deadline, cancellable);
  if (request->is_send)
    ok = wait_send (comm, request, &op, error);
  else
    ok = check_usable (comm->transport, &op, error) && wait_recv (comm, request, &op, error);
  g_free (request);
  return ok;
}

/* ---- loans: peers' memory read where it lies ---- */

/* A rank lends host memory from alloc_shared(): a sealed memfd.  Peers
 * learn, through an all-gather, the descriptor number in the lender's
 * process and the file's identity, reopen it read-only through
 * /proc/<pid>/fd (which the same access as process_vm_readv allows),
 * check that it is the same file, sealed against shrinking, and large
 * enough, and map it read-only.  So a reader never writes a lender's
 * memory, and a lender that fails or dies cannot pull pages from under a
 * reader: the mapping holds them.  Every rank maps or breaks the mesh,
 * then a barrier decides for all; unshare is a barrier after which every
 * rank unmaps. */

typedef struct
{
  gint64 fd;               /* in the lender's process; -1: not lendable memory */
  guint64 dev;
  guint64 ino;
  guint64 offset;          /* of the loan in the file */
  guint64 length;
  guint64 pad;
} LoanWire;

static CpStorage *
shm_alloc_shared (CpTransport  *transport,
                  gsize         size,
                  GError      **error)
{
  return cp_storage_new_shared (MAX (size, 1), error);
}

static LoanWire
describe_loan (const CpRegion *mine)
{
  LoanWire wire = { -1, 0, 0, mine->offset, mine->length, 0 };
  int fd = cp_storage_get_fd (mine->storage);
  struct stat st;

  /* Storage from alloc_shared() maps its memfd from the start. */
  if (fd >= 0 && cp_storage_get_kind (mine->storage) == CP_STORAGE_KIND_FD && fstat (fd, &st) == 0)
    {
      wire.fd = fd;
      wire.dev = st.st_dev;
      wire.ino = st.st_ino;
    }
  return wire;
}

static void
unmap_loans (ShmComm *comm)
{
  if (comm->loan_maps == NULL)
    return;
  for (int r = 0; r < comm->parent.size; r++)
    if (comm->loan_maps[r] != NULL)
      munmap (comm->loan_maps[r], comm->loan_lengths[r]);
  g_clear_pointer (&comm->loan_maps, g_free);
  g_clear_pointer (&comm->loan_lengths, g_free);
}

/* Maps member @r's loan @wire read-only, or says why not. */
static gboolean
map_loan (ShmComm         *comm,
          int              r,
          const LoanWire  *wire,
          gconstpointer   *address,
          GError         **error)
{
  ShmTransport *self = comm->transport;
  int rank = world_rank (comm, r);
  g_autofree char *path = g_strdup_printf ("/proc/%u/fd/%" G_GINT64_FORMAT, self->pids[rank], wire->fd);
  gsize page = (gsize) sysconf (_SC_PAGESIZE);
  gsize start = wire->offset / page * page;
  gsize length = wire->offset - start + wire->length;
  struct stat st;
  int fd, seals;
  gpointer map;

  if ((fd = open (path, O_RDONLY | O_CLOEXEC)) < 0)
    {
      int saved_errno = errno;

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "cannot open the memory mesh rank %d lent (%s): %s", rank, path,
                   g_strerror (saved_errno));
      return FALSE;
    }
  seals = fcntl (fd, F_GET_SEALS);
  if (fstat (fd, &st) != 0 || (guint64) st.st_dev != wire->dev || (guint64) st.st_ino != wire->ino)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "descriptor %" G_GINT64_FORMAT " of mesh rank %d is no longer the memory it lent",
                 wire->fd, rank);
  else if (seals < 0 || !(seals & F_SEAL_SHRINK))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "the memory mesh rank %d lent is not sealed against shrinking", rank);
  else if (wire->offset + wire->length < wire->offset ||
           wire->offset + wire->length > (guint64) st.st_size)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "mesh rank %d lent %" G_GUINT64_FORMAT " bytes at %" G_GUINT64_FORMAT
                 " of a file of %" G_GOFFSET_FORMAT, rank, wire->length, wire->offset,
                 (goffset) st.st_size);
  else if ((map = mmap (NULL, MAX (length, 1), PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                        (off_t) start)) == MAP_FAILED)
    {
      int saved_errno = errno;

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "cannot map the memory mesh rank %d lent: %s", rank, g_strerror (saved_errno));
    }
  else
    {
      comm->loan_maps[r] = map;
      comm->loan_lengths[r] = MAX (length, 1);
      *address = (const guint8 *) map + (wire->offset - start);
    }
  close (fd);
  return error == NULL || *error == NULL;
}

/* Every member's loan, gathered: the same table on every rank, which
 * every rank judges alike. */
static gboolean
gather_loans (ShmComm         *comm,
              const LoanWire  *own,
              LoanWire        *all,
              gint64           deadline,
              GCancellable    *cancellable,
              GError         **error)
{
  CpCollective coll = {
    .kind = CP_COLL_ALL_GATHER,
    .dtype = CP_DTYPE_INT64,
    .n_dims = 1,
    .shape = { sizeof *own / sizeof (gint64) },
    .outer = 1,
    .block = sizeof *own,
    .device = CP_DEVICE_KIND_HOST,
  };
  gboolean ok;

  _cp_region_init_host (&coll.send, (gpointer) own, sizeof *own);
  _cp_region_init_host (&coll.recv, all, sizeof *own * (gsize) comm->parent.size);
  ok = shm_collective (&comm->parent, &coll, deadline, cancellable, error);
  _cp_collective_clear (&coll);
  return ok;
}

static gboolean
check_loans (ShmComm         *comm,
             const LoanWire  *all,
             GError         **error)
{
  for (int r = 0; r < comm->parent.size; r++)
    {
      if (all[r].fd < 0)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                       "mesh rank %d lends memory another process cannot map (not from a memfd)",
                       world_rank (comm, r));
          return FALSE;
        }
      if (all[r].length != all[0].length)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "mesh rank %d lends %" G_GUINT64_FORMAT " bytes to read in place but "
                       "mesh rank %d lends %" G_GUINT64_FORMAT, world_rank (comm, r),
                       all[r].length, world_rank (comm, 0), all[0].length);
          return FALSE;
        }
    }
  return TRUE;
}

static gboolean
barrier (ShmComm       *comm,
         gint64         deadline,
         GCancellable  *cancellable,
         GError       **error)
{
  CpCollective coll = { .kind = CP_COLL_BARRIER, .device = CP_DEVICE_KIND_HOST };

  return shm_collective (&comm->parent, &coll, deadline, cancellable, error);
}

static gboolean
shm_share (CpComm         *parent,
           const CpRegion *mine,
           gconstpointer  *peers,
           gint64          deadline,
           GCancellable   *cancellable,
           GError        **error)
{
  ShmComm *comm = (ShmComm *) parent;
  LoanWire own = describe_loan (mine);
  g_autofree LoanWire *all = g_new0 (LoanWire, parent->size);
  GError *failure = NULL;

  unmap_loans (comm);
  if (!gather_loans (comm, &own, all, deadline, cancellable, error) || !check_loans (comm, all, error))
    return FALSE;
  comm->loan_maps = g_new0 (guint8 *, parent->size);
  comm->loan_lengths = g_new0 (gsize, parent->size);
  for (int r = 0; r < parent->size && failure == NULL; r++)
    if (r == parent->index)
      peers[r] = _cp_region_get_address (mine);
    else
      map_loan (comm, r, &all[r], &peers[r], &failure);
  if (failure != NULL)
    {
      /* Every rank maps or none reads: the barrier fails everywhere. */
      break_mesh (comm->transport, "share", failure);
      g_clear_error (&failure);
    }
  if (!barrier (comm, deadline, cancellable, error))
    {
      unmap_loans (comm);
      return FALSE;
    }
  g_debug ("shm: %d ranks lend each other %" G_GUINT64_FORMAT " bytes to read in place",
           parent->size, own.length);
  return TRUE;
}

static gboolean
shm_unshare (CpComm        *parent,
             gint64         deadline,
             GCancellable  *cancellable,
             GError       **error)
{
  ShmComm *comm = (ShmComm *) parent;
  gboolean ok = barrier (comm, deadline, cancellable, error);

  /* Whatever the verdict, this rank has stopped reading. */
  unmap_loans (comm);
  return ok;
}

/* ---- the transport ---- */

static void
shm_poll (CpTransport *transport)
{
  ShmTransport *self = (ShmTransport *) transport;
  const char *why;

  /* Each peer alone, so that every lost one is reported (once). */
  for (int r = 0; r < transport->world_size; r++)
    find_lost (self, &r, 1, &why);
}

/* Wakes this rank's sleeping waits, which then see the cancellation. */
static void
shm_interrupt (CpTransport *transport)
{
  ShmTransport *self = (ShmTransport *) transport;

  for (guint i = 0; i < N_COMM_SLOTS; i++)
    if (load64 (&comm_slot (self, i)->hash) != 0)
      futex_wake (&comm_slot (self, i)->bell);
  futex_wake (&rank_slot (self, transport->rank)->bell);
}

static void
shm_fail (CpTransport  *transport,
          const char   *operation,
          const GError *failure)
{
  break_mesh ((ShmTransport *) transport, operation, failure);
}

static void
shm_transport_free (CpTransport *transport)
{
  ShmTransport *self = (ShmTransport *) transport;

  if (self->segment != NULL)
    {
      /* Peers waiting for this rank fail with PEER_LOST from now on. */
      store32 (&rank_slot (self, transport->rank)->left, 1);
      ring_all (self);
      munmap (self->segment, self->layout.size);
    }
  for (int r = 0; r < transport->world_size; r++)
    if (self->pidfds[r] >= 0)
      close (self->pidfds[r]);
  g_free (self->pidfds);
  g_free (self->pids);
  g_free (self->reported);
  g_free (self->sequences);
  g_clear_error (&self->first);
  _cp_mutex_clear (&self->lock);
  _cp_transport_clear (transport);
  g_free (self);
}

static const CpTransportOps shm_ops = {
  .name = "shm",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .transport_free = shm_transport_free,
  .comm_new = shm_comm_new,
  .comm_free = shm_comm_free,
  .collective = shm_collective,
  .isend = shm_isend,
  .irecv = shm_irecv,
  .wait = shm_wait,
  .poll = shm_poll,
  .interrupt = shm_interrupt,
  .fail = shm_fail,
  .share = shm_share,
  .unshare = shm_unshare,
  .alloc_shared = shm_alloc_shared,
};

/* ---- usable here? ---- */

/* kernel.yama.ptrace_scope, or 0 without Yama. */
static int
ptrace_scope (void)
{
  g_autofree char *text = NULL;

  if (!g_file_get_contents ("/proc/sys/kernel/yama/ptrace_scope", &text, NULL, NULL))
    return 0;
  return (int) g_ascii_strtoll (text, NULL, 10);
}

static gboolean
set_unsupported (GError    **error,
                 const char *what,
                 int         errsv)
{
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "%s is refused here: %s", what,
               g_strerror (errsv));
  return FALSE;
}

gboolean
_cp_transport_shm_probe (GError **error)
{
  guint64 word = PROBE_MAGIC, copy = 0;
  struct iovec local = { &copy, sizeof copy }, remote = { &word, sizeof word };
  int fd = memfd_create ("cpmesh-shm-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int scope;

  if (fd < 0)
    return set_unsupported (error, "memfd_create with MFD_ALLOW_SEALING", errno);
  if (fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    {
      int errsv = errno;

      close (fd);
      return set_unsupported (error, "sealing a memfd", errsv);
    }
  close (fd);
  /* Without pidfds, peers are watched through /proc instead. */
  if ((fd = (int) syscall (SYS_pidfd_open, getpid (), 0)) < 0 && errno != ENOSYS)
    return set_unsupported (error, "pidfd_open", errno);
  if (fd >= 0)
    close (fd);
  errno = 0;
  if (process_vm_readv (getpid (), &local, 1, &remote, 1, 0) != sizeof copy || copy != word)
    return set_unsupported (error, "process_vm_readv", errno != 0 ? errno : EFAULT);
  if ((scope = ptrace_scope ()) >= 2)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "process_vm_readv between sibling processes is refused here: kernel.yama.ptrace_scope "
                   "is %d, which lets a process read the memory of no other process it did not start "
                   "(0 or 1 would let ranks read each other's)", scope);
      return FALSE;
    }
  return TRUE;
}

/* ---- the offer: who this rank is and where it listens ---- */

struct _CpShmOffer
{
  int listener;
  CpShmPeer self;
  GBytes *blob;
};

static struct sockaddr_un
abstract_address (const char *name,
                  socklen_t  *length)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  gsize n = strlen (name);

  address.sun_path[0] = '\0';
  memcpy (address.sun_path + 1, name, n);
  *length = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + 1 + n);
  return address;
}

/* A SOCK_SEQPACKET socket listening on a fresh abstract name. */
static int
listen_abstract (char     name[CP_SHM_SOCKET_NAME_LENGTH + 1],
                 GError **error)
{
  int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

  if (fd < 0)
    {
      set_unsupported (error, "a Unix socket", errno);
      return -1;
    }
  for (int attempt = 0; attempt < 8; attempt++)
    {
      guint8 random[16];
      GString *text = g_string_new (CP_SHM_SOCKET_PREFIX);
      struct sockaddr_un address;
      socklen_t length;

      if (getrandom (random, sizeof random, 0) != sizeof random)
        for (guint i = 0; i < sizeof random; i++)
          random[i] = (guint8) g_random_int ();
      for (guint i = 0; i < sizeof random; i++)
        g_string_append_printf (text, "%02x", random[i]);
      g_strlcpy (name, text->str, CP_SHM_SOCKET_NAME_LENGTH + 1);
      g_string_free (text, TRUE);
      address = abstract_address (name, &length);
      if (bind (fd, (struct sockaddr *) &address, length) == 0 && listen (fd, 16) == 0)
        return fd;
      if (errno != EADDRINUSE)
        break;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "an abstract Unix socket for the shm backend could not listen: %s", g_strerror (errno));
  close (fd);
  return -1;
}

void
_cp_transport_shm_offer_free (CpShmOffer *offer)
{
  if (offer == NULL)
    return;
  if (offer->listener >= 0)
    close (offer->listener);
  g_clear_pointer (&offer->blob, g_bytes_unref);
  g_free (offer);
}

CpShmOffer *
_cp_transport_shm_offer (const CpMeshConfig  *config,
                         GError             **error)
{
  CpShmOffer *offer;
  char name[CP_SHM_SOCKET_NAME_LENGTH + 1];

  if (config->world_size > CP_SHM_MAX_WORLD_SIZE)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "the shm backend joins at most %d processes, not %d", CP_SHM_MAX_WORLD_SIZE,
                   config->world_size);
      return NULL;
    }
  if (!_cp_transport_shm_probe (error))
    return NULL;
  /* Under Yama's scope 1 a process reads only its descendants' memory
   * unless it names its reader; ranks are siblings, and each reads every
   * other, so each lets any process of its uid read it, as Open MPI's
   * CMA transport does. */
  if (ptrace_scope () == 1)
    prctl (PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  offer = g_new0 (CpShmOffer, 1);
  offer->listener = listen_abstract (name, error);
  if (offer->listener < 0 || !_cp_shm_peer_init_self (&offer->self, name, error))
    {
      _cp_transport_shm_offer_free (offer);
      return NULL;
    }
  offer->blob = _cp_shm_pack_blob (&offer->self);
  return offer;
}

GBytes *
_cp_transport_shm_offer_get_blob (CpShmOffer *offer)
{
  return offer->blob;
}

gboolean
_cp_transport_shm_check_blob (GBytes    *blob,
                              gpointer   user_data,
                              GError   **error)
{
  CpShmPeer peer;

  return _cp_shm_parse_blob (blob, &peer, error);
}

/* ---- handing the control segment over ---- */

static int
create_segment (gsize    size,
                GError **error)
{
  int fd = memfd_create ("cpmesh-shm-control", MFD_CLOEXEC | MFD_ALLOW_SEALING);

  if (fd >= 0 && ftruncate (fd, (off_t) size) == 0 &&
      fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    return fd;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "rank 0 could not create the shm control segment of %" G_GSIZE_FORMAT " bytes: %s", size,
               g_strerror (errno));
  if (fd >= 0)
    close (fd);
  return -1;
}

static gboolean
check_credentials (int              fd,
                   const CpShmPeer *expected,
                   struct ucred    *cred)
{
  socklen_t length = sizeof *cred;

  return getsockopt (fd, SOL_SOCKET, SO_PEERCRED, cred, &length) == 0 &&
         (guint32) cred->pid == expected->pid && cred->uid == expected->uid;
}

static gboolean
wait_fd (int            fd,
         short          events,
         gint64         deadline,
         GCancellable  *cancellable)
{
  while (!g_cancellable_is_cancelled (cancellable))
    {
      gint64 left = deadline - g_get_monotonic_time ();
      struct pollfd p = { fd, events, 0 };

      if (left <= 0)
        return FALSE;
      if (poll (&p, 1, (int) MIN (left / 1000 + 1, 100)) > 0)
        return TRUE;
    }
  return FALSE;
}

static gboolean
set_connect_timeout (GError        **error,
                     GCancellable   *cancellable,
                     const char     *what)
{
  if (!g_cancellable_set_error_if_cancelled (cancellable, error))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, "%s before the mesh timeout", what);
  return FALSE;
}

/* Rank 0 sends the segment to rank @rank, at the socket its blob names,
 * once the kernel confirms the socket is that process's. */
static gboolean
hand_over (int              segment,
           const guint8    *session,
           const CpShmPeer *peer,
           int              rank,
           gint64           deadline,
           GCancellable    *cancellable,
           GError         **error)
{
  socklen_t length;
  struct sockaddr_un address = abstract_address (peer->socket, &length);
  int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct ucred cred = { 0 };
  union { struct cmsghdr header; char space[CMSG_SPACE (sizeof (int))]; } control;
  struct iovec iov = { (void *) session, SESSION_SIZE };
  struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                            .msg_controllen = sizeof control.space };
  struct cmsghdr *cmsg;
  gboolean ok = FALSE;

  while (fd >= 0 && connect (fd, (struct sockaddr *) &address, length) != 0)
    {
      /* A full backlog: strangers at the socket; the rank drops them. */
      if (errno != EAGAIN || g_get_monotonic_time () >= deadline || g_cancellable_is_cancelled (cancellable))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "rank 0 could not reach rank %d's shm socket: %s", rank, g_strerror (errno));
          close (fd);
          return FALSE;
        }
      g_usleep (1000);
    }
  if (fd < 0)
    return set_unsupported (error, "a Unix socket", errno);
  if (!check_credentials (fd, peer, &cred))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "the shm socket rank %d named belongs to process %d (uid %u), not to rank %d's "
                   "process %u", rank, (int) cred.pid, (guint) cred.uid, rank, peer->pid);
      close (fd);
      return FALSE;
    }
  memset (&control, 0, sizeof control);
  cmsg = CMSG_FIRSTHDR (&message);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN (sizeof (int));
  memcpy (CMSG_DATA (cmsg), &segment, sizeof (int));
  while (!ok)
    {
      if (sendmsg (fd, &message, MSG_NOSIGNAL) == SESSION_SIZE)
        ok = TRUE;
      else if (errno != EAGAIN || !wait_fd (fd, POLLOUT, deadline, cancellable))
        break;
    }
  if (!ok)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "rank 0 could not hand the shm control segment to rank %d: %s", rank, g_strerror (errno));
  close (fd);
  return ok;
}

/* The one descriptor a message from rank 0 carries, and its session id;
 * -1 with an error for anything else. */
static int
receive_descriptor (int        fd,
                    guint8    *session,
                    GError   **error)
{
  union { struct cmsghdr header; char space[CMSG_SPACE (4 * sizeof (int))]; } control;
  guint8 body[SESSION_SIZE + 1];
  struct iovec iov = { body, sizeof body };
  struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                            .msg_controllen = sizeof control.space };
  ssize_t got = recvmsg (fd, &message, MSG_CMSG_CLOEXEC);
  int received[4], n_received = 0;

  for (struct cmsghdr *cmsg = got >= 0 ? CMSG_FIRSTHDR (&message) : NULL; cmsg != NULL;
       cmsg = CMSG_NXTHDR (&message, cmsg))
    if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS)
      for (gsize i = 0; i < (cmsg->cmsg_len - CMSG_LEN (0)) / sizeof (int) && n_received < 4; i++)
        memcpy (&received[n_received++], CMSG_DATA (cmsg) + i * sizeof (int), sizeof (int));
  if (got == SESSION_SIZE && n_received == 1 && !(message.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
    {
      memcpy (session, body, SESSION_SIZE);
      return received[0];
    }
  for (int i = 0; i < n_received; i++)
    close (received[i]);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "rank 0 sent %" G_GSSIZE_FORMAT " bytes and %d descriptors where the shm control "
               "segment was expected", got, n_received);
  return -1;
}

/* Accepts connections until rank 0's arrives, dropping strangers, and
 * takes the segment it carries. */
static int
receive_segment (int               listener,
                 const CpShmPeer  *root,
                 int               rank,
                 guint8           *session,
                 gint64            deadline,
                 GCancellable     *cancellable,
                 GError          **error)
{
  for (;;)
    {
      struct ucred cred = { 0 };
      int fd, segment;

      if (!wait_fd (listener, POLLIN, deadline, cancellable))
        {
          g_autofree char *what = g_strdup_printf ("rank %d: rank 0 did not hand over the shm control "
                                                   "segment", rank);

          set_connect_timeout (error, cancellable, what);
          return -1;
        }
      fd = accept4 (listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0)
        continue;
      if (!check_credentials (fd, root, &cred))
        {
          g_debug ("shm: rank %d dropped a connection from process %d (uid %u), which is not rank 0",
                   rank, (int) cred.pid, (guint) cred.uid);
          close (fd);
          continue;
        }
      segment = wait_fd (fd, POLLIN, deadline, cancellable) ? receive_descriptor (fd, session, error) : -1;
      if (segment < 0 && (error == NULL || *error == NULL))
        set_connect_timeout (error, cancellable, "rank 0 connected but sent no shm control segment");
      close (fd);
      return segment;
    }
}

gboolean
_cp_shm_check_segment (int          fd,
                       gsize        size,
                       const char  *sender,
                       GError     **error)
{
  const int required = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  int seals = fcntl (fd, F_GET_SEALS);
  struct stat st;

  if (seals < 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s handed over a descriptor that is not a sealable memfd (F_GET_SEALS: %s)", sender,
                   g_strerror (errno));
      return FALSE;
    }
  if ((seals & required) != required || (seals & F_SEAL_WRITE))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s handed over a control segment sealed 0x%x; it must be sealed against shrinking, "
                   "growing and resealing (0x%x) and writable", sender, (guint) seals, (guint) required);
      return FALSE;
    }
  if (fstat (fd, &st) != 0 || !S_ISREG (st.st_mode) || (guint64) st.st_size != size)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s handed over a control segment of the wrong size, %" G_GINT64_FORMAT " bytes; this mesh's is %"
                   G_GSIZE_FORMAT, sender, (gint64) st.st_size, size);
      return FALSE;
    }
  return TRUE;
}

/* ---- finishing the connection ---- */

static ShmTransport *
transport_new (const CpMeshConfig *config)
{
  ShmTransport *self = g_new0 (ShmTransport, 1);
  int n = config->world_size;

  _cp_transport_init (&self->parent, &shm_ops, config->rank, n);
  _cp_mutex_init (&self->lock);
  self->layout = layout_for (n);
  self->pidfds = g_new (int, n);
  self->pids = g_new0 (guint32, n);
  self->reported = g_new0 (gboolean, n);
  self->sequences = g_new0 (guint64, n);
  for (int r = 0; r < n; r++)
    self->pidfds[r] = -1;
  return self;
}

/* A size in bytes from the environment variable @name, in [@min, @max]. */
static gboolean
read_size_setting (const char  *name,
                   guint64      min,
                   guint64      max,
                   gsize       *size,
                   GError     **error)
{
  const char *text = g_getenv (name);
  guint64 value = *size;

  if (text != NULL && !g_ascii_string_to_unsigned (text, 10, min, max, &value, NULL))
    {
      g_autofree char *shown = _cp_mesh_escape_text (text, -1);

      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "%s=\"%s\": expected a number of bytes in [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                   name, shown, min, max);
      return FALSE;
    }
  *size = (gsize) value;
  return TRUE;
}

/* Every rank must read the same values: they decide the algorithm. */
static gboolean
read_settings (ShmTransport  *self,
               GError       **error)
{
  self->chunk = DEFAULT_CHUNK;
  self->direct = DEFAULT_DIRECT;
  return read_size_setting ("CPMESH_SHM_CHUNK", 4096, 1 << 30, &self->chunk, error) &&
         read_size_setting ("CPMESH_SHM_DIRECT", 0, G_MAXUINT32, &self->direct, error);
}

static gboolean
open_pidfds (ShmTransport     *self,
             const CpShmPeer  *peers,
             GError          **error)
{
  for (int r = 0; r < self->parent.world_size; r++)
    {
      self->pids[r] = peers[r].pid;
      if (r == self->parent.rank)
        continue;
      self->pidfds[r] = (int) syscall (SYS_pidfd_open, (pid_t) peers[r].pid, 0);
      if (self->pidfds[r] < 0 && errno == ENOSYS && !process_gone (peers[r].pid))
        continue;
      if (self->pidfds[r] < 0)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                       "rank %d: rank %d's process %u is gone (pidfd_open: %s)", self->parent.rank, r,
                       peers[r].pid, g_strerror (errno));
          return FALSE;
        }
    }
  return TRUE;
}

static gboolean
map_segment (ShmTransport  *self,
             int            fd,
             GError       **error)
{
  void *mapped = mmap (NULL, self->layout.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

  if (mapped == MAP_FAILED)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "rank %d could not map the shm control segment: %s", self->parent.rank, g_strerror (errno));
      return FALSE;
    }
  self->segment = mapped;
  return TRUE;
}

/* Rank 0: creates, maps and hands over the segment. */
static gboolean
share_segment (ShmTransport     *self,
               const CpShmPeer  *peers,
               gint64            deadline,
               GCancellable     *cancellable,
               GError          **error)
{
  int fd = create_segment (self->layout.size, error);
  SegmentHeader *header;
  gboolean ok;

  if (fd < 0 || !map_segment (self, fd, error))
    {
      if (fd >= 0)
        close (fd);
      return FALSE;
    }
  header = header_of (self);
  header->magic = SEGMENT_MAGIC;
  header->version = SEGMENT_VERSION;
  header->world_size = (guint32) self->parent.world_size;
  if (getrandom (header->session, SESSION_SIZE, 0) != SESSION_SIZE)
    for (guint i = 0; i < SESSION_SIZE; i++)
      header->session[i] = (guint8) g_random_int ();
  ok = TRUE;
  for (int r = 1; ok && r < self->parent.world_size; r++)
    ok = hand_over (fd, header->session, &peers[r], r, deadline, cancellable, error);
  close (fd);
  return ok;
}

/* Every other rank: takes the segment from rank 0, checks and maps it. */
static gboolean
join_segment (ShmTransport     *self,
              CpShmOffer       *offer,
              const CpShmPeer  *peers,
              gint64            deadline,
              GCancellable     *cancellable,
              GError          **error)
{
  guint8 session[SESSION_SIZE];
  int fd = receive_segment (offer->listener, &peers[0], self->parent.rank, session, deadline, cancellable,
                            error);
  SegmentHeader *header;
  gboolean ok;

  if (fd < 0)
    return FALSE;
  ok = _cp_shm_check_segment (fd, self->layout.size, "rank 0", error) && map_segment (self, fd, error);
  close (fd);
  if (!ok)
    return FALSE;
  header = header_of (self);
  if (header->magic != SEGMENT_MAGIC || header->version != SEGMENT_VERSION ||
      header->world_size != (guint32) self->parent.world_size ||
      memcmp (header->session, session, SESSION_SIZE) != 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "rank 0 handed over a control segment of another kind, version or mesh");
      return FALSE;
    }
  return TRUE;
}

/* Every peer wrote its own pid into its slot and lets this rank read its
 * memory: process_vm_readv of its probe word proves both that the pid is
 * the process that maps the segment and that the kernel allows the reads
 * collectives make. */
static gboolean
check_peers (ShmTransport     *self,
             const Operation  *op,
             GError          **error)
{
  for (int r = 0; r < self->parent.world_size; r++)
    {
      RankSlot *slot = rank_slot (self, r);
      guint64 word = 0;
      struct iovec local = { &word, sizeof word };
      struct iovec remote = { (void *) (guintptr) slot->probe_address, sizeof word };

      if (r == self->parent.rank)
        continue;
      if (!load32 (&slot->ready) || slot->pid != self->pids[r])
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "%s: rank %d's slot names process %u, its blob %u", op->what, r, slot->pid,
                       self->pids[r]);
          return FALSE;
        }
      if (process_vm_readv ((pid_t) self->pids[r], &local, 1, &remote, 1, 0) != sizeof word ||
          word != (PROBE_MAGIC ^ self->pids[r]))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                       "%s: rank %d may not read the memory of rank %d (process %u): process_vm_readv: %s",
                       op->what, self->parent.rank, r, self->pids[r],
                       word == 0 ? g_strerror (errno) : "it holds something else");
          return FALSE;
        }
    }
  return TRUE;
}

/* Two sync points over all ranks: after the first every slot is written;
 * the second fails on every rank if one of them could not check its
 * peers. */
static gboolean
meet_peers (ShmTransport  *self,
            gint64         deadline,
            GError       **error)
{
  int n = self->parent.world_size;
  g_autofree int *everyone = g_new (int, n);
  ShmComm *comm;
  Operation op = { "connect", "connect", deadline, g_get_monotonic_time () };
  GError *failure = NULL;
  gboolean ok;

  for (int r = 0; r < n; r++)
    everyone[r] = r;
  comm = comm_new (self, CONNECT_KEY, everyone, n, self->parent.rank, error);
  if (comm == NULL)
    return FALSE;
  ok = sync_point (comm, &op, error);
  if (ok && !check_peers (self, &op, &failure))
    {
      fail_between_syncs (comm, &op, failure);
      g_propagate_error (error, failure);
      ok = FALSE;
    }
  ok = ok && sync_point (comm, &op, error);
  shm_comm_free (&comm->parent);
  return ok;
}

CpTransport *
_cp_transport_shm_finish (CpShmOffer          *offer,
                          const CpMeshConfig  *config,
                          GBytes * const      *blobs,
                          gint64               deadline,
                          GCancellable        *cancellable,
                          GError             **error)
{
  int n = config->world_size, me = config->rank;
  g_autofree CpShmPeer *peers = g_new0 (CpShmPeer, n);
  ShmTransport *self;
  gboolean ok = TRUE;

  g_return_val_if_fail (n <= CP_SHM_MAX_WORLD_SIZE, NULL);
  for (int r = 0; ok && r < n; r++)
    ok = _cp_shm_parse_blob (blobs[r], &peers[r], error) &&
         (r == me || _cp_shm_peer_check_same_host (&offer->self, &peers[r], r, error));
  if (!ok)
    return NULL;
  self = transport_new (config);
  self->probe_word = PROBE_MAGIC ^ offer->self.pid;
  ok = read_settings (self, error) && open_pidfds (self, peers, error) &&
       (me == 0 ? share_segment (self, peers, deadline, cancellable, error)
                : join_segment (self, offer, peers, deadline, cancellable, error));
  /* Nobody else may connect from now on. */
  close (offer->listener);
  offer->listener = -1;
  if (ok)
    {
      RankSlot *slot = rank_slot (self, me);

      slot->pid = offer->self.pid;
      slot->probe_address = (guintptr) &self->probe_word;
      store32 (&slot->ready, 1);
      ok = meet_peers (self, deadline, error);
    }
  if (!ok)
    {
      _cp_transport_unref (&self->parent);
      return NULL;
    }
  g_debug ("shm: rank %d of %d joined; control segment of %" G_GSIZE_FORMAT " bytes, collectives pull "
           "peers' buffers with process_vm_readv, all-reduce in chunks of %" G_GSIZE_FORMAT " bytes, direct "
           "up to %" G_GSIZE_FORMAT " bytes", me, n, self->layout.size, self->chunk, self->direct);
  return &self->parent;
}

/* ---- the backend table's row ---- */

static gboolean
shm_probe (const CpMeshConfig  *config,
           GError             **error)
{
  if (config != NULL && config->world_size > CP_SHM_MAX_WORLD_SIZE)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "the shm backend joins at most %d processes, not %d", CP_SHM_MAX_WORLD_SIZE,
                   config->world_size);
      return FALSE;
    }
  return _cp_transport_shm_probe (error);
}

static GBytes *
shm_offer (const CpMeshConfig      *config,
           const CpBootstrapRoute  *route,
           gpointer                *state,
           GError                 **error)
{
  CpShmOffer *offer = _cp_transport_shm_offer (config, error);

  if (offer == NULL)
    return NULL;
  *state = offer;
  return g_bytes_ref (offer->blob);
}

/* Every rank on this rank's host, namespaces and uid: as the relation is
 * equality of those fields, every rank that compares the others with
 * itself reaches the same verdict from the same blobs. */
static gboolean
shm_usable_with (const CpMeshConfig  *config,
                 GBytes * const      *blobs,
                 GError             **error)
{
  CpShmPeer self, peer;

  if (!_cp_shm_parse_blob (blobs[config->rank], &self, error))
    return FALSE;
  for (int r = 0; r < config->world_size; r++)
    if (r != config->rank &&
        (!_cp_shm_parse_blob (blobs[r], &peer, error) || !_cp_shm_peer_check_same_host (&self, &peer, r, error)))
      return FALSE;
  return TRUE;
}

static CpTransport *
shm_finish (const CpMeshConfig  *config,
            gpointer             state,
            GBytes * const      *blobs,
            gint64               deadline,
            GCancellable        *cancellable,
            GError             **error)
{
  CpTransport *transport = _cp_transport_shm_finish (state, config, blobs, deadline, cancellable, error);

  _cp_transport_shm_offer_free (state);
  return transport;
}

static void
shm_abandon (gpointer state)
{
  _cp_transport_shm_offer_free (state);
}

/* Before ucx in the default chain: ranks that all share one host, its
 * namespaces and uid copy once, straight out of each other's buffers. */
const CpTransportBackend _cp_transport_shm_backend = {
  .name = "shm",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .priority = 100,
  .summary = "processes of one host, copying once out of each other's buffers",
  .probe = shm_probe,
  .offer = shm_offer,
  .check = _cp_transport_shm_check_blob,
  .usable_with = shm_usable_with,
  .finish = shm_finish,
  .abandon = shm_abandon,
};

/* ---- blobs ---- */

#define BLOB_TYPE "(uusttttuus)"

static gboolean
read_namespace (const char  *name,
                guint64     *inode,
                GError     **error)
{
  g_autofree char *path = g_strdup_printf ("/proc/self/ns/%s", name);
  struct stat st;

  if (stat (path, &st) != 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "%s cannot be read here: %s", path,
                   g_strerror (errno));
      return FALSE;
    }
  *inode = (guint64) st.st_ino;
  return TRUE;
}

gboolean
_cp_shm_peer_init_self (CpShmPeer   *peer,
                        const char  *socket_name,
                        GError     **error)
{
  g_autofree char *boot_id = NULL;
  g_autoptr(GError) local_error = NULL;

  memset (peer, 0, sizeof *peer);
  if (!g_file_get_contents ("/proc/sys/kernel/random/boot_id", &boot_id, NULL, &local_error))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "the host's boot id is unknown: %s",
                   local_error->message);
      return FALSE;
    }
  g_strstrip (boot_id);
  g_strlcpy (peer->boot_id, boot_id, sizeof peer->boot_id);
  peer->uid = (guint32) getuid ();
  peer->pid = (guint32) getpid ();
  g_strlcpy (peer->socket, socket_name, sizeof peer->socket);
  return read_namespace ("pid", &peer->pid_ns, error) && read_namespace ("net", &peer->net_ns, error) &&
         read_namespace ("user", &peer->user_ns, error);
}

GBytes *
_cp_shm_pack_blob (const CpShmPeer *peer)
{
  g_autoptr(GVariant) variant = g_variant_ref_sink (
    g_variant_new (BLOB_TYPE, CP_SHM_BLOB_MAGIC, CP_SHM_BLOB_VERSION, peer->boot_id, (guint64) 0,
                   peer->pid_ns, peer->net_ns, peer->user_ns, peer->uid, peer->pid, peer->socket));

  return g_variant_get_data_as_bytes (variant);
}

static gboolean
is_hex_text (const char *text,
             gsize       length,
             gboolean    dashes)
{
  for (gsize i = 0; i < length; i++)
    if (!g_ascii_isxdigit (text[i]) && !(dashes && text[i] == '-'))
      return FALSE;
  return TRUE;
}

static gboolean
set_malformed (GError     **error,
               const char  *what)
{
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "a malformed shm offer: %s", what);
  return FALSE;
}

gboolean
_cp_shm_parse_blob (GBytes     *blob,
                    CpShmPeer  *peer,
                    GError    **error)
{
  g_autoptr(GVariant) variant = NULL;
  guint32 magic, version;
  const char *boot_id, *socket_name;
  guint64 reserved;

  memset (peer, 0, sizeof *peer);
  variant = g_variant_ref_sink (g_variant_new_from_bytes (G_VARIANT_TYPE (BLOB_TYPE), blob, FALSE));
  if (!g_variant_is_normal_form (variant))
    return set_malformed (error, "not a " BLOB_TYPE " GVariant in normal form");
  g_variant_get (variant, "(uu&sttttuu&s)", &magic, &version, &boot_id, &reserved, &peer->pid_ns,
                 &peer->net_ns, &peer->user_ns, &peer->uid, &peer->pid, &socket_name);
  if (magic != CP_SHM_BLOB_MAGIC)
    return set_malformed (error, "not from the shm backend");
  if (version != CP_SHM_BLOB_VERSION)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "a shm offer of version %u; this libcpmesh speaks version %u", version, CP_SHM_BLOB_VERSION);
      return FALSE;
    }
  if (strlen (boot_id) != CP_SHM_BOOT_ID_LENGTH || !is_hex_text (boot_id, CP_SHM_BOOT_ID_LENGTH, TRUE))
    return set_malformed (error, "its boot id is not a UUID");
  if (strlen (socket_name) != CP_SHM_SOCKET_NAME_LENGTH || !g_str_has_prefix (socket_name, CP_SHM_SOCKET_PREFIX) ||
      !is_hex_text (socket_name + strlen (CP_SHM_SOCKET_PREFIX), 32, FALSE))
    return set_malformed (error, "its socket name is not " CP_SHM_SOCKET_PREFIX " and 32 hexadecimal digits");
  if (peer->pid == 0 || peer->pid > G_MAXINT32 || reserved != 0)
    return set_malformed (error, "its process id or reserved field is out of range");
  g_strlcpy (peer->boot_id, boot_id, sizeof peer->boot_id);
  g_strlcpy (peer->socket, socket_name, sizeof peer->socket);
  return TRUE;
}

gboolean
_cp_shm_peer_check_same_host (const CpShmPeer  *self,
                              const CpShmPeer  *peer,
                              int               rank,
                              GError          **error)
{
  const char *differs = NULL;

  if (!g_str_equal (self->boot_id, peer->boot_id))
    differs = "runs on another host (or another boot of this one)";
  else if (self->pid_ns != peer->pid_ns)
    differs = "runs in another PID namespace";
  else if (self->net_ns != peer->net_ns)
    differs = "runs in another network namespace";
  else if (self->user_ns != peer->user_ns)
    differs = "runs in another user namespace";
  else if (self->uid != peer->uid)
    differs = "runs as another user";
  if (differs == NULL)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "the shm backend joins processes of one host, namespace and user, but rank %d %s "
               "(uid %u, pid %u, boot id %s; this rank: uid %u, pid %u, boot id %s)", rank, differs, peer->uid,
               peer->pid, peer->boot_id, self->uid, self->pid, self->boot_id);
  return FALSE;
}
