/* test-copy.c: bulk copies, and the streaming path through shard,
 * unshard and the in-process all-gather
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-memory-private.h"
#include "cp-test-util.h"

/* Every byte differs from its neighbours, so a shifted copy shows. */
static void
fill_pattern (guint8 *data,
              gsize   n,
              guint   seed)
{
  for (gsize i = 0; i < n; i++)
    data[i] = (guint8) (i * 7 + seed * 13 + (i >> 8));
}

static CpTensor *
pattern_tensor (const gint64 *shape,
                guint         n_dims,
                guint         seed)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_UINT8, shape, n_dims, &error);

  g_assert_no_error (error);
  fill_pattern (cp_tensor_get_data (tensor), cp_tensor_get_nbytes (tensor), seed);
  return tensor;
}

static void
test_copy_threshold (void)
{
  g_test_summary ("Small operations never stream; operations far past any cache do on x86-64");

  g_assert_false (_cp_copy_wants_streaming (0));
  g_assert_false (_cp_copy_wants_streaming (1 << 20));
#if defined(__x86_64__)
  g_assert_true (_cp_copy_wants_streaming ((gsize) 256 << 20));
#endif
}

/* Copies @n bytes to every offset of a line with both store kinds and
 * checks the bytes around the destination stay untouched. */
static void
check_copy_at_every_alignment (gsize n)
{
  gsize size = n + 3 * 64;
  g_autofree guint8 *src = g_malloc (size);
  g_autofree guint8 *dst = g_malloc (size);
  g_autofree guint8 *expected = g_malloc (size);

  fill_pattern (src, size, 1);
  for (int streaming = 0; streaming <= 1; streaming++)
    for (gsize offset = 0; offset < 64; offset++)
      {
        memset (dst, 0xee, size);
        memset (expected, 0xee, size);
        memcpy (expected + offset, src + 64 - offset / 2, n);
        _cp_copy (dst + offset, src + 64 - offset / 2, n, streaming);
        g_assert_cmpmem (dst, size, expected, size);
      }
}

static void
test_copy_alignments (void)
{
  const gsize sizes[] = { 0, 1, 17, 63, 64, 65, 127, 128, 129, 1000, 4096 + 17, 70000 };

  g_test_summary ("Copies are exact for every destination alignment, size and store kind");

  for (gsize i = 0; i < G_N_ELEMENTS (sizes); i++)
    check_copy_at_every_alignment (sizes[i]);
}

static void
test_copy_layout_streaming (void)
{
  /* Rows of 1021 bytes put every run at an odd address; each rank's piece
   * is 40 MiB, past the streaming threshold. */
  const gint64 shape[] = { 5, 16384, 1021 };
  g_autoptr(CpTensor) full = pattern_tensor (shape, 3, 3);
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, shape[1], 2, NULL);
  g_autoptr(CpTensor) piece0 = NULL;
  g_autoptr(CpTensor) piece1 = NULL;
  g_autoptr(CpTensor) restored = NULL;
  g_autoptr(GError) error = NULL;

  g_test_summary ("Shard and unshard that take the streaming path round-trip bit-exactly");

  piece0 = cp_layout_shard (layout, full, 1, 0, &error);
  g_assert_no_error (error);
  piece1 = cp_layout_shard (layout, full, 1, 1, &error);
  g_assert_no_error (error);
  g_assert_true (_cp_copy_wants_streaming (cp_tensor_get_nbytes (piece0)));
  /* Rank 1 holds chunks 1 and 2 of 4: global positions [4096, 12288). */
  g_assert_cmpmem (cp_tensor_get_data (piece1), 8192 * 1021,
                   (guint8 *) cp_tensor_get_data (full) + 4096 * 1021, 8192 * 1021);

  restored = cp_layout_unshard_pieces (layout, (CpTensor *[]) { piece0, piece1 }, 2, 1, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (restored, full));
}

typedef struct
{
  CpTensor *pieces[2];
  CpTensor *gathered[2];
} GatherJob;

static void
gather_rank (CpMesh   *mesh,
             gpointer  data)
{
  GatherJob *job = data;
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(GError) error = NULL;

  job->gathered[rank] = cp_mesh_all_gather (mesh, job->pieces[rank], 0, &error);
  g_assert_no_error (error);
}

static void
test_copy_all_gather_streaming (void)
{
  /* 17 MB pieces of an odd size: every rank writes 35 MB, past the
   * threshold, and rank 1's block starts at an odd address. */
  const gint64 shape[] = { 5801, 3, 1003 };
  GList *meshes = cp_test_local_group ("cp", 2);
  GatherJob job = { { pattern_tensor (shape, 3, 5), pattern_tensor (shape, 3, 6) } };
  gsize piece = cp_tensor_get_nbytes (job.pieces[0]);

  g_test_summary ("An all-gather that takes the streaming path is bit-exact on every rank");

  g_assert_true (_cp_copy_wants_streaming (2 * piece));
  cp_test_run_ranks (meshes, gather_rank, &job);
  for (int r = 0; r < 2; r++)
    {
      const guint8 *out = cp_tensor_get_data (job.gathered[r]);

      g_assert_cmpmem (out, piece, cp_tensor_get_data (job.pieces[0]), piece);
      g_assert_cmpmem (out + piece, piece, cp_tensor_get_data (job.pieces[1]), piece);
    }
  for (int r = 0; r < 2; r++)
    {
      g_clear_object (&job.gathered[r]);
      g_clear_object (&job.pieces[r]);
    }
  cp_test_free_group (meshes);
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Copy/streaming/threshold", test_copy_threshold);
  g_test_add_func ("/Cp/Copy/streaming/alignments", test_copy_alignments);
  g_test_add_func ("/Cp/Copy/streaming/layout-round-trip", test_copy_layout_streaming);
  g_test_add_func ("/Cp/Copy/streaming/all-gather", test_copy_all_gather_streaming);

  return g_test_run ();
}
