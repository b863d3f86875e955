# The _async calls awaited from asyncio: every in-process rank in one
# event loop, on Debian's PyGObject, which cannot await a GTask by itself.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import asyncio
import time
import unittest

import numpy as np

from cptest import Cp, GLib, record_error
from test_attention import reference

CP = 4
REAL = 13            # tokens; prepare pads them to 16, a multiple of 2·CP
PADDED = 16
HEADS, KV_HEADS, DIM = 2, 1, 8


def cancelled_error(test, error, rank, what):
    test.assertIsInstance(error, GLib.Error, what)
    test.assertTrue(error.matches(Cp.mesh_error_quark(), Cp.MeshError.CANCELLED), '%s: %s' % (what, error))
    test.assertIn('rank %d was cancelled' % rank, error.message, what)


class AwaitTest(unittest.TestCase):

    def setUp(self):
        rng = np.random.default_rng(11)
        shapes = ((1, HEADS, REAL, DIM), (1, KV_HEADS, REAL, DIM), (1, KV_HEADS, REAL, DIM),
                  (1, HEADS, REAL, DIM))
        self.arrays = [rng.uniform(-1, 1, size=shape).astype(np.float32) for shape in shapes]
        self.ids = np.arange(1000, 1000 + REAL, dtype=np.int64).reshape(1, REAL)

    async def rank_step(self, mesh):
        """prepare, enter, attention forward and backward, exit and unshard,
        each awaited; returns the local input ids and the unsharded results."""
        batch = Cp.Batch()
        batch['input_ids'] = Cp.Tensor.from_numpy(self.ids)
        batch['labels'] = Cp.Tensor.from_numpy(self.ids.copy())
        # Every rank its own tensor objects over the same memory.
        for name, array in zip(('q', 'k', 'v', 'dout'), self.arrays):
            batch[name] = Cp.Tensor.from_numpy(array)
        options = Cp.BatchOptions(extra_buffers={'q': 2, 'k': 2, 'v': 2, 'dout': 2})
        ctx = await batch.prepare_async(mesh, options)
        await ctx.enter_async()
        local_ids = batch['input_ids'].numpy().copy()
        attention_options = Cp.AttentionOptions.new()
        attention_options.set_causal(True)
        attention_options.set_heads(HEADS, KV_HEADS)
        attention_options.set_seq_lens([REAL])
        attention = Cp.Attention.new(mesh, attention_options)
        q, k, v, dout = (batch[name] for name in ('q', 'k', 'v', 'dout'))
        out, lse = await attention.forward_async(q, k, v)
        dq, dk, dv = await attention.backward_async(dout, q, k, v, out, lse)
        await ctx.exit_async()
        full = []
        for tensor in (out, lse, dq, dk, dv):
            whole = await ctx.unshard_async(tensor, 2)
            full.append(np.array(whole.numpy(), dtype=np.float64))
        return local_ids, full

    def test_step_on_four_ranks(self):
        meshes = Cp.Mesh.new_local_group(['cp'], [CP])
        for mesh in meshes:
            mesh.set_timeout_ms(20000)

        async def main():
            return await asyncio.wait_for(asyncio.gather(*(self.rank_step(m) for m in meshes)), 60)

        results = asyncio.run(main())
        padded = [np.concatenate([a, np.zeros(a.shape[:2] + (PADDED - REAL,) + a.shape[3:], a.dtype)], 2)
                  for a in self.arrays]
        want = reference(*padded, causal=True, real_len=REAL)
        ids = np.concatenate([self.ids[0], np.zeros(PADDED - REAL, np.int64)])
        for rank, (local_ids, full) in enumerate(results):
            # Chunks rank and 2·CP−1−rank of 2·CP, two tokens each.
            head, tail = 2 * rank, 2 * (2 * CP - 1 - rank)
            np.testing.assert_array_equal(local_ids[0], np.concatenate([ids[head:head + 2], ids[tail:tail + 2]]))
            for name, got, expected in zip(('out', 'lse', 'dq', 'dk', 'dv'), full, want):
                finite = np.isfinite(expected)
                np.testing.assert_array_equal(np.isfinite(got), finite, name)
                error = np.abs(got[finite] - expected[finite]).max()
                self.assertLessEqual(error, 1e-5 * max(np.abs(expected[finite]).max(), 1e-3),
                                     'rank %d %s' % (rank, name))

    def test_async_with(self):
        meshes = Cp.Mesh.new_local_group(['cp'], [2])

        async def rank(mesh):
            batch = Cp.Batch()
            batch['input_ids'] = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int64).reshape(1, 8))
            batch['labels'] = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int64).reshape(1, 8))
            ctx = await batch.prepare_async(mesh, None)
            async with ctx:
                inside = ctx.is_entered(), batch['input_ids'].numpy().tolist()
            return inside, ctx.is_entered()

        async def main():
            return await asyncio.wait_for(asyncio.gather(*(rank(m) for m in meshes)), 30)

        results = asyncio.run(main())
        self.assertEqual(results, [((True, [[0, 1, 6, 7]]), False), ((True, [[2, 3, 4, 5]]), False)])

    def test_callback_form(self):
        # With a callback, an _async method is the plain GIO call.
        meshes = Cp.Mesh.new_local_group(['cp'], [2])
        loop = GLib.MainLoop.new(None, False)
        results = []

        def done(mesh, result, *unused):
            results.append(mesh.barrier_finish(result))
            if len(results) == 2:
                loop.quit()

        for mesh in meshes:
            self.assertIsNone(mesh.barrier_async(None, done))
        GLib.timeout_add(10000, loop.quit)
        loop.run()
        self.assertEqual(results, [True, True])


