/* cp-transport-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>

#include "cp-sync-private.h"
#include "cp-bootstrap-private.h"

#include "cp-region-private.h"
#include "cp-tensor.h"
#include "cp-types.h"

G_BEGIN_DECLS

/* A transport connects the processes or threads of one mesh: W ranks that
 * can reach each other.  A communicator (CpComm) is a subset of those
 * ranks — the whole mesh or one submesh — that runs collectives together.
 * Backends subclass both by embedding them as their first member.
 *
 * Every blocking operation takes an absolute deadline in g_get_monotonic_time()
 * microseconds and fails with CP_MESH_ERROR_TIMED_OUT (or PEER_LOST) rather
 * than wait past it.  It also takes the cancellable of the call it runs
 * for (NULL: none; an asynchronous call's, cp-task-private.h), and ends
 * as soon as that is cancelled, with CP_MESH_ERROR_CANCELLED: a failure
 * like a timeout.  A transport learns of a cancellation only from that
 * argument.
 *
 * A failure breaks the whole transport, on every rank: a rank whose
 * operation times out, loses a peer or gets a message it cannot use
 * records that first failure and makes every rank record it too, and from
 * then on every operation of every communicator fails at once, naming it.
 * Errors every rank reaches together (ranks that disagree on a
 * collective, a point-to-point mismatch, a rank's own bad arguments) are
 * verdicts, not failures: the transport stays usable after them. */
typedef struct _CpTransport CpTransport;
typedef struct _CpComm CpComm;
typedef struct _CpRequest CpRequest;
typedef struct _CpTransportOps CpTransportOps;

/* What a backend can do, so that callers ask for a property rather than
 * test a backend's name. */
typedef enum
{
  CP_TRANSPORT_CAP_NONE = 0,
  /* Every rank is a thread of this process: the ranks share one address
   * space and one machine's processors. */
  CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE = 1 << 0,
} CpTransportCaps;

/* The bit of memory kind @kind in a set of kinds. */
#define CP_TRANSPORT_DEVICE(kind) (1u << (kind))

typedef enum
{
  CP_COLL_BARRIER,
  CP_COLL_ALL_GATHER,
  CP_COLL_ALL_TO_ALL,
  CP_COLL_ALL_REDUCE,
  CP_COLL_BROADCAST,
} CpCollKind;

/* One rank's view of a collective call.  Ranks compare their descriptors
 * before any byte moves, so a disagreement is an error on every rank and
 * never a corrupted buffer. */
typedef struct
{
  CpCollKind kind;
  CpDType dtype;
  guint n_dims;
  gint64 shape[CP_TENSOR_MAX_DIMS];
  int dim;              /* all-gather / all-to-all dimension */
  int root;             /* broadcast root, a communicator index */
  CpReduceOp op;        /* all-reduce */

  /* Set when this rank's own arguments were bad: the collective still
   * runs its rendezvous so that every rank fails with this error. */
  GError *invalid;

  /* Byte geometry.  All-gather: send is [outer][block], recv is
   * [outer][size][block].  All-to-all: send and recv are
   * [outer][size][block].  All-reduce and broadcast work in place on recv,
   * `count` elements.  The regions name the memory (cp-region-private.h):
   * the caller holds them, and clears them once the collective returned;
   * a region not set (a rank with bad arguments, a barrier, all-reduce's
   * send) names nothing. */
  gsize outer;
  gsize block;
  gsize count;
  CpRegion send;
  CpRegion recv;

  /* Where send and recv live, the same on every rank (part of the
   * agreement), and the stream of that device the copies are ordered on
   * (NULL: the device's default; host memory has none). */
  CpDeviceKind device;
  gpointer stream;
} CpCollective;

/* A point-to-point message: the receiver checks dtype and shape against
 * what it expects. */
typedef struct
{
  CpDType dtype;
  guint n_dims;
  gint64 shape[CP_TENSOR_MAX_DIMS];
  /* The memory sent from or received into, of nbytes bytes (its length),
   * held by the caller until the request's wait returned. */
  CpRegion data;
  gsize nbytes;
  /* The stream the copies are ordered on, as for a collective; each side
   * describes its own buffer (data.device says where it lives). */
  gpointer stream;
} CpMessage;

struct _CpTransportOps
{
  const char *name;
  CpTransportCaps caps;
  /* The memory kinds its collectives and messages move, as
   * CP_TRANSPORT_DEVICE() bits. */
  guint device_kinds;

