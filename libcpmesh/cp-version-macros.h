/* cp-version-macros.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib.h>

/* The library itself is built with hidden visibility; config.h defines
 * _CP_EXTERN to export the public symbols.  Users get a plain extern. */
#ifndef _CP_EXTERN
# define _CP_EXTERN extern
#endif

#define CP_VERSION_1_0 (G_ENCODE_VERSION (1, 0))

/**
 * CP_DEPRECATED_FOR:
 * @f: the function to use instead
 *
 * Marks a public symbol as deprecated in favour of @f: callers get a
 * compiler warning naming @f unless they define
 * `CP_DISABLE_DEPRECATION_WARNINGS`.
 *
 * Since: 1.0
 */
#ifdef CP_DISABLE_DEPRECATION_WARNINGS
# define CP_DEPRECATED _CP_EXTERN
# define CP_DEPRECATED_FOR(f) _CP_EXTERN
#else
# define CP_DEPRECATED G_DEPRECATED _CP_EXTERN
# define CP_DEPRECATED_FOR(f) G_DEPRECATED_FOR (f) _CP_EXTERN
#endif

#define CP_AVAILABLE_IN_ALL _CP_EXTERN
#define CP_AVAILABLE_IN_1_0 _CP_EXTERN
