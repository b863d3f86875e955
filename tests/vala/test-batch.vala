/* test-batch.vala: Cp.Batch.prepare and Cp.Context from Vala, two ranks on
 * threads
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

int main (string[] args) {
    Test.init (ref args);
    Test.add_func ("/Cp/Vala/Batch/two-ranks", test_two_ranks);
    Test.add_func ("/Cp/Vala/Batch/errors", test_errors);
    return Test.run ();
}
