/* test-ucx-exposure.c: what a stranger can do to a UCX mesh
 *
 * The ranks of a multi-process mesh listen on the network; anyone who
 * reaches a port can send it anything.  These cases play that stranger:
 *
 *   siege            hundreds of silent, trickling and garbage connections
 *                    on rank 0's rendezvous port while the real ranks
 *                    join: they must all get in
 *   crafted-bytes    every port any rank listens on, during and after the
 *                    rendezvous, gets crafted bytes; over loopback that is
 *                    rank 0's rendezvous port alone, and afterwards none
 *   interface        with a MASTER_ADDR that is not loopback, ranks listen
 *                    on that interface's address only
 *   impostor         a process on rank 0's port that is not rank 0 (one
 *                    that closes, says nothing, speaks another protocol or
 *                    admits a joiner without proving the token) makes the
 *                    joiner fail with a CpMeshError, never join
 *   no-token         a mesh whose rendezvous is reachable from other hosts
 *                    and has no token says so, once
 *
 * What a rank listens on comes from /proc (the sockets of the process's
 * descriptors in /proc/PID/net/tcp, tcp6, udp and udp6, as `ss -ltnup`
 * reads them).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

#define SUBJECT "CpMesh (ucx)"
#define SETTINGS CP_TEST_SETTINGS

/* ---- what a process listens on ---- */

typedef struct
{
  GInetSocketAddress *address;
  const char *protocol;   /* "tcp" or "udp" */
} Port;

static void
port_clear (Port *port)
{
  g_clear_object (&port->address);
}

static char *
describe_port (const Port *port)
{
  g_autofree char *host = g_inet_address_to_string (g_inet_socket_address_get_address (port->address));

  return g_strdup_printf ("%s %s:%u", port->protocol, host, g_inet_socket_address_get_port (port->address));
}

/* The inodes of the sockets among @pid's descriptors. */
static GHashTable *
socket_inodes (const char *pid)
{
  g_autofree char *fd_dir = g_strdup_printf ("/proc/%s/fd", pid);
  g_autoptr(GDir) dir = g_dir_open (fd_dir, 0, NULL);
  GHashTable *inodes = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  const char *name;

  while (dir != NULL && (name = g_dir_read_name (dir)) != NULL)
    {
      g_autofree char *path = g_build_filename (fd_dir, name, NULL);
      g_autofree char *target = g_file_read_link (path, NULL);

      if (target != NULL && g_str_has_prefix (target, "socket:["))
        g_hash_table_add (inodes, g_strndup (target + strlen ("socket:["), strlen (target) - strlen ("socket:[]")));
    }
  return inodes;
}

/* "0100007F:1F90" as the kernel prints it: each 32-bit word of the
 * address in host order, then the port. */
static GInetSocketAddress *
parse_proc_address (const char *text)
{
  g_auto(GStrv) parts = g_strsplit (text, ":", 2);
  gsize digits = strlen (parts[0]);
  guint8 bytes[16];
  g_autoptr(GInetAddress) host = NULL;

  g_assert_true (digits == 8 || digits == 32);
  for (gsize word = 0; word < digits / 8; word++)
    {
      g_autofree char *hex = g_strndup (parts[0] + 8 * word, 8);
      guint32 value = (guint32) g_ascii_strtoull (hex, NULL, 16);

      memcpy (bytes + 4 * word, &value, 4);
    }
  host = g_inet_address_new_from_bytes (bytes, digits == 8 ? G_SOCKET_FAMILY_IPV4 : G_SOCKET_FAMILY_IPV6);
  return G_INET_SOCKET_ADDRESS (g_inet_socket_address_new (host, (guint16) g_ascii_strtoull (parts[1], NULL, 16)));
}

/* Adds the sockets of @table (tcp, tcp6, udp, udp6) that belong to @inodes:
 * listening ones for TCP, every bound one for UDP. */
