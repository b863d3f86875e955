/* cp-test-util.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "cp-test-util.h"

typedef struct
{
  CpMesh *mesh;
  CpTestRankFunc func;
  gpointer user_data;
} RankJob;

static gpointer
rank_thread (gpointer data)
{
  RankJob *job = data;

  job->func (job->mesh, job->user_data);
  return NULL;
}

void
cp_test_run_ranks (GList          *meshes,
                   CpTestRankFunc  func,
                   gpointer        user_data)
{
  guint n = g_list_length (meshes);
  g_autofree RankJob *jobs = g_new0 (RankJob, n);
  g_autofree GThread **threads = g_new0 (GThread *, n);
  guint i = 0;

  for (GList *l = meshes; l != NULL; l = l->next, i++)
    {
      jobs[i] = (RankJob) { l->data, func, user_data };
      threads[i] = g_thread_new ("cp-test-rank", rank_thread, &jobs[i]);
    }
  for (i = 0; i < n; i++)
    g_thread_join (threads[i]);
}

GList *
cp_test_local_group (const char *dim_name,
                     int         size)
{
  const char *names[] = { dim_name, NULL };
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (names, &size, 1, &error);

  g_assert_no_error (error);
  g_assert_cmpuint (g_list_length (meshes), ==, (guint) size);
  return meshes;
}

void
cp_test_free_group (GList *meshes)
{
  g_list_free_full (meshes, g_object_unref);
}

CpTensor *
cp_test_tensor_pattern (CpDType       dtype,
                        const gint64 *shape,
                        guint         n_dims,
                        guint         seed)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);
  gint64 numel;

  g_assert_no_error (error);
  numel = cp_tensor_get_numel (tensor);
  for (gint64 i = 0; i < numel; i++)
    {
      /* Values up to 200 are exact in every dtype, uint8 and float16
       * included. */
      double value = (double) ((i * 7 + seed * 13) % 201);

      cp_tensor_set_value (tensor, i, dtype == CP_DTYPE_BOOL ? (double) ((i + seed) % 2) : value);
    }
  return tensor;
}

void
cp_test_assert_values (CpTensor     *tensor,
                       const double *values,
                       gsize         n_values)
{
  g_assert_cmpint (cp_tensor_get_numel (tensor), ==, (gint64) n_values);
  for (gsize i = 0; i < n_values; i++)
    g_assert_cmpfloat (cp_tensor_get_value (tensor, (gint64) i), ==, values[i]);
}

CpTensor *
cp_test_tensor_new_values (CpDType       dtype,
                           const gint64 *shape,
                           guint         n_dims,
                           const double *values)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);

  g_assert_no_error (error);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    cp_tensor_set_value (tensor, i, values[i]);
  return tensor;
}

void
cp_test_run_group (const char     *dim_name,
                   int             size,
                   CpTestRankFunc  func,
                   gpointer        user_data)
{
  GList *meshes = cp_test_local_group (dim_name, size);

  cp_test_run_ranks (meshes, func, user_data);
  cp_test_free_group (meshes);
}

void
cp_test_assert_shape (CpTensor     *tensor,
                      const gint64 *shape,
                      guint         n_dims)
{
  guint actual;
  const gint64 *have = cp_tensor_get_shape (tensor, &actual);

  g_assert_cmpuint (actual, ==, n_dims);
  g_assert_cmpmem (have, actual * sizeof (gint64), shape, n_dims * sizeof (gint64));
}

void
cp_test_run_mesh (const char * const *dim_names,
                  const int          *dim_sizes,
                  gsize               n_dims,
                  CpTestRankFunc      func,
                  gpointer            user_data)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (dim_names, dim_sizes, n_dims, &error);

  g_assert_no_error (error);
  cp_test_run_ranks (meshes, func, user_data);
  cp_test_free_group (meshes);
}

void
cp_test_batch_take (CpBatch    *batch,
                    const char *key,
                    CpTensor   *tensor)
{
  cp_batch_set (batch, key, tensor);
  g_object_unref (tensor);
}
