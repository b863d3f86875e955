/* cp-fault.c: the fault-injection hook of the test variant
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cp-fault-private.h"
#include "cp-sync-private.h"

/* Collectives are counted per rank of each backend; ranks past this
 * bound (more than a UCX mesh may hold) are never struck. */
#define MAX_RANKS 1024

static CpMutex fault_lock = CP_MUTEX_INIT;
static CpFault armed;
static char armed_backend[16];
static guint operations[2][MAX_RANKS];

static __thread gint allocations_left = -1;
static __thread gint device_operations_left = -1;
static guint32 sequence_origin;

static int
backend_index (const char *backend)
{
  return g_str_equal (backend, "ucx") ? 1 : 0;
}

void
_cp_fault_arm (const CpFault *fault)
{
  _cp_mutex_lock (&fault_lock);
  armed = *fault;
  g_strlcpy (armed_backend, fault->backend, sizeof armed_backend);
  armed.backend = armed_backend;
  memset (operations, 0, sizeof operations);
  _cp_mutex_unlock (&fault_lock);
}

void
_cp_fault_disarm (void)
{
  _cp_mutex_lock (&fault_lock);
  armed.kind = CP_FAULT_NONE;
  _cp_mutex_unlock (&fault_lock);
  allocations_left = -1;
  device_operations_left = -1;
}

guint
_cp_fault_begin_operation (const char *backend,
                           int         rank)
{
  guint operation = 0;

  if (rank < 0 || rank >= MAX_RANKS)
    return G_MAXUINT;
  _cp_mutex_lock (&fault_lock);
  operation = ++operations[backend_index (backend)][rank];
  _cp_mutex_unlock (&fault_lock);
  return operation;
}

CpFaultKind
_cp_fault_strike (const char  *backend,
                  int          rank,
                  guint        operation,
                  CpFaultStep  step,
                  guint       *delay_ms)
{
  CpFaultKind kind = CP_FAULT_NONE;

  _cp_mutex_lock (&fault_lock);
  if (armed.kind != CP_FAULT_NONE && g_str_equal (armed.backend, backend) &&
      armed.rank == rank && armed.operation == operation && armed.step == step)
    {
      kind = armed.kind;
      *delay_ms = armed.delay_ms;
      armed.kind = CP_FAULT_NONE;
    }
  _cp_mutex_unlock (&fault_lock);
  return kind;
}

void
_cp_fault_fail_allocation (guint skip)
{
  allocations_left = (gint) skip;
}

gboolean
_cp_fault_allocation_fails (void)
{
  if (allocations_left < 0)
    return FALSE;
  return allocations_left-- == 0;
}

void
_cp_fault_fail_device (guint skip)
{
  device_operations_left = (gint) skip;
}

gboolean
_cp_fault_device_pending (void)
{
  return device_operations_left >= 0;
}

gboolean
_cp_fault_device_fails (void)
{
  if (device_operations_left < 0)
    return FALSE;
  return device_operations_left-- == 0;
}

void
_cp_fault_kill_process (void)
{
  raise (SIGKILL);
  _exit (137);
}

void
_cp_fault_set_sequence_origin (guint32 origin)
{
  g_atomic_int_set ((gint *) &sequence_origin, (gint) origin);
}

guint32
_cp_fault_get_sequence_origin (void)
{
  return (guint32) g_atomic_int_get ((gint *) &sequence_origin);
}
