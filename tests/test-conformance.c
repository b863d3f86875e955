/* test-conformance.c: one suite of cases that every backend must pass
 *
 * Usage: test-conformance, with CP_TEST_TRANSPORT naming the backend
 * (local when unset)
 *
 * The cases are a table; the program runs all of them over the backend
 * CP_TEST_TRANSPORT names (tests/meson.build runs it once per backend:
 * local, loopback, ucx, shm), each case under the same path,
 * /Cp/Conformance/<feature>/<case>, whatever the backend.  A case is a
 * function every rank runs on its own mesh, plus what the test does
 * around it (a rank that never joins, one that is killed or stopped).
 *
 * How ranks are made depends on the backend alone:
 *
 *   local     threads of this process, one local group
 *   loopback  threads of this process, each joining with
 *             cp_mesh_new_with_options
 *   ucx, shm  processes: this program once more per rank, which joins
 *             from the environment a launcher would give it
 *             (CPMESH_TRANSPORT names the backend) and plays the case
 *             named by CP_CONFORMANCE_CASE
 *
 * Whichever they are, ranks report what they saw as lines ("FAILED …",
 * "VERDICT …", "DONE"), on stdout in a process and into a list on a
 * thread, so that one check reads both.  A backend this build lacks
 * (every rank fails to join with CP_MESH_ERROR_UNSUPPORTED) skips every
 * case, naming why.
 *
 * A killed rank is, on threads, one whose mesh is freed while its peers
 * are in a collective with it, and a stopped one a thread that comes to
 * the next call only after the timeout: what a process would look like
 * to its peers.  A local group is made by one call, so no rank of it can
 * fail to join: that case alone skips there.
 *
 * Expected values are computed here from the rank numbers, never taken
 * from another backend: integers exactly, reductions of floating-point
 * types against a float64 sum with the tolerance of reference_tolerance().
 *
 * Only the public API: the backends are what this suite tests.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

#define CASE_VARIABLE "CP_CONFORMANCE_CASE"
/* The mesh timeout of ordinary cases: long, they never wait on purpose. */
#define LONG_TIMEOUT_MS 30000
/* The timeout of the cases that wait for a rank that is gone. */
#define FAULT_TIMEOUT_MS 1000
/* Elements of a large message (256 KiB of float32, so that a backend's
 * protocol for large messages is used), prime. */
#define LARGE 65537

/* ---- backends ---- */

typedef enum
{
  RANKS_LOCAL_GROUP,
  RANKS_JOINED_THREADS,
  RANKS_PROCESSES,
} RankKind;

typedef struct
{
  const char *name;   /* CPMESH_TRANSPORT */
  RankKind ranks;
  /* Why a failure fails only the rank that sees it, for a backend made
   * so on purpose; NULL: the first failure is every rank's. */
  const char *lone_failures;
} Backend;

static const Backend backends[] = {
  { "local", RANKS_LOCAL_GROUP },
  { "loopback", RANKS_JOINED_THREADS,
    "the loopback backend is kept simple on purpose: a failure fails only the rank that sees it "
    "(no shared first failure), and a receive that does not match what was sent fails the "
    "receiving side only" },
  { "ucx", RANKS_PROCESSES },
  { "shm", RANKS_PROCESSES },
};

static const Backend *backend;
static const char *program_name;

/* ---- cases ---- */

typedef enum
{
  FAULT_NONE,
  FAULT_MISSING,   /* rank GPOINTER_TO_INT (data) never joins */
  FAULT_KILLED,    /* the last rank dies in the middle of all_gathers */
  FAULT_STOPPED,   /* the last rank stops past the timeout, then goes on */
} Fault;

typedef struct Case Case;

/* What a rank function sees: its mesh, which it may drop (a rank that
 * dies), and where its reports go. */
typedef struct
{
  CpMesh *mesh;
  int rank;
  int size;
  gboolean on_thread;
  GPtrArray *said;    /* on a thread; NULL in a process (stdout) */
  const Case *c;
} Rank;

typedef void (*CaseFunc) (Rank *self);

struct Case
{
  const char *path;       /* below /Cp/Conformance/ */
  const char *summary;
  CaseFunc func;
  int size;               /* ranks */
  const char *dims;       /* CPMESH_MESH_DIMS; NULL: one dimension cp */
  Fault fault;
  guint timeout_ms;       /* 0: LONG_TIMEOUT_MS */
  gboolean shared_failure;  /* checks that one rank's failure is every rank's */
  gconstpointer data;
};

static const CpDType all_dtypes[] = {
  CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
};

static const char *
dtype_name (CpDType dtype)
{
  static const char *names[] = { "bool", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
                                 "float64" };

  return names[dtype];
}

/* ---- reports ---- */

static GPrivate current_rank;

/* One line from the running rank: into its list on a thread, on stdout
 * (flushed) in a process. */
static void G_GNUC_PRINTF (1, 2)
say (const char *format,
     ...)
{
  Rank *self = g_private_get (&current_rank);
  g_autofree char *line = NULL;
  va_list args;

  va_start (args, format);
  line = g_strdup_vprintf (format, args);
  va_end (args);
  if (self != NULL && self->said != NULL)
    g_ptr_array_add (self->said, g_steal_pointer (&line));
  else
    cp_harness_report ("%s", line);
}

static gint64
ms_since (gint64 since)
{
  return (g_get_monotonic_time () - since) / 1000;
}

/* "WHAT\tDOMAIN\tCODE\tMS\tMESSAGE": the error a step ended with; the
 * test compares it across ranks and records it. */
static void
say_error (const char   *what,
           const GError *error,
           gint64        since)
{
  g_autofree char *flat = g_strdelimit (g_strdup (error->message), "\t\n", ' ');

  say ("%s\t%s\t%d\t%" G_GINT64_FORMAT "\t%s", what, g_quark_to_string (error->domain), error->code,
       ms_since (since), flat);
}

/* An error every rank must give alike: recorded once, for the
 * reliability table, from rank 0's report. */
static void
say_verdict (const char   *what,
             const GError *error)
{
  g_autofree char *line = g_strconcat ("VERDICT ", what, NULL);

  say_error (line, error, g_get_monotonic_time ());
}

/* ---- inputs and what they must become ---- */

/* Element @i of rank @rank's input: negative and positive, past 2^32
 * for int64, non-integral for floating point (so that rounding shows),
 * exact in a double. */
static double
input_value (CpDType dtype,
             int     rank,
             gint64  i,
             guint   seed)
{
  gint64 k = i * 7 + rank * 13 + seed * 5;

  switch (dtype)
    {
    case CP_DTYPE_BOOL:
      return (i + rank + seed) % 3 == 0;
    case CP_DTYPE_UINT8:
      return (double) ((i * 3 + rank * 101 + seed) % 256);
    case CP_DTYPE_INT32:
      return (double) ((k * 7919) % 2000001 - 1000000);
    case CP_DTYPE_INT64:
      return (double) ((i % 2 ? -1 : 1) * ((G_GINT64_CONSTANT (1) << 40) * (rank + 1) + k));
    default:
      return sin ((double) i * 0.731 + rank * 1.37 + seed) * 1000.0 / (1 + i % 7);
    }
}

/* Rank @rank's input on the host, its values rounded to @dtype. */
static CpTensor *
host_input (CpDType       dtype,
            const gint64 *shape,
            guint         n_dims,
            int           rank,
            guint         seed)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);

  g_assert_no_error (error);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    cp_tensor_set_value (tensor, i, input_value (dtype, rank, i, seed));
  return tensor;
}

/* The same in the suite's memory (CP_TEST_DEVICE). */
static CpTensor *
make_input (CpDType       dtype,
            const gint64 *shape,
            guint         n_dims,
            int           rank,
            guint         seed)
{
  return cp_test_on_device (host_input (dtype, shape, n_dims, rank, seed));
}

static CpTensor *
on_host (CpTensor *tensor)
{
  g_autoptr(GError) error = NULL;
  CpTensor *host = cp_tensor_to_device (tensor, CP_DEVICE_KIND_HOST, &error);

  g_assert_no_error (error);
  return host;
}

static void
assert_shape (CpTensor     *tensor,
              const gint64 *shape,
              guint         n_dims)
{
  guint got_dims = 0;
  const gint64 *got = cp_tensor_get_shape (tensor, &got_dims);

  g_assert_cmpuint (got_dims, ==, n_dims);
  for (guint d = 0; d < n_dims; d++)
    g_assert_cmpint (got[d], ==, shape[d]);
}

static void
assert_element (CpTensor   *got,
                gint64      i,
                double      want,
                const char *what)
{
  double have = cp_tensor_get_value (got, i);

  if (have != want)
    g_error ("%s on %s: element %" G_GINT64_FORMAT " is %.17g, expected %.17g", what, backend->name, i,
             have, want);
}

/* Asserts that @got (any memory) equals rank @source's input of @shape. */
static void
assert_input_of (CpTensor     *got,
                 CpDType       dtype,
                 const gint64 *shape,
                 guint         n_dims,
                 int           source,
                 guint         seed,
                 const char   *what)
{
  g_autoptr(CpTensor) host = on_host (got);
  g_autoptr(CpTensor) want = host_input (dtype, shape, n_dims, source, seed);

  g_assert_cmpint (cp_tensor_get_dtype (host), ==, dtype);
  assert_shape (host, shape, n_dims);
  for (gint64 i = 0; i < cp_tensor_get_numel (want); i++)
    assert_element (host, i, cp_tensor_get_value (want, i), what);
}

