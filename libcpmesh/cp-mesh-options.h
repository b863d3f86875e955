/* cp-mesh-options.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-version-macros.h"

G_BEGIN_DECLS

#define CP_TYPE_MESH_OPTIONS (cp_mesh_options_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpMeshOptions, cp_mesh_options, CP, MESH_OPTIONS, GObject)

CP_AVAILABLE_IN_ALL
CpMeshOptions      *cp_mesh_options_new             (void) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
int                 cp_mesh_options_get_rank        (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_rank        (CpMeshOptions       *self,
                                                     int                  rank);
CP_AVAILABLE_IN_ALL
int                 cp_mesh_options_get_world_size  (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_world_size  (CpMeshOptions       *self,
                                                     int                  world_size);
CP_AVAILABLE_IN_ALL
const char         *cp_mesh_options_get_address     (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_address     (CpMeshOptions       *self,
                                                     const char          *address);
CP_AVAILABLE_IN_ALL
guint               cp_mesh_options_get_port        (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_port        (CpMeshOptions       *self,
                                                     guint                port);
CP_AVAILABLE_IN_ALL
const char         *cp_mesh_options_get_token       (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_token       (CpMeshOptions       *self,
                                                     const char          *token);
CP_AVAILABLE_IN_ALL
const char * const *cp_mesh_options_get_dim_names   (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
char              **cp_mesh_options_dup_dim_names   (CpMeshOptions       *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
const int          *cp_mesh_options_get_dim_sizes   (CpMeshOptions       *self,
                                                     gsize               *n_dims);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_dims        (CpMeshOptions       *self,
                                                     const char * const  *dim_names,
                                                     const int           *dim_sizes,
                                                     gsize                n_dims);
CP_AVAILABLE_IN_ALL
guint               cp_mesh_options_get_timeout_ms  (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_timeout_ms  (CpMeshOptions       *self,
                                                     guint                timeout_ms);
CP_AVAILABLE_IN_ALL
const char         *cp_mesh_options_get_transport   (CpMeshOptions       *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_options_set_transport   (CpMeshOptions       *self,
                                                     const char          *transport);

G_END_DECLS
