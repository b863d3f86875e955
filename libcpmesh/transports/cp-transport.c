/* cp-transport.c: what every backend shares
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"
#include "cp-transport-private.h"

void
_cp_transport_init (CpTransport          *transport,
                    const CpTransportOps *ops,
                    int                   rank,
                    int                   world_size)
{
  transport->ops = ops;
  g_atomic_ref_count_init (&transport->ref_count);
  transport->rank = rank;
  transport->world_size = world_size;
  _cp_mutex_init (&transport->peer_lost_lock);
}

static void
clear_peer_lost_func (CpTransport *transport)
{
  if (transport->peer_lost_destroy != NULL)
    transport->peer_lost_destroy (transport->peer_lost_data);
  transport->peer_lost_func = NULL;
  transport->peer_lost_data = NULL;
  transport->peer_lost_destroy = NULL;
}

void
_cp_transport_set_peer_lost_func (CpTransport    *transport,
                                  CpPeerLostFunc  func,
                                  gpointer        user_data,
                                  GDestroyNotify  destroy)
{
  _cp_mutex_lock (&transport->peer_lost_lock);
  clear_peer_lost_func (transport);
  transport->peer_lost_func = func;
  transport->peer_lost_data = user_data;
  transport->peer_lost_destroy = destroy;
  _cp_mutex_unlock (&transport->peer_lost_lock);
}

void
_cp_transport_report_peer_lost (CpTransport *transport,
                                int          rank,
                                const char  *reason)
{
  _cp_mutex_lock (&transport->peer_lost_lock);
  if (transport->peer_lost_func != NULL)
    transport->peer_lost_func (rank, reason, transport->peer_lost_data);
  _cp_mutex_unlock (&transport->peer_lost_lock);
}

CpTransport *
_cp_transport_ref (CpTransport *transport)
{
  g_atomic_ref_count_inc (&transport->ref_count);
  return transport;
}

void
_cp_transport_unref (CpTransport *transport)
{
  if (!g_atomic_ref_count_dec (&transport->ref_count))
    return;
  clear_peer_lost_func (transport);
  transport->ops->transport_free (transport);
}

/* The lock outlives the backend's teardown, during which a peer that
 * fails still reports it (to no one, the callback being gone). */
void
_cp_transport_clear (CpTransport *transport)
{
  _cp_mutex_clear (&transport->peer_lost_lock);
}

void
_cp_comm_init (CpComm      *comm,
               CpTransport *transport,
               const int   *members,
               int          n_members,
               int          my_index)
{
  comm->transport = _cp_transport_ref (transport);
  comm->size = n_members;
  comm->index = my_index;
  comm->members = g_memdup2 (members, (gsize) n_members * sizeof (int));
}

char *
_cp_comm_key (const char *label,
              const int  *members,
              int         n)
{
  GString *key = g_string_new (label);

  for (int i = 0; i < n; i++)
    g_string_append_printf (key, "%c%d", i == 0 ? ':' : ',', members[i]);
  return g_string_free (key, FALSE);
}

void
_cp_comm_clear (CpComm *comm)
{
  g_clear_pointer (&comm->members, g_free);
  g_clear_pointer (&comm->transport, _cp_transport_unref);
}

void
_cp_comm_free (CpComm *comm)
{
  if (comm != NULL)
    comm->transport->ops->comm_free (comm);
}

const char *
_cp_transport_get_name (CpTransport *transport)
{
  return transport->ops->name;
}

gboolean
_cp_transport_has_caps (CpTransport     *transport,
                        CpTransportCaps  caps)
{
  return (transport->ops->caps & caps) == caps;
}

guint
_cp_transport_get_device_kinds (CpTransport *transport)
{
  return transport->ops->device_kinds;
}

CpComm *
_cp_transport_comm_new (CpTransport  *transport,
                        const char   *label,
                        const int    *members,
                        int           n_members,
                        int           my_index,
                        GError      **error)
{
  return transport->ops->comm_new (transport, label, members, n_members, my_index, error);
}

gboolean
_cp_transport_can_poll (CpTransport *transport)
{
  return transport->ops->poll != NULL;
}

void
_cp_transport_poll (CpTransport *transport)
{
  if (transport->ops->poll != NULL)
    transport->ops->poll (transport);
}