/* The flat index in a tensor of @shape (@n_dims ≤ 3) of @coord. */
static gint64
flat_index (const gint64 *shape,
            guint         n_dims,
            const gint64 *coord)
{
  gint64 flat = 0;

  for (guint d = 0; d < n_dims; d++)
    flat = flat * shape[d] + coord[d];
  return flat;
}

static void
unflatten (const gint64 *shape,
           guint         n_dims,
           gint64        flat,
           gint64       *coord)
{
  for (guint d = n_dims; d-- > 0;)
    {
      coord[d] = flat % shape[d];
      flat /= shape[d];
    }
}

/* The unit roundoff of @dtype's significand, as a power of two. */
static double
unit_roundoff (CpDType dtype)
{
  switch (dtype)
    {
    case CP_DTYPE_FLOAT16:
      return ldexp (1, -11);
    case CP_DTYPE_BFLOAT16:
      return ldexp (1, -8);
    case CP_DTYPE_FLOAT32:
      return ldexp (1, -24);
    case CP_DTYPE_FLOAT64:
      return ldexp (1, -53);
    default:
      return 0;
    }
}

/* How far a sum of @n values whose magnitudes add up to @magnitude may
 * be from the float64 reference: each partial sum may round once in the
 * dtype (or in a wider accumulator) and the result once more, so
 * (n + 1) unit roundoffs of the magnitudes.  Integer types: exact. */
static double
reference_tolerance (CpDType dtype,
                     int     n,
                     double  magnitude)
{
  return (n + 1) * unit_roundoff (dtype) * magnitude;
}

/* ---- collectives ---- */

static void
run_barriers (Rank *self)
{
  g_autoptr(GError) error = NULL;

  for (int i = 0; i < 20; i++)
    {
      g_assert_true (cp_mesh_barrier (self->mesh, &error));
      g_assert_no_error (error);
    }
}

/* All_gather of @shape along @dim, checked element by element against
 * the input of the rank each slot came from. */
static void
check_all_gather (Rank         *self,
                  CpDType       dtype,
                  const gint64 *shape,
                  guint         n_dims,
                  int           dim,
                  guint         seed)
{
  g_autoptr(CpTensor) mine = make_input (dtype, shape, n_dims, self->rank, seed);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (self->mesh, mine, dim, &error);
  g_autoptr(CpTensor) host = NULL;
  g_autofree char *what = g_strdup_printf ("all_gather of %s along %d", dtype_name (dtype), dim);
  int d = dim < 0 ? dim + (int) n_dims : dim;
  gint64 out_shape[3];
  g_autoptr(GPtrArray) inputs = g_ptr_array_new_with_free_func (g_object_unref);

  g_assert_no_error (error);
  memcpy (out_shape, shape, n_dims * sizeof (gint64));
  out_shape[d] *= self->size;
  host = on_host (gathered);
  assert_shape (host, out_shape, n_dims);
  g_assert_cmpint (cp_tensor_get_device (gathered), ==, cp_test_get_device ());
  for (int r = 0; r < self->size; r++)
    g_ptr_array_add (inputs, host_input (dtype, shape, n_dims, r, seed));
  for (gint64 i = 0; i < cp_tensor_get_numel (host); i++)
    {
      gint64 coord[3];
      int source;

      unflatten (out_shape, n_dims, i, coord);
      source = (int) (coord[d] / shape[d]);
      coord[d] %= shape[d];
      assert_element (host, i, cp_tensor_get_value (inputs->pdata[source], flat_index (shape, n_dims, coord)),
                      what);
    }
}

static void
run_all_gather_dtypes (Rank *self)
{
  const gint64 shape[] = { 2, 3, 4 };

  for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
    for (int dim = -1; dim < 3; dim++)
      check_all_gather (self, all_dtypes[t], shape, 3, dim, t);
}

static void
run_all_gather_sizes (Rank *self)
{
  check_all_gather (self, CP_DTYPE_FLOAT32, (const gint64[]) { 1 }, 1, 0, 1);
  check_all_gather (self, CP_DTYPE_INT64, (const gint64[]) { 7 }, 1, 0, 2);
  check_all_gather (self, CP_DTYPE_UINT8, (const gint64[]) { 31 }, 1, 0, 3);
  check_all_gather (self, CP_DTYPE_FLOAT16, (const gint64[]) { 1, 13 }, 2, 1, 4);
  check_all_gather (self, CP_DTYPE_FLOAT32, (const gint64[]) { 0, 4 }, 2, 0, 5);
  check_all_gather (self, CP_DTYPE_FLOAT32, (const gint64[]) { 5, 0 }, 2, 0, 6);
  check_all_gather (self, CP_DTYPE_FLOAT32, (const gint64[]) { LARGE }, 1, 0, 7);
  check_all_gather (self, CP_DTYPE_BFLOAT16, (const gint64[]) { 3, 10007 }, 2, 1, 8);
}

/* Into a given output; one rank's output of the wrong shape fails every
 * rank, and writes nothing. */
static void
run_all_gather_into (Rank *self)
{
  const gint64 shape[] = { 3 }, out_shape[] = { 3 * self->size }, bad_shape[] = { 3 * self->size + 1 };
  g_autoptr(CpTensor) mine = make_input (CP_DTYPE_INT32, shape, 1, self->rank, 1);
  g_autoptr(CpTensor) out = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, out_shape, 1, NULL));
  g_autoptr(CpTensor) bad = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, bad_shape, 1, 5, NULL));
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = NULL;

  g_assert_true (cp_mesh_all_gather_into (self->mesh, mine, 0, out, &error));
  g_assert_no_error (error);
  host = on_host (out);
  for (int r = 0; r < self->size; r++)
    for (gint64 i = 0; i < 3; i++)
      assert_element (host, r * 3 + i, input_value (CP_DTYPE_INT32, r, i, 1), "all_gather_into");

  g_assert_false (cp_mesh_all_gather_into (self->mesh, mine, 0, self->rank == 1 ? bad : out, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
  say_verdict ("all_gather_into where one rank's output has the wrong shape", error);
  g_clear_error (&error);
  g_clear_object (&host);
  host = on_host (bad);
  for (gint64 i = 0; i < bad_shape[0]; i++)
    assert_element (host, i, 5, "all_gather_into's refused output");
}

/* All_to_all of @shape along @dim: slot s of the result is rank s's
 * piece for this rank. */
static void
check_all_to_all (Rank         *self,
                  CpDType       dtype,
                  const gint64 *shape,
                  guint         n_dims,
                  int           dim,
                  guint         seed)
{
  g_autoptr(CpTensor) mine = make_input (dtype, shape, n_dims, self->rank, seed);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) got = cp_mesh_all_to_all (self->mesh, mine, dim, &error);
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(GPtrArray) inputs = g_ptr_array_new_with_free_func (g_object_unref);
  g_autofree char *what = g_strdup_printf ("all_to_all of %s along %d", dtype_name (dtype), dim);
  gint64 piece;

  g_assert_no_error (error);
  host = on_host (got);
  assert_shape (host, shape, n_dims);
  piece = shape[dim] / self->size;
  for (int r = 0; r < self->size; r++)
    g_ptr_array_add (inputs, host_input (dtype, shape, n_dims, r, seed));
  for (gint64 i = 0; i < cp_tensor_get_numel (host); i++)
    {
      gint64 coord[3];
      int sender;

      unflatten (shape, n_dims, i, coord);
      sender = (int) (coord[dim] / piece);
      coord[dim] = self->rank * piece + coord[dim] % piece;
      assert_element (host, i, cp_tensor_get_value (inputs->pdata[sender], flat_index (shape, n_dims, coord)),
                      what);
    }
}

static void
run_all_to_all_dtypes (Rank *self)
{
  const gint64 shape[] = { 2, 2 * self->size, 3 };

  for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
    check_all_to_all (self, all_dtypes[t], shape, 3, 1, t);
}

static void
run_all_to_all_sizes (Rank *self)
{
  int n = self->size;

  check_all_to_all (self, CP_DTYPE_INT64, (const gint64[]) { n }, 1, 0, 1);
  check_all_to_all (self, CP_DTYPE_FLOAT32, (const gint64[]) { 13 * n }, 1, 0, 2);
  check_all_to_all (self, CP_DTYPE_FLOAT16, (const gint64[]) { 0, n }, 2, 1, 3);
  check_all_to_all (self, CP_DTYPE_UINT8, (const gint64[]) { 3 * n, 0 }, 2, 0, 4);
  check_all_to_all (self, CP_DTYPE_FLOAT32, (const gint64[]) { LARGE * n }, 1, 0, 5);
}

