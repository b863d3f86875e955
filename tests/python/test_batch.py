# Cp.Batch.prepare and Cp.Context from Python: the default-path cases of
# NeMo Automodel's test_cp_utils, test_cp_utils_diffcov and
# test_cp_utils_inputs_embeds, on real in-process meshes (one thread per
# rank; PyGObject releases the GIL in every call).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import unittest

import gi

gi.require_version('Cp', '1')
from gi.repository import Cp, GLib  # noqa: E402
import numpy as np  # noqa: E402

from cptestutil import T  # noqa: E402
from ranks import run_group  # noqa: E402
from reliability import record_error  # noqa: E402


def e2_batch():
    batch = Cp.Batch()
    batch['input_ids'] = T([[11, 12, 13, 14, 15, 16]])
    batch['labels'] = T([[1, 2, 3, 4, 5, 6]])
    return batch


class MappingTests(unittest.TestCase):

    def test_dict_protocol(self):
        batch = Cp.Batch()
        ids = T([[1, 2, 3]])
        batch['input_ids'] = ids
        batch['labels'] = T([[4, 5, 6]])
        self.assertEqual(batch.keys(), ['input_ids', 'labels'])
        self.assertEqual(list(batch), ['input_ids', 'labels'])
        self.assertEqual(len(batch), 2)
        self.assertIn('labels', batch)
        self.assertNotIn('loss_mask', batch)
        self.assertIs(batch['input_ids'], ids)
        self.assertIsNone(batch.get('loss_mask'))
        with self.assertRaises(KeyError):
            batch['loss_mask']
        del batch['labels']
        with self.assertRaises(KeyError):
            del batch['labels']
        self.assertEqual(batch.keys(), ['input_ids'])
        self.assertEqual(batch.props.qkv_format, 'bshd')

    def test_options(self):
        mask = T([[1, 1]])
        options = Cp.BatchOptions(loss_mask=mask, rotate_method='alltoall',
                                  extra_buffers={'teacher_logits': 1, 'hidden': 2})
        self.assertIs(options.props.loss_mask, mask)
        self.assertEqual(options.props.rotate_method, Cp.RotateMethod.ALLTOALL)
        self.assertEqual(options.get_n_extra_buffers(), 2)
        self.assertEqual(options.get_extra_buffer(1), ('hidden', 2))


class NoContextParallelismTests(unittest.TestCase):

    def test_no_mesh(self):
        batch = e2_batch()
        batch['attention_mask'] = T([[1, 1, 1, 1, 1, 1]])
        ctx = batch.prepare(None)
        self.assertEqual(batch.keys(), ['input_ids', 'labels', 'attention_mask'])
        self.assertEqual(ctx.get_n_buffers(), 0)
        with ctx:
            self.assertTrue(ctx.is_entered())
        self.assertFalse(ctx.is_entered())

    def test_cp_size_one(self):
        def rank(mesh):
            batch = Cp.Batch()
            batch['inputs_embeds'] = T(np.ones((1, 6, 4)), np.float32)
            batch['labels'] = T([[1, 2, 3, 4, 5, 6]])
            ctx = batch.prepare(mesh)
            self.assertEqual(batch.keys(), ['inputs_embeds', 'labels'])
            self.assertEqual(batch['inputs_embeds'].shape, (1, 6, 4))
            self.assertEqual(ctx.props.cp_size, 1)
        run_group([2, 1], rank, names=('dp', 'cp'))


