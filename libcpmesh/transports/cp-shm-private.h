/* cp-shm-private.h: what ranks of the shm backend tell each other before
 * they share memory
 *
 * The shm backend (cp-transport-shm.c) reads two things that come from
 * outside the process before it trusts anything: every rank's offer (the
 * blob the bootstrap carries) and the control segment rank 0 hands over
 * as a file descriptor.  Both checks take arbitrary input and answer with
 * a GError naming what is wrong, never a crash, so that tests and
 * fuzz/fuzz-wire.c can feed them directly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define CP_SHM_BLOB_MAGIC 0x4d485343u   /* "CSHM" */
#define CP_SHM_BLOB_VERSION 1
/* "cpmesh-shm-" and 32 hexadecimal digits, the abstract socket's name
 * without its leading NUL. */
#define CP_SHM_SOCKET_PREFIX "cpmesh-shm-"
#define CP_SHM_SOCKET_NAME_LENGTH (sizeof CP_SHM_SOCKET_PREFIX - 1 + 32)
#define CP_SHM_BOOT_ID_LENGTH 36

/* What one rank says about itself: where it runs and how to reach it. */
typedef struct
{
  char boot_id[CP_SHM_BOOT_ID_LENGTH + 1];  /* /proc/sys/kernel/random/boot_id */
  guint64 pid_ns;                           /* inode of /proc/self/ns/pid */
  guint64 net_ns;                           /* … /ns/net: abstract sockets live there */
  guint64 user_ns;                          /* … /ns/user */
  guint32 uid;
  guint32 pid;
  char socket[CP_SHM_SOCKET_NAME_LENGTH + 1];
} CpShmPeer;

/* This process's identity, with the socket name @socket. */
gboolean  _cp_shm_peer_init_self   (CpShmPeer        *peer,
                                    const char       *socket,
                                    GError          **error);
GBytes   *_cp_shm_pack_blob        (const CpShmPeer  *peer);
/* Strict: a blob of another version, not in GVariant normal form, or
 * with a field out of its form is CP_MESH_ERROR_TRANSPORT. */
gboolean  _cp_shm_parse_blob       (GBytes           *blob,
                                    CpShmPeer        *peer,
                                    GError          **error);
/* Whether @peer, world rank @rank, shares this process's host, PID, net
 * and user namespaces and uid (@self); else CP_MESH_ERROR_UNSUPPORTED
 * naming the rank and what differs. */
gboolean  _cp_shm_peer_check_same_host (const CpShmPeer *self,
                                        const CpShmPeer *peer,
                                        int              rank,
                                        GError         **error);

/* The control segment's size for a world of @world_size ranks. */
gsize     _cp_shm_segment_size     (int               world_size);
/* Whether @fd, which @sender handed over, is a memfd of exactly @size
 * bytes that nobody can grow, shrink or reseal: F_SEAL_SHRINK,
 * F_SEAL_GROW and F_SEAL_SEAL set; else CP_MESH_ERROR_TRANSPORT naming
 * @sender and what is wrong.  Only then may it be mapped. */
gboolean  _cp_shm_check_segment    (int               fd,
                                    gsize             size,
                                    const char       *sender,
                                    GError          **error);

G_END_DECLS
