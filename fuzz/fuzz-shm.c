/* fuzz-shm.c: the offer another rank of an shm mesh sends
 *
 * Input: the blob, as the bootstrap hands it to the shm backend's check.
 *
 * Invariant: no crash, no sanitizer report (no read past the bytes), no
 * critical, and:
 *   - a rejection is a GError of CP_MESH_ERROR with a non-empty message;
 *   - an accepted offer has a boot id of 36 hexadecimal digits and
 *     dashes, a socket name of "cpmesh-shm-" and 32 hexadecimal digits,
 *     and a process id in [1, 2^31);
 *   - offers are canonical: packing what was parsed gives back exactly the
 *     bytes received;
 *   - an offer compared with itself names the same host.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"

#include "cp-shm-private.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  g_autoptr(GBytes) blob = g_bytes_new (data, size);
  g_autoptr(GBytes) packed = NULL;
  g_autoptr(GError) error = NULL;
  CpShmPeer peer;

  fuzz_init ();
  if (!_cp_shm_parse_blob (blob, &peer, &error))
    {
      g_assert_nonnull (error);
      g_assert_true (error->domain == CP_MESH_ERROR);
      g_assert_cmpuint (strlen (error->message), >, 0);
      return 0;
    }
  g_assert_no_error (error);
  g_assert_cmpuint (strlen (peer.boot_id), ==, CP_SHM_BOOT_ID_LENGTH);
  g_assert_cmpuint (strlen (peer.socket), ==, CP_SHM_SOCKET_NAME_LENGTH);
  g_assert_true (g_str_has_prefix (peer.socket, CP_SHM_SOCKET_PREFIX));
  g_assert_cmpuint (peer.pid, >=, 1);
  g_assert_cmpuint (peer.pid, <=, G_MAXINT32);
  packed = _cp_shm_pack_blob (&peer);
  g_assert_true (g_bytes_equal (packed, blob));
  g_assert_true (_cp_shm_peer_check_same_host (&peer, &peer, 1, &error));
  return 0;
}