gboolean
_cp_transport_can_interrupt (CpTransport *transport)
{
  return transport->ops->interrupt != NULL;
}

void
_cp_transport_interrupt (CpTransport *transport)
{
  if (transport->ops->interrupt != NULL)
    transport->ops->interrupt (transport);
}

void
_cp_transport_fail (CpTransport  *transport,
                    const char   *operation,
                    const GError *failure)
{
  transport->ops->fail (transport, operation, failure);
}

gboolean
_cp_comm_collective (CpComm        *comm,
                     CpCollective  *coll,
                     gint64         deadline,
                     GCancellable  *cancellable,
                     GError       **error)
{
  return comm->transport->ops->collective (comm, coll, deadline, cancellable, error);
}

CpRequest *
_cp_comm_isend (CpComm          *comm,
                int              peer,
                guint64          tag,
                const CpMessage *message)
{
  return comm->transport->ops->isend (comm, peer, tag, message);
}

CpRequest *
_cp_comm_irecv (CpComm    *comm,
                int        peer,
                guint64    tag,
                CpMessage *message)
{
  return comm->transport->ops->irecv (comm, peer, tag, message);
}

gboolean
_cp_comm_wait (CpComm        *comm,
               CpRequest     *request,
               gint64         deadline,
               GCancellable  *cancellable,
               GError       **error)
{
  return comm->transport->ops->wait (comm, request, deadline, cancellable, error);
}

gboolean
_cp_transport_copy_2d (gpointer       dst,
                       CpDeviceKind   dst_kind,
                       gsize          dst_pitch,
                       gconstpointer  src,
                       CpDeviceKind   src_kind,
                       gsize          src_pitch,
                       gsize          width,
                       gsize          height,
                       gboolean       streaming,
                       GError       **error)
{
  return _cp_memory_copy_2d_address (dst, dst_kind, dst_pitch, src, src_kind, src_pitch, width,
                                     height, streaming, error);
}

const char *
_cp_collective_name (CpCollKind kind)
{
  static const char *names[] = {
    [CP_COLL_BARRIER] = "barrier",
    [CP_COLL_ALL_GATHER] = "all_gather",
    [CP_COLL_ALL_TO_ALL] = "all_to_all",
    [CP_COLL_ALL_REDUCE] = "all_reduce",
    [CP_COLL_BROADCAST] = "broadcast",
  };

  return names[kind];
}

void
_cp_collective_label (char       *label,
                      gsize       size,
                      CpCollKind  kind,
                      guint64     call)
{
  g_snprintf (label, size, "%s #%" G_GUINT64_FORMAT, _cp_collective_name (kind), call);
}

void
_cp_message_label (char     *label,
                   gsize     size,
                   gboolean  is_send,
                   int       peer,
                   guint64   tag)
{
  g_snprintf (label, size, "%s rank %d with tag %" G_GUINT64_FORMAT,
              is_send ? "send to" : "recv from", peer, tag);
}

static const char *
failure_verb (const GError *failure)
{
  if (g_error_matches (failure, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT))
    return "timed out";
  if (g_error_matches (failure, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST))
    return "lost a peer";
  if (g_error_matches (failure, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED))
    return "was cancelled";
  return "failed";
}

GError *
_cp_transport_describe_failure (int           rank,
                                const char   *operation,
                                const GError *failure)
{
  return g_error_new (failure->domain, failure->code, "rank %d %s in %s: %s", rank,
                      failure_verb (failure), operation, failure->message);
}

void
_cp_transport_set_broken_error (GError       **error,
                                const char    *what,
                                const GError  *first)
{
  g_set_error (error, first->domain, first->code, "%s: mesh broken: %s", what, first->message);
}

static char *
describe_operand (const CpCollective *coll)
{
  g_autofree char *shape = _cp_shape_to_string (coll->shape, coll->n_dims);

  return g_strdup_printf ("%s%s", cp_dtype_get_name (coll->dtype), shape);
}