static void
run_all_to_all_indivisible (Rank *self)
{
  const gint64 shape[] = { 2 * self->size + 1 };
  g_autoptr(CpTensor) mine = make_input (CP_DTYPE_INT64, shape, 1, self->rank, 0);
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_mesh_all_to_all (self->mesh, mine, 0, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
  say_verdict ("all_to_all of a dimension the world size does not divide", error);
}

/* What element @i of the reduction must be, from every rank's input in
 * float64 (rounded into the dtype by a tensor of it), and how far from
 * it the result may be. */
static double
reduced_value (CpDType     dtype,
               CpReduceOp  op,
               GPtrArray  *inputs,
               gint64      i,
               double     *tolerance)
{
  double acc = 0, magnitude = 0;

  for (guint r = 0; r < inputs->len; r++)
    {
      double v = cp_tensor_get_value (inputs->pdata[r], i);

      magnitude += fabs (v);
      if (r == 0)
        acc = v;
      else if (op == CP_REDUCE_OP_SUM)
        acc += v;
      else
        acc = op == CP_REDUCE_OP_MAX ? MAX (acc, v) : MIN (acc, v);
    }
  /* Sum of booleans: logical or; of uint8: modulo 256. */
  if (dtype == CP_DTYPE_BOOL)
    acc = acc != 0;
  if (dtype == CP_DTYPE_UINT8)
    acc = fmod (acc, 256);
  *tolerance = op == CP_REDUCE_OP_SUM ? reference_tolerance (dtype, (int) inputs->len, magnitude) : 0;
  return acc;
}

static void
check_all_reduce (Rank         *self,
                  CpDType       dtype,
                  CpReduceOp    op,
                  const gint64 *shape,
                  guint         n_dims,
                  guint         seed)
{
  g_autoptr(CpTensor) t = make_input (dtype, shape, n_dims, self->rank, seed);
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(GPtrArray) inputs = g_ptr_array_new_with_free_func (g_object_unref);
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_reduce (self->mesh, t, op, &error));
  g_assert_no_error (error);
  host = on_host (t);
  assert_shape (host, shape, n_dims);
  for (int r = 0; r < self->size; r++)
    g_ptr_array_add (inputs, host_input (dtype, shape, n_dims, r, seed));
  for (gint64 i = 0; i < cp_tensor_get_numel (host); i++)
    {
      double tolerance;
      double want = reduced_value (dtype, op, inputs, i, &tolerance);
      double have = cp_tensor_get_value (host, i);

      if (fabs (have - want) > tolerance)
        g_error ("all_reduce (op %d) of %s on %s: element %" G_GINT64_FORMAT " is %.17g, expected %.17g "
                 "± %.3g", op, dtype_name (dtype), backend->name, i, have, want, tolerance);
    }
}

/* Every dtype: one element, a prime count, and for the wide types a
 * large one. */
static void
run_all_reduce (Rank *self)
{
  CpReduceOp op = GPOINTER_TO_INT (self->c->data);

  for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
    {
      CpDType dtype = all_dtypes[t];

      check_all_reduce (self, dtype, op, (const gint64[]) { 1 }, 1, t);
      check_all_reduce (self, dtype, op, (const gint64[]) { 37 }, 1, t + 10);
      check_all_reduce (self, dtype, op, (const gint64[]) { 3, 5, 7 }, 3, t + 20);
      if (dtype == CP_DTYPE_FLOAT32 || dtype == CP_DTYPE_INT64 || dtype == CP_DTYPE_BFLOAT16)
        check_all_reduce (self, dtype, op, (const gint64[]) { LARGE }, 1, t + 30);
    }
  check_all_reduce (self, CP_DTYPE_FLOAT32, op, (const gint64[]) { 0 }, 1, 40);
  check_all_reduce (self, CP_DTYPE_INT64, op, (const gint64[]) { 2, 0 }, 2, 41);
}

static void
check_broadcast (Rank         *self,
                 CpDType       dtype,
                 const gint64 *shape,
                 guint         n_dims,
                 int           root,
                 guint         seed)
{
  g_autoptr(CpTensor) t = make_input (dtype, shape, n_dims, self->rank, seed);
  g_autoptr(GError) error = NULL;
  g_autofree char *what = g_strdup_printf ("broadcast of %s from %d", dtype_name (dtype), root);

  g_assert_true (cp_mesh_broadcast (self->mesh, t, root, &error));
  g_assert_no_error (error);
  assert_input_of (t, dtype, shape, n_dims, root, seed, what);
}

static void
run_broadcast_roots (Rank *self)
{
  for (int root = 0; root < self->size; root++)
    {
      for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
        {
          check_broadcast (self, all_dtypes[t], (const gint64[]) { 1 }, 1, root, t);
          check_broadcast (self, all_dtypes[t], (const gint64[]) { 5, 7 }, 2, root, t + 10);
        }
      check_broadcast (self, CP_DTYPE_FLOAT32, (const gint64[]) { 0 }, 1, root, 20);
      check_broadcast (self, CP_DTYPE_FLOAT32, (const gint64[]) { LARGE }, 1, root, 21);
    }
}

static void
run_broadcast_bad_root (Rank *self)
{
  g_autoptr(CpTensor) t = make_input (CP_DTYPE_FLOAT32, (const gint64[]) { 3 }, 1, self->rank, 0);
  g_autoptr(GError) error = NULL;

  g_assert_false (cp_mesh_broadcast (self->mesh, t, self->size, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE);
  say_verdict ("broadcast from a root outside the mesh", error);
  assert_input_of (t, CP_DTYPE_FLOAT32, (const gint64[]) { 3 }, 1, self->rank, 0, "refused broadcast");
}

/* A mesh of one rank: every collective is the identity (a gathered or
 * exchanged tensor equal to the input), point-to-point aside. */
static void
run_one_rank (Rank *self)
{
  const gint64 shape[] = { 3, 5 };
  g_autoptr(GError) error = NULL;

  g_assert_cmpint (self->size, ==, 1);
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
  for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
    {
      check_all_gather (self, all_dtypes[t], shape, 2, 1, t);
      check_all_to_all (self, all_dtypes[t], shape, 2, 0, t);
      for (int op = CP_REDUCE_OP_SUM; op <= CP_REDUCE_OP_MIN; op++)
        check_all_reduce (self, all_dtypes[t], op, shape, 2, t);
      check_broadcast (self, all_dtypes[t], shape, 2, 0, t);
    }
  run_broadcast_bad_root (self);
}

/* ---- point to point ---- */

/* Every rank's input passed once round the ring, one send_recv a step:
 * at step s a rank holds the input of the rank s + 1 behind it. */
static void
check_ring (Rank         *self,
            CpDType       dtype,
            const gint64 *shape,
            guint         n_dims,
            guint         seed)
{
  int n = self->size, rank = self->rank;
  g_autoptr(CpTensor) out = make_input (dtype, shape, n_dims, rank, seed);
  g_autoptr(CpTensor) in = cp_test_on_device (cp_tensor_new (dtype, shape, n_dims, NULL));
  g_autoptr(GError) error = NULL;
  g_autofree char *what = g_strdup_printf ("send_recv of %s", dtype_name (dtype));

  for (int step = 0; step < n; step++)
    {
      g_assert_true (cp_mesh_send_recv (self->mesh, out, (rank + 1) % n, in, (rank + n - 1) % n, 9, &error));
      g_assert_no_error (error);
      assert_input_of (in, dtype, shape, n_dims, (rank + 2 * n - step - 1) % n, seed, what);
      /* What came in goes out next. */
      {
        CpTensor *sent = out;

        out = in;
        in = sent;
      }
    }
}

static void
run_ring (Rank *self)
{
  for (guint t = 0; t < G_N_ELEMENTS (all_dtypes); t++)
    {
      check_ring (self, all_dtypes[t], (const gint64[]) { 1 }, 1, t);
      check_ring (self, all_dtypes[t], (const gint64[]) { 3, 37 }, 2, t + 10);
    }
  check_ring (self, CP_DTYPE_FLOAT64, (const gint64[]) { 0 }, 1, 20);
  check_ring (self, CP_DTYPE_FLOAT32, (const gint64[]) { LARGE }, 1, 21);
}

/* Separate sends and receives between ranks 0 and 1, by tag, the others
 * idle: small, empty and large messages in order. */
static void
run_pair (Rank *self)
{
  static const gint64 sizes[] = { 1, 0, 37, LARGE };
  g_autoptr(GError) error = NULL;

  for (guint k = 0; k < G_N_ELEMENTS (sizes); k++)
    {
      const gint64 shape[] = { sizes[k] };

      if (self->rank == 0)
        {
          g_autoptr(CpTensor) t = make_input (CP_DTYPE_FLOAT32, shape, 1, 0, k);

          g_assert_true (cp_mesh_send (self->mesh, t, 1, 100 + k, &error));
          g_assert_no_error (error);
        }
      else if (self->rank == 1)
        {
          g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL));

          g_assert_true (cp_mesh_recv (self->mesh, t, 0, 100 + k, &error));
          g_assert_no_error (error);
          assert_input_of (t, CP_DTYPE_FLOAT32, shape, 1, 0, k, "recv");
        }
    }
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
}

/* A send and a receive that disagree fail on both sides with the same
 * error, and leave the receiving tensor untouched; the mesh stays
 * usable. */
