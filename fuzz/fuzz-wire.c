/* fuzz-wire.c: the bytes UCX ranks read off the network
 *
 * Input: byte 0 picks the message (the gate's greeting or verdict; the
 * rendezvous' challenge, hello, verdict or address table; a collective's
 * descriptor; a point-to-point header), byte 1 carries a few options (the
 * table's world size; whether the hello gets a valid proof so that rank
 * 0's checks past the proof run), and the rest is the message, fed to its
 * parser in cp-ucx-wire.c as a peer would send it.
 *
 * Invariant: no crash, no sanitizer report (no read past the bytes), no
 * critical, and:
 *   - a rejection is a GError of CP_MESH_ERROR with a non-empty message;
 *   - an accepted message has every field in range (nonces and proofs of
 *     32 bytes, worker addresses of 1 byte to 64 KiB, as many as the
 *     world has ranks, dimension names and sizes that pair up, known
 *     collectives and dtypes, at most 8 dimensions, refusal codes that
 *     are CpMeshError codes);
 *   - the rendezvous messages and the address table are canonical:
 *     packing what was parsed gives back exactly the bytes received;
 *     descriptors parse back to what they were packed from;
 *   - rank 0's judgement of a hello is an acceptance or a CpMeshError code
 *     with a reason, and it accepts only a hello that proves the token;
 *   - descriptors and headers can be described and compared (the
 *     messages that name them read every field) without error.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"

#include "cp-ucx-wire-private.h"

#define TOKEN "fuzz token"
#define WHERE "127.0.0.1:29500"

enum
{
  GATE_GREETING,
  GATE_VERDICT,
  CHALLENGE,
  HELLO,
  VERDICT,
  TABLE,
  DESCRIPTOR,
  HEADER,
  N_MESSAGES,
};

static void
assert_mesh_error (const GError *error)
{
  fuzz_assert_rejected (error);
  g_assert_cmpuint (error->domain, ==, CP_MESH_ERROR);
  g_assert_cmpint (error->code, >=, CP_MESH_ERROR_FAILED);
  g_assert_cmpint (error->code, <=, CP_MESH_ERROR_NO_DEVICE);
}

static void
fuzz_gate (int           kind,
           const guint8 *data,
           gsize         size)
{
  g_autoptr(GError) error = NULL;
  guint8 challenge[CP_UCX_NONCE_SIZE];
  guint16 port = 0;

  if (kind == GATE_GREETING)
    {
      if (!_cp_ucx_gate_parse_greeting (data, size, WHERE, challenge, &error))
        assert_mesh_error (error);
      else
        g_assert_cmpmem (challenge, sizeof challenge, data + CP_UCX_GATE_MAGIC_SIZE, CP_UCX_NONCE_SIZE);
      return;
    }
  if (_cp_ucx_gate_parse_verdict (data, size, WHERE, &port, &error))
    {
      g_assert_cmpuint (size, ==, CP_UCX_GATE_VERDICT_HEAD);
      g_assert_cmpuint (data[0], ==, CP_UCX_GATE_ACCEPTED);
      g_assert_cmpuint (port, ==, (guint16) (data[1] << 8 | data[2]));
    }
  else
    assert_mesh_error (error);
}

static void
fuzz_challenge (GBytes *payload)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) again = NULL;
  guint8 nonce[CP_UCX_NONCE_SIZE];

  if (!_cp_ucx_parse_challenge (payload, nonce, &error))
    {
      assert_mesh_error (error);
      return;
    }
  again = _cp_ucx_pack_challenge (nonce);
  g_assert_true (g_bytes_equal (again, payload));
}

/* Rank 0 of a world of four, "dp=2,cp=2", with rank 2 joined already. */
static int
judge (CpUcxHello *hello,
       gboolean    prove,
       char      **why)
{
  static char *names[] = { "dp", "cp", NULL };
  static int sizes[] = { 2, 2 };
  const CpMeshConfig config = {
    .world_size = 4, .address = "127.0.0.1", .port = 29500, .token = TOKEN,
    .dim_names = names, .dim_sizes = sizes, .n_dims = 2, .timeout_ms = 1000,
  };
  const gboolean joined[4] = { TRUE, FALSE, TRUE, FALSE };
  guint8 nonce[CP_UCX_NONCE_SIZE] = { 7 };

  if (prove)
    _cp_ucx_hello_mac (TOKEN, "cpmesh join", nonce, hello->nonce, hello->rank, hello->world_size,
                       hello->mac);
  return _cp_ucx_judge_hello (hello, &config, nonce, joined, why);
}

