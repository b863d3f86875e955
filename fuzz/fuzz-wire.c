/* fuzz-wire.c: the bytes ranks read off the network
 *
 * Input: byte 0 picks the message (the rendezvous greeting, a frame's
 * head, a joiner's hello, rank 0's verdict or address table, a
 * collective's descriptor, a point-to-point header, a peer's UCX worker
 * address), byte 1 carries
 * options (bit 0: give the message a valid proof of the token, so that
 * the checks past the proof run; the other bits: the table's world size),
 * and the rest is the message, fed to its parser in cp-bootstrap-wire.c
 * or cp-ucx-wire.c as a peer would send it.
 *
 * Invariant: no crash, no sanitizer report (no read past the bytes), no
 * critical, and:
 *   - a rejection is a GError of CP_MESH_ERROR with a non-empty message;
 *   - an accepted message has every field in range (a greeting of this
 *     protocol, frame lengths within their bound, nonces of 32 bytes,
 *     offers of at most 8 backends, named once each in byte order with
 *     valid names, their blobs of 1 byte to 64 KiB and 96 KiB together,
 *     as many offers as the world has ranks, dimension names and sizes
 *     that pair up, known collectives and dtypes, at most 8 dimensions);
 *   - the check of each backend this target knows (shm, ucx) takes or
 *     refuses its blob of an accepted offer with a CpMeshError, as rank 0
 *     runs it;
 *   - hellos and tables are canonical: packing what was parsed gives back
 *     exactly the bytes received; descriptors parse back to what they were
 *     packed from;
 *   - a verdict or table is accepted only with a valid proof; rank 0's
 *     judgement of a hello is an acceptance only with a valid proof, else
 *     a CpMeshError code with a reason;
 *   - descriptors and headers can be described and compared (the
 *     messages that name them read every field) without error;
 *   - a worker address that parses has at most 128 transports and is
 *     accepted when checked against itself.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"

#include "cp-bootstrap-private.h"
#include "cp-transport-private.h"
#include "cp-ucx-wire-private.h"

#define TOKEN "fuzz token"
#define WHERE "127.0.0.1:29501"

enum
{
  GREETING,
  FRAME_HEAD,
  HELLO,
  VERDICT,
  TABLE,
  DESCRIPTOR,
  HEADER,
  ADDRESS,
  N_MESSAGES,
};

/* The challenge and nonce of the connection every message belongs to. */
static const guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 7 };
static const guint8 nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 9 };

static void
assert_mesh_error (const GError *error)
{
  fuzz_assert_rejected (error);
  g_assert_cmpuint (error->domain, ==, CP_MESH_ERROR);
  g_assert_cmpint (error->code, >=, CP_MESH_ERROR_FAILED);
  g_assert_cmpint (error->code, <=, CP_MESH_ERROR_NO_DEVICE);
}

static void
fuzz_greeting (const guint8 *data,
               gsize         size)
{
  g_autoptr(GError) error = NULL;
  guint8 parsed[CP_BOOTSTRAP_NONCE_SIZE];
  guint8 again[CP_BOOTSTRAP_GREETING_SIZE];

  if (!_cp_bootstrap_parse_greeting (data, size, WHERE, parsed, &error))
    {
      assert_mesh_error (error);
      return;
    }
  _cp_bootstrap_pack_greeting (parsed, again);
  g_assert_cmpmem (again, sizeof again, data, size);
}

static void
fuzz_frame_head (const guint8 *data,
                 gsize         size)
{
  g_autoptr(GError) error = NULL;
  guint8 head[CP_BOOTSTRAP_FRAME_HEAD] = { 0 };
  g_autoptr(GBytes) payload = NULL;
  g_autoptr(GBytes) frame = NULL;
  gsize length = 0;

  memcpy (head, data, MIN (size, sizeof head));
  if (!_cp_bootstrap_parse_frame_head (head, CP_BOOTSTRAP_HELLO_MAX, "hello", &length, &error))
    {
      assert_mesh_error (error);
      return;
    }
  g_assert_cmpuint (length, >=, 1);
  g_assert_cmpuint (length, <=, CP_BOOTSTRAP_HELLO_MAX);
  payload = g_bytes_new_take (g_malloc0 (length), length);
  frame = _cp_bootstrap_frame (payload);
  g_assert_cmpmem (g_bytes_get_data (frame, NULL), sizeof head, head, sizeof head);
}