  /* Tears the backend down, then calls _cp_transport_clear() before it
   * frees the structure: peers may still report failures while it closes
   * its connections. */
  void       (*transport_free) (CpTransport   *transport);

  /* A communicator of @n_members transport ranks in which this rank has
   * index @my_index.  Every member creates it with the same @label and
   * list; communicators with different labels never match each other's
   * operations, even over the same ranks. */
  CpComm    *(*comm_new)       (CpTransport   *transport,
                                const char    *label,
                                const int     *members,
                                int            n_members,
                                int            my_index,
                                GError       **error);
  void       (*comm_free)      (CpComm        *comm);

  gboolean   (*collective)     (CpComm        *comm,
                                CpCollective  *coll,
                                gint64         deadline,
                                GCancellable  *cancellable,
                                GError       **error);

  /* Non-blocking point-to-point; @peer is a communicator index.  The
   * message, and the region it names, must stay valid until wait()
   * returns. */
  CpRequest *(*isend)          (CpComm        *comm,
                                int            peer,
                                guint64        tag,
                                const CpMessage *message);
  CpRequest *(*irecv)          (CpComm        *comm,
                                int            peer,
                                guint64        tag,
                                CpMessage     *message);
  /* Completes and frees @request. */
  gboolean   (*wait)           (CpComm        *comm,
                                CpRequest     *request,
                                gint64         deadline,
                                GCancellable  *cancellable,
                                GError       **error);

  /* Optional: makes progress without blocking, unless another thread is
   * inside the transport, so that lost peers are noticed while the
   * program is idle. */
  void       (*poll)           (CpTransport   *transport);

  /* Optional, for backends whose waits sleep: wakes this rank's waits,
   * from any thread, so that they see at once that the cancellable they
   * were given was cancelled.  Backends whose waits poll look at it in
   * every round instead. */
  void       (*interrupt)      (CpTransport   *transport);

  /* Records @failure, which this rank suffered outside any wait of the
   * transport during @operation (an asynchronous call cancelled before it
   * began), as the first failure, and makes every rank record it, as a
   * failure inside a wait does. */
  void       (*fail)           (CpTransport   *transport,
                                const char    *operation,
                                const GError  *failure);

  /* Optional, for backends whose ranks are processes that can map each
   * other's memory: a collective by which every member lends the others
   * @mine, host memory from alloc_shared(), and learns in @peers[i] the
   * kernel address at which this rank reads member i's loan (its own
   * included),
   * readable until unshare().  Backends whose ranks share an address
   * space need neither: the seam lends through an all-gather of
   * addresses (_cp_comm_share()). */
  gboolean   (*share)          (CpComm        *comm,
                                const CpRegion *mine,
                                gconstpointer *peers,
                                gint64         deadline,
                                GCancellable  *cancellable,
                                GError       **error);
  /* Ends the loans of the last share(): returns once no member reads
   * another's memory any more, so every member may write or free its
   * own again; a collective. */
  gboolean   (*unshare)        (CpComm        *comm,
                                gint64         deadline,
                                GCancellable  *cancellable,
                                GError       **error);
  /* Optional: @size bytes of host memory that share() can lend (a
   * sealed memfd another process can map), where the library allocates
   * buffers its peers will read, as a GStreamer element proposes its
   * allocator downstream. */
  CpStorage *(*alloc_shared)   (CpTransport   *transport,
                                gsize          size,
                                GError       **error);
};

/* Told that the transport lost the process of world rank @rank.  Called
 * from whichever thread noticed, inside the transport: it must only
 * schedule work, never call back into the mesh. */
typedef void (*CpPeerLostFunc) (int          rank,
                                const char  *reason,
                                gpointer     user_data);

struct _CpTransport
{
  const CpTransportOps *ops;
  gatomicrefcount ref_count;
  int rank;
  int world_size;

  CpMutex peer_lost_lock;
  CpPeerLostFunc peer_lost_func;
  gpointer peer_lost_data;
  GDestroyNotify peer_lost_destroy;
};

struct _CpComm
{
  CpTransport *transport;
  int size;
  int index;
  int *members;
};

CpTransport *_cp_transport_ref   (CpTransport  *transport);
void         _cp_transport_unref (CpTransport  *transport);
void         _cp_transport_init  (CpTransport          *transport,
                                  const CpTransportOps *ops,
                                  int                   rank,
                                  int                   world_size);