static void
add_ports (GArray     *ports,
           const char *pid,
           const char *table,
           GHashTable *inodes)
{
  g_autofree char *path = g_strdup_printf ("/proc/%s/net/%s", pid, table);
  g_autofree char *contents = NULL;
  g_auto(GStrv) lines = NULL;
  gboolean is_tcp = g_str_has_prefix (table, "tcp");

  if (!g_file_get_contents (path, &contents, NULL, NULL))
    return;
  lines = g_strsplit (contents, "\n", -1);
  for (guint i = 1; lines[i] != NULL; i++)
    {
      g_auto(GStrv) fields = g_strsplit_set (g_strstrip (lines[i]), " ", -1);
      g_autoptr(GPtrArray) words = g_ptr_array_new ();
      Port port;

      for (guint f = 0; fields[f] != NULL; f++)
        if (fields[f][0] != '\0')
          g_ptr_array_add (words, fields[f]);
      if (words->len < 10 || !g_hash_table_contains (inodes, words->pdata[9]) ||
          (is_tcp && !g_str_equal (words->pdata[3], "0A")))
        continue;
      port.address = parse_proc_address (words->pdata[1]);
      port.protocol = is_tcp ? "tcp" : "udp";
      g_array_append_val (ports, port);
    }
}

static GArray *
ports_of (CpTestRank *rank)
{
  const char *pid = g_subprocess_get_identifier (rank->process);
  GArray *ports = g_array_new (FALSE, FALSE, sizeof (Port));
  g_autoptr(GHashTable) inodes = NULL;
  const char *tables[] = { "tcp", "tcp6", "udp", "udp6" };

  g_array_set_clear_func (ports, (GDestroyNotify) port_clear);
  if (pid == NULL)
    return ports;
  inodes = socket_inodes (pid);
  for (guint t = 0; t < G_N_ELEMENTS (tables); t++)
    add_ports (ports, pid, tables[t], inodes);
  return ports;
}

static char *
describe_ports (GArray *ports)
{
  GString *text = g_string_new (NULL);

  for (guint i = 0; i < ports->len; i++)
    {
      g_autofree char *one = describe_port (&g_array_index (ports, Port, i));

      g_string_append_printf (text, "%s%s", i ? ", " : "", one);
    }
  return g_string_free (text, FALSE);
}

/* ---- a stranger's connections ---- */

