/* libcpmesh.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>

#define CP_INSIDE
# include "cp-version-macros.h"
# include "cp-version.h"
# include "cp-features.h"
# include "cp-types.h"
# include "cp-enum-types.h"
# include "cp-error.h"
# include "cp-storage.h"
# include "cp-tensor.h"
# include "cp-layout.h"
# include "cp-mesh.h"
# include "cp-mesh-options.h"
# include "cp-context.h"
# include "cp-batch-options.h"
# include "cp-thd-options.h"
# include "cp-batch.h"
# include "cp-attention.h"
#undef CP_INSIDE
