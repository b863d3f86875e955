/* cp-test-broken.h: one call that may fail, and the calls after it
 *
 * The scenario the tests of a broken mesh play on every rank, on
 * in-process ranks (threads) and on UCX ranks (processes) alike: a
 * warm-up barrier with the mesh's own timeout, then, with a short
 * timeout, one call that a fault may strike, then one call of each kind
 * with the mesh's own timeout again.
 * Every call is timed, and every call that succeeds has its data checked
 * against what every rank contributed.
 *
 * A UCX rank prints its report ("CALL …" lines) and the test reads it
 * back, so the test judges both backends with the same code.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <libcpmesh.h>

G_BEGIN_DECLS

typedef enum
{
  CP_TEST_CALL_BARRIER,
  CP_TEST_CALL_ALL_GATHER,
  CP_TEST_CALL_ALL_TO_ALL,
  CP_TEST_CALL_ALL_REDUCE,
  CP_TEST_CALL_BROADCAST,
  CP_TEST_CALL_SEND_RECV,
  CP_TEST_N_CALLS,
} CpTestCall;

/* Times are g_get_monotonic_time(), which every process of a host
 * shares. */
typedef struct
{
  gboolean ok;
  gboolean correct;   /* it succeeded with the right data */
  gint64 started_us;
  gint64 ended_us;
  GError *error;
} CpTestOutcome;

typedef struct
{
  CpTestOutcome struck;                    /* the call the fault may strike */
  CpTestOutcome later[CP_TEST_N_CALLS];    /* then one call of each kind */
} CpTestReport;

/* "all_gather", "send_recv", … */
const char *cp_test_call_name     (CpTestCall    call);
/* -1 for an unknown name. */
int         cp_test_call_from_name (const char   *name);

/* Runs @call on @mesh as the @index-th call of the scenario, timed; its
 * input depends on @index and the rank, so that data of another call
 * never passes for this one's.  Broadcasts come from the last rank. */
void        cp_test_call_run      (CpMesh        *mesh,
                                   CpTestCall     call,
                                   guint          index,
                                   CpTestOutcome *outcome);

/* The scenario: a warm-up barrier, then @struck with a timeout of
 * @timeout_ms, then one call of each kind with the mesh's own timeout. */
void        cp_test_report_play   (CpMesh        *mesh,
                                   CpTestCall     struck,
                                   guint          timeout_ms,
                                   CpTestReport  *report);
void        cp_test_report_clear  (CpTestReport  *report);

/* One line per call on stdout, "CALL INDEX OK CORRECT STARTED ENDED
 * DOMAIN CODE MESSAGE", INDEX 0 for the struck call; and back from a
 * rank's lines. */
void        cp_test_report_print  (const CpTestReport *report);
void        cp_test_report_parse  (GPtrArray     *lines,
                                   CpTestReport  *report);

G_END_DECLS
