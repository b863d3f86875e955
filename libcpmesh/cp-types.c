/* cp-types.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "cp-dtype-private.h"

static const struct {
  const char *name;
  gsize size;
  gboolean floating;
} dtype_info[] = {
  [CP_DTYPE_BOOL]     = { "bool",     1, FALSE },
  [CP_DTYPE_UINT8]    = { "uint8",    1, FALSE },
  [CP_DTYPE_INT32]    = { "int32",    4, FALSE },
  [CP_DTYPE_INT64]    = { "int64",    8, FALSE },
  [CP_DTYPE_FLOAT16]  = { "float16",  2, TRUE },
  [CP_DTYPE_BFLOAT16] = { "bfloat16", 2, TRUE },
  [CP_DTYPE_FLOAT32]  = { "float32",  4, TRUE },
  [CP_DTYPE_FLOAT64]  = { "float64",  8, TRUE },
};

static gboolean
dtype_is_valid (CpDType dtype)
{
  return (guint) dtype < G_N_ELEMENTS (dtype_info);
}

/**
 * cp_dtype_get_size:
 * @dtype: an element type
 *
 * Gets the size of one element of @dtype in bytes.
 *
 * Returns: the element size in bytes
 *
 * Since: 1.0
 */
gsize
cp_dtype_get_size (CpDType dtype)
{
  g_return_val_if_fail (dtype_is_valid (dtype), 0);

  return dtype_info[dtype].size;
}

/**
 * cp_dtype_get_name:
 * @dtype: an element type
 *
 * Gets the short lower-case name of @dtype, such as `"bfloat16"`, the name
 * numpy and PyTorch use.
 *
 * Returns: (transfer none): the name
 *
 * Since: 1.0
 */
const char *
cp_dtype_get_name (CpDType dtype)
{
  g_return_val_if_fail (dtype_is_valid (dtype), NULL);

  return dtype_info[dtype].name;
}

/**
 * cp_dtype_is_floating:
 * @dtype: an element type
 *
 * Tells whether @dtype is a floating-point type.
 *
 * Returns: %TRUE for the four floating-point types
 *
 * Since: 1.0
 */
gboolean
cp_dtype_is_floating (CpDType dtype)
{
  g_return_val_if_fail (dtype_is_valid (dtype), FALSE);

  return dtype_info[dtype].floating;
}

/**
 * cp_dtype_from_name:
 * @name: a name as returned by [func@Cp.DType.get_name]
 * @dtype: (out): the element type
 *
 * Looks up an element type by name.
 *
 * Returns: %TRUE if @name names an element type
 *
 * Since: 1.0
 */
gboolean
cp_dtype_from_name (const char *name,
                    CpDType    *dtype)
{
  g_return_val_if_fail (name != NULL, FALSE);
  g_return_val_if_fail (dtype != NULL, FALSE);

  for (guint i = 0; i < G_N_ELEMENTS (dtype_info); i++)
    {
      if (g_str_equal (name, dtype_info[i].name))
        {
          *dtype = (CpDType) i;
          return TRUE;
        }
    }
  return FALSE;
}

float
_cp_half_to_float (guint16 h)
{
  guint32 sign = (guint32) (h & 0x8000u) << 16;
  guint32 exponent = (h >> 10) & 0x1fu;
  guint32 mantissa = h & 0x3ffu;
  guint32 bits;
  float f;

  if (exponent == 0x1f)
    bits = sign | 0x7f800000u | (mantissa << 13);
  else if (exponent != 0)
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  else if (mantissa == 0)
    bits = sign;
  else
    {
      /* Subnormal half: exact in float32. */
      f = ldexpf ((float) mantissa, -24);
      return sign ? -f : f;
    }
  memcpy (&f, &bits, sizeof f);
  return f;
}

