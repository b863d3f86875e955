// Shard a [batch 2, sequence 8] tensor over 2 in-process ranks, gather it back.
// valac --pkg libcpmesh-1 example.vala

string rank_main (Cp.Mesh mesh) {
    try {
        var batch = new Cp.Tensor (Cp.DType.FLOAT32, { 2, 8 });
        for (int i = 0; i < 16; i++)
            batch.set_value (i, i);
        var layout = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, 8, 2);
        var local = layout.shard (batch, 1, mesh.rank);     // [2, 4]
        var full = mesh.unshard (local, 1);                 // all-gather + restore
        return "rank %d holds %g %g %g %g, restored: %s".printf (
            mesh.rank, local.get_value (0), local.get_value (1),
            local.get_value (2), local.get_value (3), full.equal (batch) ? "yes" : "no");
    } catch (Error e) {
        return "rank %d: %s".printf (mesh.rank, e.message);
    }
}

int main () {
    try {
        var threads = new Thread<string>[0];
        foreach (var mesh in Cp.Mesh.new_local_group ({ "cp" }, { 2 }))
            threads += new Thread<string> ("rank", () => rank_main (mesh));
        int failed = 0;
        foreach (var thread in threads) {
            var line = thread.join ();
            print ("%s\n", line);
            failed += line.has_suffix ("restored: yes") ? 0 : 1;
        }
        return failed;
    } catch (Error e) {
        printerr ("%s\n", e.message);
        return 1;
    }
}
