/* test-transport.c: the table of backends, the CPMESH_TRANSPORT override
 * and capabilities
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-features.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"
#include "transports/cp-transport-private.h"
#include "cp-mesh-private.h"

#define SETTINGS CP_TEST_SETTINGS

static void
test_table_default (void)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *built = _cp_transport_backend_list ();
  const CpTransportBackend *backend = _cp_transport_backend_find (NULL, &error);

  g_assert_no_error (error);
  /* shm, always built, leads the default chain. */
  g_assert_cmpstr (backend->name, ==, "shm");
  g_assert_true (g_str_has_prefix (built, backend->name));
  g_assert_nonnull (strstr (built, "local"));
  g_assert_true (_cp_transport_backend_serves (backend, CP_DEVICE_KIND_HOST));
  g_assert_false (_cp_transport_backend_serves (backend, CP_DEVICE_KIND_CUDA));
}

static void
test_table_unknown (void)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *built = _cp_transport_backend_list ();

  g_assert_null (_cp_transport_backend_find ("carrier-pigeon", &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport table",
                       "look up a backend this build does not have");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
  g_assert_nonnull (strstr (error->message, built));
}

/* The override fails loudly: no other backend is tried in its place. */
static void
test_override_unknown (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=carrier-pigeon"), NULL,
                                            &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport this build does not have");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
  g_assert_nonnull (strstr (error->message, "local"));
}

static void
test_override_local (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=local"), NULL, &error);
  const gint64 shape[] = { 3 };
  g_autoptr(CpTensor) piece = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 1, 7);
  g_autoptr(CpTensor) whole = NULL;

  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "local");
  g_assert_cmpint (cp_mesh_get_world_size (mesh), ==, 1);
  whole = cp_mesh_all_gather (mesh, piece, 0, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (whole, piece));
}

static void
test_override_local_processes (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=local", "RANK=0",
                                                      "WORLD_SIZE=2", "CPMESH_TIMEOUT_MS=2000"),
                                            NULL, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "connect two processes with the in-process transport");
  g_assert_nonnull (strstr (error->message, "\"local\""));
}

/* ---- the default chain ---- */

static gboolean
has_candidate (GPtrArray  *rows,
               const char *name)
{
  for (guint i = 0; i < rows->len; i++)
    if (g_str_equal (((const CpTransportBackend *) rows->pdata[i])->name, name))
      return TRUE;
  return FALSE;
}

static void
test_table_chain (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GPtrArray) chain = _cp_transport_backend_candidates (NULL, &error);
  g_autoptr(GPtrArray) named = _cp_transport_backend_candidates ("local", &error);
  g_autoptr(GPtrArray) unknown = NULL;

  g_test_summary ("The default chain holds every built backend but the test-only ones (loopback, in the "
                  "test variant), most preferred first; a name makes the one backend it names the only "
                  "candidate");
  g_assert_no_error (error);
  g_assert_cmpstr (((const CpTransportBackend *) chain->pdata[0])->name, ==, "shm");
  g_assert_cmpstr (((const CpTransportBackend *) chain->pdata[1])->name, ==, CP_HAS_UCX ? "ucx" : "local");
  g_assert_true (has_candidate (chain, "local"));
  g_assert_false (has_candidate (chain, "loopback"));
  for (guint i = 1; i < chain->len; i++)
    g_assert_cmpint (((const CpTransportBackend *) chain->pdata[i - 1])->priority, >=,
                     ((const CpTransportBackend *) chain->pdata[i])->priority);
  g_assert_cmpuint (named->len, ==, 1);
  g_assert_cmpstr (((const CpTransportBackend *) named->pdata[0])->name, ==, "local");
  unknown = _cp_transport_backend_candidates ("carrier-pigeon", &error);
  g_assert_null (unknown);
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED);
}

/* ---- picking a backend from every rank's offer ---- */

static GBytes *
never_offered (const CpMeshConfig      *config,
               const CpBootstrapRoute  *route,
               gpointer                *state,
               GError                 **error)
{
  g_assert_not_reached ();
}

/* A stand-in for the shared-memory backend: its blob names the host,
 * and it works only where every rank names the same one. */