void         _cp_transport_clear (CpTransport          *transport);

void         _cp_transport_set_peer_lost_func (CpTransport    *transport,
                                              CpPeerLostFunc  func,
                                              gpointer        user_data,
                                              GDestroyNotify  destroy);
void         _cp_transport_report_peer_lost   (CpTransport    *transport,
                                              int             rank,
                                              const char     *reason);

void         _cp_comm_init       (CpComm       *comm,
                                  CpTransport  *transport,
                                  const int    *members,
                                  int           n_members,
                                  int           my_index);
void         _cp_comm_clear      (CpComm       *comm);
/* "label:0,2,4": names a communicator the same way on every member. */
char        *_cp_comm_key        (const char   *label,
                                  const int    *members,
                                  int           n);
void         _cp_comm_free       (CpComm       *comm);

/* The calls the rest of the library makes on a transport: the only way
 * in from outside transports/, so that a backend is a table of functions
 * no caller names. */
const char  *_cp_transport_get_name    (CpTransport      *transport);
gboolean     _cp_transport_has_caps    (CpTransport      *transport,
                                        CpTransportCaps   caps);
/* The memory kinds @transport moves, as CP_TRANSPORT_DEVICE() bits. */
guint        _cp_transport_get_device_kinds (CpTransport *transport);
CpComm      *_cp_transport_comm_new    (CpTransport      *transport,
                                        const char       *label,
                                        const int        *members,
                                        int               n_members,
                                        int               my_index,
                                        GError          **error);
/* Whether _cp_transport_poll() does anything: backends that notice lost
 * peers only while they wait need no polling. */
gboolean     _cp_transport_can_poll    (CpTransport      *transport);
void         _cp_transport_poll        (CpTransport      *transport);
/* Whether _cp_transport_interrupt() does anything: backends whose waits
 * poll see a cancellation by themselves. */
gboolean     _cp_transport_can_interrupt (CpTransport    *transport);
void         _cp_transport_interrupt   (CpTransport      *transport);
void         _cp_transport_fail        (CpTransport      *transport,
                                        const char       *operation,
                                        const GError     *failure);

gboolean     _cp_comm_collective       (CpComm           *comm,
                                        CpCollective     *coll,
                                        gint64            deadline,
                                        GCancellable     *cancellable,
                                        GError          **error);
CpRequest   *_cp_comm_isend            (CpComm           *comm,
                                        int               peer,
                                        guint64           tag,
                                        const CpMessage  *message);
CpRequest   *_cp_comm_irecv            (CpComm           *comm,
                                        int               peer,
                                        guint64           tag,
                                        CpMessage        *message);
gboolean     _cp_comm_wait             (CpComm           *comm,
                                        CpRequest        *request,
                                        gint64            deadline,
                                        GCancellable     *cancellable,
                                        GError          **error);

/* What a rank learns from a share: where it reads each member's loan
 * (its own included), in communicator order, and what it holds to keep
 * the loans of peers in its own address space alive until it has read
 * them, so that a lender that fails and frees its memory cannot pull it
 * from under a reader. */
typedef struct
{
  int n;
  gconstpointer *addresses;
  CpStorage **held;
} CpLoans;

/* Drops what @loans holds; once this rank has read the loans, or given
 * up reading them. */
void         _cp_loans_clear           (CpLoans          *loans);

/* Whether the members of @comm can lend each other memory of kind
 * @device to read where it lies (_cp_comm_share()): ranks that share an
 * address space always can, processes when their backend maps each
 * other's memory (host memory only).  The same answer on every member. */
gboolean     _cp_comm_can_share        (CpComm           *comm,
                                        CpDeviceKind      device);
/* Lends @mine to every member of @comm and fills @loans with the kernel
 * address of member i's loan, until _cp_comm_unshare(); both are
 * collectives of @comm, with the agreement and failure rules of every
 * other collective (a loan of another length on another rank is a
 * verdict on every rank). */
gboolean     _cp_comm_share            (CpComm           *comm,
                                        const CpRegion   *mine,
                                        CpLoans          *loans,
                                        gint64            deadline,
                                        GCancellable     *cancellable,
                                        GError          **error);
