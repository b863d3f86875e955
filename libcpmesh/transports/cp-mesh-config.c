/* cp-mesh-config.c: rank, world size and rendezvous from the environment
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <arpa/inet.h>
#include <string.h>

#include "cp-error.h"
#include "cp-mesh-config-private.h"

/* The launchers whose conventions we read, most specific first: torchrun
 * started under srun or mpirun sees its parent's variables too, and its
 * own are the ones that describe this process. */
typedef struct
{
  const char *name;
  const char *rank;
  const char *world_size;
  const char *local_rank;
} Launcher;

static const Launcher launchers[] = {
  { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK" },
  { "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK" },
  { "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" },
};

typedef enum { ABSENT, FOUND, INVALID } Lookup;

char *
_cp_mesh_escape_text (const char *text,
                      gssize      length)
{
  const char *end = text + (length < 0 ? strlen (text) : (gsize) length);
  GString *out = g_string_sized_new ((gsize) (end - text));

  while (text < end)
    {
      gunichar c = g_utf8_get_char_validated (text, end - text);

      if (c == (gunichar) -1 || c == (gunichar) -2)
        {
          g_string_append_printf (out, "\\x%02x", (guint8) *text++);
          continue;
        }
      if (c < 0x20 || c == 0x7f)
        g_string_append_printf (out, "\\x%02x", c);
      else if ((c >= 0x80 && c < 0xa0) || c == 0x2028 || c == 0x2029)
        g_string_append_printf (out, "\\u%04x", c);
      else if (c == '\\')
        g_string_append (out, "\\\\");
      else
        g_string_append_len (out, text, g_utf8_next_char (text) - text);
      text = g_utf8_next_char (text);
    }
  return g_string_free (out, FALSE);
}

static void
set_env_error (GError     **error,
               const char  *name,
               const char  *value,
               const char  *why)
{
  g_autofree char *shown = _cp_mesh_escape_text (value, -1);

  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
               "%s=\"%s\": %s", name, shown, why);
}

/* A whole number as launchers write one: decimal digits alone, without
 * a sign, spaces or leading zeros ("+29500", "-0" and "007" are typing
 * mistakes, or another program's convention, not a rank or a port). */
static gboolean
parse_decimal (const char *text,
               gint64      min,
               gint64      max,
               gint64     *out)
{
  gsize digits = strspn (text, "0123456789");

  if (digits == 0 || text[digits] != '\0' || digits > 18 || (text[0] == '0' && digits > 1))
    return FALSE;
  *out = g_ascii_strtoll (text, NULL, 10);
  return *out >= min && *out <= max;
}

/* Reads integer variable @name in [@min, @max]. */
static Lookup
lookup_int (const char * const  *envp,
            const char          *name,
            gint64               min,
            gint64               max,
            gint64              *out,
            GError             **error)
{
  const char *value = g_environ_getenv ((char **) envp, name);
  gint64 parsed = 0;

  if (value == NULL)
    return ABSENT;
  if (!parse_decimal (value, min, max, &parsed))
    {
      g_autofree char *why = g_strdup_printf ("expected a whole number in [%" G_GINT64_FORMAT
                                              ", %" G_GINT64_FORMAT "], in decimal digits alone (no "
                                              "sign, spaces or leading zeros)", min, max);

      set_env_error (error, name, value, why);
      return INVALID;
    }
  *out = parsed;
  return FOUND;
}

static const Launcher *
find_launcher (const char * const *envp)
{
  for (gsize i = 0; i < G_N_ELEMENTS (launchers); i++)
    if (g_environ_getenv ((char **) envp, launchers[i].rank) != NULL ||
        g_environ_getenv ((char **) envp, launchers[i].world_size) != NULL)
      return &launchers[i];
  return NULL;
}

static gboolean
check_pair (const Launcher      *launcher,
            const char * const  *envp,
            Lookup               have_rank,
            Lookup               have_world,
            GError             **error)
{
  const char *set = have_rank == FOUND ? launcher->rank : launcher->world_size;
  const char *unset = have_rank == FOUND ? launcher->world_size : launcher->rank;
  g_autofree char *why = NULL;

  if (have_rank == FOUND && have_world == FOUND)
    return TRUE;
  why = g_strdup_printf ("%s is set but %s is not", set, unset);
  set_env_error (error, set, g_environ_getenv ((char **) envp, set), why);
  return FALSE;
}

/* Rank and world size come from one launcher's pair of variables: half
 * a pair is an error, never mixed with another launcher's half. */