static gboolean
on_one_host (const CpMeshConfig  *config,
             GBytes * const      *blobs,
             GError             **error)
{
  for (int r = 1; r < config->world_size; r++)
    if (!g_bytes_equal (blobs[r], blobs[0]))
      {
        g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "rank %d is on host %.*s, rank 0 on %.*s",
                     r, (int) g_bytes_get_size (blobs[r]), (const char *) g_bytes_get_data (blobs[r], NULL),
                     (int) g_bytes_get_size (blobs[0]), (const char *) g_bytes_get_data (blobs[0], NULL));
        return FALSE;
      }
  return TRUE;
}

static gboolean
one_process_only (const CpMeshConfig  *config,
                  GError             **error)
{
  if (config->world_size == 1)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "threads of one process, not %d processes",
               config->world_size);
  return FALSE;
}

/* Rows as the real table would hold them, with no probe and no
 * usable_with where the row does not need one. */
static const CpTransportBackend fake_shm = { .name = "shm", .priority = 100, .offer = never_offered,
                                             .usable_with = on_one_host };
static const CpTransportBackend fake_ucx = { .name = "ucx", .priority = 50, .offer = never_offered };
static const CpTransportBackend fake_local = { .name = "local", .priority = 10, .probe = one_process_only };

typedef struct
{
  CpMeshConfig config;
  GPtrArray *table;
  CpTransportCandidate candidates[3];
  guint n;
  char *story;
  GError *error;
} Pick;

/* Rank 0's view of a mesh of strlen(@hosts) ranks, rank r on host
 * hosts[r]; the ranks @shm_missing names ("01": ranks 0 and 1) offer no
 * shm blob, those @ucx_missing names no ucx blob.  @named: the
 * candidates are @named alone. */
static void
pick_setup (Pick       *pick,
            const char *hosts,
            const char *shm_missing,
            const char *ucx_missing,
            const char *named)
{
  int world_size = (int) strlen (hosts);
  const CpTransportBackend *rows[] = { &fake_shm, &fake_ucx, &fake_local };

  memset (pick, 0, sizeof *pick);
  g_assert_true (_cp_mesh_config_init (&pick->config, 0, world_size, "127.0.0.1", 29501, NULL, NULL, NULL, 0,
                                       1000, NULL));
  pick->table = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_bootstrap_offer_unref);
  for (int r = 0; r < world_size; r++)
    {
      CpBootstrapOffer *offer = _cp_bootstrap_offer_new ();
      g_autoptr(GBytes) host = g_bytes_new (&hosts[r], 1);
      g_autoptr(GBytes) address = g_bytes_new_static ("an address", 10);

      if (strchr (shm_missing, '0' + r) == NULL)
        _cp_bootstrap_offer_add (offer, "shm", host);
      if (strchr (ucx_missing, '0' + r) == NULL)
        _cp_bootstrap_offer_add (offer, "ucx", address);
      g_ptr_array_add (pick->table, offer);
    }
  for (guint i = 0; i < G_N_ELEMENTS (rows); i++)
    if (named == NULL || g_str_equal (rows[i]->name, named))
      {
        CpTransportCandidate *candidate = &pick->candidates[pick->n++];

        candidate->backend = rows[i];
        /* What prepare() leaves for a row this rank cannot run. */
        if (rows[i]->probe != NULL)
          rows[i]->probe (&pick->config, &candidate->unusable);
        else if (_cp_bootstrap_offer_lookup (pick->table->pdata[0], rows[i]->name) == NULL)
          candidate->unusable = g_error_new (CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "its probe failed here");
      }
}

static int
pick_run (Pick *pick)
{
  return _cp_transport_pick (pick->candidates, pick->n, pick->n == 1, &pick->config, pick->table, &pick->story,
                             &pick->error);
}

static void
pick_clear (Pick *pick)
{
  for (guint i = 0; i < pick->n; i++)
    g_clear_error (&pick->candidates[i].unusable);
  g_ptr_array_unref (pick->table);
  g_free (pick->story);
  g_clear_error (&pick->error);
  _cp_mesh_config_clear (&pick->config);
}

