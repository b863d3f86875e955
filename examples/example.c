/* Shard a [batch 2, sequence 8] tensor over 2 in-process ranks, gather it back. */
#include <libcpmesh.h>

static gpointer
rank_main (CpMesh *mesh)
{
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(GError) error = NULL;  /* constant shapes cannot fail; a collective can */
  g_autoptr(CpTensor) flat = cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 16, 1, NULL);
  g_autoptr(CpTensor) batch = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, (gint64[]) { 2, 8 }, 2,
                                                          cp_tensor_get_storage (flat), 0, NULL);
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 2, NULL);
  g_autoptr(CpTensor) local = cp_layout_shard (layout, batch, 1, rank, NULL);  /* [2, 4] */
  g_autoptr(CpTensor) full = cp_mesh_unshard (mesh, local, 1, &error);  /* all-gather + restore */

  if (full == NULL)
    return g_strdup_printf ("rank %d: %s", rank, error->message);
  return g_strdup_printf ("rank %d holds %g %g %g %g, restored: %s", rank,
                          cp_tensor_get_value (local, 0), cp_tensor_get_value (local, 1),
                          cp_tensor_get_value (local, 2), cp_tensor_get_value (local, 3),
                          cp_tensor_equal (full, batch) ? "yes" : "no");
}

int
main (void)
{
  GList *meshes = cp_mesh_new_local_group ((const char *[]) { "cp", NULL }, (int[]) { 2 }, 1, NULL);
  GThread *threads[] = { g_thread_new ("rank 0", (GThreadFunc) rank_main, meshes->data),
                         g_thread_new ("rank 1", (GThreadFunc) rank_main, meshes->next->data) };
  int failed = 0;

  for (int r = 0; r < 2; r++)
    {
      g_autofree char *line = g_thread_join (threads[r]);
      g_print ("%s\n", line);
      failed += !g_str_has_suffix (line, "restored: yes");
    }
  g_list_free_full (meshes, g_object_unref);
  return failed;
}
