/* cpmesh-launch-keeper.h: the process between cpmesh launch and each rank
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <sys/types.h>

#include <glib.h>

G_BEGIN_DECLS

/* What a keeper needs to know of its launcher: the process whose death
 * ends the rank, whatever killed it. */
typedef struct
{
  pid_t launcher;
} CpmeshKeeper;

/* The signal by which the launcher tells a keeper to kill its rank and
 * everything the rank started, now (the launcher's SIGKILL would kill
 * the keeper itself, and leave the rank's orphans to init). */
#define CPMESH_KEEPER_KILL_NOW SIGUSR1

/* The child setup of every rank (GSpawnChildSetupFunc, @user_data a
 * CpmeshKeeper): the child GLib forked becomes the rank's keeper, and
 * never returns; a child of it returns, and GLib executes the rank's
 * program in it.  Only async-signal-safe calls happen here. */
void         cpmesh_keeper_child_setup (gpointer              user_data);

/* Kills every child of the calling thread with SIGKILL and reaps it,
 * until none is left; as a subreaper (PR_SET_CHILD_SUBREAPER) the caller
 * thereby kills all its descendants, however they detached (setsid,
 * double forks).  When @watched is reaped, its wait status goes to
 * @watched_status.  Async-signal-safe. */
void         cpmesh_kill_descendants   (pid_t                 watched,
                                        int                  *watched_status);

G_END_DECLS