static void
test_pick_one_host (void)
{
  Pick pick;

  g_test_summary ("Ranks that all offer shm from one host pick shm");
  pick_setup (&pick, "aaa", "", "", NULL);
  g_assert_cmpint (pick_run (&pick), ==, 0);
  g_assert_no_error (pick.error);
  g_assert_cmpstr (pick.story, ==, "shm");
  pick_clear (&pick);
}

static void
test_pick_two_hosts (void)
{
  Pick pick;

  g_test_summary ("Ranks on two hosts pick ucx for the whole mesh, and the story says why shm was "
                  "passed over");
  pick_setup (&pick, "aab", "", "", NULL);
  g_assert_cmpint (pick_run (&pick), ==, 1);
  g_assert_no_error (pick.error);
  g_assert_cmpstr (pick.story, ==, "ucx; passed over: shm (rank 2 is on host b, rank 0 on a)");
  pick_clear (&pick);
}

static void
test_pick_missing_blob (void)
{
  Pick pick;

  g_test_summary ("A backend one rank does not offer is passed over on every rank");
  pick_setup (&pick, "aaaa", "13", "", NULL);
  g_assert_cmpint (pick_run (&pick), ==, 1);
  g_assert_cmpstr (pick.story, ==, "ucx; passed over: shm (ranks 1 and 3 do not offer it (it is not built or not "
                   "usable there))");
  pick_clear (&pick);
}

static void
test_pick_named_across_hosts (void)
{
  Pick pick;

  g_test_summary ("CPMESH_TRANSPORT=shm across hosts is CP_MESH_ERROR_UNSUPPORTED saying why, never a "
                  "fallback to ucx");
  pick_setup (&pick, "ab", "", "", "shm");
  g_assert_cmpint (pick_run (&pick), ==, -1);
  CP_TEST_ASSERT_CASE (pick.error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport pick",
                       "CPMESH_TRANSPORT names shm while the ranks are on two hosts");
  g_assert_cmpstr (pick.error->message, ==, "rank 0: transport \"shm\" was asked for (CPMESH_TRANSPORT or "
                   "CpMeshOptions:transport) but cannot connect this mesh of 2: rank 1 is on host b, rank 0 on a");
  pick_clear (&pick);
}

static void
test_pick_named_missing (void)
{
  Pick pick;

  g_test_summary ("CPMESH_TRANSPORT=shm where a rank does not offer shm is CP_MESH_ERROR_UNSUPPORTED "
                  "naming that rank");
  pick_setup (&pick, "aaa", "2", "", "shm");
  g_assert_cmpint (pick_run (&pick), ==, -1);
  CP_TEST_ASSERT_CASE (pick.error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport pick",
                       "CPMESH_TRANSPORT names shm and another rank cannot offer it");
  g_assert_nonnull (strstr (pick.error->message, "rank 2 does not offer it"));
  pick_clear (&pick);
}

static void
test_pick_named_unusable_here (void)
{
  Pick pick;

  g_test_summary ("CPMESH_TRANSPORT=shm on a rank whose shm probe failed is CP_MESH_ERROR_UNSUPPORTED "
                  "with the probe's reason");
  pick_setup (&pick, "aa", "0", "", "shm");
  g_assert_cmpint (pick_run (&pick), ==, -1);
  CP_TEST_ASSERT_CASE (pick.error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport pick",
                       "CPMESH_TRANSPORT names shm on a rank where its probe fails");
  g_assert_true (g_str_has_suffix (pick.error->message, "cannot connect this mesh of 2: its probe failed here"));
  pick_clear (&pick);
}

static void
test_pick_none (void)
{
  Pick pick;

  g_test_summary ("When no backend can connect the mesh, every rank fails with CP_MESH_ERROR_UNSUPPORTED "
                  "saying why each was passed over");
  pick_setup (&pick, "ab", "", "1", NULL);
  g_assert_cmpint (pick_run (&pick), ==, -1);
  CP_TEST_ASSERT_CASE (pick.error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "transport pick",
                       "no backend of the default chain can connect the mesh");
  g_assert_cmpstr (pick.error->message, ==, "rank 0: no transport this libcpmesh has can connect this mesh of 2: "
                   "shm (rank 1 is on host b, rank 0 on a); ucx (rank 1 does not offer it (it is not built or "
                   "not usable there)); local (threads of one process, not 2 processes)");
  pick_clear (&pick);
}