static void
fuzz_hello (GBytes  *payload,
            gboolean prove)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpUcxHello) hello = _cp_ucx_parse_hello (payload, &error);
  g_autoptr(GBytes) again = NULL;
  g_autofree char *why = NULL;
  gsize address_size;
  int code;

  if (hello == NULL)
    {
      assert_mesh_error (error);
      return;
    }
  address_size = g_bytes_get_size (hello->address);
  g_assert_cmpuint (address_size, >=, 1);
  g_assert_cmpuint (address_size, <=, CP_UCX_ADDRESS_MAX);
  g_assert_cmpuint (g_strv_length (hello->dim_names), ==, hello->n_dims);
  again = _cp_ucx_pack_hello (hello);
  g_assert_true (g_bytes_equal (again, payload));
  code = judge (hello, prove, &why);
  if (code == CP_UCX_ACCEPTED)
    {
      g_assert_true (prove);
      g_assert_null (why);
      return;
    }
  g_assert_cmpint (code, >=, CP_MESH_ERROR_FAILED);
  g_assert_cmpint (code, <=, CP_MESH_ERROR_NO_DEVICE);
  g_assert_nonnull (why);
  g_assert_cmpstr (why, !=, "");
}

static void
fuzz_verdict (GBytes *payload)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *reason = NULL;
  guint8 mac[CP_UCX_MAC_SIZE];
  int code = 0;

  if (!_cp_ucx_parse_verdict (payload, &code, &reason, mac, &error))
    {
      assert_mesh_error (error);
      return;
    }
  if (code == CP_UCX_ACCEPTED)
    return;
  g_assert_cmpint (code, >=, CP_MESH_ERROR_FAILED);
  g_assert_cmpint (code, <=, CP_MESH_ERROR_NO_DEVICE);
  g_assert_nonnull (reason);
}

static void
fuzz_table (GBytes *payload,
            int     world_size)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GPtrArray) addresses = _cp_ucx_parse_table (payload, world_size, &error);
  g_autoptr(GBytes) again = NULL;

  if (addresses == NULL)
    {
      assert_mesh_error (error);
      return;
    }
  g_assert_cmpuint (addresses->len, ==, (guint) world_size);
  for (guint r = 0; r < addresses->len; r++)
    {
      gsize size = g_bytes_get_size (g_ptr_array_index (addresses, r));

      g_assert_cmpuint (size, >=, 1);
      g_assert_cmpuint (size, <=, CP_UCX_ADDRESS_MAX);
    }
  again = _cp_ucx_pack_table ((GBytes * const *) addresses->pdata, world_size);
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

  if (!_cp_collective_check_agreement (descs, 2, &error))
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

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  int kind = fuzz_take_u8 (&in) % N_MESSAGES;
  guint8 options = fuzz_take_u8 (&in);
  g_autoptr(GBytes) payload = g_bytes_new (in.data, in.size);

  fuzz_init ();
  switch (kind)
    {
    case GATE_GREETING:
    case GATE_VERDICT:
      fuzz_gate (kind, in.data, in.size);
      break;
    case CHALLENGE:
      fuzz_challenge (payload);
      break;
    case HELLO:
      fuzz_hello (payload, options & 1);
      break;
    case VERDICT:
      fuzz_verdict (payload);
      break;
    case TABLE:
      fuzz_table (payload, 1 + options % 8);
      break;
    case DESCRIPTOR:
      fuzz_descriptor (in.data, in.size);
      break;
    default:
      fuzz_header (in.data, in.size);
      break;
    }
  return 0;
}