/* Rank 0 of a world of four, "dp=2,cp=2", with rank 2 joined already. */
static int
judge (CpBootstrapHello *hello,
       gboolean          proved,
       char            **why)
{
  static char *names[] = { "dp", "cp", NULL };
  static int sizes[] = { 2, 2 };
  const CpMeshConfig config = {
    .world_size = 4, .address = "127.0.0.1", .port = 29501, .token = TOKEN,
    .dim_names = names, .dim_sizes = sizes, .n_dims = 2, .timeout_ms = 1000,
  };
  const gboolean joined[4] = { TRUE, FALSE, TRUE, FALSE };

  if (proved)
    _cp_bootstrap_sign (TOKEN, "cpmesh join", challenge, hello->nonce, hello->body, hello->mac);
  return _cp_bootstrap_judge_hello (hello, &config, challenge, joined, why);
}

/* Whether @payload ends in a valid proof of @purpose over its body: an
 * input may carry one unchanged from a seed, so a message accepted
 * without the target signing it is fine exactly then. */
static gboolean
carries_proof (GBytes     *payload,
               const char *purpose)
{
  gsize size = g_bytes_get_size (payload);
  g_autoptr(GBytes) body = NULL;
  g_autoptr(GBytes) proved = NULL;

  if (size < CP_BOOTSTRAP_MAC_SIZE)
    return FALSE;
  body = g_bytes_new_from_bytes (payload, 0, size - CP_BOOTSTRAP_MAC_SIZE);
  proved = _cp_bootstrap_prove (TOKEN, purpose, challenge, nonce, body);
  return g_bytes_equal (proved, payload);
}

/* The limits every offer that parses keeps. */
static void
assert_offer_in_range (const CpBootstrapOffer *offer)
{
  guint n = _cp_bootstrap_offer_get_n_blobs (offer);
  gsize total = 0;

  g_assert_cmpuint (n, <=, CP_BOOTSTRAP_MAX_BACKENDS);
  for (guint i = 0; i < n; i++)
    {
      const char *name = _cp_bootstrap_offer_get_name (offer, i);
      gsize size = g_bytes_get_size (_cp_bootstrap_offer_get_blob (offer, i));

      g_assert_cmpuint (strlen (name), >=, 1);
      g_assert_cmpuint (strlen (name), <=, CP_BOOTSTRAP_NAME_MAX);
      g_assert_true (strspn (name, "abcdefghijklmnopqrstuvwxyz0123456789_-") == strlen (name));
      if (i > 0)
        g_assert_cmpint (strcmp (_cp_bootstrap_offer_get_name (offer, i - 1), name), <, 0);
      g_assert_cmpuint (size, >=, 1);
      g_assert_cmpuint (size, <=, CP_BOOTSTRAP_BLOB_MAX);
      g_assert_true (_cp_bootstrap_offer_lookup (offer, name) == _cp_bootstrap_offer_get_blob (offer, i));
      total += size;
    }
  g_assert_cmpuint (total, <=, CP_BOOTSTRAP_OFFER_MAX);
}

/* Refuses what the UCX worker address parser refuses, as the backend's
 * check would. */
static gboolean
check_ucx_blob (GBytes    *blob,
                gpointer   user_data,
                GError   **error)
{
  g_autoptr(GArray) entries = _cp_ucx_address_parse (g_bytes_get_data (blob, NULL), g_bytes_get_size (blob),
                                                     error);

  return entries != NULL;
}