static void
test_pick_without_rendezvous (void)
{
  Pick pick;

  g_test_summary ("A backend that needs no rendezvous is picked on its probe alone, with no table");
  pick_setup (&pick, "a", "", "", "local");
  g_clear_pointer (&pick.table, g_ptr_array_unref);
  pick.table = g_ptr_array_new ();
  g_assert_cmpint (_cp_transport_pick (pick.candidates, 1, TRUE, &pick.config, NULL, &pick.story, &pick.error),
                   ==, 0);
  g_assert_cmpstr (pick.story, ==, "local");
  pick_clear (&pick);
}

static void
test_connect_default_one_rank (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS (NULL), NULL, &error);

  g_test_summary ("A mesh of one process connects over the most preferred backend of the default chain "
                  "that can run here");
  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, _cp_transport_shm_probe (NULL) ? "shm"
                                                   : CP_HAS_UCX ? "ucx" : "local");
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

#if CP_HAS_UCX
/* UCX in unified mode reads peers' addresses unchecked: the library
 * refuses to run it so, which makes UCX unusable here. */
static void
test_override_unusable_here (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_test_summary ("CPMESH_TRANSPORT naming a backend that is built but cannot run here fails with "
                  "CP_MESH_ERROR_UNSUPPORTED saying why; no other backend is tried");
  g_setenv ("UCX_UNIFIED_MODE", "y", TRUE);
  mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=ucx"), NULL, &error);
  g_unsetenv ("UCX_UNIFIED_MODE");
  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport that is built but cannot run here (UCX in unified mode)");
  g_assert_nonnull (strstr (error->message, "transport \"ucx\" was asked for"));
  g_assert_nonnull (strstr (error->message, "UCX_UNIFIED_MODE=y"));
}

/* A rank that cannot run the named backend still joins, so that the
 * others learn the verdict; when they never come, it says why it could
 * not have connected anyway rather than only that they did not. */
static void
test_override_unusable_here_alone (void)
{
  g_autofree char *port = g_strdup_printf ("CPMESH_PORT=%u", cp_test_free_port ());
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_test_summary ("CPMESH_TRANSPORT naming a backend that cannot run on this rank, whose peers never "
                  "join, fails with CP_MESH_ERROR_UNSUPPORTED saying why, not with the timeout alone");
  g_setenv ("UCX_UNIFIED_MODE", "y", TRUE);
  mesh = cp_test_connect (SETTINGS ("CPMESH_TRANSPORT=ucx", "RANK=0", "WORLD_SIZE=2", port,
                                    "CPMESH_TIMEOUT_MS=300"), NULL, &error);
  g_unsetenv ("UCX_UNIFIED_MODE");
  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport that cannot run on this rank, whose peers never join");
  g_test_message ("%s", error->message);
  g_assert_nonnull (strstr (error->message, "UCX_UNIFIED_MODE=y"));
  g_assert_nonnull (strstr (error->message, "; and the rendezvous failed: rank 0: rank 1 never joined"));
}

static void
test_default_passes_over_unusable (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_test_summary ("The default chain passes over a backend that cannot run here: a mesh of one "
                  "process whose UCX is unusable connects over shm, or in-process where shm cannot "
                  "run either");
  g_setenv ("UCX_UNIFIED_MODE", "y", TRUE);
  mesh = cp_test_connect (SETTINGS (NULL), NULL, &error);
  g_unsetenv ("UCX_UNIFIED_MODE");
  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, _cp_transport_shm_probe (NULL) ? "shm" : "local");
}
#endif

static void
test_capability_shared_address_space (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpTransport *transport = _cp_mesh_get_comm (meshes->data)->transport;

  g_assert_true (_cp_transport_has_caps (transport, CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE));
  g_assert_true (_cp_transport_has_caps (transport, CP_TRANSPORT_CAP_NONE));
  g_assert_cmpstr (_cp_transport_get_name (transport), ==, "local");
  g_assert_false (_cp_transport_can_poll (transport));
  cp_test_free_group (meshes);
}