static void
run_p2p_mismatch (Rank *self)
{
  const gint64 four[] = { 4 }, five[] = { 5 };
  g_autoptr(GError) error = NULL;

  if (self->rank == 0)
    {
      g_autoptr(CpTensor) t = make_input (CP_DTYPE_INT32, four, 1, 0, 0);

      g_assert_false (cp_mesh_send (self->mesh, t, 1, 4, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      say_verdict ("send of a shape other than the receiver posted", error);
      g_clear_error (&error);
      g_assert_true (cp_mesh_send (self->mesh, t, 1, 5, &error));
      g_assert_no_error (error);
    }
  else if (self->rank == 1)
    {
      g_autoptr(CpTensor) wrong = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, five, 1, 7, NULL));
      g_autoptr(CpTensor) got = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, four, 1, NULL));
      g_autoptr(CpTensor) host = NULL;

      g_assert_false (cp_mesh_recv (self->mesh, wrong, 0, 4, &error));
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      say_verdict ("send of a shape other than the receiver posted", error);
      host = on_host (wrong);
      for (gint64 i = 0; i < 5; i++)
        assert_element (host, i, 7, "the refused receive");
      g_clear_error (&error);
      g_assert_true (cp_mesh_recv (self->mesh, got, 0, 5, &error));
      g_assert_no_error (error);
      assert_input_of (got, CP_DTYPE_INT32, four, 1, 0, 0, "recv after a mismatch");
    }
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
}

/* ---- submeshes ---- */

/* World rank of the member of this rank's @dim submesh at @index: the
 * mesh is row-major over (dp, cp). */
static int
member_rank (Rank       *self,
             const char *dim,
             int         index)
{
  int cp_size = cp_mesh_get_dim_size (self->mesh, "cp");
  int dp = cp_mesh_get_coordinate (self->mesh, "dp"), cp = cp_mesh_get_coordinate (self->mesh, "cp");

  return g_str_equal (dim, "cp") ? dp * cp_size + index : index * cp_size + cp;
}

/* Every collective on one dimension's submesh stays inside its group. */
static void
check_submesh (Rank       *self,
               const char *dim)
{
  g_autoptr(GError) error = NULL;
  CpMesh *sub = cp_mesh_get_submesh (self->mesh, dim, &error);
  int n, me;
  double sum = 0;
  g_autoptr(CpTensor) t = NULL;
  g_autoptr(CpTensor) gathered = NULL;
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(CpTensor) root = NULL;

  g_assert_no_error (error);
  n = cp_mesh_get_world_size (sub);
  me = cp_mesh_get_rank (sub);
  g_assert_cmpint (n, ==, cp_mesh_get_dim_size (self->mesh, dim));
  g_assert_cmpint (me, ==, cp_mesh_get_coordinate (self->mesh, dim));
  g_assert_cmpint (member_rank (self, dim, me), ==, self->rank);

  t = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT64, (const gint64[]) { 3 }, 1, self->rank, NULL));
  g_assert_true (cp_mesh_all_reduce (sub, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  for (int i = 0; i < n; i++)
    sum += member_rank (self, dim, i);
  host = on_host (t);
  assert_element (host, 2, sum, "all_reduce on a submesh");

  g_clear_object (&t);
  t = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, (const gint64[]) { 1 }, 1, self->rank, NULL));
  gathered = cp_mesh_all_gather (sub, t, 0, &error);
  g_assert_no_error (error);
  g_clear_object (&host);
  host = on_host (gathered);
  for (int i = 0; i < n; i++)
    assert_element (host, i, member_rank (self, dim, i), "all_gather on a submesh");

  root = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT32, (const gint64[]) { 2 }, 1, self->rank, NULL));
  g_assert_true (cp_mesh_broadcast (sub, root, n - 1, &error));
  g_assert_no_error (error);
  g_clear_object (&host);
  host = on_host (root);
  assert_element (host, 1, member_rank (self, dim, n - 1), "broadcast on a submesh");

  check_all_to_all (&(Rank) { sub, me, n, self->on_thread, self->said, self->c }, CP_DTYPE_INT64,
                    (const gint64[]) { 2 * n, 3 }, 2, 0, 7);
  g_assert_true (cp_mesh_barrier (sub, &error));
  g_assert_no_error (error);
}

static void
run_submeshes (Rank *self)
{
  g_autoptr(GError) error = NULL;

  check_submesh (self, "cp");
  check_submesh (self, "dp");
  check_submesh (self, "cp");
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
}

/* ---- disagreement: the same error on every rank, and the mesh goes
 * on ---- */

typedef enum { DISAGREE_SHAPE, DISAGREE_DTYPE, DISAGREE_OPERATION, DISAGREE_REDUCE_OP, DISAGREE_ROOT } Disagreement;

static void
run_disagreement (Rank *self)
{
  Disagreement kind = GPOINTER_TO_INT (self->c->data);
  gboolean odd = self->rank == 1;
  const gint64 four[] = { 4 }, five[] = { 5 };
  CpDType dtype = kind == DISAGREE_DTYPE && odd ? CP_DTYPE_INT64 : CP_DTYPE_INT32;
  g_autoptr(CpTensor) t = make_input (dtype, kind == DISAGREE_SHAPE && odd ? five : four, 1, self->rank, 0);
  g_autoptr(CpTensor) before = on_host (t);
  g_autoptr(CpTensor) after = NULL;
  g_autoptr(GError) error = NULL;
  gboolean ok;

  switch (kind)
    {
    case DISAGREE_SHAPE:
    case DISAGREE_DTYPE:
      {
        g_autoptr(CpTensor) out = cp_mesh_all_gather (self->mesh, t, 0, &error);

        ok = out != NULL;
        break;
      }
    case DISAGREE_OPERATION:
      if (odd)
        ok = cp_mesh_all_reduce (self->mesh, t, CP_REDUCE_OP_SUM, &error);
      else
        ok = cp_mesh_broadcast (self->mesh, t, 0, &error);
      break;
    case DISAGREE_REDUCE_OP:
      ok = cp_mesh_all_reduce (self->mesh, t, odd ? CP_REDUCE_OP_MAX : CP_REDUCE_OP_SUM, &error);
      break;
    case DISAGREE_ROOT:
    default:
      ok = cp_mesh_broadcast (self->mesh, t, odd ? 1 : 0, &error);
      break;
    }
  g_assert_false (ok);
  g_assert_nonnull (error);
  switch (kind)
    {
    case DISAGREE_SHAPE:
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE);
      g_assert_nonnull (strstr (error->message, "rank 0 passed int32[4], rank 1 passed int32[5]"));
      say_verdict ("all_gather whose ranks pass different shapes", error);
      break;
    case DISAGREE_DTYPE:
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DTYPE);
      say_verdict ("all_gather whose ranks pass different dtypes", error);
      break;
    case DISAGREE_OPERATION:
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
      g_assert_nonnull (strstr (error->message, "rank 0 called broadcast, rank 1 called all_reduce"));
      say_verdict ("ranks that call different collectives at the same step", error);
      break;
    case DISAGREE_REDUCE_OP:
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
      say_verdict ("all_reduce whose ranks pass different reduce ops", error);
      break;
    case DISAGREE_ROOT:
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
      say_verdict ("broadcast whose ranks name different roots", error);
      break;
    }
  /* Nothing was written, and a refusal every rank reached is no
   * failure: the mesh goes on. */
  after = on_host (t);
  g_assert_true (cp_tensor_equal (after, before));
  g_clear_error (&error);
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
  check_all_reduce (self, CP_DTYPE_INT64, CP_REDUCE_OP_SUM, four, 1, 3);
}

/* ---- faults ---- */

/* Small all_gathers, each checked, until one fails ("READY" after the
 * first); then "FAILED" with the index of the failing call and
 * "LATER" with the error of a barrier made after it. */
static void
gather_until_failure (Rank *self,
                      int   stop_at,
                      int   pause_at)
{
  const gint64 shape[] = { 1024 };
  g_autoptr(CpTensor) mine = make_input (CP_DTYPE_FLOAT32, shape, 1, self->rank, 0);
  g_autoptr(GError) error = NULL;
  gint64 since;
  int index;

  for (index = 0;; index++)
    {
      g_autoptr(CpTensor) out = NULL;

      if (index == stop_at)
        return;
      if (index == pause_at)
        g_usleep (1300 * FAULT_TIMEOUT_MS * cp_test_time_factor ());
      since = g_get_monotonic_time ();
      out = cp_mesh_all_gather (self->mesh, mine, 0, &error);
      if (out == NULL)
        break;
      if (index == 0)
        say ("READY");
    }
  say_error ("FAILED", error, since);
  say ("FAILED_AT %d", index);
  g_clear_error (&error);
  since = g_get_monotonic_time ();
  g_assert_false (cp_mesh_barrier (self->mesh, &error));
  say_error ("LATER", error, since);
}

static gboolean
is_victim (Rank *self)
{
  return self->rank == self->size - 1;
}

/* The test kills the last process; on threads the last rank drops its
 * mesh after a few calls, while its peers wait in the next. */
static void
run_killed (Rank *self)
{
  if (self->on_thread && is_victim (self))
    {
      gather_until_failure (self, 3, -1);
      g_usleep (50 * G_TIME_SPAN_MILLISECOND);
      g_clear_object (&self->mesh);
      return;
    }
  gather_until_failure (self, -1, -1);
}

/* The test stops the last process past the timeout; on threads the last
 * rank sleeps that long before its next call. */
