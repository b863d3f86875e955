/* cp-sync-private.h: a mutex and condition variable ThreadSanitizer sees
 *
 * GMutex and GCond are built on futexes that ThreadSanitizer cannot see,
 * so every hand-off through them reads as a data race.  These wrappers
 * behave like them (a condition wait with a deadline on the monotonic
 * clock of g_get_monotonic_time ()), on pthread primitives the tool
 * understands.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <glib.h>

G_BEGIN_DECLS

typedef pthread_mutex_t CpMutex;
typedef pthread_cond_t CpCond;

#define CP_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER

static inline void
_cp_mutex_init (CpMutex *mutex)
{
  g_assert_cmpint (pthread_mutex_init (mutex, NULL), ==, 0);
}

static inline void
_cp_mutex_clear (CpMutex *mutex)
{
  pthread_mutex_destroy (mutex);
}

static inline void
_cp_mutex_lock (CpMutex *mutex)
{
  g_assert_cmpint (pthread_mutex_lock (mutex), ==, 0);
}

/* TRUE when it took the lock. */
static inline gboolean
_cp_mutex_trylock (CpMutex *mutex)
{
  return pthread_mutex_trylock (mutex) == 0;
}

static inline void
_cp_mutex_unlock (CpMutex *mutex)
{
  g_assert_cmpint (pthread_mutex_unlock (mutex), ==, 0);
}

static inline void
_cp_cond_init (CpCond *cond)
{
  pthread_condattr_t attr;

  pthread_condattr_init (&attr);
  pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
  g_assert_cmpint (pthread_cond_init (cond, &attr), ==, 0);
  pthread_condattr_destroy (&attr);
}

static inline void
_cp_cond_clear (CpCond *cond)
{
  pthread_cond_destroy (cond);
}

static inline void
_cp_cond_broadcast (CpCond *cond)
{
  pthread_cond_broadcast (cond);
}

static inline void
_cp_cond_wait (CpCond  *cond,
               CpMutex *mutex)
{
  pthread_cond_wait (cond, mutex);
}

/* Like g_cond_wait_until (): FALSE once @end_time, in the microseconds of
 * g_get_monotonic_time (), has passed. */
static inline gboolean
_cp_cond_wait_until (CpCond  *cond,
                     CpMutex *mutex,
                     gint64   end_time)
{
  struct timespec deadline = {
    .tv_sec = end_time / G_USEC_PER_SEC,
    .tv_nsec = (end_time % G_USEC_PER_SEC) * 1000,
  };

  return pthread_cond_timedwait (cond, mutex, &deadline) != ETIMEDOUT;
}

G_END_DECLS