/* Ranks must move the same kind of memory: their descriptors say which. */
static void
test_agreement_device (void)
{
  CpCollective host = { .kind = CP_COLL_ALL_REDUCE, .dtype = CP_DTYPE_FLOAT32, .n_dims = 1,
                        .shape = { 4 }, .device = CP_DEVICE_KIND_HOST };
  CpCollective cuda = host;
  const CpCollective *descs[] = { &host, &cuda };
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_collective_check_agreement (descs, 2, 0, &error));
  g_assert_no_error (error);
  cuda.device = CP_DEVICE_KIND_CUDA;
  g_assert_false (_cp_collective_check_agreement (descs, 2, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "collective agreement",
                       "ranks that pass different kinds of memory");
  g_assert_nonnull (strstr (error->message, "rank 0 passed host memory, rank 1 passed cuda memory"));
}

static void
note_released (gpointer released)
{
  *(gboolean *) released = TRUE;
}

/* A posted message names its memory by a region, which holds the
 * storage: the program may drop the tensor it sent as soon as the send
 * is posted, and the bytes stay until the send completes. */
static void
test_message_region_keeps_storage (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpComm *sender = _cp_mesh_get_comm (meshes->data);
  CpComm *receiver = _cp_mesh_get_comm (meshes->next->data);
  const gint64 shape[] = { 4 };
  float *values = g_new (float, 4);
  gboolean released = FALSE;
  g_autoptr(GError) error = NULL;
  CpTensor *sent = cp_tensor_new_borrowed (CP_DTYPE_FLOAT32, shape, 1, GPOINTER_TO_SIZE (values),
                                           4 * sizeof (float), note_released, &released, NULL,
                                           &error);
  g_autoptr(CpTensor) received = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, &error);
  CpMessage outgoing, incoming;
  CpRequest *send_request, *recv_request;
  gint64 deadline = g_get_monotonic_time () + 10 * G_TIME_SPAN_SECOND;

  g_assert_no_error (error);
  for (int i = 0; i < 4; i++)
    values[i] = 1.5f * (float) (i + 1);
  _cp_message_from_tensor (&outgoing, sent);
  g_assert_true (outgoing.data.storage == cp_tensor_get_storage (sent));
  g_assert_cmpuint (outgoing.nbytes, ==, 4 * sizeof (float));
  send_request = _cp_comm_isend (sender, 1, 7, &outgoing);
  g_clear_object (&sent);
  g_assert_false (released);

  _cp_message_from_tensor (&incoming, received);
  recv_request = _cp_comm_irecv (receiver, 0, 7, &incoming);
  g_assert_true (_cp_comm_wait (receiver, recv_request, deadline, NULL, &error));
  g_assert_no_error (error);
  g_assert_true (_cp_comm_wait (sender, send_request, deadline, NULL, &error));
  g_assert_no_error (error);
  g_assert_false (released);
  for (int i = 0; i < 4; i++)
    g_assert_cmpfloat (cp_tensor_get_value (received, i), ==, 1.5 * (i + 1));
  _cp_message_clear (&outgoing);
  _cp_message_clear (&incoming);
  g_assert_true (released);
  g_free (values);
  cp_test_free_group (meshes);
}

/* Cancellation reaches a transport as an argument of its wait, not
 * through the thread that runs it: a wait given a cancelled cancellable
 * ends at once, long before its deadline, and names the cancellation. */