/* Compares rank @r's descriptor with rank 0's. */
static gboolean
check_pair (const CpCollective *first,
            const CpCollective *other,
            int                 r,
            GError            **error)
{
  const char *name = _cp_collective_name (first->kind);
  g_autofree char *a = NULL;
  g_autofree char *b = NULL;

  if (other->kind != first->kind)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "ranks disagree on the collective: communicator rank 0 called %s, rank %d called %s",
                   name, r, _cp_collective_name (other->kind));
      return FALSE;
    }
  if (first->kind == CP_COLL_BARRIER)
    return TRUE;
  if (other->device != first->device)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "%s: communicator rank 0 passed %s memory, rank %d passed %s memory", name,
                   _cp_device_kind_get_name (first->device), r,
                   _cp_device_kind_get_name (other->device));
      return FALSE;
    }
  a = describe_operand (first);
  b = describe_operand (other);
  if (other->dtype != first->dtype)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DTYPE,
                   "%s: communicator rank 0 passed %s, rank %d passed %s", name, a, r, b);
      return FALSE;
    }
  if (other->n_dims != first->n_dims ||
      memcmp (other->shape, first->shape, first->n_dims * sizeof (gint64)) != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "%s: communicator rank 0 passed %s, rank %d passed %s", name, a, r, b);
      return FALSE;
    }
  if (other->dim != first->dim || other->root != first->root || other->op != first->op)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "%s: ranks disagree on the arguments: rank 0 used dim %d, root %d, op %d; "
                   "rank %d used dim %d, root %d, op %d",
                   name, first->dim, first->root, first->op, r, other->dim, other->root, other->op);
      return FALSE;
    }
  return TRUE;
}

gboolean
_cp_collective_check_agreement (const CpCollective * const *descs,
                                int                         n,
                                int                         speaker,
                                GError                    **error)
{
  /* A rank with bad arguments of its own: everyone reports its error, so
   * the first such rank decides, the same on every rank; each says who
   * it is first, since the mistake may be another's. */
  for (int r = 0; r < n; r++)
    {
      if (descs[r]->invalid != NULL)
        {
          g_set_error (error, descs[r]->invalid->domain, descs[r]->invalid->code,
                       "mesh rank %d: communicator rank %d: %s", speaker, r, descs[r]->invalid->message);
          return FALSE;
        }
    }
  for (int r = 1; r < n; r++)
    if (!check_pair (descs[0], descs[r], r, error))
      return FALSE;
  return TRUE;
}

/* Reductions.  Integers wrap (computed unsigned, so overflow is defined),
 * booleans use or/and, 16-bit floats accumulate in float32. */

#define REDUCE_LOOP(type, combine)                                          \
  G_STMT_START {                                                            \
    type *out = (type *) dst;                                               \
    for (gsize i = 0; i < count; i++)                                       \
      {                                                                     \
        type acc = ((const type *) srcs[0])[offset + i];                    \
        for (int r = 1; r < n; r++)                                         \
          {                                                                 \
            type v = ((const type *) srcs[r])[offset + i];                  \
            acc = combine;                                                  \
          }                                                                 \
        out[i] = acc;                                                       \
      }                                                                     \
  } G_STMT_END

#define REDUCE_OPS(type, sum_expr)                                          \
  G_STMT_START {                                                            \
    switch (op)                                                             \
      {                                                                     \
      case CP_REDUCE_OP_SUM: REDUCE_LOOP (type, sum_expr); break;           \
      case CP_REDUCE_OP_MAX: REDUCE_LOOP (type, (v > acc ? v : acc)); break;\
      case CP_REDUCE_OP_MIN: REDUCE_LOOP (type, (v < acc ? v : acc)); break;\
      default: g_assert_not_reached ();                                     \
      }                                                                     \
  } G_STMT_END

static void
reduce_half (CpDType        dtype,
             CpReduceOp     op,
             gpointer       dst,
             gconstpointer *srcs,
             int            n,
             gsize          offset,
             gsize          count)
{
  gboolean bf16 = dtype == CP_DTYPE_BFLOAT16;
  guint16 *out = dst;

  for (gsize i = 0; i < count; i++)
    {
      float acc = 0.0f;

      for (int r = 0; r < n; r++)
        {
          guint16 raw = ((const guint16 *) srcs[r])[offset + i];
          float v = bf16 ? _cp_bf16_to_float (raw) : _cp_half_to_float (raw);

          if (r == 0)
            acc = v;
          else if (op == CP_REDUCE_OP_SUM)
            acc += v;
          else if (op == CP_REDUCE_OP_MAX)
            acc = v > acc ? v : acc;
          else
            acc = v < acc ? v : acc;
        }
      out[i] = bf16 ? _cp_float_to_bf16 (acc) : _cp_float_to_half (acc);
    }
}

