/* const-arrays.vala: every call of the Cp API whose C array type is const,
 * built by test_quiet_build.py with plain valac, whose output must stay
 * empty: the C compiler warned about `const char * const *` and
 * `const gint64 *` at each of them before the VAPI spelled out their C
 * types (bindings/vala/Cp-1.metadata and Cp-1-custom.vala), and at each
 * zero-terminated getter before the VAPI mapped it to its copying `dup_`
 * twin. Prints what it read back, which the test compares.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

async void try_connect (MainLoop loop) {
  try {
    /* RANK without WORLD_SIZE: refused before anything is opened. */
    yield Cp.Mesh.connect_async ({ "RANK=0", null }, null);
    print ("connect: joined\n");
  } catch (Error e) {
    print ("connect: refused\n");
  }
  loop.quit ();
}

int main () {
  try {
    var mesh = Cp.Mesh.new_local_group ({ "dp", "cp" }, { 1, 1 }).data;
    unowned int[] sizes = mesh.get_dim_sizes ();
    print ("mesh: %s %d %d\n", string.joinv (",", mesh.dim_names), sizes.length, sizes[1]);

    var options = new Cp.MeshOptions ();
    options.set_dims ({ "dp", "cp" }, { 2, 3 });
    unowned int[]? option_sizes = options.get_dim_sizes ();
    print ("options: %s %d %d\n", string.joinv (",", options.dim_names), option_sizes[0], option_sizes[1]);

    /* The zero-terminated getters, measured by Vala itself. */
    var unset = new Cp.MeshOptions ();
    print ("names: %s %d, %s %d, %s\n",
           string.joinv (",", mesh.get_dim_names ()), mesh.get_dim_names ().length,
           string.joinv (",", options.get_dim_names ()), options.get_dim_names ().length,
           unset.get_dim_names () == null ? "unset" : "set");

    var batch = new Cp.Batch ();
    batch.set ("input_ids", new Cp.Tensor (Cp.DType.INT64, { 1, 8 }));
    batch.set ("labels", new Cp.Tensor (Cp.DType.INT64, { 1, 8 }));
    string[] keys = batch.get_keys ();
    foreach (unowned string key in batch.get_keys ())
      print ("key: %s\n", key);
    print ("keys: %d %s\n", keys.length, keys[1]);

    var tensor = new Cp.Tensor (Cp.DType.FLOAT32, { 2, 3 });
    unowned int64[] shape = tensor.get_shape ();
    print ("shape: %d [%lld, %lld]\n", shape.length, shape[0], shape[1]);

    var attention = new Cp.AttentionOptions ();
    attention.set_seq_lens ({ 4, 8 });
    unowned int64[]? seq_lens = attention.get_seq_lens ();
    attention.set_cu_seqlens ({ 0, 4, 12 });
    unowned int64[]? bounds = attention.get_cu_seqlens ();
    attention.set_cu_seqlens_padded ({ 0, 4, 12 });
    unowned int64[]? padded = attention.get_cu_seqlens_padded ();
    print ("attention: %lld %lld %lld\n", seq_lens[1], bounds[2], padded[1]);

    try {
      new Cp.Mesh.ucx (0, 1, "127.0.0.1", 0, null, { "cp" }, { 2 }, 1000);
      print ("ucx: made\n");
    } catch (Error e) {
      print ("ucx: refused\n");   /* 2 ranks of cp for a world of 1 */
    }

    var loop = new MainLoop ();
    try_connect.begin (loop);
    loop.run ();
  } catch (Error e) {
    printerr ("%s\n", e.message);
    return 1;
  }
  return 0;
}