static void
test_wait_cancellable (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  CpComm *receiver = _cp_mesh_get_comm (meshes->next->data);
  const gint64 shape[] = { 2 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) tensor = cp_tensor_new (CP_DTYPE_INT32, shape, 1, &error);
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  gint64 started = g_get_monotonic_time ();
  CpMessage incoming;
  CpRequest *request;

  g_assert_no_error (error);
  g_cancellable_cancel (cancellable);
  _cp_message_from_tensor (&incoming, tensor);
  request = _cp_comm_irecv (receiver, 0, 3, &incoming);
  g_assert_false (_cp_comm_wait (receiver, request, started + 30 * G_TIME_SPAN_SECOND, cancellable,
                                 &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED, "transport wait",
                       "wait for a message with a cancelled cancellable");
  g_assert_nonnull (strstr (error->message, "cancelled"));
  g_assert_cmpint (g_get_monotonic_time () - started, <, 5 * G_TIME_SPAN_SECOND);
  _cp_message_clear (&incoming);
  cp_test_free_group (meshes);
}

static void
test_options_defaults (void)
{
  g_autoptr(CpMeshOptions) options = cp_mesh_options_new ();
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 3 };
  g_autoptr(GVariant) dim_sizes = NULL;
  g_autofree char *printed = NULL;
  g_auto(GStrv) copied_names = NULL;
  gsize n_dims = 9;

  g_assert_cmpint (cp_mesh_options_get_rank (options), ==, 0);
  g_assert_cmpint (cp_mesh_options_get_world_size (options), ==, 1);
  g_assert_null (cp_mesh_options_get_address (options));
  g_assert_cmpuint (cp_mesh_options_get_port (options), ==, 0);
  g_assert_null (cp_mesh_options_get_token (options));
  g_assert_null (cp_mesh_options_get_dim_names (options));
  g_assert_null (cp_mesh_options_dup_dim_names (options));
  g_assert_null (cp_mesh_options_get_dim_sizes (options, &n_dims));
  g_assert_cmpuint (n_dims, ==, 0);
  g_assert_cmpuint (cp_mesh_options_get_timeout_ms (options), ==, 0);
  g_assert_null (cp_mesh_options_get_transport (options));

  cp_mesh_options_set_dims (options, names, sizes, 2);
  g_assert_cmpstrv (cp_mesh_options_get_dim_names (options), names);
  copied_names = cp_mesh_options_dup_dim_names (options);
  g_assert_cmpstrv (copied_names, names);
  g_assert_true ((const char * const *) copied_names != cp_mesh_options_get_dim_names (options));
  g_assert_cmpmem (cp_mesh_options_get_dim_sizes (options, &n_dims), sizeof sizes, sizes, sizeof sizes);
  g_object_get (options, "dim-sizes", &dim_sizes, NULL);
  printed = g_variant_print (dim_sizes, FALSE);
  g_assert_cmpstr (printed, ==, "[2, 3]");
}

static void
test_options_local (void)
{
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "transport", "local",
                                                   "timeout-ms", 5000, NULL);
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 1, 1 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  cp_mesh_options_set_dims (options, names, sizes, 2);
  mesh = cp_mesh_new_with_options (options, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "local");
  g_assert_cmpuint (cp_mesh_get_timeout_ms (mesh), ==, 5000);
  g_assert_cmpint (cp_mesh_get_dim_size (mesh, "dp"), ==, 1);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

static void
test_options_names_without_sizes (void)
{
  const char *names[] = { "dp", "cp", NULL };
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "transport", "local",
                                                   "dim-names", names, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_with_options (options, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMeshOptions",
                       "set dimension names without sizes");
  g_assert_nonnull (strstr (error->message, "2 dimension names"));
}

static void
test_options_bad_rank (void)
{
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", 3,
                                                   "world-size", 2, "port", 1, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_with_options (options, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMeshOptions",
                       "a rank outside the world size");
  g_assert_nonnull (strstr (error->message, "rank 3 of world size 2"));
}

/* Options that leave the transport unnamed take CPMESH_TRANSPORT. */
static void
test_options_environment (void)
{
  g_autoptr(CpMeshOptions) options = cp_mesh_options_new ();
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_setenv ("CPMESH_TRANSPORT", "carrier-pigeon", TRUE);
  mesh = cp_mesh_new_with_options (options, &error);
  g_unsetenv ("CPMESH_TRANSPORT");
  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT",
                       "name a transport this build does not have, under explicit options");
  g_assert_nonnull (strstr (error->message, "\"carrier-pigeon\""));
}

#if CP_HAS_UCX
typedef struct
{
  guint16 port;
  int rank;
  CpMesh *mesh;
  GError *error;
} UcxJoin;