static void
reduce_bool (CpReduceOp     op,
             gpointer       dst,
             gconstpointer *srcs,
             int            n,
             gsize          offset,
             gsize          count)
{
  guint8 *out = dst;

  for (gsize i = 0; i < count; i++)
    {
      gboolean any = FALSE;
      gboolean all = TRUE;

      for (int r = 0; r < n; r++)
        {
          gboolean v = ((const guint8 *) srcs[r])[offset + i] != 0;

          any |= v;
          all &= v;
        }
      out[i] = op == CP_REDUCE_OP_MIN ? all : any;
    }
}

gsize
_cp_collective_slice_start (const CpCollective *coll,
                            int                 n,
                            int                 r)
{
  return coll->count * (gsize) r / (gsize) n;
}

void
_cp_reduce_many (CpDType        dtype,
                 CpReduceOp     op,
                 gpointer       dst,
                 gconstpointer *srcs,
                 int            n,
                 gsize          offset,
                 gsize          count)
{
  switch (dtype)
    {
    case CP_DTYPE_BOOL:
      reduce_bool (op, dst, srcs, n, offset, count);
      break;
    case CP_DTYPE_UINT8:
      REDUCE_OPS (guint8, (guint8) (acc + v));
      break;
    case CP_DTYPE_INT32:
      REDUCE_OPS (gint32, (gint32) ((guint32) acc + (guint32) v));
      break;
    case CP_DTYPE_INT64:
      REDUCE_OPS (gint64, (gint64) ((guint64) acc + (guint64) v));
      break;
    case CP_DTYPE_FLOAT16:
    case CP_DTYPE_BFLOAT16:
      reduce_half (dtype, op, dst, srcs, n, offset, count);
      break;
    case CP_DTYPE_FLOAT32:
      REDUCE_OPS (float, acc + v);
      break;
    case CP_DTYPE_FLOAT64:
      REDUCE_OPS (double, acc + v);
      break;
    default:
      g_assert_not_reached ();
    }
}

void
_cp_collective_clear (CpCollective *coll)
{
  _cp_region_clear (&coll->send);
  _cp_region_clear (&coll->recv);
}

void
_cp_message_clear (CpMessage *message)
{
  _cp_region_clear (&message->data);
}

char *
_cp_message_describe (const CpMessage *message)
{
  g_autofree char *shape = _cp_shape_to_string (message->shape, message->n_dims);

  return g_strdup_printf ("%s%s", cp_dtype_get_name (message->dtype), shape);
}

gboolean
_cp_message_matches (const CpMessage *sent,
                     const CpMessage *expected)
{
  return sent->dtype == expected->dtype && sent->n_dims == expected->n_dims &&
         sent->nbytes == expected->nbytes &&
         memcmp (sent->shape, expected->shape, sent->n_dims * sizeof (gint64)) == 0;
}

void
_cp_message_set_mismatch (GError          **error,
                          const CpMessage  *sent,
                          int               src,
                          guint64           tag,
                          int               dst,
                          const CpMessage  *expected)
{
  g_autofree char *what_sent = _cp_message_describe (sent);
  g_autofree char *what_expected = _cp_message_describe (expected);

  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
               "rank %d sent %s with tag %" G_GUINT64_FORMAT " but rank %d expected %s",
               src, what_sent, tag, dst, what_expected);
}

/* Loans. */

gboolean
_cp_comm_can_share (CpComm       *comm,
                    CpDeviceKind  device)
{
  const CpTransportOps *ops = comm->transport->ops;

  if (!(ops->device_kinds & CP_TRANSPORT_DEVICE (device)))
    return FALSE;
  if (ops->caps & CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE)
    return TRUE;
  return ops->share != NULL && device == CP_DEVICE_KIND_HOST;
}

/* Every member's loan, as an all-gather of (address, length) pairs sees
 * it. */
typedef struct
{
  guint64 address;
  guint64 length;
  guint64 storage;
} LoanWords;

void
_cp_loans_clear (CpLoans *loans)
{
  for (int i = 0; loans->held != NULL && i < loans->n; i++)
    g_clear_pointer (&loans->held[i], cp_storage_unref);
  g_clear_pointer (&loans->held, g_free);
  g_clear_pointer (&loans->addresses, g_free);
  loans->n = 0;
}