/* Runs each backend's check on its own blob, as rank 0 does. */
static void
check_offer (const CpBootstrapOffer *offer)
{
  const CpBootstrapCheck checks[] = {
    { "shm", _cp_transport_shm_check_blob, NULL },
    { "ucx", check_ucx_blob, NULL },
  };

  for (guint i = 0; i < _cp_bootstrap_offer_get_n_blobs (offer); i++)
    {
      g_autoptr(GError) error = NULL;

      if (!_cp_bootstrap_check_blob (checks, G_N_ELEMENTS (checks), _cp_bootstrap_offer_get_name (offer, i),
                                     _cp_bootstrap_offer_get_blob (offer, i), &error))
        assert_mesh_error (error);
      else
        g_assert_no_error (error);
    }
}

static void
fuzz_hello (GBytes   *payload,
            gboolean  proved)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpBootstrapHello) hello = _cp_bootstrap_parse_hello (payload, &error);
  g_autoptr(GBytes) again = NULL;
  g_autofree char *why = NULL;
  int code;

  if (hello == NULL)
    {
      assert_mesh_error (error);
      return;
    }
  assert_offer_in_range (hello->offer);
  check_offer (hello->offer);
  g_assert_cmpuint (g_strv_length (hello->dim_names), ==, hello->n_dims);
  again = _cp_bootstrap_pack_hello_body (hello);
  g_assert_true (g_bytes_equal (again, hello->body));
  code = judge (hello, proved, &why);
  if (code == CP_BOOTSTRAP_ACCEPTED)
    {
      if (!proved)
        {
          guint8 mac[CP_BOOTSTRAP_MAC_SIZE];

          _cp_bootstrap_sign (TOKEN, "cpmesh join", challenge, hello->nonce, hello->body, mac);
          g_assert_cmpmem (mac, sizeof mac, hello->mac, sizeof mac);
        }
      g_assert_null (why);
      return;
    }
  g_assert_cmpint (code, >=, CP_MESH_ERROR_FAILED);
  g_assert_cmpint (code, <=, CP_MESH_ERROR_NO_DEVICE);
  g_assert_nonnull (why);
  g_assert_cmpstr (why, !=, "");
}

static void
fuzz_verdict (GBytes   *body,
              gboolean  proved)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) payload = proved ? _cp_bootstrap_prove (TOKEN, "cpmesh verdict", challenge, nonce, body)
                                     : g_bytes_ref (body);

  if (_cp_bootstrap_parse_verdict (payload, TOKEN, challenge, nonce, WHERE, &error))
    g_assert_true (proved || carries_proof (payload, "cpmesh verdict"));
  else
    assert_mesh_error (error);
}

static void
fuzz_table (GBytes   *body,
            gboolean  proved,
            int       world_size)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) payload = proved ? _cp_bootstrap_prove (TOKEN, "cpmesh table", challenge, nonce, body)
                                     : g_bytes_ref (body);
  g_autoptr(GPtrArray) offers = _cp_bootstrap_parse_table (payload, TOKEN, challenge, nonce, world_size, WHERE,
                                                           &error);
  g_autoptr(GBytes) again = NULL;

  if (offers == NULL)
    {
      assert_mesh_error (error);
      return;
    }
  g_assert_true (proved || carries_proof (payload, "cpmesh table"));
  g_assert_cmpuint (offers->len, ==, (guint) world_size);
  for (guint r = 0; r < offers->len; r++)
    {
      assert_offer_in_range (g_ptr_array_index (offers, r));
      check_offer (g_ptr_array_index (offers, r));
    }
  again = _cp_bootstrap_pack_table (TOKEN, challenge, nonce, (CpBootstrapOffer * const *) offers->pdata,
                                    world_size);
  g_assert_true (g_bytes_equal (again, payload));
}

static void
assert_same_descriptor (const CpCollective *a,
                        const CpCollective *b)
{
  g_assert_cmpint (a->kind, ==, b->kind);
  g_assert_cmpint (a->dtype, ==, b->dtype);
  g_assert_cmpuint (a->n_dims, ==, b->n_dims);
  g_assert_cmpmem (a->shape, a->n_dims * sizeof (gint64), b->shape, b->n_dims * sizeof (gint64));
  g_assert_cmpint (a->dim, ==, b->dim);
  g_assert_cmpint (a->root, ==, b->root);
  g_assert_cmpint (a->op, ==, b->op);
  g_assert_true ((a->invalid == NULL) == (b->invalid == NULL));
}

