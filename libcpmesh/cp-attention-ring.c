/* cp-attention-ring.c: the ring's point-to-point transfers
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-attention-private.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"

/* Tags of the ring's point-to-point messages. */
#define TAG_KV  CP_MESH_INTERNAL_TAG (0x4b56)
#define TAG_DKV CP_MESH_INTERNAL_TAG (0x644b56)

/* One posted point-to-point transfer with a ring neighbour: the mesh
 * posts it on the communicator that moves the tensor's memory, as it
 * routes every other call. */
typedef CpMeshTransfer Transfer;

static void
transfer_post (CpAttention *self,
               Transfer    *transfer,
               CpTensor    *tensor,
               gboolean     send,
               guint64      tag)
{
  CpComm *comm = _cp_attention_get_comm (self);
  int next = (comm->index + 1) % comm->size;
  int previous = (comm->index + comm->size - 1) % comm->size;

  _cp_mesh_transfer_post (self->mesh, transfer, tensor, send, send ? next : previous, tag);
}

/* Completes every posted transfer of @transfers, in place (a posted
 * request points at its transfer's message), even after a failure,
 * so that no peer is left reading a buffer about to be freed; reports the
 * first error. */
static gboolean
transfers_wait (CpAttention     *self,
                Transfer * const *transfers,
                guint            n,
                GError         **error)
{
  gboolean ok = TRUE;

  for (guint i = 0; i < n; i++)
    ok = _cp_mesh_transfer_wait (self->mesh, transfers[i], _cp_mesh_deadline (self->mesh),
                                 ok ? error : NULL) && ok;
  return ok;
}

static void
swap_tensors (CpTensor **a,
              CpTensor **b)
{
  CpTensor *swap = *a;

  *a = *b;
  *b = swap;
}

gboolean
_cp_attention_reads_in_place (CpAttention *self,
                              const Plan  *plan)
{
  return plan->in_place;
}

/* Says how the ring moved K/V, so a slower path never goes unnoticed and
 * a benchmark can count the bytes: 0 when every shard was read in place. */
static void
report_ring (CpAttention *self,
             const Plan  *plan,
             const char  *pass,
             gsize        bytes_per_step)
{
  const char *transport = _cp_transport_get_name (_cp_attention_get_comm (self)->transport);

  if (plan->in_place)
    g_debug ("attention: %s ring of %d steps over %s read every peer's K/V in place: "
             "0 K/V bytes copied per step", pass, plan->size, transport);
  else
    g_debug ("attention: %s ring of %d steps over %s passed %" G_GSIZE_FORMAT
             " K/V bytes per step%s", pass, plan->size, transport, bytes_per_step,
             _cp_mesh_can_share (self->mesh, CP_DEVICE_KIND_HOST)
               ? " (CPMESH_ATTENTION_IN_PLACE=0)" : "");
}

/* Lends this rank's K/V pack @kv to every peer for the call and learns
 * where theirs are: the ring then reads each shard where it lies, with no
 * copy, and no rank writes or frees its pack until every rank has passed
 * the unshare at the end (_cp_comm_unshare()). */
static gboolean
lend_kv (CpAttention  *self,
         CpTensor     *kv,
         CpLoans      *loans,
         GError      **error)
{
  return _cp_mesh_share (self->mesh, kv, loans, error);
}

/* Ends the loan of lend_kv() once this rank has read every peer's pack:
 * every rank waits there until no peer reads its pack any more. */
static gboolean
return_kv (CpAttention  *self,
           CpLoans      *loans,
           GError      **error)
{
  _cp_loans_clear (loans);
  return _cp_mesh_unshare (self->mesh, CP_DEVICE_KIND_HOST, error);
}

/* The ring with every shard read where it lies: the steps of the ring,
 * in its order, so the bits are those of the ring that passes shards. */
static gboolean
forward_in_place (CpAttention  *self,
                  const Plan   *plan,
                  Forward      *fwd,
                  Buffers      *bufs,
                  GError      **error)
{
  CpLoans loans;
  gsize numel = (gsize) cp_tensor_get_numel (bufs->kv);

  if (!lend_kv (self, bufs->kv, &loans, error))
    return FALSE;
  for (int step = 0; step < plan->size; step++)
    {
      int source = (plan->rank - step + plan->size) % plan->size;

      _cp_attention_forward_at (plan, fwd, loans.addresses[source], numel, source, 1);
    }
  report_ring (self, plan, "forward", 0);
  return return_kv (self, &loans, error);
}

/* The ring: at step i this rank holds the shard of rank (r − i) mod C and
 * has already posted its hand-over to the next rank, so the transfer of
 * the following shard runs while this one is computed. */
gboolean
_cp_attention_forward_ring (CpAttention  *self,
                            const Plan   *plan,
                            Forward      *fwd,
                            Buffers      *bufs,
                            GError      **error)
{
  CpTensor *current = bufs->kv;
  CpTensor *next = bufs->kv_next;

  if (_cp_attention_reads_in_place (self, plan))
    return forward_in_place (self, plan, fwd, bufs, error);
  for (int step = 0; step < plan->size; step++)
    {
      int source = (plan->rank - step + plan->size) % plan->size;
      Transfer transfers[2] = { { 0 } };
      gboolean last = step == plan->size - 1;

      if (!last)
        {
          transfer_post (self, &transfers[0], next, FALSE, TAG_KV);
          transfer_post (self, &transfers[1], current, TRUE, TAG_KV);
        }
      _cp_attention_forward_on (plan, fwd, current, source, 1);
      if (!transfers_wait (self, (Transfer *[]) { &transfers[0], &transfers[1] }, 2, error))
        return FALSE;
      if (!last)
        swap_tensors (&current, &next);
    }
  report_ring (self, plan, "forward", cp_tensor_get_nbytes (bufs->kv));
  return TRUE;
}