gboolean     _cp_comm_unshare          (CpComm           *comm,
                                        gint64            deadline,
                                        GCancellable     *cancellable,
                                        GError          **error);
/* Storage of @size bytes that @transport can lend, or NULL (no error)
 * when any host memory will do or the transport lends none. */
CpStorage   *_cp_transport_alloc_shared (CpTransport     *transport,
                                         gsize            size,
                                         GError         **error);

/* Copies @height rows of @width bytes from @src, in memory of kind
 * @src_kind, to @dst, in memory of kind @dst_kind, through the memory
 * interface, as backends whose ranks share an address space move bytes:
 * host memory with the streaming copy when @streaming, device memory as
 * its device copies it.  FALSE with an error when the device failed. */
gboolean     _cp_transport_copy_2d     (gpointer          dst,
                                        CpDeviceKind      dst_kind,
                                        gsize             dst_pitch,
                                        gconstpointer     src,
                                        CpDeviceKind      src_kind,
                                        gsize             src_pitch,
                                        gsize             width,
                                        gsize             height,
                                        gboolean          streaming,
                                        GError          **error);

/* Decides, identically on every rank, whether the descriptors of one
 * collective agree.  @descs holds every rank's descriptor in communicator
 * order; @speaker is the mesh rank of the caller, which an error names
 * first, since it reports what may be another rank's mistake. */
gboolean     _cp_collective_check_agreement (const CpCollective * const *descs,
                                             int                   n,
                                             int                   speaker,
                                             GError              **error);

/* Reduces elements [@offset, @offset + @count) of @n buffers into
 * @dst[0 .. @count), in buffer order, so every rank and every backend computing it gets
 * identical bits.  16-bit floats
 * are accumulated in float32 and rounded once. */
void         _cp_reduce_many     (CpDType        dtype,
                                  CpReduceOp     op,
                                  gpointer       dst,
                                  gconstpointer *srcs,
                                  int            n,
                                  gsize          offset,
                                  gsize          count);

/* Where member @r's slice of an all-reduce's @coll->count elements
 * starts when @n members split them (it ends where member r + 1's
 * starts).  Every backend splits the same way, so every rank reduces the
 * same elements in the same order. */
gsize        _cp_collective_slice_start (const CpCollective *coll,
                                         int                 n,
                                         int                 r);

const char  *_cp_collective_name (CpCollKind kind);

/* How a first failure names the operation it struck, the same in every
 * backend: "all_gather #12", the twelfth collective of its communicator
 * on this rank, or "send to rank 1 with tag 5", "recv from rank 0 with
 * tag 5". */
void         _cp_collective_label (char          *label,
                                   gsize          size,
                                   CpCollKind     kind,
                                   guint64        call);
void         _cp_message_label    (char          *label,
                                   gsize          size,
                                   gboolean       is_send,
                                   int            peer,
                                   guint64        tag);

/* A transport's first failure as every later operation names it: "rank 1
 * timed out in all_gather #12: …", with @failure's code, where @rank is
 * the world rank that suffered @failure during @operation. */
GError      *_cp_transport_describe_failure (int            rank,
                                             const char    *operation,
                                             const GError  *failure);

/* "@what: mesh broken: @first's message", with @first's code: the error of
 * an operation that the transport's first failure @first keeps from
 * running. */
void         _cp_transport_set_broken_error (GError       **error,
                                             const char    *what,
                                             const GError  *first);

/* Drops the references the regions of @coll and @message hold. */
void         _cp_collective_clear (CpCollective    *coll);
void         _cp_message_clear    (CpMessage       *message);

/* "float32[4, 8]" */
char        *_cp_message_describe (const CpMessage *message);

/* Whether a message sent as @sent fits a receive expecting @expected. */
gboolean     _cp_message_matches  (const CpMessage *sent,
                                   const CpMessage *expected);

/* "rank 0 sent int32[4] with tag 4 but rank 1 expected int32[5]", as
 * %CP_TENSOR_ERROR_SHAPE; both sides of a mismatch report it. */
void         _cp_message_set_mismatch (GError          **error,
                                       const CpMessage  *sent,
                                       int               src,
                                       guint64           tag,
                                       int               dst,
                                       const CpMessage  *expected);

/* The in-process backend: @world_size transports, one per rank, that
 * share memory. */
CpTransport **_cp_transport_local_new_group (int world_size);

/* ---- connecting a mesh ---- */