guint16
_cp_float_to_half (float f)
{
  guint32 bits;
  guint32 sign;
  guint32 magnitude;

  memcpy (&bits, &f, sizeof bits);
  sign = (bits >> 16) & 0x8000u;
  magnitude = bits & 0x7fffffffu;

  if (magnitude >= 0x7f800000u)
    return (guint16) (sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u) /* rounds to at least 65520: overflow */
    return (guint16) (sign | 0x7c00u);
  if (magnitude < 0x38800000u) /* below the smallest normal half */
    {
      /* Scale so that the half subnormal unit is 1, then round to nearest
       * even with the FPU (exact for every value in this range). */
      float scaled = ldexpf (fabsf (f), 24);
      return (guint16) (sign | (guint32) nearbyintf (scaled));
    }
  magnitude -= 112u << 23; /* rebias the exponent */
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);
  return (guint16) (sign | (magnitude >> 13));
}

double
_cp_dtype_read (CpDType       dtype,
                gconstpointer data,
                gsize         index)
{
  switch (dtype)
    {
    case CP_DTYPE_BOOL:
      return ((const guint8 *) data)[index] != 0;
    case CP_DTYPE_UINT8:
      return ((const guint8 *) data)[index];
    case CP_DTYPE_INT32:
      return ((const gint32 *) data)[index];
    case CP_DTYPE_INT64:
      return (double) ((const gint64 *) data)[index];
    case CP_DTYPE_FLOAT16:
      return _cp_half_to_float (((const guint16 *) data)[index]);
    case CP_DTYPE_BFLOAT16:
      return _cp_bf16_to_float (((const guint16 *) data)[index]);
    case CP_DTYPE_FLOAT32:
      return ((const float *) data)[index];
    case CP_DTYPE_FLOAT64:
      return ((const double *) data)[index];
    default:
      g_assert_not_reached ();
    }
}

static gint64
double_to_int64_saturated (double value)
{
  if (isnan (value))
    return 0;
  if (value >= 9223372036854775807.0)
    return G_MAXINT64;
  if (value <= -9223372036854775808.0)
    return G_MININT64;
  return (gint64) value;
}

void
_cp_dtype_write (CpDType  dtype,
                 gpointer data,
                 gsize    index,
                 double   value)
{
  gint64 integer;

  switch (dtype)
    {
    case CP_DTYPE_BOOL:
      ((guint8 *) data)[index] = value != 0.0;
      break;
    case CP_DTYPE_UINT8:
      integer = double_to_int64_saturated (value);
      ((guint8 *) data)[index] = (guint8) CLAMP (integer, 0, G_MAXUINT8);
      break;
    case CP_DTYPE_INT32:
      integer = double_to_int64_saturated (value);
      ((gint32 *) data)[index] = (gint32) CLAMP (integer, G_MININT32, G_MAXINT32);
      break;
    case CP_DTYPE_INT64:
      ((gint64 *) data)[index] = double_to_int64_saturated (value);
      break;
    case CP_DTYPE_FLOAT16:
      ((guint16 *) data)[index] = _cp_float_to_half ((float) value);
      break;
    case CP_DTYPE_BFLOAT16:
      ((guint16 *) data)[index] = _cp_float_to_bf16 ((float) value);
      break;
    case CP_DTYPE_FLOAT32:
      ((float *) data)[index] = (float) value;
      break;
    case CP_DTYPE_FLOAT64:
      ((double *) data)[index] = value;
      break;
    default:
      g_assert_not_reached ();
    }
}

void
_cp_dtype_fill (CpDType  dtype,
                gpointer data,
                gsize    n,
                double   value)
{
  gsize size = dtype_info[dtype].size;
  guint8 *bytes = data;
  gsize filled;

  if (n == 0)
    return;

  /* Write one element, then double the filled prefix with memcpy: fast for
   * every dtype without a switch per element. */
  _cp_dtype_write (dtype, data, 0, value);
  for (filled = 1; filled < n; filled *= 2)
    memcpy (bytes + filled * size, bytes, MIN (filled, n - filled) * size);
}