/* The ring backward: the K/V shard travels as in forward, and the float32
 * dK, dV partial of the shard travels with it, one step behind: at step
 * i this rank adds its contribution to the partial of shard (r − i) that
 * the previous rank sent, and hands the sum on.  After C steps the
 * partial of every shard has visited every rank and arrives, complete, at
 * the shard's owner. */
typedef struct
{
  CpTensor *kv[2];         /* current, next */
  CpTensor *kv32;
  CpTensor *partial[3];    /* computing, received, in flight */
  Transfer kv_moves[2];
  Transfer partial_in;
  Transfer partial_out;
  CpLoans loans;           /* the peers' packs, when read in place */
} Ring;

/* Where the kernel reads the shard of rank @source at this step. */
static gconstpointer
ring_shard (Ring *ring,
            int   source)
{
  if (ring->loans.addresses != NULL)
    return ring->loans.addresses[source];
  return _cp_memory_kernel_address (ring->kv[0]);
}

static gboolean
ring_wait_all (CpAttention  *self,
               Ring         *ring,
               GError      **error)
{
  Transfer *all[] = { &ring->kv_moves[0], &ring->kv_moves[1], &ring->partial_in, &ring->partial_out };

  return transfers_wait (self, all, G_N_ELEMENTS (all), error);
}

/* Adds the partial the previous rank sent for the current shard, then
 * sends the sum on; the previous hand-over must be complete before its
 * buffer is reused. */
static gboolean
ring_pass_partial (CpAttention  *self,
                   const Plan   *plan,
                   Ring         *ring,
                   int           step,
                   GError      **error)
{
  if (step > 0)
    {
      Transfer *wait[] = { &ring->partial_in, &ring->partial_out };

      if (!transfers_wait (self, wait, G_N_ELEMENTS (wait), error))
        return FALSE;
      plan->kernel->add_float32 (_cp_memory_kernel_address (ring->partial[0]),
                                 _cp_memory_kernel_address (ring->partial[1]),
                                 (gsize) cp_tensor_get_numel (ring->partial[0]));
    }
  swap_tensors (&ring->partial[0], &ring->partial[2]);
  transfer_post (self, &ring->partial_out, ring->partial[2], TRUE, TAG_DKV);
  return TRUE;
}

static gboolean
ring_step (CpAttention        *self,
           const Plan         *plan,
           const CpAttnGrads  *grads,
           Ring               *ring,
           int                 step,
           GError            **error)
{
  int source = (plan->rank - step + plan->size) % plan->size;
  gboolean last = step == plan->size - 1;

  gboolean moves = ring->loans.addresses == NULL && !last;

  if (moves)
    {
      transfer_post (self, &ring->kv_moves[0], ring->kv[1], FALSE, TAG_KV);
      transfer_post (self, &ring->kv_moves[1], ring->kv[0], TRUE, TAG_KV);
    }
  if (step > 0)
    transfer_post (self, &ring->partial_in, ring->partial[1], FALSE, TAG_DKV);
  _cp_attention_backward_at (plan, grads, ring_shard (ring, source),
                             (gsize) cp_tensor_get_numel (ring->kv[0]), ring->kv32, source, 1,
                             ring->partial[0]);
  if (!ring_pass_partial (self, plan, ring, step, error))
    return FALSE;
  if (moves)
    {
      Transfer *wait[] = { &ring->kv_moves[0], &ring->kv_moves[1] };

      if (!transfers_wait (self, wait, G_N_ELEMENTS (wait), error))
        return FALSE;
      swap_tensors (&ring->kv[0], &ring->kv[1]);
    }
  return TRUE;
}

gboolean
_cp_attention_backward_ring (CpAttention        *self,
                             const Plan         *plan,
                             const CpAttnGrads  *grads,
                             Buffers            *bufs,
                             GError            **error)
{
  Ring ring = {
    .kv = { bufs->kv, bufs->kv_next },
    .kv32 = bufs->kv32,
    .partial = { bufs->partial[0], bufs->partial[1], bufs->partial[2] },
  };
  Transfer final = { 0 };
  gboolean in_place = _cp_attention_reads_in_place (self, plan);
  gboolean ok = TRUE;

  if (in_place && !lend_kv (self, bufs->kv, &ring.loans, error))
    return FALSE;
  for (int step = 0; ok && step < plan->size; step++)
    ok = ring_step (self, plan, grads, &ring, step, error);
  if (ok)
    {
      /* The last hand-over brings this rank's own shard home. */
      transfer_post (self, &final, bufs->dkv, FALSE, TAG_DKV);
      ok = transfers_wait (self, (Transfer *[]) { &final }, 1, error);
    }
  ok = ring_wait_all (self, &ring, ok ? error : NULL) && ok;
  if (in_place)
    ok = return_kv (self, &ring.loans, ok ? error : NULL) && ok;
  if (ok)
    report_ring (self, plan, "backward", in_place ? 0 : cp_tensor_get_nbytes (bufs->kv));
  return ok;
}