class CancelTest(unittest.TestCase):

    def test_task_cancel_fails_every_rank(self):
        meshes = Cp.Mesh.new_local_group(['cp'], [CP])
        for mesh in meshes:
            mesh.set_timeout_ms(20000)
        tensors = [Cp.Tensor.from_numpy(np.arange(2, dtype=np.float32) + 10 * r) for r in range(CP)]

        async def main():
            # The last rank is late: the others wait in the all_gather.
            waiting = [asyncio.ensure_future(m.all_gather_async(t, 0)) for m, t in zip(meshes[:-1], tensors)]
            await asyncio.sleep(0.1)
            cancelled_at = time.monotonic()
            waiting[0].cancel()
            outcomes = await asyncio.gather(*waiting, return_exceptions=True)
            took = time.monotonic() - cancelled_at
            late = await asyncio.gather(meshes[-1].all_gather_async(tensors[-1], 0), return_exceptions=True)
            later = await asyncio.gather(*(m.barrier_async() for m in meshes), return_exceptions=True)
            return outcomes, took, late[0], later

        outcomes, took, late, later = asyncio.run(asyncio.wait_for(main(), 30))
        self.assertIsInstance(outcomes[0], asyncio.CancelledError)
        for rank in (1, 2):
            cancelled_error(self, outcomes[rank], 0, 'rank %d' % rank)
        record_error(self, 'CpMesh',
                     'an asyncio task awaiting all_gather_async is cancelled: a rank waiting in the call',
                     outcomes[1])
        self.assertLess(took, 3.0)
        cancelled_error(self, late, 0, 'the late rank')
        self.assertIn('mesh broken', late.message)
        record_error(self, 'CpMesh',
                     'an asyncio task awaiting all_gather_async is cancelled: the rank that comes late',
                     late)
        for rank, error in enumerate(later):
            cancelled_error(self, error, 0, 'a later barrier on rank %d' % rank)

    def test_given_cancellable(self):
        from gi.repository import Gio

        meshes = Cp.Mesh.new_local_group(['cp'], [2])
        cancellable = Gio.Cancellable()
        cancellable.cancel()

        async def main():
            return await asyncio.gather(meshes[0].barrier_async(cancellable), meshes[1].barrier_async(),
                                        return_exceptions=True)

        outcomes = asyncio.run(asyncio.wait_for(main(), 30))
        cancelled_error(self, outcomes[0], 0, 'the rank cancelled before the call')
        self.assertIn('cancelled before it began', outcomes[0].message)
        cancelled_error(self, outcomes[1], 0, 'its peer')
        record_error(self, 'CpMesh', 'barrier_async given a cancelled GCancellable',
                     outcomes[0])


if __name__ == '__main__':
    unittest.main()