/* A lender takes, before the exchange, the reference each reader will
 * drop once it has read the loan: so no reader ever depends on the
 * lender still being in the call. */
static void
lend_storage (CpStorage *storage,
              int        n_readers)
{
  for (int i = 0; i < n_readers; i++)
    cp_storage_ref (storage);
}

static void
take_back_storage (CpStorage *storage,
                   int        n_readers)
{
  for (int i = 0; i < n_readers; i++)
    cp_storage_unref (storage);
}

/* Ranks that share an address space lend by telling each other where the
 * memory is; every rank then checks every loan's length, so a mismatch is
 * the same verdict everywhere. */
static gboolean
share_addresses (CpComm         *comm,
                 const CpRegion *mine,
                 CpLoans        *loans,
                 gint64          deadline,
                 GCancellable   *cancellable,
                 GError        **error)
{
  LoanWords own = { (guint64) (guintptr) _cp_memory_kernel_address_region (mine), mine->length,
                    (guint64) (guintptr) mine->storage };
  g_autofree LoanWords *all = g_new0 (LoanWords, comm->size);
  CpCollective coll = {
    .kind = CP_COLL_ALL_GATHER,
    .dtype = CP_DTYPE_INT64,
    .n_dims = 1,
    .shape = { 3 },
    .outer = 1,
    .block = sizeof own,
    .device = CP_DEVICE_KIND_HOST,
  };
  gboolean ok;

  _cp_region_init_host (&coll.send, &own, sizeof own);
  _cp_region_init_host (&coll.recv, all, sizeof own * (gsize) comm->size);
  lend_storage (mine->storage, comm->size - 1);
  ok = comm->transport->ops->collective (comm, &coll, deadline, cancellable, error);
  _cp_collective_clear (&coll);
  if (!ok)
    {
      take_back_storage (mine->storage, comm->size - 1);
      return FALSE;
    }
  loans->n = comm->size;
  loans->addresses = g_new0 (gconstpointer, comm->size);
  loans->held = g_new0 (CpStorage *, comm->size);
  for (int i = 0; i < comm->size; i++)
    {
      loans->addresses[i] = (gconstpointer) (guintptr) all[i].address;
      if (i != comm->index)
        loans->held[i] = (CpStorage *) (guintptr) all[i].storage;
    }
  for (int i = 0; i < comm->size; i++)
    if (all[i].length != all[0].length)
      {
        _cp_loans_clear (loans);
        g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                     "rank %d lends %" G_GUINT64_FORMAT " bytes to read in place but rank %d "
                     "lends %" G_GUINT64_FORMAT, comm->members[i], all[i].length,
                     comm->members[0], all[0].length);
        return FALSE;
      }
  return TRUE;
}

gboolean
_cp_comm_share (CpComm         *comm,
                const CpRegion *mine,
                CpLoans        *loans,
                gint64          deadline,
                GCancellable   *cancellable,
                GError        **error)
{
  g_return_val_if_fail (_cp_comm_can_share (comm, mine->device), FALSE);
  g_return_val_if_fail (_cp_region_is_set (mine), FALSE);

  memset (loans, 0, sizeof *loans);
  if (comm->transport->ops->caps & CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE)
    return share_addresses (comm, mine, loans, deadline, cancellable, error);
  loans->n = comm->size;
  loans->addresses = g_new0 (gconstpointer, comm->size);
  if (!comm->transport->ops->share (comm, mine, loans->addresses, deadline, cancellable, error))
    {
      _cp_loans_clear (loans);
      return FALSE;
    }
  return TRUE;
}

gboolean
_cp_comm_unshare (CpComm        *comm,
                  gint64         deadline,
                  GCancellable  *cancellable,
                  GError       **error)
{
  CpCollective barrier = { .kind = CP_COLL_BARRIER, .device = CP_DEVICE_KIND_HOST };

  if (comm->transport->ops->unshare != NULL)
    return comm->transport->ops->unshare (comm, deadline, cancellable, error);
  return comm->transport->ops->collective (comm, &barrier, deadline, cancellable, error);
}

CpStorage *
_cp_transport_alloc_shared (CpTransport  *transport,
                            gsize         size,
                            GError      **error)
{
  if (transport->ops->alloc_shared == NULL)
    return NULL;
  return transport->ops->alloc_shared (transport, size, error);
}
