/* cp-fault-private.h: faults the library can be told to suffer
 *
 * Compiled only into the test variant of the library (Meson option
 * fault_injection, which defines CP_FAULT_INJECTION for that variant
 * alone): the shared library users install never contains the hook.
 * Without it, the calls below are constants the compiler folds away.
 *
 * A test arms one fault at a time.  It strikes one rank (a world rank of
 * one backend, "local" or "ucx") at one of its collectives, counted from
 * 1 since the fault was armed — the first call after arming is
 * operation 1, as error messages number a communicator's calls from 1 —
 * at one step of it:
 *
 *   descriptor  the rank's description of the call, which is also its
 *               arrival: the in-process backend's only message, since
 *               its ranks copy straight out of each other's memory
 *   data        the pieces the rank sends to its peers (UCX); in-process,
 *               the moment between arriving and copying
 *   result      an all_reduce's second exchange, of the reduced slices
 *               (UCX only)
 *   hello       a joiner's HELLO to rank 0 during the rendezvous, which
 *               carries the blobs of every backend: armed for the backend
 *               "bootstrap"; its operation is always 0, before any call
 *
 * Each point-to-point request (the send and the receive of a send_recv
 * are two) counts as an operation too.  A send's descriptor step is its
 * header and its data step its data; a receive's descriptor step comes
 * before it waits for the header, its data step before it takes the data
 * (UCX: and sends the acknowledgement, which the step's fault strikes).
 *
 * What happens there: the message is dropped, sent late, sent with its
 * second half cut off (UCX only: in-process ranks share memory, nothing
 * crosses a wire), or the rank dies — the process kills itself with
 * SIGKILL (UCX) or the rank leaves its group (in-process, at a
 * descriptor step).  An in-process rank that has arrived can only be
 * late: its peers may be reading its memory.  Allocation failures are
 * armed per thread instead: the next host allocation of the calling
 * thread fails.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  CP_FAULT_NONE,
  CP_FAULT_DROP,
  CP_FAULT_DELAY,
  CP_FAULT_TRUNCATE,
  CP_FAULT_KILL,
} CpFaultKind;

typedef enum
{
  CP_FAULT_STEP_DESCRIPTOR,
  CP_FAULT_STEP_DATA,
  CP_FAULT_STEP_HELLO,
  CP_FAULT_STEP_RESULT,
} CpFaultStep;

typedef struct
{
  CpFaultKind kind;
  const char *backend;  /* "local", "ucx", or "bootstrap" for the hello */
  int rank;             /* the world rank it strikes */
  guint operation;      /* which of the rank's collectives, from 1; 0: the rendezvous */
  CpFaultStep step;
  guint delay_ms;       /* CP_FAULT_DELAY */
} CpFault;

#ifdef CP_FAULT_INJECTION

/* Arms @fault, replacing any armed one, and restarts every rank's count
 * of collectives. */
void        _cp_fault_arm               (const CpFault *fault);
/* Disarms the fault, and the allocation and device failures of the
 * calling thread. */
void        _cp_fault_disarm            (void);

/* Called by a backend as rank @rank starts a collective: its number
 * since the fault was armed, from 1. */
guint       _cp_fault_begin_operation   (const char    *backend,
                                         int            rank);

/* Called at each step of the collective @operation: the fault to apply
 * now, if the armed one strikes here (it strikes once), else
 * CP_FAULT_NONE.  @delay_ms receives the delay of CP_FAULT_DELAY. */
CpFaultKind _cp_fault_strike            (const char    *backend,
                                         int            rank,
                                         guint          operation,
                                         CpFaultStep    step,
                                         guint         *delay_ms);

/* Makes the host allocation after the next @skip ones made by the calling
 * thread fail. */
void        _cp_fault_fail_allocation   (guint          skip);

/* Called by the host allocator: whether this allocation must fail. */
gboolean    _cp_fault_allocation_fails  (void);

/* Makes the test-memory copy or fill after the next @skip ones issued by
 * the calling thread fail, as a device whose copy engine fails would. */
void        _cp_fault_fail_device       (guint          skip);

/* Called by test memory's copies and fills: whether this one must fail. */
gboolean    _cp_fault_device_fails      (void);

/* Whether the calling thread's device failure is armed and has not
 * struck yet. */
gboolean    _cp_fault_device_pending    (void);

/* A rank told to die: the process ends at once, as SIGKILL ends it. */
G_NORETURN void _cp_fault_kill_process  (void);

/* Where the collective sequence numbers of UCX communicators created
 * from now on start, so that a test can cross the wrap of the tag's
 * sequence field in a few calls. */
void        _cp_fault_set_sequence_origin (guint32      origin);
guint32     _cp_fault_get_sequence_origin (void);

#else

static inline guint
_cp_fault_begin_operation (const char *backend,
                           int         rank)
{
  return 0;
}

static inline CpFaultKind
_cp_fault_strike (const char  *backend,
                  int          rank,
                  guint        operation,
                  CpFaultStep  step,
                  guint       *delay_ms)
{
  return CP_FAULT_NONE;
}

static inline gboolean
_cp_fault_allocation_fails (void)
{
  return FALSE;
}

static inline gboolean
_cp_fault_device_fails (void)
{
  return FALSE;
}

static inline void
_cp_fault_kill_process (void)
{
}

static inline guint32
_cp_fault_get_sequence_origin (void)
{
  return 0;
}

#endif

G_END_DECLS