/* The agreement check reads every field of both descriptors to describe
 * them; a peer's own error wins. */
static void
check_agreement (const CpCollective *peer)
{
  CpCollective mine = { .kind = CP_COLL_ALL_GATHER, .dtype = CP_DTYPE_FLOAT32, .n_dims = 1, .shape = { 4 } };
  const CpCollective *descs[] = { &mine, peer };
  g_autoptr(GError) error = NULL;

  if (!_cp_collective_check_agreement (descs, 2, 0, &error))
    fuzz_assert_rejected (error);
  else
    g_assert_null (peer->invalid);
}

static void
fuzz_descriptor (const guint8 *data,
                 gsize         size)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) packed = NULL;
  CpCollective coll, again;

  if (!_cp_ucx_unpack_descriptor (data, size, &coll, &error))
    {
      assert_mesh_error (error);
      return;
    }
  g_assert_cmpint (coll.kind, <=, CP_COLL_BROADCAST);
  g_assert_cmpint (coll.dtype, <=, CP_DTYPE_FLOAT64);
  g_assert_cmpuint (coll.n_dims, <=, CP_TENSOR_MAX_DIMS);
  check_agreement (&coll);
  packed = _cp_ucx_pack_descriptor (&coll);
  g_assert_cmpuint (g_bytes_get_size (packed), <=, CP_UCX_DESCRIPTOR_MAX);
  g_assert_true (_cp_ucx_unpack_descriptor (g_bytes_get_data (packed, NULL), g_bytes_get_size (packed),
                                            &again, NULL));
  assert_same_descriptor (&coll, &again);
  g_clear_error (&coll.invalid);
  g_clear_error (&again.invalid);
}

static void
fuzz_header (const guint8 *data,
             gsize         size)
{
  CpUcxWireMessage wire = { 0 };
  CpMessage message, expected = { .dtype = CP_DTYPE_INT32, .n_dims = 1, .shape = { 4 }, .nbytes = 16 };
  g_autoptr(GError) error = NULL;
  g_autofree char *text = NULL;

  memcpy (&wire, data, MIN (size, sizeof wire));
  _cp_ucx_message_from_wire (&message, &wire);
  g_assert_cmpint (message.dtype, <=, CP_DTYPE_FLOAT64);
  g_assert_cmpuint (message.n_dims, <=, CP_TENSOR_MAX_DIMS);
  text = _cp_message_describe (&message);
  g_assert_cmpstr (text, !=, "");
  if (!_cp_message_matches (&message, &expected))
    {
      _cp_message_set_mismatch (&error, &message, 1, 4, 0, &expected);
      fuzz_assert_rejected (error);
    }
}

static void
fuzz_address (GBytes *address)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GArray) entries = _cp_ucx_address_parse (g_bytes_get_data (address, NULL),
                                                     g_bytes_get_size (address), &error);

  if (entries == NULL)
    {
      assert_mesh_error (error);
      return;
    }
  g_assert_cmpuint (entries->len, <=, 128);
  g_assert_true (_cp_ucx_address_check (address, address, &error));
  g_assert_no_error (error);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  int kind = fuzz_take_u8 (&in) % N_MESSAGES;
  guint8 options = fuzz_take_u8 (&in);
  gboolean proved = options & 1;
  g_autoptr(GBytes) payload = g_bytes_new (in.data, in.size);

  fuzz_init ();
  switch (kind)
    {
    case GREETING:
      fuzz_greeting (in.data, in.size);
      break;
    case FRAME_HEAD:
      fuzz_frame_head (in.data, in.size);
      break;
    case HELLO:
      fuzz_hello (payload, proved);
      break;
    case VERDICT:
      fuzz_verdict (payload, proved);
      break;
    case TABLE:
      fuzz_table (payload, proved, 1 + (options >> 1) % 8);
      break;
    case DESCRIPTOR:
      fuzz_descriptor (in.data, in.size);
      break;
    case ADDRESS:
      fuzz_address (payload);
      break;
    default:
      fuzz_header (in.data, in.size);
      break;
    }
  return 0;
}