static int
connect_to (GInetSocketAddress *address)
{
  struct sockaddr_storage native;
  int fd;

  g_assert_true (g_socket_address_to_native (G_SOCKET_ADDRESS (address), &native, sizeof native, NULL));
  fd = socket (native.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  g_assert_cmpint (fd, >=, 0);
  if (connect (fd, (struct sockaddr *) &native, g_socket_address_get_native_size (G_SOCKET_ADDRESS (address))) == 0)
    return fd;
  close (fd);
  return -1;
}

static void
write_bytes (int           fd,
             const guint8 *bytes,
             gsize         size)
{
  /* The peer may close first: that is its right, and no failure here. */
  (void) !send (fd, bytes, size, MSG_NOSIGNAL);
}

/* Sends @port what scanners and attackers send: random bytes, zeros,
 * ones, a frame that announces gigabytes, a frame of garbage, and leaves
 * one connection open after a partial frame. */
static void
send_crafted_bytes (GInetSocketAddress *address,
                    GArray             *open_fds)
{
  guint8 noise[4096];
  const guint8 huge_frame[] = { 0xff, 0xff, 0xff, 0xff, 1, 2, 3 };
  const guint8 partial[] = { 0x00, 0x00, 0x10 };
  guint8 garbage_frame[4 + 256] = { 0x00, 0x00, 0x01, 0x00 };
  const guint8 fills[] = { 0x00, 0xff };
  int fd;

  for (gsize i = 0; i < sizeof noise; i++)
    noise[i] = (guint8) g_random_int ();
  memcpy (garbage_frame + 4, noise, 256);
  for (guint f = 0; f < G_N_ELEMENTS (fills) + 3; f++)
    {
      if ((fd = connect_to (address)) < 0)
        continue;
      if (f < G_N_ELEMENTS (fills))
        {
          guint8 fill[4096];

          memset (fill, fills[f], sizeof fill);
          write_bytes (fd, fill, sizeof fill);
        }
      else if (f == G_N_ELEMENTS (fills))
        write_bytes (fd, noise, sizeof noise);
      else if (f == G_N_ELEMENTS (fills) + 1)
        write_bytes (fd, huge_frame, sizeof huge_frame);
      else
        write_bytes (fd, garbage_frame, sizeof garbage_frame);
      close (fd);
    }
  if ((fd = connect_to (address)) >= 0)
    {
      write_bytes (fd, partial, sizeof partial);
      g_array_append_val (open_fds, fd);
    }
}

static void
close_all (GArray *fds)
{
  for (guint i = 0; i < fds->len; i++)
    close (g_array_index (fds, int, i));
  g_array_set_size (fds, 0);
}

/* ---- the go-ahead ranks wait for (CP_TEST_GO_FILE) ---- */

/* A path that does not exist yet, in a fresh directory. */
static char *
new_go_file (void)
{
  g_autofree char *dir = g_dir_make_tmp ("cpmesh-go-XXXXXX", NULL);

  g_assert_nonnull (dir);
  return g_build_filename (dir, "go", NULL);
}

static void
give_go (const char *go)
{
  g_assert_true (g_file_set_contents (go, "", 0, NULL));
}

static void
remove_go_file (const char *go)
{
  g_autofree char *dir = g_path_get_dirname (go);

  g_unlink (go);
  g_rmdir (dir);
}

/* ---- siege ---- */

#define SILENT 100
#define TRICKLING 16

typedef struct
{
  guint16 port;
  gint stop;
  guint connections;   /* how many the stranger opened */
} Siege;

/* Connects without waiting, so that a gate that does not accept never
 * holds the stranger up: it keeps knocking. */
static int
siege_connect (Siege *siege)
{
  struct sockaddr_in address = {
    .sin_family = AF_INET,
    .sin_port = htons (siege->port),
    .sin_addr.s_addr = htonl (INADDR_LOOPBACK),
  };
  int fd = socket (AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

  g_assert_cmpint (fd, >=, 0);
  if (connect (fd, (struct sockaddr *) &address, sizeof address) != 0 && errno != EINPROGRESS)
    {
      close (fd);
      return -1;
    }
  siege->connections++;
  return fd;
}

/* A connection the gate closed (or never took) is opened again, after a
 * moment, as a persistent stranger would. */
static void
keep_open (Siege *siege,
           int   *fd)
{
  struct pollfd poller = { *fd, POLLIN, 0 };
  guint8 drain[256];

  if (*fd >= 0 && poll (&poller, 1, 0) == 1 && recv (*fd, drain, sizeof drain, MSG_DONTWAIT) <= 0)
    {
      close (*fd);
      *fd = -1;
      return;
    }
  if (*fd < 0)
    *fd = siege_connect (siege);
}

static void
send_garbage_once (Siege *siege)
{
  int fd = siege_connect (siege);
  struct pollfd connected = { fd, POLLOUT, 0 };
  guint8 noise[1024];

  if (fd < 0)
    return;
  poll (&connected, 1, 20);
  for (gsize i = 0; i < sizeof noise; i++)
    noise[i] = (guint8) g_random_int ();
  write_bytes (fd, noise, sizeof noise);
  close (fd);
}

static gpointer
besiege (gpointer data)
{
  Siege *siege = data;
  int silent[SILENT], trickling[TRICKLING];
  const guint8 byte = 0;

  for (guint i = 0; i < SILENT; i++)
    silent[i] = -1;
  for (guint i = 0; i < TRICKLING; i++)
    trickling[i] = -1;
  for (guint tick = 0; !g_atomic_int_get (&siege->stop); tick++)
    {
      for (guint i = 0; i < SILENT; i++)
        keep_open (siege, &silent[i]);
      for (guint i = 0; i < TRICKLING; i++)
        {
          keep_open (siege, &trickling[i]);
          if (trickling[i] >= 0 && tick % 10 == 0)
            write_bytes (trickling[i], &byte, 1);
        }
      send_garbage_once (siege);
      g_usleep (20 * G_TIME_SPAN_MILLISECOND);
    }
  for (guint i = 0; i < SILENT; i++)
    if (silent[i] >= 0)
      close (silent[i]);
  for (guint i = 0; i < TRICKLING; i++)
    if (trickling[i] >= 0)
      close (trickling[i]);
  return NULL;
}

static void
wait_until_listening (guint16 port)
{
  g_autoptr(GInetAddress) loopback = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
  g_autoptr(GSocketAddress) address = g_inet_socket_address_new (loopback, port);

  for (guint attempt = 0; attempt < 1000; attempt++)
    {
      int fd = connect_to (G_INET_SOCKET_ADDRESS (address));

      if (fd >= 0)
        {
          close (fd);
          return;
        }
      g_usleep (10 * G_TIME_SPAN_MILLISECOND);
    }
  g_error ("nothing listens on port %u", port);
}

static void
test_siege (void)
{
  guint16 port = cp_test_free_port ();
  Siege siege = { port, 0, 0 };
  CpTestGroup group = { 0 };
  GThread *stranger;

  g_test_summary ("Silent, trickling and garbage connections by the hundred on rank 0's port "
                  "while ranks join: every rank gets in");
  cp_test_group_spawn (&group, "join", 0, 4, port, SETTINGS ("CPMESH_TIMEOUT_MS=30000", "CPMESH_TOKEN=siege"));
  wait_until_listening (port);
  stranger = g_thread_new ("stranger", besiege, &siege);
  /* Long enough for the stranger to fill every place at the gate. */
  g_usleep (500 * G_TIME_SPAN_MILLISECOND);
  for (int r = 1; r < 4; r++)
    cp_test_group_spawn (&group, "join", r, 4, port, SETTINGS ("CPMESH_TIMEOUT_MS=30000", "CPMESH_TOKEN=siege"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_atomic_int_set (&siege.stop, 1);
  g_thread_join (stranger);
  g_test_message ("the stranger opened %u connections", siege.connections);
  for (int r = 0; r < 4; r++)
    {
      g_autofree char *joined = g_strdup_printf ("JOINED %d", r);

      if (cp_test_rank_find_line (group.ranks[r], joined) == NULL)
        g_error ("rank %d did not join: %s", r, cp_test_rank_find_line (group.ranks[r], "ERROR"));
      cp_test_assert_exit (group.ranks[r], 0);
    }
  g_assert_cmpuint (siege.connections, >, SILENT + TRICKLING);
  cp_test_group_clear (&group);
  cp_test_record_outcome (SUBJECT, "100 silent, 16 trickling and garbage connections on rank 0's "
                          "rendezvous port, kept up while 3 ranks join",
                          "the ranks join", "every rank joined and passed a barrier");
}

/* ---- crafted bytes on every port ---- */

static gboolean
all_joined (CpTestRank **ranks,
            guint        n)
{
  for (guint i = 0; i < n; i++)
    if (cp_test_rank_find_line (ranks[i], "JOINED") == NULL && !cp_test_rank_is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

static GArray *
wait_for_ports (CpTestRank *rank)
{
  for (guint attempt = 0; attempt < 1000; attempt++)
    {
      GArray *ports = ports_of (rank);

      if (ports->len > 0 || cp_test_rank_is_done (rank))
        return ports;
      g_array_unref (ports);
      g_usleep (10 * G_TIME_SPAN_MILLISECOND);
    }
  g_error ("rank 0 never listened");
}

static void
test_crafted_bytes (void)
{
  guint16 port = cp_test_free_port ();
  g_autofree char *go = new_go_file ();
  g_autofree char *go_setting = g_strdup_printf ("CP_TEST_GO_FILE=%s", go);
  g_autoptr(GArray) open_fds = g_array_new (FALSE, FALSE, sizeof (int));
  g_autoptr(GArray) during = NULL;
  g_autofree char *listed = NULL;
  CpTestGroup group = { 0 };
  Port *gate;

  g_test_summary ("Crafted bytes on every port a rank listens on, during and after the "
                  "rendezvous, harm no rank; over loopback only rank 0's rendezvous port is "
                  "open, and only until the mesh formed");
  cp_test_group_spawn (&group, "collectives", 0, 3, port, SETTINGS (go_setting, "CPMESH_TIMEOUT_MS=30000"));
  during = wait_for_ports (group.ranks[0]);
  listed = describe_ports (during);
  g_test_message ("rank 0 listens on %s during the rendezvous", listed);
  g_assert_cmpuint (during->len, ==, 1);
  gate = &g_array_index (during, Port, 0);
  g_assert_cmpstr (gate->protocol, ==, "tcp");
  g_assert_cmpuint (g_inet_socket_address_get_port (gate->address), ==, port);
  g_assert_true (g_inet_address_get_is_loopback (g_inet_socket_address_get_address (gate->address)));
  send_crafted_bytes (gate->address, open_fds);

  for (int r = 1; r < 3; r++)
    cp_test_group_spawn (&group, "collectives", r, 3, port, SETTINGS (go_setting, "CPMESH_TIMEOUT_MS=30000"));
  cp_test_run_until (group.ranks, group.n, all_joined);
  for (int r = 0; r < 3; r++)
    {
      g_autoptr(GArray) after = ports_of (group.ranks[r]);
      g_autofree char *text = describe_ports (after);

      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "JOINED"));
      if (after->len > 0)
        g_error ("rank %d still listens once the mesh formed: %s", r, text);
    }
  /* The rendezvous port closed with the rendezvous. */
  g_assert_cmpint (connect_to (gate->address), <, 0);
  send_crafted_bytes (gate->address, open_fds);

  give_go (go);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  close_all (open_fds);
  remove_go_file (go);
  for (int r = 0; r < 3; r++)
    {
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "OK"));
      cp_test_assert_exit (group.ranks[r], 0);
    }
  cp_test_group_clear (&group);
  cp_test_record_outcome (SUBJECT, "crafted bytes on every port a rank listens on, during and after "
                          "the rendezvous (MASTER_ADDR loopback)",
                          "the ranks survive", "only rank 0's rendezvous port is open, only until the "
                          "mesh formed; every collective then matched the in-process backend");
}

/* ---- the interface that reaches MASTER_ADDR ---- */

/* An IPv4 address of an interface that is up and not loopback, or NULL. */
static char *
outside_address (void)
{
  struct ifaddrs *list = NULL;
  char *found = NULL;

  if (getifaddrs (&list) != 0)
    return NULL;
  for (struct ifaddrs *ifa = list; ifa != NULL && found == NULL; ifa = ifa->ifa_next)
    {
      g_autoptr(GSocketAddress) address = NULL;

      if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET || (ifa->ifa_flags & IFF_LOOPBACK) ||
          !(ifa->ifa_flags & IFF_UP))
        continue;
      address = g_socket_address_new_from_native (ifa->ifa_addr, sizeof (struct sockaddr_in));
      found = g_inet_address_to_string (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address)));
    }
  freeifaddrs (list);
  return found;
}

