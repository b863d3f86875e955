# Cp.Attention from Python against a numpy reference
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import unittest

import numpy as np

from cptest import Cp, GLib, record_error
from ranks import run_group


def reference(q, k, v, dout, causal, real_len):
    """float64 attention over [B, H, S, D] with padding past real_len.
    Query head h reads key/value head h // (H / H_kv) (grouped-query
    attention: consecutive query heads share one key/value head)."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    group = n_heads // n_kv_heads
    kv_of = np.arange(n_heads) // group
    k = k[:, kv_of]
    v = v[:, kv_of]
    s_len = q.shape[2]
    scale = q.shape[3] ** -0.5
    pos = np.arange(s_len)
    visible = (pos[None, :] < real_len) & (pos[:, None] < real_len)
    if causal:
        visible &= pos[None, :] <= pos[:, None]
    scores = np.where(visible, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    real_rows = pos < real_len
    m = np.where(real_rows[:, None], scores, 0).max(-1, keepdims=True)
    p = np.where(visible, np.exp(scores - m), 0)
    lse = np.where(real_rows, (m[..., 0] + np.log(np.maximum(p.sum(-1), 1e-300))), -np.inf)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    out = p @ v
    dv = p.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdims=True))
    dq = ds @ k * scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    # Each key/value head's gradient sums over the query heads reading it.
    dk_shared = np.zeros((dk.shape[0], n_kv_heads) + dk.shape[2:])
    dv_shared = np.zeros_like(dk_shared)
    for h in range(n_heads):
        dk_shared[:, kv_of[h]] += dk[:, h]
        dv_shared[:, kv_of[h]] += dv[:, h]
    return out, lse, dq, dk_shared, dv_shared


class AttentionTest(unittest.TestCase):

    def setUp(self):
        self.rng = np.random.default_rng(7)

    def inputs(self, b, h, hkv, s, d):
        return [self.rng.uniform(-1, 1, size=shape).astype(np.float32)
                for shape in ((b, h, s, d), (b, hkv, s, d), (b, hkv, s, d), (b, h, s, d))]

    def run_cp(self, cp_size, method, causal, arrays, real_len, dtype=Cp.DType.FLOAT32):
        s_len = arrays[0].shape[2]
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, s_len, cp_size)
        if dtype == Cp.DType.BFLOAT16:
            tensors = [Cp.Tensor.from_numpy(Cp.float32_to_bfloat16(a), dtype=dtype) for a in arrays]
        else:
            tensors = [Cp.Tensor.from_numpy(a) for a in arrays]

        def body(mesh):
            rank = mesh.get_rank()
            options = Cp.AttentionOptions.new()
            options.set_causal(causal)
            options.set_rotate_method(method)
            options.set_seq_lens([real_len] * arrays[0].shape[0])
            attention = Cp.Attention.new(mesh, options)
            q, k, v, dout = (layout.shard(t, 2, rank) for t in tensors)
            out, lse = attention.forward(q, k, v)
            dq, dk, dv = attention.backward(dout, q, k, v, out, lse)
            return out, lse, dq, dk, dv

        pieces = run_group([cp_size], body, timeout_ms=None, limit_s=100)
        full = []
        for i in range(5):
            tensor = layout.unshard_pieces([p[i] for p in pieces], 2)
            array = tensor.numpy()
            if tensor.get_dtype() == Cp.DType.BFLOAT16:
                array = Cp.bfloat16_to_float32(array)
            full.append(np.array(array, dtype=np.float64))
        return full

    def check(self, got, want, dtype, group):
        names = ('out', 'lse', 'dq', 'dk', 'dv')
        for name, a, b in zip(names, got, want):
            finite = np.isfinite(b)
            self.assertTrue(np.array_equal(np.isfinite(a), finite), name)
            a, b = a[finite], b[finite]
            if dtype == Cp.DType.FLOAT32:
                self.assertLessEqual(np.abs(a - b).max(), 1e-5 * max(np.abs(b).max(), 1e-3), name)
            else:
                tol = 2.5e-2 if group == 1 else 3.5e-2
                np.testing.assert_allclose(a, b, atol=tol, rtol=tol, err_msg=name)
                rmse = np.sqrt(np.mean((a - b) ** 2))
                self.assertLessEqual(rmse, 0.01 * (max(a.max(), b.max()) - min(a.min(), b.min())), name)

    def test_matches_numpy(self):
        for cp_size in (1, 2, 3):
            for method in (Cp.RotateMethod.ALLGATHER, Cp.RotateMethod.ALLTOALL):
                for causal in (True, False):
                    with self.subTest(cp_size=cp_size, method=method, causal=causal):
                        real_len = 4 * cp_size + 3
                        s_len = -(-real_len // (2 * cp_size)) * 2 * cp_size
                        arrays = self.inputs(1, 4, 1, s_len, 64)
                        want = reference(*arrays, causal, real_len)
                        got = self.run_cp(cp_size, method, causal, arrays, real_len)
                        self.check(got, want, Cp.DType.FLOAT32, 4)
                        # Padding positions get exactly zero gradients.
                        for grad in got[2:]:
                            self.assertTrue(np.all(grad[:, :, real_len:] == 0))

    def test_grouped_query_heads(self):
        # 1 < H_kv < H: query head h must read key/value head h // (H / H_kv);
        # a mapping such as h % H_kv agrees with it only when H_kv is 1 or H.
        for n_heads, n_kv_heads in ((4, 2), (6, 3)):
            for cp_size in (1, 2, 3):
                for method in (Cp.RotateMethod.ALLGATHER, Cp.RotateMethod.ALLTOALL):
                    for causal in (True, False):
                        with self.subTest(heads=(n_heads, n_kv_heads), cp_size=cp_size,
                                          method=method, causal=causal):
                            real_len = 4 * cp_size + 3
                            s_len = -(-real_len // (2 * cp_size)) * 2 * cp_size
                            arrays = self.inputs(2, n_heads, n_kv_heads, s_len, 32)
                            want = reference(*arrays, causal, real_len)
                            got = self.run_cp(cp_size, method, causal, arrays, real_len)
                            self.check(got, want, Cp.DType.FLOAT32, n_heads // n_kv_heads)

    def check_bfloat16(self, b, h, hkv, d):
        """C = 2 causal ring attention on bfloat16 inputs of S = 16 against
        float64 on the same rounded values."""
        arrays = self.inputs(b, h, hkv, 16, d)
        rounded = [Cp.bfloat16_to_float32(Cp.float32_to_bfloat16(a)) for a in arrays]
        want = reference(*rounded, True, 16)
        got = self.run_cp(2, Cp.RotateMethod.ALLTOALL, True, arrays, 16, Cp.DType.BFLOAT16)
        self.check(got, want, Cp.DType.BFLOAT16, h // hkv)

    def test_grouped_query_heads_bfloat16(self):
        self.check_bfloat16(1, 6, 3, 64)

    def test_bfloat16(self):
        self.check_bfloat16(2, 4, 4, 128)

    def test_options(self):
        options = Cp.AttentionOptions.new()
        self.assertTrue(options.get_causal())
        self.assertEqual(options.get_rotate_method(), Cp.RotateMethod.ALLGATHER)
        options.set_heads(8, 2)
        self.assertEqual((options.get_n_heads(), options.get_n_kv_heads()), (8, 2))
        options.set_cu_seqlens_padded([0, 8, 12])
        self.assertEqual(list(options.get_cu_seqlens_padded()), [0, 8, 12])
        copy = options.copy()
        self.assertEqual(list(copy.get_cu_seqlens_padded()), [0, 8, 12])
        copy.props.causal = False
        self.assertTrue(options.props.causal)

    def test_options_properties(self):
        options = Cp.AttentionOptions(causal=False, rotate_method=Cp.RotateMethod.ALLTOALL,
                                      n_heads=4, n_kv_heads=2, n_threads=1)
        self.assertFalse(options.get_causal())
        self.assertEqual(options.get_rotate_method(), Cp.RotateMethod.ALLTOALL)
        self.assertEqual((options.get_n_heads(), options.get_n_kv_heads()), (4, 2))
        options.set_scale(0.5)
        self.assertEqual(options.props.scale, 0.5)
        mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        attention = Cp.Attention.new(mesh, options)
        self.assertEqual(attention.get_n_threads(), 1)
        self.assertEqual(attention.dup_options().props.rotate_method, Cp.RotateMethod.ALLTOALL)

    def test_error(self):
        mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        attention = Cp.Attention.new(mesh, None)
        self.assertGreaterEqual(attention.get_n_threads(), 1)
        q = Cp.Tensor.from_numpy(np.zeros((1, 3, 4, 8), dtype=np.float32))
        k = Cp.Tensor.from_numpy(np.zeros((1, 2, 4, 8), dtype=np.float32))
        with self.assertRaises(GLib.Error) as raised:
            attention.forward(q, k, k)
        self.assertTrue(raised.exception.matches(Cp.attention_error_quark(), Cp.AttentionError.SHAPE))
        self.assertIn('not divisible', raised.exception.message)
        record_error(self, 'CpAttention', 'forward with q heads not a multiple of k/v heads (GQA)',
                     raised.exception)

    def test_without_mesh(self):
        # Cp.Attention.new(None, options): attention on one rank, the same
        # bits as on the only rank of a one-rank mesh.
        q, k, v, dout = (Cp.Tensor.from_numpy(a) for a in self.inputs(1, 2, 2, 8, 16))
        options = Cp.AttentionOptions.new()
        options.set_causal(True)
        alone = Cp.Attention.new(None, options)
        ranked = Cp.Attention.new(Cp.Mesh.new_local_group(['cp'], [1])[0], options)
        self.assertEqual(alone.get_mesh().get_world_size(), 1)
        out, lse = alone.forward(q, k, v)
        want_out, want_lse = ranked.forward(q, k, v)
        self.assertTrue(out.equal(want_out))
        self.assertTrue(lse.equal(want_lse))
        got = alone.backward(dout, q, k, v, out, lse)
        want = ranked.backward(dout, q, k, v, want_out, want_lse)
        for a, b in zip(got, want):
            self.assertTrue(a.equal(b))
        reference_out = reference(*(t.numpy().astype(np.float64) for t in (q, k, v, dout)),
                                  True, 8)[0]
        self.assertLessEqual(np.abs(out.numpy() - reference_out).max(), 1e-5)


if __name__ == '__main__':
    unittest.main()
