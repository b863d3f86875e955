// One context-parallel attention step on 4 in-process ranks (threads): the
// job of train-step.c, printing the same checksum.
// valac --pkg libcpmesh-1 -X -lm train-step.vala
//
// SPDX-License-Identifier: LGPL-2.1-or-later

const int RANKS = 4;
const int SEQ = 250;
const int HEADS = 4;
const int KV_HEADS = 2;
const int HEAD_DIM = 16;

// Exact in float32, the same in every language.
Cp.Tensor operand (int heads, int a, int b, int c, int modulus) throws Error {
    var t = new Cp.Tensor (Cp.DType.FLOAT32, { 1, heads, SEQ, HEAD_DIM });
    for (int h = 0; h < heads; h++)
        for (int s = 0; s < SEQ; s++)
            for (int d = 0; d < HEAD_DIM; d++)
                t.set_value ((h * SEQ + s) * HEAD_DIM + d,
                             ((s * a + h * b + d * c) % modulus - modulus / 2) / 64.0);
    return t;
}

Cp.Batch load_batch () throws Error {
    var batch = new Cp.Batch ();
    var ids = new Cp.Tensor (Cp.DType.INT64, { 1, SEQ });
    var labels = new Cp.Tensor (Cp.DType.INT64, { 1, SEQ });
    for (int s = 0; s < SEQ; s++) {
        ids.set_value (s, (s * 7 + 3) % 1000);
        labels.set_value (s, ((s + 1) % SEQ * 7 + 3) % 1000);
    }
    batch.set ("input_ids", ids);
    batch.set ("labels", labels);
    batch.set ("q", operand (HEADS, 31, 17, 7, 97));
    batch.set ("k", operand (KV_HEADS, 29, 13, 5, 89));
    batch.set ("v", operand (KV_HEADS, 23, 11, 3, 83));
    batch.set ("dout", operand (HEADS, 19, 5, 13, 79));
    return batch;
}

// Each value in units of 2^-20, rounded down, added as integers.
int64 checksum (Cp.Tensor t) {
    int64 sum = 0;
    for (int64 i = 0; i < t.get_numel (); i++)
        sum += (int64) Math.floor (t.get_value (i) * 1048576.0);
    return sum;
}

string train_step (Cp.Mesh mesh) {
    try {
        var batch = load_batch ();
        var batch_options = new Cp.BatchOptions ();
        foreach (var key in new string[] { "q", "k", "v", "dout" })
            batch_options.add_extra_buffer (key, 2);
        var ctx = batch.prepare (mesh, batch_options);
        var options = new Cp.AttentionOptions ();
        options.set_heads (HEADS, KV_HEADS);
        options.set_seq_lens ({ SEQ });
        options.set_n_threads (1);
        var attention = new Cp.Attention (mesh, options);
        Cp.Tensor output, lse, dq, dk, dv;
        ctx.enter ();
        attention.forward (batch.get ("q"), batch.get ("k"), batch.get ("v"), out output, out lse);
        attention.backward (batch.get ("dout"), batch.get ("q"), batch.get ("k"), batch.get ("v"),
                            output, lse, out dq, out dk, out dv);
        ctx.exit ();
        int64 sum = 0;
        foreach (var local in new Cp.Tensor[] { output, dq, dk, dv })
            sum += checksum (mesh.unshard (local, 2));
        return sum.to_string ();
    } catch (Error e) {
        return "rank %d: %s".printf (mesh.rank, e.message);
    }
}

int main () {
    try {
        var threads = new Thread<string>[0];
        foreach (var mesh in Cp.Mesh.new_local_group ({ "cp" }, { RANKS }))
            threads += new Thread<string> ("rank", () => train_step (mesh));
        string[] results = {};
        foreach (var thread in threads)
            results += thread.join ();
        foreach (var result in results) {
            if (result.has_prefix ("rank ")) {
                printerr ("%s\n", result);
                return 1;
            }
        }
        print ("train-step: %d ranks, %d positions padded to 256, checksum %s\n", RANKS, SEQ, results[0]);
        return 0;
    } catch (Error e) {
        printerr ("%s\n", e.message);
        return 1;
    }
}