static void
test_interface (void)
{
  g_autofree char *host = outside_address ();
  g_autofree char *master = NULL;
  g_autofree char *go = NULL;
  g_autofree char *go_setting = NULL;
  guint16 port = cp_test_free_port ();
  CpTestGroup group = { 0 };
  guint n_ports = 0;

  g_test_summary ("With a MASTER_ADDR that is not loopback, UCX keeps to the interface that "
                  "reaches it: no rank listens on any other address");
  if (host == NULL)
    {
      g_test_skip ("this host has no interface but loopback");
      return;
    }
  master = g_strdup_printf ("MASTER_ADDR=%s", host);
  go = new_go_file ();
  go_setting = g_strdup_printf ("CP_TEST_GO_FILE=%s", go);
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "join", r, 2, port, SETTINGS (master, go_setting, "CPMESH_TOKEN=interface",
                                                               "CPMESH_TIMEOUT_MS=30000"));
  cp_test_run_until (group.ranks, group.n, all_joined);
  for (int r = 0; r < 2; r++)
    {
      g_autoptr(GArray) ports = ports_of (group.ranks[r]);
      g_autofree char *text = describe_ports (ports);

      g_test_message ("rank %d listens on %s", r, text);
      for (guint i = 0; i < ports->len; i++)
        {
          g_autofree char *bound = g_inet_address_to_string (
            g_inet_socket_address_get_address (g_array_index (ports, Port, i).address));

          if (!g_str_equal (bound, host))
            g_error ("rank %d listens on %s, not only on %s", r, text, host);
        }
      n_ports += ports->len;
    }
  g_assert_cmpuint (n_ports, >, 0);
  give_go (go);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  remove_go_file (go);
  for (int r = 0; r < 2; r++)
    cp_test_assert_exit (group.ranks[r], 0);
  cp_test_group_clear (&group);
}