static gboolean
read_rank (CpMeshConfig        *config,
           const char * const  *envp,
           GError             **error)
{
  const Launcher *launcher = find_launcher (envp);
  gint64 rank = 0, world = 1, local = -1;
  Lookup have_rank, have_world;

  config->launcher = launcher ? launcher->name : "none";
  /* No launcher: a mesh of this one process. */
  config->world_size = 1;
  if (launcher == NULL)
    return TRUE;
  have_world = lookup_int (envp, launcher->world_size, 1, CP_MESH_UCX_MAX_WORLD_SIZE, &world, error);
  if (have_world == INVALID)
    return FALSE;
  have_rank = lookup_int (envp, launcher->rank, 0, G_MAXINT, &rank, error);
  if (have_rank == INVALID || !check_pair (launcher, envp, have_rank, have_world, error))
    return FALSE;
  if (rank >= world)
    {
      g_autofree char *why = g_strdup_printf ("rank is not below %s=%" G_GINT64_FORMAT,
                                              launcher->world_size, world);

      set_env_error (error, launcher->rank, g_environ_getenv ((char **) envp, launcher->rank), why);
      return FALSE;
    }
  if (lookup_int (envp, launcher->local_rank, 0, world - 1, &local, error) == INVALID)
    return FALSE;
  config->rank = (int) rank;
  config->world_size = (int) world;
  config->local_rank = (int) local;
  return TRUE;
}

/* The first host of a Slurm host list: "node[01-04,7],gpu5" → "node01". */
static char *
first_slurm_host (const char *list)
{
  const char *bracket = strchr (list, '[');
  const char *comma = strchr (list, ',');

  if (bracket == NULL || (comma != NULL && comma < bracket))
    return g_strndup (list, comma ? (gsize) (comma - list) : strlen (list));
  return g_strdup_printf ("%.*s%.*s", (int) (bracket - list), list,
                          (int) strspn (bracket + 1, "0123456789"), bracket + 1);
}

/* CPMESH_PORT, else one above MASTER_PORT (29500 by default): torchrun's
 * agent, and torch.distributed's store in a program that also uses it,
 * listen on MASTER_PORT itself. */
static gboolean
read_port (CpMeshConfig        *config,
           const char * const  *envp,
           GError             **error)
{
  gint64 port = CP_MESH_DEFAULT_PORT;
  Lookup master;

  switch (lookup_int (envp, "CPMESH_PORT", 1, 65535, &port, error))
    {
    case FOUND:
      config->port = (guint16) port;
      config->port_origin = "CPMESH_PORT";
      return TRUE;
    case INVALID:
      return FALSE;
    case ABSENT:
    default:
      break;
    }
  master = lookup_int (envp, "MASTER_PORT", 1, 65535, &port, error);
  if (master == INVALID)
    return FALSE;
  if (port == 65535)
    {
      set_env_error (error, "MASTER_PORT", "65535", "rank 0 listens one above MASTER_PORT unless "
                     "CPMESH_PORT names its port; set CPMESH_PORT");
      return FALSE;
    }
  config->port = (guint16) (port + 1);
  config->port_origin = master == FOUND ? "MASTER_PORT + 1, as CPMESH_PORT is unset"
                                        : "29500 + 1, as neither CPMESH_PORT nor MASTER_PORT is set";
  return TRUE;
}

/* A host name or an address in its standard form, for @origin (a
 * variable's name, or "the address given").  The C library also reads
 * older numeric forms — "0x7f000001", "127.1", "2130706433", octal
 * parts — that other programs of a job (a launcher, a firewall rule)
 * read differently or not at all; they are refused with the standard
 * form of the address they stand for. */
static gboolean
check_host (const char  *host,
            const char  *origin,
            GError     **error)
{
  struct in_addr numeric;
  guint8 any[16];

  for (const char *c = host; *c != '\0'; c++)
    if (*c <= ' ' || *c > '~')
      {
        set_env_error (error, origin, host, "expected a host name or address, in printable ASCII "
                       "without spaces");
        return FALSE;
      }
  if (host[0] == '\0')
    {
      set_env_error (error, origin, host, "expected a host name or address");
      return FALSE;
    }
  if (inet_aton (host, &numeric) != 0 && inet_pton (AF_INET, host, any) != 1)
    {
      char standard[INET_ADDRSTRLEN];
      g_autofree char *why = NULL;

      inet_ntop (AF_INET, &numeric, standard, sizeof standard);
      why = g_strdup_printf ("a numeric form of %s that only some programs read; write %s", standard,
                             standard);
      set_env_error (error, origin, host, why);
      return FALSE;
    }
  return TRUE;
}

