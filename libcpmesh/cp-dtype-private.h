/* cp-dtype-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <string.h>

#include "cp-types.h"

G_BEGIN_DECLS

/* Conversions between the 16-bit float formats and float32.  Both round to
 * nearest even, like the hardware conversions, so values round-trip through
 * any host or device path identically. */
float   _cp_half_to_float   (guint16 h);
guint16 _cp_float_to_half   (float   f);

static inline float
_cp_bf16_to_float (guint16 b)
{
  guint32 bits = (guint32) b << 16;
  float f;

  memcpy (&f, &bits, sizeof f);
  return f;
}

static inline guint16
_cp_float_to_bf16 (float f)
{
  guint32 bits;

  memcpy (&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return (guint16) ((bits >> 16) | 0x0040u); /* keep NaN a quiet NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (guint16) (bits >> 16);
}

/* Element access by flat index, through double.  For tests, bindings and
 * fill values; never on a hot path. */
double  _cp_dtype_read      (CpDType       dtype,
                             gconstpointer data,
                             gsize         index);
void    _cp_dtype_write     (CpDType       dtype,
                             gpointer      data,
                             gsize         index,
                             double        value);

/* Fills @n elements at @data with @value converted to @dtype. */
void    _cp_dtype_fill      (CpDType       dtype,
                             gpointer      data,
                             gsize         n,
                             double        value);

G_END_DECLS