/* ---- impostors on rank 0's port ---- */

typedef enum
{
  IMPOSTOR_CLOSES,
  IMPOSTOR_SILENT,
  IMPOSTOR_FOREIGN,
  IMPOSTOR_OLD,
  IMPOSTOR_UNPROVEN,
  IMPOSTOR_LOUD,
} ImpostorKind;

typedef struct
{
  ImpostorKind kind;
  GPtrArray *connections;   /* kept open until the case ends */
} Impostor;

static void
write_greeting (GOutputStream *out,
                const char    *magic,
                gsize          magic_size)
{
  guint8 greeting[40] = { 0 };

  memcpy (greeting, magic, MIN (magic_size, sizeof greeting));
  g_assert_true (g_output_stream_write_all (out, greeting, sizeof greeting, NULL, NULL, NULL));
}

/* Answers the joiner's hello with a verdict of @code and @reason that
 * carries no proof of the token: an admission (-1), or a refusal. */
static void
send_verdict (GSocketConnection *connection,
              int                code,
              const char        *reason)
{
  GInputStream *in = g_io_stream_get_input_stream (G_IO_STREAM (connection));
  GOutputStream *out = g_io_stream_get_output_stream (G_IO_STREAM (connection));
  g_autoptr(GVariant) body = g_variant_ref_sink (g_variant_new ("(is)", code, reason));
  gsize size = g_variant_get_size (body);
  g_autofree guint8 *frame = g_malloc0 (4 + size + 32);
  guint8 head[4];
  g_autofree guint8 *hello = NULL;
  gsize length, got = 0;

  /* This libcpmesh's rendezvous protocol, so that the joiner goes on. */
  write_greeting (out, "CPMESH\0\3", 8);
  g_assert_true (g_input_stream_read_all (in, head, sizeof head, &got, NULL, NULL));
  length = (gsize) head[0] << 24 | head[1] << 16 | head[2] << 8 | head[3];
  hello = g_malloc (length);
  g_assert_true (g_input_stream_read_all (in, hello, length, &got, NULL, NULL));
  frame[3] = (guint8) (size + 32);
  g_variant_store (body, frame + 4);
  g_assert_true (g_output_stream_write_all (out, frame, 4 + size + 32, NULL, NULL, NULL));
}

