/* test-layout.vala: Cp.Layout from Vala, through the generated VAPI
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

static int64[] local_indices (Cp.Layout layout, int rank) {
  var t = layout.get_local_indices (rank);
  var out = new int64[t.get_numel ()];

  for (int i = 0; i < out.length; i++)
    out[i] = (int64) t.get_value (i);
  return out;
}

static void assert_indices (Cp.Layout layout, int rank, int64[] expected) {
  var got = local_indices (layout, rank);

  assert_cmpint (got.length, EQ, expected.length);
  for (int i = 0; i < got.length; i++)
    assert_cmpint ((int) got[i], EQ, (int) expected[i]);
}

/* SEED-SEMANTICS E1 and E6. */
static void test_examples () {
  try {
    var c2 = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 8, 2);
    var c4 = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 16, 4);
    var thd = new Cp.Layout.thd ({ 0, 8, 12 }, 2);

    assert_indices (c2, 0, { 0, 1, 6, 7 });
    assert_indices (c2, 1, { 2, 3, 4, 5 });
    assert_indices (c4, 3, { 6, 7, 8, 9 });
    assert_indices (thd, 0, { 0, 1, 6, 7, 8, 11 });
    assert_indices (thd, 1, { 2, 3, 4, 5, 9, 10 });
    assert_cmpint (c4.get_cp_size (), EQ, 4);
    assert_cmpuint (thd.get_n_documents (), EQ, 2);

    var restore = c2.get_restore_indices ();
    int64[] expected = { 0, 1, 4, 5, 6, 7, 2, 3 };
    for (int i = 0; i < expected.length; i++)
      assert_cmpfloat (restore.get_value (i), EQ, expected[i]);
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_round_trip () {
  try {
    var layout = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 16, 4);
    var full = new Cp.Tensor (Cp.DType.FLOAT64, { 3, 16, 2 });
    for (int i = 0; i < full.get_numel (); i++)
      full.set_value (i, i * 0.5);

    var pieces = new Cp.Tensor[4];
    for (int r = 0; r < 4; r++)
      pieces[r] = layout.shard (full, 1, r);
    assert_cmpint ((int) pieces[0].get_dim (1), EQ, 4);

    var back = layout.unshard_pieces (pieces, 1);
    assert_true (back.equal (full));
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_cost_and_fingerprint () {
  try {
    var ht = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 16, 4);
    var contiguous = new Cp.Layout (Cp.LoadBalance.CONTIGUOUS, 16, 4);

    assert_cmpfloat (ht.get_imbalance (), EQ, 1.0);
    assert_cmpfloat (ht.get_cost (0), EQ, ht.get_cost (3));
    assert_cmpfloat (contiguous.get_imbalance (), GT, 1.5);
    /* The same value as in C and Python. */
    assert_true (ht.fingerprint () == 0x60d6407a50e9d88eULL);
    assert_false (ht.equal (contiguous));
    Cp.Layout alias = ht; /* a second reference, taken with cp_layout_ref () */
    assert_true (alias.equal (ht));
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_errors () {
  try {
    var layout = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 6, 2);
    assert_null (layout);
  } catch (Cp.TensorError.SHAPE e) {
    assert_true ("sequence length 6 is not a non-negative multiple of 4" in e.message);
  } catch (Error e) {
    assert_no_error (e);
  }

  try {
    var layout = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 8, 2);
    var wrong = new Cp.Tensor (Cp.DType.INT64, { 2, 10 });
    var piece = layout.shard (wrong, 1, 0);
    assert_null (piece);
  } catch (Cp.TensorError.SHAPE e) {
    assert_true ("has length 10, the layout needs 8" in e.message);
  } catch (Error e) {
    assert_no_error (e);
  }
}

int main (string[] args) {
  Test.init (ref args);
  Test.add_func ("/Cp/Vala/Layout/indices/examples", test_examples);
  Test.add_func ("/Cp/Vala/Layout/shard/round-trip", test_round_trip);
  Test.add_func ("/Cp/Vala/Layout/cost/fingerprint", test_cost_and_fingerprint);
  Test.add_func ("/Cp/Vala/Layout/errors/shape", test_errors);
  return Test.run ();
}
