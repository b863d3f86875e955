/* fuzz-common.h: what every libFuzzer target of libcpmesh shares
 *
 * A target reads its arguments from the fuzzer's bytes with the
 * fuzz_take_* readers (missing bytes read as zero, so every input is
 * valid), calls the library, and checks its invariant with g_assert_*:
 * a failed check aborts, which libFuzzer reports as a crash with the
 * input that caused it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdint.h>
#include <string.h>

#include <libcpmesh.h>

typedef struct
{
  const guint8 *data;
  size_t size;
} FuzzInput;

static inline guint64
fuzz_take_bits (FuzzInput *in,
                guint      n_bytes)
{
  guint64 value = 0;

  for (guint i = 0; i < n_bytes && in->size > 0; i++, in->data++, in->size--)
    value |= (guint64) in->data[0] << (8 * i);
  return value;
}

static inline guint8
fuzz_take_u8 (FuzzInput *in)
{
  return (guint8) fuzz_take_bits (in, 1);
}

static inline gint32
fuzz_take_i32 (FuzzInput *in)
{
  return (gint32) (guint32) fuzz_take_bits (in, 4);
}

static inline gint64
fuzz_take_i64 (FuzzInput *in)
{
  return (gint64) fuzz_take_bits (in, 8);
}

/* A rejection is a GError with a message, never a critical or a crash. */
static inline void
fuzz_assert_rejected (const GError *error)
{
  g_assert_nonnull (error);
  g_assert_nonnull (error->message);
  g_assert_cmpstr (error->message, !=, "");
}

/* Criticals and warnings abort: the library must turn bad input into a
 * GError, never into a g_return_if_fail. */
static inline void
fuzz_init (void)
{
  g_log_set_always_fatal (G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING);
}
