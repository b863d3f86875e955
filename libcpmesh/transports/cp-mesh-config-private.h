/* cp-mesh-config-private.h: how a multi-process mesh is told who it is
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The port torchrun uses when MASTER_PORT is not set.  Rank 0 listens
 * one above MASTER_PORT unless CPMESH_PORT says otherwise: torchrun's
 * agent and torch.distributed's store already listen on MASTER_PORT. */
#define CP_MESH_DEFAULT_PORT 29500

/* The UCX backend packs a communicator index into 10 tag bits. */
#define CP_MESH_UCX_MAX_WORLD_SIZE 1024

/* The default for CpMesh:timeout-ms: long enough for the slowest rank of
 * a real step to catch up, short enough that a lost peer is noticed. */
#define CP_MESH_DEFAULT_TIMEOUT_MS 120000

/* Keeps meshes of absurd sizes from allocating per-rank tables. */
#define CP_MESH_MAX_WORLD_SIZE 65536

/* Checks dimension names and sizes and returns their product: what every
 * mesh's shape must pass, whether a launcher's environment or a program
 * gave it (below the mesh, so that configuring a mesh calls nothing
 * above the transports). */
gboolean _cp_mesh_config_check_dims (const char * const  *dim_names,
                                     const int           *dim_sizes,
                                     gsize                n_dims,
                                     int                 *world_size,
                                     GError             **error);

/* Everything a process needs to join a multi-process mesh: which rank it
 * is, where rank 0 listens, the shared secret and the mesh's shape. */
typedef struct _CpMeshConfig
{
  int rank;
  int world_size;
  int local_rank;       /* -1 when the launcher does not say */
  char *address;        /* the host rank 0 listens on */
  guint16 port;
  const char *port_origin; /* where the port came from, for messages */
  char *token;          /* NULL: any process that reaches the port may join */
  char **dim_names;
  int *dim_sizes;
  gsize n_dims;
  guint timeout_ms;
  const char *launcher; /* "torchrun", "Open MPI", "Slurm" or "explicit" */
  char *transport;      /* the backend asked for (CPMESH_TRANSPORT); NULL: the default */
} CpMeshConfig;

/* Reads the launcher conventions from @envp (NAME=VALUE strings), or from
 * the process environment when @envp is NULL. */
gboolean _cp_mesh_config_init_from_environ (CpMeshConfig        *config,
                                            const char * const  *envp,
                                            GError             **error);

/* Fills and checks @config from explicit values; NULL or 0 pick defaults. */
gboolean _cp_mesh_config_init              (CpMeshConfig        *config,
                                            int                  rank,
                                            int                  world_size,
                                            const char          *address,
                                            guint                port,
                                            const char          *token,
                                            const char * const  *dim_names,
                                            const int           *dim_sizes,
                                            gsize                n_dims,
                                            guint                timeout_ms,
                                            GError             **error);

void     _cp_mesh_config_clear             (CpMeshConfig        *config);

/* Text from outside this process — an environment value, what a peer
 * says — as it may appear in a GError message: valid UTF-8 (bindings
 * cannot convert anything else) that cannot move a terminal's cursor,
 * colour it or start a line.  Control characters and bytes that are not
 * UTF-8 are written \xNN (\u0085 and the like for C1 controls and line
 * separators), and a backslash is doubled.  @length -1: up to the NUL. */
char    *_cp_mesh_escape_text              (const char          *text,
                                            gssize               length);

G_END_DECLS