static gboolean
on_visitor (GSocketService     *service,
            GSocketConnection  *connection,
            GObject            *source,
            gpointer            user_data)
{
  Impostor *impostor = user_data;
  GOutputStream *out = g_io_stream_get_output_stream (G_IO_STREAM (connection));

  switch (impostor->kind)
    {
    case IMPOSTOR_CLOSES:
      g_io_stream_close (G_IO_STREAM (connection), NULL, NULL);
      return TRUE;
    case IMPOSTOR_FOREIGN:
      write_greeting (out, "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", 32);
      break;
    case IMPOSTOR_OLD:
      write_greeting (out, "CPMESH\0\1", 8);
      break;
    case IMPOSTOR_UNPROVEN:
      send_verdict (connection, -1, "");
      break;
    case IMPOSTOR_LOUD:
      /* Clears the screen, paints it red and forges a second line. */
      send_verdict (connection, CP_MESH_ERROR_INVALID_TOPOLOGY,
                    "\033[2J\033[31mdenied\r\nrank 1: all is well\xc2\x85\xc2\x9b" "31m");
      break;
    case IMPOSTOR_SILENT:
    default:
      break;
    }
  g_ptr_array_add (impostor->connections, g_object_ref (connection));
  return TRUE;
}

/* Joins while this thread's main loop serves whatever listens on it. */
static GError *
fail_to_connect (const char * const *environment)
{
  GError *error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (environment, NULL, &error);

  g_assert_null (mesh);
  g_assert_nonnull (error);
  return error;
}