static void
run_stopped (Rank *self)
{
  gather_until_failure (self, -1, self->on_thread && is_victim (self) ? 3 : -1);
}

/* ---- cancellation ---- */

typedef struct
{
  GMainLoop *loop;
  GError *error;
} AsyncCall;

static void
recv_done (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  AsyncCall *call = user_data;

  g_assert_false (cp_mesh_recv_finish (CP_MESH (source), result, &call->error));
  g_main_loop_quit (call->loop);
}

static gboolean
cancel_now (gpointer cancellable)
{
  g_cancellable_cancel (cancellable);
  return G_SOURCE_REMOVE;
}

/* Each rank waits for a message the other never sends: rank 0 in
 * cp_mesh_recv, rank 1 in cp_mesh_recv_async on a main loop of its own,
 * whose cancellable it cancels after 300 ms.  Both fail, CANCELLED, and
 * so does every later call. */
static void
run_cancel (Rank *self)
{
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, (const gint64[]) { 4 }, 1, NULL));
  g_autoptr(GMainContext) context = g_main_context_new ();
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  AsyncCall call = { NULL, NULL };
  gint64 since = g_get_monotonic_time ();

  g_main_context_push_thread_default (context);
  call.loop = g_main_loop_new (context, FALSE);
  if (self->rank == 0)
    g_assert_false (cp_mesh_recv (self->mesh, t, 1, 9, &call.error));
  else
    {
      g_autoptr(GSource) timer = g_timeout_source_new (300);

      g_source_set_callback (timer, cancel_now, cancellable, NULL);
      g_source_attach (timer, context);
      cp_mesh_recv_async (self->mesh, t, 0, 9, cancellable, recv_done, &call);
      g_main_loop_run (call.loop);
    }
  g_assert_error (call.error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
  g_assert_nonnull (strstr (call.error->message, "rank 1 was cancelled"));
  g_assert_cmpint (ms_since (since), <, 3000 * cp_test_time_factor ());
  say_verdict (self->rank == 1 ? "recv_async cancelled while it waits for its peer"
                               : "recv waiting for a peer whose recv_async was cancelled", call.error);
  g_clear_error (&call.error);
  since = g_get_monotonic_time ();
  g_assert_false (cp_mesh_barrier (self->mesh, &call.error));
  g_assert_error (call.error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
  g_assert_nonnull (strstr (call.error->message, "mesh broken: rank 1 was cancelled"));
  g_assert_cmpint (ms_since (since), <, 200 * cp_test_time_factor ());
  say_verdict ("a call after an async call of the mesh was cancelled", call.error);
  g_clear_error (&call.error);
  g_main_loop_unref (call.loop);
  g_main_context_pop_thread_default (context);
}

static void
barrier_done (GObject      *source,
              GAsyncResult *result,
              gpointer      user_data)
{
  AsyncCall *call = user_data;

  g_assert_false (cp_mesh_barrier_finish (CP_MESH (source), result, &call->error));
  g_main_loop_quit (call->loop);
}

/* The last rank's barrier_async waits for peers that come late, and is
 * cancelled after 300 ms: it fails, CANCELLED, and so does the barrier
 * each peer makes when it comes, at once. */
static void
run_cancel_late_peers (Rank *self)
{
  g_autoptr(GMainContext) context = g_main_context_new ();
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  AsyncCall call = { NULL, NULL };
  gint64 since;

  g_main_context_push_thread_default (context);
  call.loop = g_main_loop_new (context, FALSE);
  if (self->rank == self->size - 1)
    {
      g_autoptr(GSource) timer = g_timeout_source_new (300);

      since = g_get_monotonic_time ();
      g_source_set_callback (timer, cancel_now, cancellable, NULL);
      g_source_attach (timer, context);
      cp_mesh_barrier_async (self->mesh, cancellable, barrier_done, &call);
      g_main_loop_run (call.loop);
      g_assert_error (call.error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
      g_assert_cmpint (ms_since (since), <, 3000 * cp_test_time_factor ());
      say_verdict ("barrier_async cancelled while its peers are late", call.error);
    }
  else
    {
      g_usleep (800 * G_TIME_SPAN_MILLISECOND * cp_test_time_factor ());
      since = g_get_monotonic_time ();
      g_assert_false (cp_mesh_barrier (self->mesh, &call.error));
      g_assert_error (call.error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED);
      g_assert_nonnull (strstr (call.error->message, "was cancelled"));
      g_assert_cmpint (ms_since (since), <, 200 * cp_test_time_factor ());
      say_verdict ("a barrier made after a peer's barrier_async was cancelled", call.error);
    }
  g_clear_error (&call.error);
  g_main_loop_unref (call.loop);
  g_main_context_pop_thread_default (context);
}

/* ---- test memory ---- */

/* @host (taken) in test memory. */
static CpTensor *
in_test_memory (CpTensor *host)
{
  g_autoptr(CpTensor) taken = host;
  g_autoptr(GError) error = NULL;
  CpTensor *moved = cp_tensor_to_device (taken, CP_DEVICE_KIND_TEST, &error);

  g_assert_no_error (error);
  return moved;
}

static void
assert_in_test_memory (CpTensor *tensor)
{
  g_assert_cmpint (cp_tensor_get_device (tensor), ==, CP_DEVICE_KIND_TEST);
}

static void
check_gather_in_test_memory (Rank *self)
{
  const gint64 shape[] = { 37 };
  g_autoptr(CpTensor) t = in_test_memory (host_input (CP_DTYPE_FLOAT32, shape, 1, self->rank, 1));
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) gathered = cp_mesh_all_gather (self->mesh, t, 0, &error);

  g_assert_no_error (error);
  assert_in_test_memory (gathered);
  for (int r = 0; r < self->size; r++)
    {
      g_autoptr(CpTensor) piece = cp_tensor_narrow (gathered, 0, r * shape[0], shape[0], &error);

      g_assert_no_error (error);
      assert_input_of (piece, CP_DTYPE_FLOAT32, shape, 1, r, 1, "all_gather in test memory");
    }
}

static void
check_broadcast_in_test_memory (Rank *self)
{
  const gint64 shape[] = { 37 };
  g_autoptr(CpTensor) t = in_test_memory (host_input (CP_DTYPE_FLOAT64, shape, 1, self->rank, 2));
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_broadcast (self->mesh, t, self->size - 1, &error));
  g_assert_no_error (error);
  assert_in_test_memory (t);
  assert_input_of (t, CP_DTYPE_FLOAT64, shape, 1, self->size - 1, 2, "broadcast in test memory");
}

static void
check_reduce_in_test_memory (Rank *self)
{
  const gint64 shape[] = { 37 };
  int n = self->size;
  g_autoptr(CpTensor) t = in_test_memory (cp_tensor_new_full (CP_DTYPE_INT64, shape, 1, self->rank + 1, NULL));
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_reduce (self->mesh, t, CP_REDUCE_OP_SUM, &error));
  g_assert_no_error (error);
  assert_in_test_memory (t);
  host = on_host (t);
  for (gint64 i = 0; i < shape[0]; i++)
    assert_element (host, i, n * (n + 1) / 2, "all_reduce in test memory");
}

static void
check_exchange_in_test_memory (Rank *self)
{
  int n = self->size, rank = self->rank;
  const gint64 shape[] = { 2 * n };
  g_autoptr(CpTensor) t = in_test_memory (host_input (CP_DTYPE_INT32, shape, 1, rank, 3));
  g_autoptr(CpTensor) in = in_test_memory (cp_tensor_new (CP_DTYPE_INT32, shape, 1, NULL));
  g_autoptr(CpTensor) host = NULL;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) exchanged = cp_mesh_all_to_all (self->mesh, t, 0, &error);

  g_assert_no_error (error);
  assert_in_test_memory (exchanged);
  host = on_host (exchanged);
  for (int s = 0; s < n; s++)
    for (int k = 0; k < 2; k++)
      assert_element (host, 2 * s + k, input_value (CP_DTYPE_INT32, s, 2 * rank + k, 3),
                      "all_to_all in test memory");
  g_assert_true (cp_mesh_send_recv (self->mesh, t, (rank + 1) % n, in, (rank + n - 1) % n, 3, &error));
  g_assert_no_error (error);
  assert_in_test_memory (in);
  assert_input_of (in, CP_DTYPE_INT32, shape, 1, (rank + n - 1) % n, 3, "send_recv in test memory");
}

/* Every kind of call on tensors in test memory, which the library may
 * reach only through its memory interface: a backend that moves host
 * memory alone is staged through the host, and the results stay in
 * test memory. */
static void
run_test_memory (Rank *self)
{
  g_autoptr(GError) error = NULL;

  check_gather_in_test_memory (self);
  check_broadcast_in_test_memory (self);
  check_reduce_in_test_memory (self);
  check_exchange_in_test_memory (self);
  g_assert_true (cp_mesh_barrier (self->mesh, &error));
  g_assert_no_error (error);
}

/* Never reached: no rank may join a mesh whose last rank never came. */
static void
run_join (Rank *self)
{
  g_error ("%s: rank %d joined a mesh of %d whose last rank never came", backend->name, self->rank,
           self->size);
}

/* ---- the table ---- */