class PrepareTests(unittest.TestCase):

    def test_e2_padding_and_head_tail(self):
        def rank(mesh):
            batch = e2_batch()
            batch['padding_mask'] = T([[0, 0, 0, 0, 1, 1]], np.bool_)
            ctx = batch.prepare(mesh)
            ids, labels, pos = batch['input_ids'], batch['labels'], batch['position_ids']
            np.testing.assert_array_equal(ids.numpy(), [[11, 12, 13, 14, 15, 16, 0, 0]])
            np.testing.assert_array_equal(labels.numpy(), [[1, 2, 3, 4, 5, 6, -100, -100]])
            np.testing.assert_array_equal(pos.numpy(), [[0, 1, 2, 3, 4, 5, 0, 0]])
            np.testing.assert_array_equal(batch['padding_mask'].numpy(), [[0, 0, 0, 0, 1, 1, 1, 1]])
            with ctx:
                if mesh.get_rank() == 0:
                    np.testing.assert_array_equal(ids.numpy(), [[11, 12, 0, 0]])
                    np.testing.assert_array_equal(labels.numpy(), [[1, 2, -100, -100]])
                    np.testing.assert_array_equal(pos.numpy(), [[0, 1, 0, 0]])
                else:
                    np.testing.assert_array_equal(ids.numpy(), [[13, 14, 15, 16]])
                    np.testing.assert_array_equal(labels.numpy(), [[3, 4, 5, 6]])
                    np.testing.assert_array_equal(pos.numpy(), [[2, 3, 4, 5]])
            np.testing.assert_array_equal(pos.numpy(), [[0, 1, 2, 3, 4, 5, 0, 0]])
            self.assertEqual(ids.shape, (1, 4))
        run_group([2], rank)

    def test_e1_layouts(self):
        def rank(mesh):
            c, r = mesh.get_world_size(), mesh.get_rank()
            batch = Cp.Batch()
            batch['input_ids'] = T([np.arange(4 * c)])
            batch['labels'] = T([np.arange(4 * c)])
            with batch.prepare(mesh):
                expected = [2 * r, 2 * r + 1, 2 * (2 * c - 1 - r), 2 * (2 * c - 1 - r) + 1]
                np.testing.assert_array_equal(batch['input_ids'].numpy(), [expected])
        for size in (2, 3, 4, 8):
            run_group([size], rank)

    def test_e3_mrope(self):
        def rank(mesh):
            batch = Cp.Batch()
            batch['inputs_embeds'] = T(np.zeros((1, 8, 4)), np.float32)
            batch['labels'] = T([np.arange(8)])
            pos = T(np.arange(24).reshape(3, 1, 8))
            batch['position_ids'] = pos
            ctx = batch.prepare(mesh)
            self.assertEqual(ctx.seq_dims, [1, 1, 2])
            with ctx:
                index = [0, 1, 6, 7] if mesh.get_rank() == 0 else [2, 3, 4, 5]
                np.testing.assert_array_equal(pos.numpy(), np.arange(24).reshape(3, 1, 8)[:, :, index])
            self.assertEqual(pos.shape, (3, 1, 8))
        run_group([2], rank)

    def test_position_synthesis_and_expansion(self):
        def rank(mesh):
            a = Cp.Batch()
            a['inputs_embeds'] = T(np.zeros((1, 12, 32)), np.float32)
            a['labels'] = T(np.zeros((1, 12)))
            a.prepare(mesh)
            np.testing.assert_array_equal(a['position_ids'].numpy(), [np.arange(12)])
            b = Cp.Batch()
            b['inputs_embeds'] = T(np.zeros((3, 8, 16)), np.float32)
            b['labels'] = T(np.zeros((3, 8)))
            b.prepare(mesh)
            np.testing.assert_array_equal(b['position_ids'].numpy(), np.tile(np.arange(8), (3, 1)))
            c = Cp.Batch()
            c['input_ids'] = T(np.zeros((2, 8)))
            c['labels'] = T(np.zeros((2, 8)))
            single = T([np.arange(8)])
            c['position_ids'] = single
            ctx = c.prepare(mesh)
            self.assertEqual(single.shape, (2, 8))
            self.assertIs(ctx.buffers[2], c['position_ids'])
        run_group([2], rank)

    def test_no_rows(self):
        # The last batch of a dataset may be empty: [0, S] ids or [0, S, H]
        # embeddings are prepared, entered and exited like any other.
        for key, shape, dtype in (('input_ids', (0, 6), np.int64), ('inputs_embeds', (0, 6, 3), np.float32)):
            def rank(mesh):
                batch = Cp.Batch()
                batch[key] = T(np.zeros(shape), dtype)
                batch['labels'] = T(np.zeros((0, 6)))
                ctx = batch.prepare(mesh)
                positions = batch['position_ids']
                self.assertEqual({k: v.shape[:2] for k, v in batch.items()},
                                 {key: (0, 8), 'labels': (0, 8), 'position_ids': (0, 8)})
                with ctx:
                    self.assertEqual(batch[key].shape, (0, 4) + shape[2:])
                    self.assertEqual(positions.shape, (0, 4))
                self.assertEqual(positions.shape, (0, 8))
                self.assertEqual(batch['labels'].shape, (0, 4))
            run_group([2], rank)

    def test_registration_order_and_extras(self):
        def rank(mesh):
            batch = e2_batch()
            batch['padding_mask'] = T([[0, 0, 0, 0, 0, 0]], np.bool_)
            teacher = T(np.random.default_rng(0).standard_normal((1, 6, 5)), np.float32)
            original = teacher.numpy().copy()
            batch['teacher_logits'] = teacher
            batch['mm_token_type_ids'] = T([[0, 1, 1, 0, 0, 0]])
            loss_mask = T([[1, 1, 1, 1, 0, 0]], np.float32)
            options = Cp.BatchOptions(loss_mask=loss_mask, extra_buffers={'teacher_logits': 1})
            ctx = batch.prepare(mesh, options)
            names = [ctx.get_buffer_name(i) for i in range(ctx.get_n_buffers())]
            self.assertEqual(names, ['input_ids', 'labels', 'position_ids', 'loss_mask',
                                     'padding_mask', 'teacher_logits'])
            self.assertEqual(ctx.seq_dims, [1, 1, 1, 1, 1, 1])
            self.assertIs(ctx.buffers[3], loss_mask)
            self.assertEqual(teacher.shape, (1, 8, 5))
            np.testing.assert_array_equal(teacher.numpy()[:, :6], original)
            np.testing.assert_array_equal(teacher.numpy()[:, 6:], 0)
            # The caller's loss mask is the padded one, then the sharded one.
            np.testing.assert_array_equal(loss_mask.numpy(), [[1, 1, 1, 1, 0, 0, 0, 0]])
            with ctx:
                self.assertEqual(loss_mask.shape, (1, 4))
                self.assertEqual(batch['mm_token_type_ids'].shape, (1, 6))
        run_group([2], rank)

    def test_extra_buffer_contents(self):
        # Extras along dimensions 1, 2 (not the last) and -1, every element
        # distinct: inside the context each rank holds exactly the padded
        # original taken at its head-tail positions, computed here.
        s = 13
        specs = [('along_1', (2, s, 3), 1, np.float32), ('along_2', (2, 3, s, 2), 2, np.int32),
                 ('along_last', (3, 2, 2, s), -1, np.int64)]

        def rank(mesh):
            c, r = mesh.get_world_size(), mesh.get_rank()
            padded = -(-s // (2 * c)) * 2 * c
            k = padded // (2 * c)
            index = np.r_[r * k:(r + 1) * k, (2 * c - 1 - r) * k:(2 * c - r) * k]
            batch = Cp.Batch()
            batch['input_ids'] = T(np.arange(2 * s).reshape(2, s))
            batch['labels'] = T(np.arange(2 * s).reshape(2, s))
            originals = {}
            for key, shape, dim, dtype in specs:
                originals[key] = np.arange(1, np.prod(shape) + 1).reshape(shape).astype(dtype)
                batch[key] = T(originals[key], dtype)
                batch.set_seq_dim(key, dim)
            ctx = batch.prepare(mesh)
            with ctx:
                for key, shape, dim, dtype in specs:
                    axis = dim % len(shape)
                    pad = [(0, 0)] * len(shape)
                    pad[axis] = (0, padded - s)
                    want = np.take(np.pad(originals[key], pad), index, axis=axis)
                    np.testing.assert_array_equal(batch[key].numpy(), want, err_msg=key)
        for size in (2, 4):
            run_group([size], rank)

    def test_pad_values_and_identity(self):
        def rank(mesh):
            batch = Cp.Batch()
            batch['inputs_embeds'] = T(np.ones((1, 6, 4)), np.float32)
            batch['labels'] = T([[1, 2, 3, 4, 5, 6]])
            batch['padding_mask'] = T([[0, 0, 0, 0, 1, 1]], np.bool_)
            batch.prepare(mesh)
            embeds = batch['inputs_embeds'].numpy()
            np.testing.assert_array_equal(embeds[0, :6], 1)
            np.testing.assert_array_equal(embeds[0, 6:], 0)
            np.testing.assert_array_equal(batch['labels'].numpy()[0, 6:], [-100, -100])
            np.testing.assert_array_equal(batch['position_ids'].numpy()[0, 6:], [0, 0])
            np.testing.assert_array_equal(batch['padding_mask'].numpy(), [[0, 0, 0, 0, 1, 1, 1, 1]])

            aligned = Cp.Batch()
            embeds = T(np.ones((1, 8, 16)), np.float32)
            aligned['inputs_embeds'] = embeds
            aligned['labels'] = T([np.arange(8)])
            ctx = aligned.prepare(mesh)
            self.assertIs(ctx.buffers[0], embeds)
            self.assertEqual(embeds.get_storage().get_data_address(),
                             ctx.buffers[0].get_storage().get_data_address())
        run_group([2], rank)

    def test_attention_mask_dropped(self):
        def rank(mesh):
            batch = Cp.Batch()
            batch['input_ids'] = T([[1, 2, 3]])
            batch['labels'] = T([[1, 2, 3]])
            batch['attention_mask'] = T([[1, 1, 1]])
            batch.prepare(mesh)
            self.assertNotIn('attention_mask', batch)
        run_group([2], rank)

    def test_e4_grad_primary_under_hsdp(self):
        def rank(mesh):
            cp_rank = mesh.get_coordinate('cp')
            batch = Cp.Batch()
            embeds = T(np.arange(8.0).reshape(1, 8, 1), np.float32)
            embeds.set_requires_grad(True)
            batch['inputs_embeds'] = embeds
            batch['labels'] = T([np.arange(8)])
            ctx = batch.prepare(mesh)
            local = batch['inputs_embeds']
            self.assertIsNot(local, embeds)
            self.assertTrue(local.props.requires_grad)
            expected = [0, 1, 6, 7] if cp_rank == 0 else [2, 3, 4, 5]
            np.testing.assert_array_equal(local.numpy().ravel(), expected)
            np.testing.assert_array_equal(embeds.numpy().ravel(), np.arange(8))
            self.assertFalse(any(b.props.requires_grad for b in ctx.buffers))
            ones = T(np.ones((1, 4, 1)), np.float32)
            grad = ctx.get_layout().shard_backward(ones, 1, cp_rank)
            np.testing.assert_array_equal(grad.numpy().ravel(),
                                          [1, 1, 0, 0, 0, 0, 1, 1] if cp_rank == 0 else [0, 0, 1, 1, 1, 1, 0, 0])
        run_group([4, 2], rank, names=('dp', 'cp'))

    def test_global_token_mean_c128(self):
        cp_size, seq_len, hidden = 128, 56, 3
        weight = np.arange(seq_len * hidden, dtype=np.float64).reshape(seq_len, hidden) / 13.0
        losses = [0.0] * cp_size
        grads = [None] * cp_size

        def rank(mesh):
            r = mesh.get_rank()
            batch = Cp.Batch()
            embeds = T(weight[None].copy(), np.float64)
            embeds.set_requires_grad(True)
            batch['inputs_embeds'] = embeds
            labels = T([np.arange(seq_len)])
            batch['labels'] = labels
            ctx = batch.prepare(mesh)
            self.assertEqual(ctx.buffers[0].shape, (1, 256))
            np.testing.assert_array_equal(labels.numpy()[0, seq_len:], -100)
            local = batch['inputs_embeds'].numpy()
            self.assertEqual(local.shape, (1, 2, hidden))
            with ctx:
                valid = labels.numpy()[0] != -100
                sums = local[0].sum(axis=-1) + 0.75
                losses[r] = float((sums[valid] ** 2).sum() / seq_len)
                local_grad = np.where(valid[:, None], cp_size * 2.0 * sums[:, None] / seq_len, 0.0)
                local_grad = np.repeat(local_grad, hidden, axis=1)[None]
                full = ctx.get_layout().shard_backward(T(np.ascontiguousarray(local_grad), np.float64), 1, r)
                grads[r] = full.numpy()[0, :seq_len].copy()
        run_group([cp_size], rank)
        sums = weight.sum(axis=-1) + 0.75
        self.assertAlmostEqual(sum(losses), float((sums ** 2).sum() / seq_len), places=9)
        np.testing.assert_allclose(np.mean(grads, axis=0)[:, 0], 2.0 * sums / seq_len, rtol=1e-12)

    def test_e5_unshard(self):
        def rank(mesh):
            batch = e2_batch()
            ctx = batch.prepare(mesh)
            with ctx:
                labels = batch['labels'].numpy()[0].astype(np.float32)
                logits = T(np.stack([labels, 10 * labels], axis=-1)[None], np.float32)
                full = ctx.unshard(logits, 1)
                self.assertEqual(full.shape, (1, 8, 2))
                np.testing.assert_array_equal(full.numpy()[0, :6, 0], [1, 2, 3, 4, 5, 6])
        run_group([2], rank)

    def test_with_exits_on_exception(self):
        def rank(mesh):
            batch = e2_batch()
            ctx = batch.prepare(mesh)
            pos = batch['position_ids']
            with self.assertRaises(RuntimeError):
                with ctx:
                    self.assertEqual(pos.shape, (1, 4))
                    raise RuntimeError('boom')
            self.assertFalse(ctx.is_entered())
            self.assertEqual(pos.shape, (1, 8))
        run_group([2], rank)

    def test_run_callback(self):
        def rank(mesh):
            batch = e2_batch()
            ctx = batch.prepare(mesh)
            seen = []
            ctx.run(lambda c: seen.append((c.is_entered(), batch['input_ids'].shape)))
            self.assertEqual(seen, [(True, (1, 4))])
            self.assertFalse(ctx.is_entered())
        run_group([2], rank)


class ContextStateTests(unittest.TestCase):
    """Misuse of a context raises GLib.Error CONTEXT_STATE and changes nothing."""

    def assert_state_error(self, caught, what):
        self.assertTrue(caught.exception.matches(Cp.batch_error_quark(), Cp.BatchError.CONTEXT_STATE),
                        caught.exception)
        record_error(self, 'CpContext', what, caught.exception)

    def test_nested_with_keeps_the_outer_context(self):
        def rank(mesh):
            batch = e2_batch()
            ctx = batch.prepare(mesh)
            pos = batch['position_ids']
            with ctx:
                local = pos.numpy().copy()
                with self.assertRaises(GLib.Error) as caught:
                    with ctx:
                        self.fail('the inner with must not run')
                self.assert_state_error(caught, 'with ctx: on an entered context (every rank fails)')
                self.assertIn('entered already', caught.exception.message)
                # The outer context is still entered, its buffers still local.
                self.assertTrue(ctx.is_entered())
                np.testing.assert_array_equal(pos.numpy(), local)
            self.assertFalse(ctx.is_entered())
            np.testing.assert_array_equal(pos.numpy(), [[0, 1, 2, 3, 4, 5, 0, 0]])
        run_group([2], rank)

    def test_exit_and_register_out_of_turn(self):
        def rank(mesh):
            ctx = Cp.Context.new(mesh, Cp.RotateMethod.ALLGATHER)
            ids = T([np.arange(8)])
            with self.assertRaises(GLib.Error) as caught:
                ctx.exit()
            self.assert_state_error(caught, 'cp_context_exit of a context that is not entered')
            ctx.register_buffer(ids, 1, True)
            late = T([np.arange(8)])
            with ctx:
                with self.assertRaises(GLib.Error) as caught:
                    ctx.register_buffer(late, 1, True)
                self.assert_state_error(caught, 'cp_context_register_buffer on an entered context')
                self.assertEqual(ctx.get_n_buffers(), 1)
            np.testing.assert_array_equal(ids.numpy(), [np.arange(8)])
        run_group([2], rank)


class SharedTensorTests(unittest.TestCase):
    """One tensor used by several rank threads. Reading it from all of them
    is safe; padding or sharding it in place from several batches or
    contexts fails with IN_USE on every rank, and nothing changes. Which
    rank claims the tensor first varies, so each case runs many times."""

    RUNS = 20

    def assert_in_use(self, caught, needle, subject, what):
        self.assertTrue(caught.exception.matches(Cp.tensor_error_quark(), Cp.TensorError.IN_USE),
                        caught.exception)
        self.assertIn(needle, caught.exception.message)
        record_error(self, subject, what, caught.exception)

    def test_one_tensor_in_every_rank_batch(self):
        for size in (2, 4):
            for _ in range(self.RUNS):
                full = np.arange(6)[None]
                shared = T(full)
                address = shared.get_data_address()

                def rank(mesh):
                    batch = e2_batch()
                    batch['labels'] = shared
                    ids = batch['input_ids']
                    with self.assertRaises(GLib.Error) as caught:
                        batch.prepare(mesh)
                    self.assert_in_use(caught, "prepare: 'labels' is being changed in place", 'CpBatch',
                                       'cp_batch_prepare on every rank with one labels tensor in every '
                                       "rank's batch (every rank fails)")
                    self.assertEqual(batch.keys(), ['input_ids', 'labels'])
                    np.testing.assert_array_equal(ids.numpy(), [[11, 12, 13, 14, 15, 16]])
                run_group([size], rank)
                self.assertEqual(shared.get_data_address(), address)
                np.testing.assert_array_equal(shared.numpy(), full)

    def test_one_loss_mask_in_shared_options(self):
        mask = T([[1, 1, 1, 0, 0, 0]], np.float32)
        options = Cp.BatchOptions(loss_mask=mask)

        def rank(mesh):
            with self.assertRaises(GLib.Error) as caught:
                e2_batch().prepare(mesh, options)
            self.assert_in_use(caught, "'loss_mask'", 'CpBatch', 'cp_batch_prepare on every rank with '
                               'one options object carrying a loss mask (every rank fails)')
        for _ in range(self.RUNS):
            run_group([2], rank)
        np.testing.assert_array_equal(mask.numpy(), [[1, 1, 1, 0, 0, 0]])

    def test_one_buffer_in_every_rank_context(self):
        shared = T([np.arange(8)])

        def rank(mesh):
            ctx = Cp.Context.new(mesh, Cp.RotateMethod.ALLGATHER)
            ctx.register_buffer(shared, 1, True)
            with self.assertRaises(GLib.Error) as caught:
                with ctx:
                    self.fail('no rank may enter')
            self.assert_in_use(caught, 'enter: buffer 0 is being changed in place', 'CpContext',
                               'cp_context_enter on every rank with one tensor registered by every '
                               'rank (every rank fails)')
            self.assertFalse(ctx.is_entered())
        for _ in range(self.RUNS):
            run_group([2], rank)
        np.testing.assert_array_equal(shared.numpy(), [np.arange(8)])

    def test_one_array_wrapped_by_every_rank(self):
        # Separate tensor objects may view one memory: prepare and enter give
        # a tensor new memory instead of writing into the memory it views.
        ids = np.arange(6)[None] + 10
        labels = np.arange(6)[None]

        def rank(mesh):
            batch = Cp.Batch()
            batch['input_ids'] = Cp.Tensor.from_numpy(ids)
            batch['labels'] = Cp.Tensor.from_numpy(labels)
            index = [0, 1, 6, 7] if mesh.get_rank() == 0 else [2, 3, 4, 5]
            with batch.prepare(mesh):
                np.testing.assert_array_equal(batch['labels'].numpy(),
                                              np.pad(labels, ((0, 0), (0, 2)), constant_values=-100)[:, index])
                np.testing.assert_array_equal(batch['input_ids'].numpy(), np.pad(ids, ((0, 0), (0, 2)))[:, index])
        for _ in range(self.RUNS):
            run_group([2], rank)
        np.testing.assert_array_equal(ids, np.arange(6)[None] + 10)
        np.testing.assert_array_equal(labels, np.arange(6)[None])

    def test_every_rank_reads_one_tensor(self):
        # The reads of the issue: shard, copy, narrow, numpy views, bytes
        # and unshard, from every rank at once, many times, all exact.
        full = np.arange(2 * 16 * 3, dtype=np.float32).reshape(2, 16, 3)
        shared = Cp.Tensor.from_numpy(full.copy())
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 16, 4)

        def rank(mesh):
            r = mesh.get_rank()
            k = 2
            index = np.r_[r * k:(r + 1) * k, (7 - r) * k:(8 - r) * k]
            for _ in range(50):
                np.testing.assert_array_equal(layout.shard(shared, 1, r).numpy(), full[:, index])
                np.testing.assert_array_equal(shared.copy().numpy(), full)
                np.testing.assert_array_equal(shared.narrow(1, 3, 5).numpy(), full[:, 3:8])
                np.testing.assert_array_equal(shared.numpy(), full)
                self.assertEqual(shared.dup_bytes().get_data(), full.tobytes())
                gathered = mesh.all_gather(shared, 0).numpy()
                np.testing.assert_array_equal(gathered, np.concatenate([full] * 4))
                piece = layout.shard(shared, 1, r)
                np.testing.assert_array_equal(mesh.unshard(piece, 1).numpy(), full)
        run_group([4], rank)
        np.testing.assert_array_equal(shared.numpy(), full)