/* MASTER_ADDR, else the first node of a Slurm step, else loopback. */
static gboolean
read_rendezvous (CpMeshConfig        *config,
                 const char * const  *envp,
                 GError             **error)
{
  const char *address = g_environ_getenv ((char **) envp, "MASTER_ADDR");
  const char *nodes = g_environ_getenv ((char **) envp, "SLURM_STEP_NODELIST");

  if (nodes == NULL)
    nodes = g_environ_getenv ((char **) envp, "SLURM_JOB_NODELIST");
  if (address != NULL)
    config->address = g_strdup (address);
  else if (g_str_equal (config->launcher, "Slurm") && nodes != NULL && nodes[0] != '\0')
    config->address = first_slurm_host (nodes);
  else
    config->address = g_strdup ("127.0.0.1");
  if (!check_host (config->address, address != NULL ? "MASTER_ADDR" : "the first host of SLURM_STEP_NODELIST",
                   error))
    return FALSE;
  return read_port (config, envp, error);
}

/* A dimension name goes into messages and onto the wire as a string:
 * printable UTF-8. */
static gboolean
is_printable_name (const char *name)
{
  g_autofree char *shown = NULL;

  if (!g_utf8_validate (name, -1, NULL))
    return FALSE;
  shown = _cp_mesh_escape_text (name, -1);
  return g_str_equal (shown, name);
}

/* CPMESH_MESH_DIMS="dp=2,cp=2": names and sizes, outermost first. */
static gboolean
parse_dims (CpMeshConfig  *config,
            const char    *text,
            GError       **error)
{
  g_auto(GStrv) items = g_strsplit (text, ",", -1);
  gsize n = g_strv_length (items);

  config->dim_names = g_new0 (char *, n + 1);
  config->dim_sizes = g_new0 (int, MAX (n, 1));
  config->n_dims = n;
  for (gsize i = 0; i < n; i++)
    {
      g_auto(GStrv) pair = g_strsplit (items[i], "=", 2);
      gint64 size = 0;

      if (g_strv_length (pair) != 2 || !is_printable_name (pair[0]) ||
          !parse_decimal (g_strstrip (pair[1]), 1, CP_MESH_UCX_MAX_WORLD_SIZE, &size))
        {
          set_env_error (error, "CPMESH_MESH_DIMS", text,
                         "expected comma-separated NAME=SIZE pairs, such as \"dp=2,cp=4\"");
          return FALSE;
        }
      config->dim_names[i] = g_strdup (g_strstrip (pair[0]));
      config->dim_sizes[i] = (int) size;
    }
  return TRUE;
}

static void
set_default_dims (CpMeshConfig *config)
{
  config->dim_names = g_strdupv ((char **) (const char * const[]) { "cp", NULL });
  config->dim_sizes = g_memdup2 (&config->world_size, sizeof (int));
  config->n_dims = 1;
}

gboolean
_cp_mesh_config_check_dims (const char * const  *dim_names,
                            const int           *dim_sizes,
                            gsize                n_dims,
                            int                 *world_size,
                            GError             **error)
{
  gint64 world = 1;

  if (n_dims == 0 || dim_names == NULL || g_strv_length ((char **) dim_names) != n_dims)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "a mesh needs one name per dimension: %u names for %" G_GSIZE_FORMAT
                   " sizes", dim_names ? g_strv_length ((char **) dim_names) : 0, n_dims);
      return FALSE;
    }
  for (gsize i = 0; i < n_dims; i++)
    {
      if (dim_names[i][0] == '\0' || g_strv_contains (dim_names + i + 1, dim_names[i]))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                       "dimension name \"%s\" is empty or used twice", dim_names[i]);
          return FALSE;
        }
      if (dim_sizes[i] < 1 || (world *= dim_sizes[i]) > CP_MESH_MAX_WORLD_SIZE)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                       "dimension \"%s\" has size %d; sizes must be at least 1 and multiply "
                       "to at most %d ranks", dim_names[i], dim_sizes[i], CP_MESH_MAX_WORLD_SIZE);
          return FALSE;
        }
    }
  *world_size = (int) world;
  return TRUE;
}

static gboolean
check_dims_cover_world (CpMeshConfig  *config,
                        const char    *what,
                        GError       **error)
{
  g_autoptr(GError) dims_error = NULL;
  int product = 0;

  if (!_cp_mesh_config_check_dims ((const char * const *) config->dim_names, config->dim_sizes,
                                   config->n_dims, &product, &dims_error))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "%s: %s", what,
                   dims_error->message);
      return FALSE;
    }
  if (product != config->world_size)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "%s: the dimensions hold %d ranks, but the world size is %d",
                   what, product, config->world_size);
      return FALSE;
    }
  return TRUE;
}