/* A backend the library can connect a mesh with: one row of the table in
 * cp-transport-backends.c.  Connecting (cp-transport-connect.c) asks
 * every candidate row, as GIO verifies each candidate module, whether it
 * can work here (probe), has each usable one make this rank's blob and
 * private state (offer), runs one rendezvous that carries every blob of
 * every rank (cp-bootstrap-private.h), picks one row from what every rank
 * offered — the same on every rank, since all see the same table — then
 * lets it make the transport (finish) and frees the state of the others
 * (abandon).
 *
 * A row without offer needs no rendezvous: its ranks meet by themselves
 * (the in-process backends), and its probe must answer alike on every
 * rank. */
typedef struct _CpTransportBackend CpTransportBackend;

struct _CpTransportBackend
{
  /* What CPMESH_TRANSPORT, CpMeshOptions:transport and CpMesh:backend
   * say; also the key of its blob in the rendezvous. */
  const char *name;
  /* The memory kinds it moves, as CP_TRANSPORT_DEVICE() bits. */
  guint device_kinds;
  /* Its place in the default chain: the highest usable priority wins;
   * a negative one takes part only when named. */
  int priority;
  /* What `cpmesh info` says of it. */
  const char *summary;

  /* Optional (NULL: always): whether it can work in this process, for
   * the mesh @config describes (NULL: for any mesh); FALSE with
   * CP_MESH_ERROR_UNSUPPORTED saying why. */
  gboolean     (*probe)       (const CpMeshConfig      *config,
                               GError                 **error);
  /* Optional (NULL: no rendezvous): this rank's blob, and in @state what
   * finish or abandon will get.  @route says how the ranks reach rank 0. */
  GBytes      *(*offer)       (const CpMeshConfig      *config,
                               const CpBootstrapRoute  *route,
                               gpointer                *state,
                               GError                 **error);
  /* Optional: judges another rank's blob, with @state as user data,
   * before anything else reads it; a bad one fails the rendezvous on
   * every rank. */
  CpBootstrapCheckFunc check;
  /* Optional (NULL: whenever every rank offered it): whether the blobs
   * of every rank, in rank order, let it connect this mesh; FALSE with
   * CP_MESH_ERROR_UNSUPPORTED saying why (ranks on several hosts).
   * Decides from the blobs alone, so every rank decides alike. */
  gboolean     (*usable_with) (const CpMeshConfig      *config,
                               GBytes * const          *blobs,
                               GError                 **error);
  /* Makes this rank's transport, within @deadline, from @state (which it
   * takes, success or not) and every rank's blob (NULL for a row without
   * offer); FALSE may still be CP_MESH_ERROR_UNSUPPORTED. */
  CpTransport *(*finish)      (const CpMeshConfig      *config,
                               gpointer                 state,
                               GBytes * const          *blobs,
                               gint64                   deadline,
                               GCancellable            *cancellable,
                               GError                 **error);
  /* Frees @state of an offer that was not picked.  NULL: @state is NULL. */
  void         (*abandon)     (gpointer                 state);
};

/* The built backend called @name, or the most preferred one when @name
 * is NULL; an unknown name is CP_MESH_ERROR_UNSUPPORTED naming it and
 * every backend built. */
const CpTransportBackend *_cp_transport_backend_find   (const char  *name,
                                                        GError     **error);
/* "ucx, local": the backends built, the default chain first, by
 * priority. */
char                     *_cp_transport_backend_list   (void);
gboolean                  _cp_transport_backend_serves (const CpTransportBackend *backend,
                                                        CpDeviceKind              device);
/* The rows a connection tries, most preferred first: the one @name names
 * (NULL on an unknown name, with the error of _cp_transport_backend_find),
 * or, when @name is NULL, the default chain. */
GPtrArray                *_cp_transport_backend_candidates (const char  *name,
                                                            GError     **error);

/* One candidate of a connection as this rank prepared it. */
typedef struct
{
  const CpTransportBackend *backend;
  GError *unusable;   /* why it cannot run on this rank (probe or offer), or NULL */
  GBytes *blob;       /* this rank's, once offered */
  gpointer state;     /* the offer's, for finish or abandon */
} CpTransportCandidate;