static const Case cases[] = {
  { "barrier/repeated", "Twenty barriers in a row", run_barriers, 3 },
  { "world/one-rank", "a mesh of one rank: every collective of every dtype", run_one_rank, 1 },
  { "all-gather/every-dtype", "all_gather of every dtype along every dimension, -1 too", run_all_gather_dtypes, 3 },
  { "all-gather/odd-sizes", "all_gather of one element, prime counts, empty pieces and large ones",
    run_all_gather_sizes, 3 },
  { "all-gather/into", "all_gather_into a given output; one rank's wrong output fails every rank",
    run_all_gather_into, 3 },
  { "all-to-all/every-dtype", "all_to_all of every dtype", run_all_to_all_dtypes, 3 },
  { "all-to-all/odd-sizes", "all_to_all of one element per rank, prime counts, empty and large pieces",
    run_all_to_all_sizes, 3 },
  { "all-to-all/indivisible", "all_to_all of a length the world size does not divide fails every rank",
    run_all_to_all_indivisible, 3 },
  { "all-reduce/sum", "all_reduce sum of every dtype and odd sizes, against float64", run_all_reduce, 3,
    .data = GINT_TO_POINTER (CP_REDUCE_OP_SUM) },
  { "all-reduce/max", "all_reduce max of every dtype and odd sizes", run_all_reduce, 3,
    .data = GINT_TO_POINTER (CP_REDUCE_OP_MAX) },
  { "all-reduce/min", "all_reduce min of every dtype and odd sizes", run_all_reduce, 3,
    .data = GINT_TO_POINTER (CP_REDUCE_OP_MIN) },
  { "broadcast/every-root", "broadcast from each root, every dtype, one element to large",
    run_broadcast_roots, 3 },
  { "broadcast/bad-root", "broadcast from a root outside the mesh fails every rank", run_broadcast_bad_root, 3 },
  { "send-recv/ring", "send_recv round the ring, every dtype, one element to large", run_ring, 3 },
  { "send-recv/pair", "send and recv by tag between two ranks while a third idles", run_pair, 3 },
  { "send-recv/mismatch", "a send and a receive that disagree fail on both sides; the mesh goes on",
    run_p2p_mismatch, 3, .shared_failure = TRUE },
  { "submesh/2d", "every collective on each dimension's submesh of a dp=2 × cp=2 mesh", run_submeshes, 4,
    "dp=2,cp=2" },
  { "submesh/uneven", "every collective on each dimension's submesh of a dp=3 × cp=2 mesh", run_submeshes, 6,
    "dp=3,cp=2" },
  { "disagree/shape", "ranks passing different shapes all fail alike", run_disagreement, 3,
    .data = GINT_TO_POINTER (DISAGREE_SHAPE) },
  { "disagree/dtype", "ranks passing different dtypes all fail alike", run_disagreement, 3,
    .data = GINT_TO_POINTER (DISAGREE_DTYPE) },
  { "disagree/operation", "ranks calling different collectives all fail alike", run_disagreement, 3,
    .data = GINT_TO_POINTER (DISAGREE_OPERATION) },
  { "disagree/reduce-op", "ranks passing different reduce ops all fail alike", run_disagreement, 3,
    .data = GINT_TO_POINTER (DISAGREE_REDUCE_OP) },
  { "disagree/root", "ranks naming different broadcast roots all fail alike", run_disagreement, 3,
    .data = GINT_TO_POINTER (DISAGREE_ROOT) },
  { "join/missing-last-rank", "a rank that never comes: every other fails to join, TIMED_OUT, within the "
    "timeout", run_join, 3, .fault = FAULT_MISSING, .timeout_ms = 500, .data = GINT_TO_POINTER (2) },
  { "join/missing-rank-0", "rank 0 never comes: every other rank fails to join, TIMED_OUT, within the "
    "timeout", run_join, 3, .fault = FAULT_MISSING, .timeout_ms = 500, .data = GINT_TO_POINTER (0) },
  { "fault/killed-rank", "a rank killed in the middle of all_gathers: every survivor fails the same call "
    "with PEER_LOST, and every later call", run_killed, 3, .fault = FAULT_KILLED, .timeout_ms = FAULT_TIMEOUT_MS },
  { "fault/stopped-rank", "a rank stopped past the timeout in the middle of all_gathers: every rank fails the "
    "same call with TIMED_OUT, the stopped one too once it goes on", run_stopped, 3, .fault = FAULT_STOPPED,
    .timeout_ms = FAULT_TIMEOUT_MS, .shared_failure = TRUE },
  { "cancel/recv-async", "an async receive cancelled on one rank fails there and on its peer, CANCELLED, "
    "and every later call", run_cancel, 2, .timeout_ms = 20000,
    .shared_failure = TRUE },
  { "cancel/barrier-async", "a barrier_async cancelled while its peers are late fails, CANCELLED, and so "
    "does each peer's barrier when it comes", run_cancel_late_peers, 3, .timeout_ms = 20000,
    .shared_failure = TRUE },
  { "device/test-memory", "every kind of call on tensors in test memory", run_test_memory, 3 },
};

/* ---- what the ranks said ---- */

typedef struct
{
  GPtrArray *lines;     /* char* */
  gboolean exited;      /* normally: with a status */
  int status;           /* exit status, or 128 + the signal */
} Said;

static void
said_clear (Said *said)
{
  g_clear_pointer (&said->lines, g_ptr_array_unref);
}

static const char *
said_find (const Said *said,
           const char *prefix)
{
  for (guint i = 0; i < said->lines->len; i++)
    if (g_str_has_prefix (said->lines->pdata[i], prefix))
      return said->lines->pdata[i];
  return NULL;
}

/* The error a line "WHAT\tDOMAIN\tCODE\tMS\tMESSAGE" reported. */
static GError *
parse_error (const char *line,
             gint64     *ms)
{
  g_auto(GStrv) fields = g_strsplit (line, "\t", 5);

  g_assert_cmpuint (g_strv_length (fields), ==, 5);
  if (ms != NULL)
    *ms = g_ascii_strtoll (fields[3], NULL, 10);
  return g_error_new_literal (g_quark_from_string (fields[1]), (int) g_ascii_strtoll (fields[2], NULL, 10),
                              fields[4]);
}

static GError *
said_dup_error (const Said *said,
                int         rank,
                const char *what,
                gint64     *ms)
{
  g_autofree char *prefix = g_strconcat (what, "\t", NULL);
  const char *line = said_find (said, prefix);

  if (line == NULL)
    g_error ("%s: rank %d reported no \"%s\"", backend->name, rank, what);
  return parse_error (line, ms);
}

static char *
subject (void)
{
  return g_strdup_printf ("CpMesh (%s)", backend->name);
}

static void
record_case (const char   *what,
             const GError *error)
{
  g_autofree char *who = subject ();

  cp_test_record_error (who, what, error);
}

/* The lowest rank that reported a line starting with @prefix, or -1. */
static int
first_to_say (const Said *said,
              int         n,
              const char *prefix)
{
  for (int r = 0; r < n; r++)
    if (said_find (&said[r], prefix) != NULL)
      return r;
  return -1;
}

/* Every rank that reported a verdict gave it alike (domain and code);
 * the first rank's is recorded. */
static void
check_verdicts (const Said *said,
                int         n)
{
  for (int r = 0; r < n; r++)
    for (guint i = 0; i < said[r].lines->len; i++)
      {
        const char *line = said[r].lines->pdata[i];
        const char *tab = strchr (line, '\t');
        g_autofree char *prefix = NULL;
        g_autofree char *what = NULL;
        g_autoptr(GError) mine = NULL;

        if (!g_str_has_prefix (line, "VERDICT ") || tab == NULL)
          continue;
        prefix = g_strndup (line, (gsize) (tab - line) + 1);
        what = g_strndup (line + strlen ("VERDICT "), (gsize) (tab - line) - strlen ("VERDICT "));
        /* Checked once, from the first rank that reported it. */
        if (first_to_say (said, n, prefix) != r)
          continue;
        mine = parse_error (line, NULL);
        for (int other = r + 1; other < n; other++)
          {
            const char *their_line = said_find (&said[other], prefix);
            g_autoptr(GError) theirs = their_line != NULL ? parse_error (their_line, NULL) : NULL;

            if (theirs != NULL && !g_error_matches (theirs, mine->domain, mine->code))
              g_error ("%s: %s: rank %d got %s %d (%s), rank %d %s %d (%s)", backend->name,
                       what, r, g_quark_to_string (mine->domain), mine->code,
                       mine->message, other, g_quark_to_string (theirs->domain), theirs->code,
                       theirs->message);
          }
        record_case (what, mine);
      }
}

/* ---- ranks on threads ---- */

static void
rank_thread (CpMesh   *mesh,
             gpointer  user_data)
{
  Rank *self = user_data;

  g_private_set (&current_rank, self);
  self->c->func (self);
  say ("DONE");
  g_private_set (&current_rank, NULL);
}

typedef struct
{
  int rank;
  const Case *c;
  guint port;
  CpMesh *mesh;
  GError *error;
  gint64 ms;
} Join;