class PropertyTests(unittest.TestCase):
    """Random B, S, C and buffer sets against an independent numpy oracle:
    inside the context every buffer is its padded original indexed with
    the head-tail positions of this rank; unsharding gives the padded
    original back bit for bit; exit restores the position ids."""

    def test_random_batches(self):
        for seed in range(12):
            rng = np.random.default_rng(seed)
            size = int(rng.choice([2, 3, 4, 8]))
            b, s, h = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 4))

            def rank(mesh, b=b, s=s, h=h, seed=seed):
                local_rng = np.random.default_rng(seed)
                c, r = mesh.get_world_size(), mesh.get_rank()
                padded = -(-s // (2 * c)) * 2 * c
                k = padded // (2 * c)
                index = np.r_[r * k:(r + 1) * k, (2 * c - 1 - r) * k:(2 * c - r) * k]
                ids = local_rng.integers(0, 1000, (b, s))
                teacher = local_rng.standard_normal((b, s, h)).astype(np.float32)
                batch = Cp.Batch()
                batch['input_ids'] = T(ids)
                batch['labels'] = T(ids + 1)
                batch['teacher_logits'] = T(teacher, np.float32)
                batch.set_seq_dim('teacher_logits', 1)
                ctx = batch.prepare(mesh)
                pad = padded - s
                want = {
                    'input_ids': np.pad(ids, ((0, 0), (0, pad))),
                    'labels': np.pad(ids + 1, ((0, 0), (0, pad)), constant_values=-100),
                    'position_ids': np.pad(np.tile(np.arange(s), (b, 1)), ((0, 0), (0, pad))),
                    'teacher_logits': np.pad(teacher, ((0, 0), (0, pad), (0, 0))),
                }
                with ctx:
                    for key, full in want.items():
                        np.testing.assert_array_equal(batch[key].numpy(), full[:, index])
                        gathered = ctx.unshard(batch[key], 1)
                        np.testing.assert_array_equal(gathered.numpy(), full)
                np.testing.assert_array_equal(batch['position_ids'].numpy(), want['position_ids'])
            run_group([size], rank)


class ErrorTests(unittest.TestCase):

    def assert_prepare_fails(self, make_batch, options, code, needle, what):
        """Every rank prepares its own batch from make_batch(): an error on
        the ranks' batches is the same error on every rank, and leaves each
        batch as it was."""
        def rank(mesh):
            batch = make_batch()
            keys = batch.keys()
            before = {key: (batch[key], batch[key].numpy().copy()) for key in keys}
            with self.assertRaises(GLib.Error) as caught:
                batch.prepare(mesh, options)
            # Codes of different domains share numbers: match both.
            self.assertTrue(caught.exception.matches(type(code).quark(), code), caught.exception)
            self.assertIn(needle, caught.exception.message)
            record_error(self, 'CpBatch', what, caught.exception)
            self.assertEqual(batch.keys(), keys)
            for key, (tensor, values) in before.items():
                self.assertIs(batch[key], tensor)
                np.testing.assert_array_equal(tensor.numpy(), values)
        run_group([2], rank)

    @staticmethod
    def e2_with(**changes):
        """Builds E2 batches with keys set to make() or removed (None)."""
        def build():
            batch = e2_batch()
            for key, make in changes.items():
                if make is None:
                    del batch[key]
                else:
                    batch[key] = make()
            return batch
        return build

    def test_xor_and_missing_keys(self):
        self.assert_prepare_fails(self.e2_with(input_ids=None), None, Cp.BatchError.MISSING_KEY, 'exactly one',
                                  'cp_batch_prepare of a batch with neither input_ids nor inputs_embeds')
        embeds = self.e2_with(inputs_embeds=lambda: T(np.zeros((1, 6, 2)), np.float32))
        self.assert_prepare_fails(embeds, None, Cp.BatchError.CONFLICTING_KEYS, 'exactly one',
                                  'cp_batch_prepare of a batch with both input_ids and inputs_embeds')
        self.assert_prepare_fails(self.e2_with(labels=None), None, Cp.BatchError.MISSING_KEY, "'labels'",
                                  'cp_batch_prepare of a batch without labels')
        self.assert_prepare_fails(e2_batch, Cp.BatchOptions(extra_buffers={'teacher_logits': 1}),
                                  Cp.BatchError.MISSING_KEY, "'teacher_logits' is missing",
                                  'cp_batch_prepare naming an extra buffer the batch lacks')

    def test_shapes_and_options(self):
        short = self.e2_with(labels=lambda: T([[1, 2, 3, 4, 5]]))
        self.assert_prepare_fails(short, None, Cp.TensorError.SHAPE, "'labels'",
                                  'cp_batch_prepare with labels shorter than input_ids')
        axis = self.e2_with(teacher_logits=lambda: T(np.zeros((1, 6, 5)), np.float32))
        self.assert_prepare_fails(axis, Cp.BatchOptions(extra_buffers={'teacher_logits': 3}),
                                  Cp.TensorError.SHAPE, 'dimension 3',
                                  'cp_batch_prepare with an extra buffer along a dimension it does not have')
        self.assert_prepare_fails(e2_batch, Cp.BatchOptions(rotate_method='addtoall'),
                                  Cp.BatchError.INVALID_OPTION, '"addtoall"',
                                  'cp_batch_prepare with an unknown rotate method name')

    def test_float_input_ids(self):
        floats = self.e2_with(input_ids=lambda: T([np.arange(6)], np.float32))
        self.assert_prepare_fails(floats, None, Cp.BatchError.DTYPE,
                                  "'input_ids' is float32[1, 6] on host, but token ids are integers",
                                  'cp_batch_prepare with float32 input_ids')

    def test_float_labels_and_mask_pad_with_zero(self):
        # The reference pads floating buffers with 0.0 whatever their key.
        def rank(mesh):
            batch = e2_batch()
            batch['labels'] = T([np.arange(1, 7)], np.float32)
            batch['padding_mask'] = T([[0, 0, 0, 0, 1, 1]], np.float64)
            batch.prepare(mesh)
            np.testing.assert_array_equal(batch['labels'].numpy(), [[1, 2, 3, 4, 5, 6, 0, 0]])
            np.testing.assert_array_equal(batch['padding_mask'].numpy(), [[0, 0, 0, 0, 1, 1, 0, 0]])
        run_group([2], rank)

    def test_rank_disagreement_at_enter(self):
        def rank(mesh):
            length = 8 if mesh.get_rank() == 0 else 12
            batch = Cp.Batch()
            batch['input_ids'] = T([np.arange(length)])
            batch['labels'] = T([np.arange(length)])
            ctx = batch.prepare(mesh)
            ids = batch['input_ids']
            with self.assertRaises(GLib.Error) as caught:
                ctx.enter()
            self.assertTrue(caught.exception.matches(Cp.mesh_error_quark(),
                                                     Cp.MeshError.INVALID_TOPOLOGY))
            self.assertIn('padded sequence length 8', caught.exception.message)
            record_error(self, 'CpContext', "cp_context_enter where ranks' lengths disagree (every rank fails)",
                         caught.exception)
            self.assertEqual(ids.shape, (1, length))
            self.assertFalse(ctx.is_entered())
        run_group([2], rank)


if __name__ == '__main__':
    unittest.main(verbosity=2)