static gpointer
join_with_options (gpointer data)
{
  UcxJoin *join = data;
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 1, 2 };
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", join->rank,
                                                   "world-size", 2, "port", (guint) join->port,
                                                   "token", "t0k3n", "timeout-ms", 20000,
                                                   "transport", "ucx", NULL);

  cp_mesh_options_set_dims (options, names, sizes, 2);
  join->mesh = cp_mesh_new_with_options (options, &join->error);
  return NULL;
}

static void
test_options_ucx (void)
{
  guint16 port = cp_test_free_port ();
  UcxJoin joins[2] = { { port, 0 }, { port, 1 } };
  GThread *threads[2];

  cp_harness_set_up_glib ();
  for (int r = 0; r < 2; r++)
    threads[r] = g_thread_new ("rank", join_with_options, &joins[r]);
  for (int r = 0; r < 2; r++)
    g_thread_join (threads[r]);
  for (int r = 0; r < 2; r++)
    {
      g_assert_no_error (joins[r].error);
      g_assert_cmpstr (cp_mesh_get_backend (joins[r].mesh), ==, "ucx");
      g_assert_cmpint (cp_mesh_get_rank (joins[r].mesh), ==, r);
      g_assert_cmpint (cp_mesh_get_dim_size (joins[r].mesh, "cp"), ==, 2);
      g_object_unref (joins[r].mesh);
    }
}
#endif

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Transport/table/default", test_table_default);
  g_test_add_func ("/Cp/Transport/table/unknown", test_table_unknown);
  g_test_add_func ("/Cp/Transport/table/chain", test_table_chain);
  g_test_add_func ("/Cp/Transport/pick/one-host", test_pick_one_host);
  g_test_add_func ("/Cp/Transport/pick/two-hosts", test_pick_two_hosts);
  g_test_add_func ("/Cp/Transport/pick/missing-blob", test_pick_missing_blob);
  g_test_add_func ("/Cp/Transport/pick/named-across-hosts", test_pick_named_across_hosts);
  g_test_add_func ("/Cp/Transport/pick/named-missing", test_pick_named_missing);
  g_test_add_func ("/Cp/Transport/pick/named-unusable-here", test_pick_named_unusable_here);
  g_test_add_func ("/Cp/Transport/pick/none", test_pick_none);
  g_test_add_func ("/Cp/Transport/pick/without-rendezvous", test_pick_without_rendezvous);
  g_test_add_func ("/Cp/Transport/connect/default-one-rank", test_connect_default_one_rank);
  g_test_add_func ("/Cp/Transport/override/unknown", test_override_unknown);
  g_test_add_func ("/Cp/Transport/override/local", test_override_local);
  g_test_add_func ("/Cp/Transport/override/local-processes", test_override_local_processes);
  g_test_add_func ("/Cp/Transport/capability/shared-address-space",
                   test_capability_shared_address_space);
  g_test_add_func ("/Cp/Transport/agreement/device", test_agreement_device);
  g_test_add_func ("/Cp/Transport/message/region-keeps-storage", test_message_region_keeps_storage);
  g_test_add_func ("/Cp/Transport/cancel/wait-argument", test_wait_cancellable);
  g_test_add_func ("/Cp/MeshOptions/properties/defaults", test_options_defaults);
  g_test_add_func ("/Cp/MeshOptions/new/local", test_options_local);
  g_test_add_func ("/Cp/MeshOptions/new/names-without-sizes", test_options_names_without_sizes);
  g_test_add_func ("/Cp/MeshOptions/new/bad-rank", test_options_bad_rank);
  g_test_add_func ("/Cp/MeshOptions/new/environment", test_options_environment);
#if CP_HAS_UCX
  g_test_add_func ("/Cp/MeshOptions/new/ucx", test_options_ucx);
  g_test_add_func ("/Cp/Transport/override/unusable-here", test_override_unusable_here);
  g_test_add_func ("/Cp/Transport/override/unusable-here-alone", test_override_unusable_here_alone);
  g_test_add_func ("/Cp/Transport/default/passes-over-unusable", test_default_passes_over_unusable);
#endif
  return g_test_run ();
}
