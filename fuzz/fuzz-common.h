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

/* An in-process mesh of @size ranks ("cp"), made on first use and kept:
 * one per size for the life of the fuzzer. */
static inline GList *
fuzz_local_group (int size)
{
  static GList *groups[65];
  const char *names[] = { "cp", NULL };

  g_assert_cmpint (size, >=, 1);
  g_assert_cmpint (size, <, (int) G_N_ELEMENTS (groups));
  if (groups[size] == NULL)
    {
      g_autoptr(GError) error = NULL;

      groups[size] = cp_mesh_new_local_group (names, &size, 1, &error);
      g_assert_no_error (error);
      /* Rank threads of a slow (sanitized, fuzzed) process still meet. */
      for (GList *l = groups[size]; l != NULL; l = l->next)
        cp_mesh_set_timeout_ms (l->data, 60000);
    }
  return groups[size];
}

/* Criticals and warnings abort: the library must turn bad input into a
 * GError, never into a g_return_if_fail. */
static inline void
fuzz_init (void)
{
  g_log_set_always_fatal (G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING);
}