static gboolean
parse_dims (const char  *dims,
            GStrv       *names,
            int        **sizes,
            gsize       *n_dims)
{
  g_auto(GStrv) parts = NULL;

  if (dims == NULL)
    return FALSE;
  parts = g_strsplit (dims, ",", -1);
  *n_dims = g_strv_length (parts);
  *names = g_new0 (char *, *n_dims + 1);
  *sizes = g_new0 (int, *n_dims);
  for (gsize d = 0; d < *n_dims; d++)
    {
      g_auto(GStrv) pair = g_strsplit (parts[d], "=", 2);

      (*names)[d] = g_strdup (pair[0]);
      (*sizes)[d] = (int) g_ascii_strtoll (pair[1], NULL, 10);
    }
  return TRUE;
}

/* The rank that never joins, or -1. */
static int
absent_rank (const Case *c)
{
  return c->fault == FAULT_MISSING ? GPOINTER_TO_INT (c->data) : -1;
}

static guint
case_timeout (const Case *c)
{
  return (c->timeout_ms != 0 ? c->timeout_ms : LONG_TIMEOUT_MS) * cp_test_time_factor ();
}

static gpointer
join_thread (gpointer data)
{
  Join *join = data;
  g_autoptr(CpMeshOptions) options = cp_mesh_options_new ();
  g_auto(GStrv) names = NULL;
  g_autofree int *sizes = NULL;
  gsize n_dims = 0;
  gint64 since = g_get_monotonic_time ();

  cp_mesh_options_set_rank (options, join->rank);
  cp_mesh_options_set_world_size (options, join->c->size);
  cp_mesh_options_set_port (options, join->port);
  cp_mesh_options_set_timeout_ms (options, case_timeout (join->c));
  cp_mesh_options_set_transport (options, backend->name);
  if (parse_dims (join->c->dims, &names, &sizes, &n_dims))
    cp_mesh_options_set_dims (options, (const char * const *) names, sizes, n_dims);
  join->mesh = cp_mesh_new_with_options (options, &join->error);
  join->ms = ms_since (since);
  return NULL;
}

/* The meshes of a local group of @c's shape, in rank order. */
static CpMesh **
make_local_group (const Case *c)
{
  CpMesh **meshes = g_new0 (CpMesh *, c->size);
  g_auto(GStrv) names = NULL;
  g_autofree int *sizes = NULL;
  gsize n_dims = 0;
  g_autoptr(GError) error = NULL;
  GList *group;
  int r = 0;

  if (!parse_dims (c->dims, &names, &sizes, &n_dims))
    {
      names = g_strdupv ((char *[]) { "cp", NULL });
      sizes = g_memdup2 (&c->size, sizeof (int));
      n_dims = 1;
    }
  group = cp_mesh_new_local_group ((const char * const *) names, sizes, n_dims, &error);
  g_assert_no_error (error);
  for (GList *l = group; l != NULL; l = l->next, r++)
    {
      meshes[r] = l->data;
      cp_mesh_set_timeout_ms (meshes[r], case_timeout (c));
    }
  g_list_free (group);
  return meshes;
}

/* The meshes of @c's ranks, each joining on a thread of its own (all
 * but the last when it never comes); a rank that could not join has
 * NULL, and its error said as "ERROR". */
static CpMesh **
join_on_threads (const Case *c,
                 Said       *said)
{
  static guint next_port = 1;
  CpMesh **meshes = g_new0 (CpMesh *, c->size);
  g_autofree Join *joins = g_new0 (Join, c->size);
  g_autofree GThread **threads = g_new0 (GThread *, c->size);

  /* The port only names the meeting among this process's threads. */
  for (int r = 0; r < c->size; r++)
    {
      joins[r] = (Join) { r, c, next_port };
      if (r != absent_rank (c))
        threads[r] = g_thread_new ("cp-join", join_thread, &joins[r]);
    }
  next_port++;
  for (int r = 0; r < c->size; r++)
    {
      if (threads[r] == NULL)
        continue;
      g_thread_join (threads[r]);
      meshes[r] = joins[r].mesh;
      if (joins[r].error != NULL)
        {
          g_autofree char *flat = g_strdelimit (g_strdup (joins[r].error->message), "\t\n", ' ');

          g_ptr_array_add (said[r].lines, g_strdup_printf ("ERROR\t%s\t%d\t%" G_GINT64_FORMAT "\t%s",
                                                           g_quark_to_string (joins[r].error->domain),
                                                           joins[r].error->code, joins[r].ms, flat));
          g_clear_error (&joins[r].error);
        }
    }
  return meshes;
}

static void
run_on_threads (const Case *c,
                Said       *said)
{
  g_autofree CpMesh **meshes = NULL;
  g_autofree Rank *ranks = g_new0 (Rank, c->size);
  g_autofree gpointer *rank_data = g_new0 (gpointer, c->size);
  GList *joined = NULL;
  g_autoptr(GError) error = NULL;

  cp_harness_set_up_glib ();
  meshes = backend->ranks == RANKS_LOCAL_GROUP ? make_local_group (c) : join_on_threads (c, said);
  for (int r = c->size - 1; r >= 0; r--)
    {
      said[r].exited = TRUE;
      if (meshes[r] == NULL)
        {
          said[r].status = 3;
          continue;
        }
      ranks[r] = (Rank) { meshes[r], r, c->size, TRUE, said[r].lines, c };
      joined = g_list_prepend (joined, meshes[r]);
    }
  /* Every rank joined, or none runs the case. */
  if (g_list_length (joined) == (guint) c->size)
    {
      for (int r = 0; r < c->size; r++)
        rank_data[r] = &ranks[r];
      if (!cp_harness_run_threads (joined, rank_thread, rank_data, 60000 * cp_test_time_factor (), &error))
        g_error ("%s: %s", backend->name, error->message);
    }
  for (int r = 0; r < c->size; r++)
    g_clear_object (&ranks[r].mesh);
  g_list_free (joined);
}

/* ---- ranks as processes ---- */

static gboolean
all_said_done (CpTestRank **ranks,
               guint        n)
{
  return cp_test_all_said (ranks, n, "DONE");
}

static void
run_as_processes (const Case *c,
                  Said       *said)
{
  guint16 port = cp_test_free_port ();
  CpTestGroup group = { program_name };
  g_autofree char *transport = g_strconcat ("CPMESH_TRANSPORT=", backend->name, NULL);
  g_autofree char *which = g_strconcat (CASE_VARIABLE "=", c->path, NULL);
  g_autofree char *timeout = g_strdup_printf ("CPMESH_TIMEOUT_MS=%u", case_timeout (c));
  g_autofree char *dims = c->dims != NULL ? g_strconcat ("CPMESH_MESH_DIMS=", c->dims, NULL) : NULL;
  const char *settings[] = { transport, which, timeout, dims, NULL };
  int rank_of[G_N_ELEMENTS (group.ranks)];
  CpTestRank *victim;

  for (int r = 0; r < c->size; r++)
    if (r != absent_rank (c))
      {
        rank_of[group.n] = r;
        cp_test_group_spawn (&group, "rank", r, c->size, port, settings);
      }
  victim = group.ranks[group.n - 1];
  if (c->fault == FAULT_KILLED || c->fault == FAULT_STOPPED)
    {
      cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
      cp_test_run_for (50);
    }
  if (c->fault == FAULT_KILLED && !cp_test_rank_is_done (victim))
    g_subprocess_send_signal (victim->process, SIGKILL);
  if (c->fault == FAULT_STOPPED && !cp_test_rank_is_done (victim))
    {
      g_subprocess_send_signal (victim->process, SIGSTOP);
      cp_test_run_for (1300 * FAULT_TIMEOUT_MS * cp_test_time_factor () / 1000);
      g_subprocess_send_signal (victim->process, SIGCONT);
    }
  /* Every rank keeps its mesh until all are done, as threads do. */
  cp_test_run_until (group.ranks, group.n, all_said_done);
  for (guint r = 0; r < group.n; r++)
    cp_test_rank_release (group.ranks[r]);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (guint i = 0; i < group.n; i++)
    {
      CpTestRank *rank = group.ranks[i];
      Said *mine = &said[rank_of[i]];

      for (guint k = 0; k < rank->lines->len; k++)
        g_ptr_array_add (mine->lines, g_strdup (rank->lines->pdata[k]));
      mine->exited = TRUE;
      mine->status = cp_harness_exit_status (rank->process);
    }
  cp_test_group_clear (&group);
}

static void
run_nothing (Rank *self)
{
}

/* A mesh of one process: whether this build has the backend at all. */
static const Case probe_case = { "probe", "whether the backend is built", run_nothing, 1 };

/* What a rank process does: join, play, report, and keep its mesh until
 * the test closes its stdin. */
static int
play_rank (const char *path)
{
  const Case *c = g_str_equal (path, probe_case.path) ? &probe_case : NULL;
  g_autoptr(GError) error = NULL;
  Rank self = { 0 };
  gint64 since = g_get_monotonic_time ();
  char line[16];

  setvbuf (stdout, NULL, _IOLBF, 0);
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    if (g_str_equal (cases[i].path, path))
      c = &cases[i];
  g_assert_nonnull (c);
  self.mesh = cp_mesh_new_from_env (&error);
  if (self.mesh == NULL)
    {
      say_error ("ERROR", error, since);
      return 3;
    }
  self.rank = cp_mesh_get_rank (self.mesh);
  self.size = cp_mesh_get_world_size (self.mesh);
  self.c = c;
  g_assert_cmpstr (cp_mesh_get_backend (self.mesh), ==, g_getenv ("CPMESH_TRANSPORT"));
  c->func (&self);
  say ("DONE");
  while (fgets (line, sizeof line, stdin) != NULL)
    ;
  g_clear_object (&self.mesh);
  return 0;
}