static void
check_impostor (ImpostorKind  kind,
                int           code,
                const char   *text,
                const char   *what)
{
  Impostor impostor = { kind, g_ptr_array_new_with_free_func (g_object_unref) };
  g_autoptr(GSocketService) service = g_socket_service_new ();
  guint16 port = g_socket_listener_add_any_inet_port (G_SOCKET_LISTENER (service), NULL, NULL);
  g_autofree char *port_setting = g_strdup_printf ("CPMESH_PORT=%u", port);
  g_autoptr(GError) error = NULL;
  gint64 started = g_get_monotonic_time ();

  g_assert_cmpuint (port, !=, 0);
  g_signal_connect (service, "incoming", G_CALLBACK (on_visitor), &impostor);
  /* Long enough for UCX to start under valgrind, short enough to wait out. */
  error = fail_to_connect (SETTINGS ("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port_setting,
                                     "CPMESH_TOKEN=impostor", "CPMESH_TIMEOUT_MS=2000"));
  g_test_message ("%s", error->message);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, code, SUBJECT, what);
  /* Whatever the process on the port says reaches the message escaped. */
  for (const char *c = error->message; *c != '\0'; c++)
    g_assert_cmpint ((guint8) *c, >=, 0x20);
  g_assert_null (strstr (error->message, "\xc2\x85"));
  g_assert_null (strstr (error->message, "\xc2\x9b"));
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
  g_assert_cmpint (g_get_monotonic_time () - started, <, 10 * G_TIME_SPAN_SECOND);
  g_socket_service_stop (service);
  g_socket_listener_close (G_SOCKET_LISTENER (service));
  g_ptr_array_unref (impostor.connections);
}

static void
test_impostor (void)
{
  g_test_summary ("A joiner facing something other than rank 0 on the rendezvous port fails "
                  "with a CpMeshError and never joins");
  check_impostor (IMPOSTOR_CLOSES, CP_MESH_ERROR_TIMED_OUT, "rank 0 did not answer at 127.0.0.1:",
                  "the rendezvous port closes every connection at once (the joiner knocks until its timeout)");
  check_impostor (IMPOSTOR_SILENT, CP_MESH_ERROR_TIMED_OUT, "no greeting",
                  "the process on the rendezvous port accepts and says nothing");
  check_impostor (IMPOSTOR_FOREIGN, CP_MESH_ERROR_TRANSPORT, "is not the rendezvous of a libcpmesh rank 0",
                  "another program (an SSH server) on the rendezvous port");
  check_impostor (IMPOSTOR_OLD, CP_MESH_ERROR_UNSUPPORTED, "speaks rendezvous protocol 1",
                  "rank 0 speaks an older rendezvous protocol");
  check_impostor (IMPOSTOR_UNPROVEN, CP_MESH_ERROR_AUTH, "did not prove it holds the mesh token",
                  "a process on the rendezvous port admits the joiner without proving the token");
  check_impostor (IMPOSTOR_LOUD, CP_MESH_ERROR_INVALID_TOPOLOGY,
                  "refused this process: \\x1b[2J\\x1b[31mdenied\\x0d\\x0arank 1: all is well\\u0085\\u009b31m",
                  "a process on the rendezvous port refuses the joiner with ANSI escapes and newlines");
}

/* ---- no token ---- */

static void
count_message (const char     *domain,
               GLogLevelFlags  level,
               const char     *message,
               gpointer        user_data)
{
  if (strstr (message, "CPMESH_TOKEN") != NULL)
    (*(guint *) user_data)++;
}

static void
time_out_as_rank_0 (const char *host,
                    const char *token)
{
  g_autofree char *master = g_strdup_printf ("MASTER_ADDR=%s", host);
  g_autofree char *port = g_strdup_printf ("CPMESH_PORT=%u", cp_test_free_port ());
  g_autofree char *token_setting = g_strdup_printf ("CPMESH_TOKEN=%s", token ? token : "");
  g_autoptr(GError) error = fail_to_connect (SETTINGS ("RANK=0", "WORLD_SIZE=2", master, port, token_setting,
                                                       "CPMESH_TIMEOUT_MS=200"));

  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT);
  /* One rank missing: named in the singular. */
  g_assert_nonnull (strstr (error->message, "rank 0: rank 1 never joined within 200 ms"));
}