/* Which of @candidates (most preferred first) connects the mesh, the
 * same on every rank: the first whose blob every rank's offer in @table
 * holds and whose usable_with takes them, or, for a row without offer,
 * whose probe passed.  @table is the rendezvous's CpBootstrapOffer* per
 * rank, NULL when none ran.  When @named, the one candidate was asked for
 * by name: failing it is CP_MESH_ERROR_UNSUPPORTED saying why, never
 * another backend.  @story (nullable) receives, for the debug log, why
 * the pick fell where it did.  Returns the index, or -1 with the
 * error. */
int          _cp_transport_pick       (const CpTransportCandidate *candidates,
                                       guint                       n,
                                       gboolean                    named,
                                       const CpMeshConfig         *config,
                                       GPtrArray                  *table,
                                       char                      **story,
                                       GError                    **error);

/* Joins this process to the mesh @config describes, as its rank, within
 * its timeout, over the backend it names or the one the default chain
 * picks. */
CpTransport *_cp_transport_connect    (const CpMeshConfig         *config,
                                       GCancellable               *cancellable,
                                       GError                    **error);

/* Each built backend, a line "  NAME  usable here | why not  SUMMARY",
 * and the rule of the default chain: what `cpmesh info` prints. */
__attribute__((visibility ("default")))
char        *_cp_transport_describe_backends (void);

/* The UCX backend's row.  Only built when CP_HAS_UCX. */
extern const CpTransportBackend _cp_transport_ucx_backend;

/* The intra-host backend (cp-transport-shm.c, doc/mesh-shm.md): ranks
 * that are processes of one host copy straight out of each other's
 * buffers with process_vm_readv.  At most this many processes. */
#define CP_SHM_MAX_WORLD_SIZE 64

/* Whether this host lets the shm backend work, before any rendezvous:
 * sealed memfds, pidfds and process_vm_readv work, and Yama lets sibling
 * processes read each other (kernel.yama.ptrace_scope at most 1); else
 * FALSE with CP_MESH_ERROR_UNSUPPORTED saying what is refused
 * ("process_vm_readv is refused here: Operation not permitted").  Cheap:
 * `cpmesh info` and default-chain probes call it. */
__attribute__((visibility ("default")))
gboolean      _cp_transport_shm_probe       (GError             **error);

/* The shm backend's row, and the steps it is made of (tests call them):
 * the offer probes the host, listens on a fresh abstract Unix socket and
 * packs this rank's blob (host and namespace identity, uid, pid, the
 * socket's name); UNSUPPORTED when the shm backend cannot work here.
 * The check parses a peer's blob strictly (TRANSPORT when malformed); it
 * needs no user data.  Finish, given every rank's blob in rank order,
 * fails with UNSUPPORTED naming the rank and what differs unless all
 * ranks share this host, namespaces and uid — the row's usable_with
 * decides that before finish, from the blobs alone, so the default chain
 * passes shm over on every rank — and otherwise hands the control
 * segment over (rank 0) or takes it (the others), checks every peer and
 * returns the transport, all before @deadline.  The offer's socket is
 * closed by finish, or by freeing the offer. */
extern const CpTransportBackend _cp_transport_shm_backend;

typedef struct _CpShmOffer CpShmOffer;

CpShmOffer   *_cp_transport_shm_offer       (const CpMeshConfig  *config,
                                             GError             **error);
GBytes       *_cp_transport_shm_offer_get_blob (CpShmOffer       *offer);
void          _cp_transport_shm_offer_free  (CpShmOffer          *offer);
gboolean      _cp_transport_shm_check_blob  (GBytes              *blob,
                                             gpointer             user_data,
                                             GError             **error);
CpTransport  *_cp_transport_shm_finish      (CpShmOffer          *offer,
                                             const CpMeshConfig  *config,
                                             GBytes * const      *blobs,
                                             gint64               deadline,
                                             GCancellable        *cancellable,
                                             GError             **error);

/* The in-process backend as a table entry: a mesh of one rank. */
CpTransport  *_cp_transport_local_connect   (const CpMeshConfig  *config,
                                             GCancellable        *cancellable,
                                             GError             **error);

/* A backend for tests only, built into the test variant of the library. */
CpTransport  *_cp_transport_loopback_connect (const CpMeshConfig  *config,
                                              GCancellable        *cancellable,
                                              GError             **error);
/* How many point-to-point sends the loopback transport @transport has
 * posted: which communicator a call's messages took. */
guint         _cp_transport_loopback_count_sends (CpTransport *transport);

G_END_DECLS