/* ---- the checks around a case ---- */

/* Every rank that came failed to join, UNSUPPORTED: the backend is not
 * in this build (or not usable here). */
static char *
dup_unsupported (const Said *said,
                 int         n,
                 int         absent)
{
  g_autoptr(GError) first = NULL;

  for (int r = 0; r < n; r++)
    {
      const char *line;
      g_autoptr(GError) error = NULL;

      if (r == absent)
        continue;
      line = said_find (&said[r], "ERROR\t");
      error = line != NULL ? parse_error (line, NULL) : NULL;

      if (error == NULL || !g_error_matches (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED))
        return NULL;
      if (first == NULL)
        first = g_steal_pointer (&error);
    }
  return g_strdup_printf ("backend %s: %s", backend->name, first->message);
}

static void
assert_ran (const Said *said,
            int         rank)
{
  if (!said->exited || said->status != 0 || said_find (said, "DONE") == NULL)
    {
      g_autofree char *lines = NULL;

      g_ptr_array_add (said->lines, NULL);
      lines = g_strjoinv ("\n  ", (char **) said->lines->pdata);
      g_ptr_array_remove_index (said->lines, said->lines->len - 1);
      g_error ("%s: rank %d ended with status %d, having said:\n  %s", backend->name, rank, said->status, lines);
    }
}

static void
check_missing (const Case *c,
               Said       *said)
{
  guint limit = case_timeout (c) + 3000 * cp_test_time_factor ();
  int absent = absent_rank (c);

  for (int r = 0; r < c->size; r++)
    {
      gint64 ms;
      g_autoptr(GError) error = NULL;

      if (r == absent)
        continue;
      error = said_dup_error (&said[r], r, "ERROR", &ms);
      g_test_message ("rank %d: %s (%" G_GINT64_FORMAT " ms)", r, error->message, ms);
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT);
      g_assert_cmpint (ms, <=, limit);
      g_assert_cmpint (said[r].status, ==, 3);
      if (absent == 0 && r == 1)
        record_case ("rank 0 never comes: the other ranks fail to join within the timeout", error);
      else if (absent != 0 && r == 0)
        record_case ("a rank that never comes: rank 0 fails to join within the timeout", error);
      else if (absent != 0 && r == 1)
        record_case ("a rank that never comes: another rank fails to join within the timeout", error);
    }
}

/* What a message "…mesh broken: rank R timed out in all_gather #7: …"
 * says broke the mesh, without the rank that saw it first: "timed out
 * in all_gather #7".  Two ranks whose waits end at the same moment may
 * each have seen the failure first; they must agree on what and where. */
static char *
dup_failure_named (const char *message)
{
  const char *named = strstr (message, "mesh broken: rank ");
  const char *end;

  if (named == NULL)
    return NULL;
  named += strlen ("mesh broken: rank ");
  while (g_ascii_isdigit (*named))
    named++;
  end = strchr (named, ':');
  return g_strndup (named, end != NULL ? (gsize) (end - named) : strlen (named));
}

/* Every rank that lived failed the same call with @code, within the
 * timeout, and its next call at once. */
static void
check_fault (const Case *c,
             Said       *said,
             int         code,
             int         survivors)
{
  guint limit = case_timeout (c) + 3000 * cp_test_time_factor ();
  const char *first_at = NULL;
  g_autofree char *first_named = NULL;

  for (int r = 0; r < survivors; r++)
    {
      gint64 ms, later_ms;
      g_autoptr(GError) failed = said_dup_error (&said[r], r, "FAILED", &ms);
      g_autoptr(GError) later = said_dup_error (&said[r], r, "LATER", &later_ms);
      const char *at = said_find (&said[r], "FAILED_AT ");

      assert_ran (&said[r], r);
      g_test_message ("rank %d: %s (%" G_GINT64_FORMAT " ms); %s; later: %s (%" G_GINT64_FORMAT " ms)", r,
                      failed->message, ms, at, later->message, later_ms);
      if (!g_error_matches (failed, CP_MESH_ERROR, code))
        g_error ("%s: rank %d failed with %s %d (%s), expected CpMeshError %d", backend->name, r,
                 g_quark_to_string (failed->domain), failed->code, failed->message, code);
      g_assert_error (later, CP_MESH_ERROR, code);
      g_assert_cmpint (ms, <=, limit);
      g_assert_cmpint (later_ms, <=, 500 * cp_test_time_factor ());
      /* The same call failed everywhere. */
      g_assert_nonnull (at);
      if (first_at == NULL)
        first_at = at;
      g_assert_cmpstr (at, ==, first_at);
      /* Where one failure is every rank's, later calls name a failure
       * of the same kind in the same call everywhere. */
      if (backend->lone_failures == NULL)
        {
          g_autofree char *named = dup_failure_named (later->message);

          if (named == NULL)
            g_error ("%s: rank %d's later call does not name the failure that broke the mesh: %s",
                     backend->name, r, later->message);
          if (first_named == NULL)
            first_named = g_strdup (named);
          g_assert_cmpstr (named, ==, first_named);
        }
      if (r == 0)
        {
          record_case (c->fault == FAULT_KILLED ? "a rank killed in the middle of all_gathers (survivors)"
                                                : "a rank stopped past the timeout in the middle of "
                                                  "all_gathers (every rank, the stopped one once it goes on)",
                       failed);
          record_case (c->fault == FAULT_KILLED ? "a call after a rank was killed (survivors, at once)"
                                                : "a call after a rank was stopped past the timeout (at once)",
                       later);
        }
    }
}

/* Why this build cannot run the backend's cases, or NULL. */
static char *unbuilt;

static char *
probe_backend (void)
{
  Said said = { g_ptr_array_new_with_free_func (g_free) };
  char *why;

  run_as_processes (&probe_case, &said);
  why = dup_unsupported (&said, 1, -1);
  said_clear (&said);
  return why;
}

static void
skip_unbuilt (void)
{
  g_test_skip (unbuilt);
}

static void
test_case (gconstpointer data)
{
  const Case *c = data;
  g_autofree Said *said = g_new0 (Said, c->size);
  g_autofree char *unsupported = NULL;
  int victim = c->size - 1;

  g_test_summary (c->summary);
  if (c->fault == FAULT_MISSING && backend->ranks == RANKS_LOCAL_GROUP)
    {
      g_test_skip ("a local group is made whole by one call: no rank can fail to join it");
      return;
    }
  if (c->shared_failure && backend->lone_failures != NULL)
    {
      g_test_skip (backend->lone_failures);
      return;
    }
  for (int r = 0; r < c->size; r++)
    said[r].lines = g_ptr_array_new_with_free_func (g_free);
  if (backend->ranks == RANKS_PROCESSES)
    run_as_processes (c, said);
  else
    run_on_threads (c, said);

  unsupported = dup_unsupported (said, c->size, absent_rank (c));
  if (unsupported != NULL)
    g_test_skip (unsupported);
  else if (c->fault == FAULT_MISSING)
    check_missing (c, said);
  else if (c->fault == FAULT_KILLED)
    {
      check_fault (c, said, CP_MESH_ERROR_PEER_LOST, c->size - 1);
      if (backend->ranks == RANKS_PROCESSES)
        g_assert_cmpint (said[victim].status, ==, 128 + SIGKILL);
    }
  else if (c->fault == FAULT_STOPPED)
    check_fault (c, said, CP_MESH_ERROR_TIMED_OUT, c->size);
  else
    {
      for (int r = 0; r < c->size; r++)
        assert_ran (&said[r], r);
      check_verdicts (said, c->size);
    }
  for (int r = 0; r < c->size; r++)
    said_clear (&said[r]);
}

int
main (int    argc,
      char **argv)
{
  const char *name = g_getenv ("CP_TEST_TRANSPORT");
  const char *rank_case = g_getenv (CASE_VARIABLE);

  for (guint i = 0; i < G_N_ELEMENTS (backends); i++)
    if (g_strcmp0 (backends[i].name, name != NULL ? name : "local") == 0)
      backend = &backends[i];
  if (backend == NULL)
    g_error ("CP_TEST_TRANSPORT=%s names no backend this suite knows", name);
  program_name = g_path_get_basename (argv[0]);
  if (rank_case != NULL)
    return play_rank (rank_case);

  g_test_init (&argc, &argv, NULL);
  /* Ranks as processes of a backend the build lacks would fail to join
   * once per case: one mesh of one process finds out for all of them,
   * in the program that runs the subtests. */
  if (backend->ranks == RANKS_PROCESSES && !g_test_subprocess ())
    unbuilt = probe_backend ();
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strconcat ("/Cp/Conformance/", cases[i].path, NULL);

      if (unbuilt != NULL)
        cp_test_add_func_in_process (path, skip_unbuilt);
      else
        g_test_add_data_func (path, &cases[i], test_case);
    }
  return g_test_run ();
}
