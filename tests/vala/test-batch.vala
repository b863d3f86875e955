/* test-batch.vala: Cp.Batch.prepare, Cp.Context and Cp.Attention from Vala:
 * two ranks on threads, and four ranks driven from one main loop with the
 * async methods, each rank's values checked
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

Cp.Tensor row (int64[] values) throws GLib.Error {
    var tensor = new Cp.Tensor (Cp.DType.INT64, { 1, values.length });
    for (int i = 0; i < values.length; i++)
        tensor.set_value (i, values[i]);
    return tensor;
}

void assert_values (Cp.Tensor tensor, int64[] values) {
    assert_cmpint ((int) tensor.get_numel (), CompareOperator.EQ, values.length);
    for (int i = 0; i < values.length; i++)
        assert_cmpfloat (tensor.get_value (i), CompareOperator.EQ, values[i]);
}

/* E2 with enter and exit, then run() with a closure. */
bool e2_rank (Cp.Mesh mesh) {
    try {
        var batch = new Cp.Batch ();
        batch.set ("input_ids", row ({ 11, 12, 13, 14, 15, 16 }));
        batch.set ("labels", row ({ 1, 2, 3, 4, 5, 6 }));
        var context = batch.prepare (mesh, null);
        var ids = batch.get ("input_ids");
        var positions = batch.get ("position_ids");
        assert_values (positions, { 0, 1, 2, 3, 4, 5, 0, 0 });
        context.enter ();
        if (mesh.get_rank () == 0)
            assert_values (ids, { 11, 12, 0, 0 });
        else
            assert_values (ids, { 13, 14, 15, 16 });
        context.exit ();
        assert_values (positions, { 0, 1, 2, 3, 4, 5, 0, 0 });

        int entered_len = 0;
        context.run ((ctx) => {
            entered_len = (int) positions.get_dim (1);
        });
        assert_cmpint (entered_len, CompareOperator.EQ, 4);
        assert (!context.is_entered);
    } catch (GLib.Error e) {
        error ("rank %d: %s", mesh.get_rank (), e.message);
    }
    return true;
}

void test_two_ranks () {
    try {
        var meshes = Cp.Mesh.new_local_group ({ "cp" }, { 2 });
        Thread<bool>[] threads = {};
        foreach (var mesh in meshes)
            threads += new Thread<bool> ("rank", () => e2_rank (mesh));
        foreach (var thread in threads)
            assert (thread.join ());
    } catch (GLib.Error e) {
        error ("%s", e.message);
    }
}

/* A batch without a primary buffer: every rank fails with the same
 * error, since prepare is called by all ranks together. */
bool error_rank (Cp.Mesh mesh) {
    try {
        var batch = new Cp.Batch ();
        batch.set ("labels", row ({ 1, 2 }));
        batch.prepare (mesh, null);
        assert_not_reached ();
    } catch (Cp.BatchError.MISSING_KEY e) {
        assert ("exactly one" in e.message);
    } catch (GLib.Error e) {
        error ("unexpected error: %s", e.message);
    }
    return true;
}

void test_errors () {
    try {
        var meshes = Cp.Mesh.new_local_group ({ "cp" }, { 2 });
        Thread<bool>[] threads = {};
        foreach (var mesh in meshes)
            threads += new Thread<bool> ("rank", () => error_rank (mesh));
        foreach (var thread in threads)
            assert (thread.join ());
    } catch (GLib.Error e) {
        error ("%s", e.message);
    }
}

/* ---- four ranks from one main loop ---- */

const int RANKS = 4;
const int REAL = 13;      /* tokens; prepare pads them to 16 */
const int PADDED = 16;

Cp.Tensor smooth (int64 length, uint seed) throws GLib.Error {
    var tensor = new Cp.Tensor (Cp.DType.FLOAT32, { 1, 1, length, 8 });
    for (int64 i = 0; i < tensor.get_numel (); i++)
        tensor.set_value (i, i < REAL * 8 ? ((i * 37 + seed * 11) % 101) / 101.0 - 0.5 : 0.0);
    return tensor;
}

Cp.Attention attention_on (Cp.Mesh mesh) throws GLib.Error {
    var options = new Cp.AttentionOptions ();
    options.set_causal (true);
    options.set_seq_lens ({ REAL });
    return new Cp.Attention (mesh, options);
}

/* One rank's step, every call yielded to the main loop; asserts this
 * rank's values and returns the attention output, unsharded. */
async Cp.Tensor rank_step (Cp.Mesh mesh) throws GLib.Error {
    int r = mesh.get_rank ();
    int64[] ids = {};
    for (int i = 0; i < REAL; i++)
        ids += 1000 + i;
    var batch = new Cp.Batch ();
    batch.set ("input_ids", row (ids));
    batch.set ("labels", row (ids));
    batch.set ("q", smooth (REAL, 1));
    batch.set ("kv", smooth (REAL, 2));
    var options = new Cp.BatchOptions ();
    options.add_extra_buffer ("q", 2);
    options.add_extra_buffer ("kv", 2);
    var context = yield batch.prepare_async (mesh, options, null);
    yield context.enter_async (null);

    /* Chunks r and 2·RANKS−1−r of 2·RANKS, two tokens each; padding is 0. */
    int64 tail = 2 * (2 * RANKS - 1 - r);
    int64[] mine = { 2 * r, 2 * r + 1, tail, tail + 1 };
    for (int i = 0; i < 4; i++)
        mine[i] = mine[i] < REAL ? 1000 + mine[i] : 0;
    assert_values (batch.get ("input_ids"), mine);

    Cp.Tensor output, lse;
    var attention = attention_on (mesh);
    yield attention.forward_async (batch.get ("q"), batch.get ("kv"), batch.get ("kv"), null, out output, out lse);
    yield context.exit_async (null);
    assert (!context.is_entered);
    return yield context.unshard_async (output, 2, null);
}

void test_four_ranks_async () {
    try {
        Cp.Tensor expected, lse;
        var one = Cp.Mesh.new_local_group ({ "cp" }, { 1 });
        attention_on (one.data).forward (smooth (PADDED, 1), smooth (PADDED, 2), smooth (PADDED, 2),
                                         out expected, out lse);

        var meshes = Cp.Mesh.new_local_group ({ "cp" }, { RANKS });
        var loop = new MainLoop ();
        int done = 0;
        foreach (var mesh in meshes) {
            rank_step.begin (mesh, (obj, res) => {
                try {
                    var whole = rank_step.end (res);
                    for (int64 i = 0; i < expected.get_numel (); i++)
                        assert_cmpfloat_with_epsilon (whole.get_value (i), expected.get_value (i), 1e-5);
                } catch (GLib.Error e) {
                    error ("rank %d: %s", mesh.get_rank (), e.message);
                }
                if (++done == RANKS)
                    loop.quit ();
            });
        }
        loop.run ();
        assert_cmpint (done, CompareOperator.EQ, RANKS);
    } catch (GLib.Error e) {
        error ("%s", e.message);
    }
}

int main (string[] args) {
    Test.init (ref args);
    Test.add_func ("/Cp/Vala/Batch/two-ranks", test_two_ranks);
    Test.add_func ("/Cp/Vala/Batch/errors", test_errors);
    Test.add_func ("/Cp/Vala/Batch/four-ranks-async", test_four_ranks_async);
    return Test.run ();
}