static void
test_no_token (void)
{
  g_autofree char *host = outside_address ();
  guint unexpected = 0;
  guint handler;

  g_test_summary ("A mesh reachable from other hosts without CPMESH_TOKEN says so, once; "
                  "over loopback or with a token it says nothing");
  if (host == NULL)
    {
      g_test_skip ("this host has no interface but loopback");
      return;
    }
  handler = g_log_set_handler ("Cp", G_LOG_LEVEL_MESSAGE, count_message, &unexpected);
  time_out_as_rank_0 ("127.0.0.1", NULL);
  time_out_as_rank_0 (host, "secret");
  g_log_remove_handler ("Cp", handler);
  g_assert_cmpuint (unexpected, ==, 0);

  g_test_expect_message ("Cp", G_LOG_LEVEL_MESSAGE, "CPMESH_TOKEN is not set: any process that reaches "
                         "*:* can join this mesh as a rank and receive its data*");
  time_out_as_rank_0 (host, NULL);
  g_test_assert_expected_messages ();
  handler = g_log_set_handler ("Cp", G_LOG_LEVEL_MESSAGE, count_message, &unexpected);
  time_out_as_rank_0 (host, NULL);
  g_log_remove_handler ("Cp", handler);
  g_assert_cmpuint (unexpected, ==, 0);
}

/* MASTER_ADDR=0.0.0.0 or :: has rank 0 listen on every interface, though
 * its ranks meet over loopback: the gate is as open as on any other
 * address, and without a token that is said. */
static void
test_no_token_any (gconstpointer data)
{
  const char *host = data;
  g_autofree char *master = g_strdup_printf ("MASTER_ADDR=%s", host);
  g_autofree char *port = g_strdup_printf ("CPMESH_PORT=%u", cp_test_free_port ());
  g_autoptr(GError) error = NULL;

  g_test_summary ("A mesh whose rank 0 listens on the unspecified address, without CPMESH_TOKEN, "
                  "says that every interface is open");
  /* The message comes once per process: with every subtest in one
   * process, /Cp/Ucx/exposure/no-token has had it. */
  if (g_getenv ("CP_TEST_IN_PROCESS") != NULL)
    {
      g_test_skip ("the message is said once per process, and every subtest runs in one");
      return;
    }
  g_test_expect_message ("Cp", G_LOG_LEVEL_MESSAGE, "CPMESH_TOKEN is not set: rank 0 listens at *, on every "
                         "interface of its host, and any process that reaches it can join*");
  error = fail_to_connect (SETTINGS ("RANK=0", "WORLD_SIZE=2", master, port, "CPMESH_TIMEOUT_MS=200"));
  g_test_assert_expected_messages ();
  /* Without IPv6, "::" cannot be listened on, which says so too. */
  g_assert_true (g_error_matches (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT) ||
                 (g_str_equal (host, "::") && g_error_matches (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT)));
}

int
main (int   argc,
      char *argv[])
{
  if (!CP_HAS_UCX)
    {
      g_print ("1..0 # SKIP libcpmesh was built without UCX\n");
      return 0;
    }
  g_test_init (&argc, &argv, NULL);
  /* A choice of this environment's would override the library's. */
  g_unsetenv ("UCX_NET_DEVICES");
  g_unsetenv ("UCX_TLS");

  g_test_add_func ("/Cp/Ucx/exposure/siege", test_siege);
  g_test_add_func ("/Cp/Ucx/exposure/crafted-bytes", test_crafted_bytes);
  g_test_add_func ("/Cp/Ucx/exposure/interface", test_interface);
  g_test_add_func ("/Cp/Ucx/exposure/impostor", test_impostor);
  g_test_add_func ("/Cp/Ucx/exposure/no-token", test_no_token);
  g_test_add_data_func ("/Cp/Ucx/exposure/no-token-any/ipv4", "0.0.0.0", test_no_token_any);
  g_test_add_data_func ("/Cp/Ucx/exposure/no-token-any/ipv6", "::", test_no_token_any);

  return g_test_run ();
}