static gboolean
read_dims (CpMeshConfig        *config,
           const char * const  *envp,
           GError             **error)
{
  const char *text = g_environ_getenv ((char **) envp, "CPMESH_MESH_DIMS");
  g_autofree char *shown = NULL;
  g_autofree char *what = NULL;

  if (text == NULL)
    {
      set_default_dims (config);
      return TRUE;
    }
  if (!parse_dims (config, text, error))
    return FALSE;
  shown = _cp_mesh_escape_text (text, -1);
  what = g_strdup_printf ("CPMESH_MESH_DIMS=\"%s\"", shown);
  return check_dims_cover_world (config, what, error);
}

static gboolean
read_settings (CpMeshConfig        *config,
               const char * const  *envp,
               GError             **error)
{
  const char *token = g_environ_getenv ((char **) envp, "CPMESH_TOKEN");
  const char *transport = g_environ_getenv ((char **) envp, "CPMESH_TRANSPORT");
  gint64 timeout = CP_MESH_DEFAULT_TIMEOUT_MS;

  if (lookup_int (envp, "CPMESH_TIMEOUT_MS", 1, G_MAXINT, &timeout, error) == INVALID)
    return FALSE;
  config->timeout_ms = (guint) timeout;
  config->token = token != NULL && token[0] != '\0' ? g_strdup (token) : NULL;
  config->transport = transport != NULL && transport[0] != '\0' ? g_strdup (transport) : NULL;
  return TRUE;
}

gboolean
_cp_mesh_config_init_from_environ (CpMeshConfig        *config,
                                   const char * const  *envp,
                                   GError             **error)
{
  g_auto(GStrv) own = envp == NULL ? g_get_environ () : NULL;

  memset (config, 0, sizeof *config);
  config->local_rank = -1;
  if (own != NULL)
    envp = (const char * const *) own;
  if (read_rank (config, envp, error) && read_rendezvous (config, envp, error) &&
      read_settings (config, envp, error) && read_dims (config, envp, error))
    return TRUE;
  _cp_mesh_config_clear (config);
  return FALSE;
}

static gboolean
check_explicit (int          rank,
                int          world_size,
                guint        port,
                guint        timeout_ms,
                GError     **error)
{
  if (world_size < 1 || world_size > CP_MESH_UCX_MAX_WORLD_SIZE || rank < 0 || rank >= world_size)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "rank %d of world size %d: the world size must be in [1, %d] and the rank "
                   "below it", rank, world_size, CP_MESH_UCX_MAX_WORLD_SIZE);
      return FALSE;
    }
  if (port > 65535 || (port == 0 && world_size > 1))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "rendezvous port %u: ranks need a port in [1, 65535] to meet on", port);
      return FALSE;
    }
  /* The same range as CPMESH_TIMEOUT_MS: what CpMesh:timeout-ms holds. */
  if (timeout_ms > G_MAXINT)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "timeout %u ms: it must be at most %d ms (0 for the default)", timeout_ms, G_MAXINT);
      return FALSE;
    }
  return TRUE;
}

gboolean
_cp_mesh_config_init (CpMeshConfig        *config,
                      int                  rank,
                      int                  world_size,
                      const char          *address,
                      guint                port,
                      const char          *token,
                      const char * const  *dim_names,
                      const int           *dim_sizes,
                      gsize                n_dims,
                      guint                timeout_ms,
                      GError             **error)
{
  memset (config, 0, sizeof *config);
  if (!check_explicit (rank, world_size, port, timeout_ms, error) ||
      (address != NULL && !check_host (address, "address", error)))
    return FALSE;
  config->rank = rank;
  config->world_size = world_size;
  config->local_rank = -1;
  config->address = g_strdup (address != NULL ? address : "127.0.0.1");
  config->port = (guint16) port;
  config->port_origin = "the port given";
  config->token = token != NULL && token[0] != '\0' ? g_strdup (token) : NULL;
  config->timeout_ms = timeout_ms != 0 ? timeout_ms : CP_MESH_DEFAULT_TIMEOUT_MS;
  config->launcher = "explicit";
  if (dim_names == NULL)
    {
      set_default_dims (config);
      return TRUE;
    }
  config->dim_names = g_strdupv ((char **) dim_names);
  config->dim_sizes = g_memdup2 (dim_sizes, MAX (n_dims, 1) * sizeof (int));
  config->n_dims = n_dims;
  if (check_dims_cover_world (config, "mesh dimensions", error))
    return TRUE;
  _cp_mesh_config_clear (config);
  return FALSE;
}

void
_cp_mesh_config_clear (CpMeshConfig *config)
{
  g_clear_pointer (&config->address, g_free);
  g_clear_pointer (&config->token, g_free);
  g_clear_pointer (&config->transport, g_free);
  g_clear_pointer (&config->dim_names, g_strfreev);
  g_clear_pointer (&config->dim_sizes, g_free);
}
