# Cp.Batch.to_thd from Python: the cases of NeMo Automodel's test_thd_utils
# and the TE cases of test_cp_utils, examples E6-E8 and a property over
# random packed documents, on in-process meshes (one thread per rank).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import threading
import unittest

import gi

gi.require_version('Cp', '1')
from gi.repository import Cp, GLib  # noqa: E402
import numpy as np  # noqa: E402

from cptestutil import T  # noqa: E402
from ranks import run_group  # noqa: E402
from reliability import record_error  # noqa: E402

SENTINEL = -1000


def packed(ids, seq_lens, seq_lens_padded=None, positions=None):
    ids = np.array(ids)
    batch = Cp.Batch()
    batch['input_ids'] = T(ids, ids.dtype)
    batch['labels'] = T(ids + 1 if ids.ndim == 2 else np.zeros(ids.shape[:2]))
    if positions is None:
        positions = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1))
    batch['position_ids'] = T(positions)
    batch['seq_lens'] = T(seq_lens)
    batch['seq_lens_padded'] = T(seq_lens if seq_lens_padded is None else seq_lens_padded)
    return batch


def uniform(rows, cols, packs=1):
    return packed(np.arange(1, rows * cols + 1).reshape(rows, cols), np.full((rows, packs), cols // packs))


def arr(batch, key):
    return batch[key].numpy()


class ConversionTests(unittest.TestCase):

    def test_basic_conversion(self):
        batch = packed([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], [[6], [6]])
        out = batch.to_thd()
        self.assertEqual(out.props.qkv_format, 'thd')
        self.assertEqual(out['input_ids'].shape, (12,))
        self.assertEqual(out['labels'].shape, (12,))
        np.testing.assert_array_equal(arr(out, 'input_ids'), np.arange(1, 13))
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0, 6, 12])
        self.assertEqual(arr(out, 'cu_seqlens').dtype, np.int32)
        self.assertNotIn('cu_seqlens_padded', out)
        self.assertEqual(int(arr(out, 'max_seqlen')), 6)

    def test_packed_sequences(self):
        out = packed([[1, 2, 3, 99, 4, 5], [6, 7, 99, 8, 9, 10]], [[3, 2], [2, 3]], [[4, 2], [3, 3]]).to_thd()
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0, 3, 5, 7, 10])
        np.testing.assert_array_equal(arr(out, 'cu_seqlens_padded'), [0, 4, 6, 9, 12])
        out = packed([[1, 2, 3, 99, 4, 5], [6, 7, 8, 9, 10, 11]],
                     [[3, 2], [6, SENTINEL]], [[4, 2], [6, SENTINEL]]).to_thd()
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0, 3, 5, 11])
        np.testing.assert_array_equal(arr(out, 'cu_seqlens_padded'), [0, 4, 6, 12])
        np.testing.assert_array_equal(arr(out, 'padding_mask'), [0, 0, 0, 1] + [0] * 8)

    def test_dtypes_and_embeddings(self):
        out = uniform(2, 3).to_thd()
        for key in ('input_ids', 'labels', 'position_ids'):
            self.assertEqual(arr(out, key).dtype, np.int64)
        batch = uniform(2, 6)
        batch['input_ids'] = T(np.random.default_rng(0).standard_normal((2, 6, 128)), np.float32)
        out = batch.to_thd()
        self.assertEqual(out['input_ids'].shape, (12, 128))
        self.assertEqual(arr(out, 'input_ids').dtype, np.float32)
        self.assertEqual(out['cu_seqlens'].shape, (3,))

    def test_sizes(self):
        for rows in (1, 2, 4, 8):
            out = uniform(rows, 16).to_thd()
            self.assertEqual(out['input_ids'].shape, (rows * 16,))
            self.assertEqual(out['cu_seqlens'].shape, (rows + 1,))
        for cols in (32, 64, 128, 256, 512, 1024):
            self.assertEqual(arr(uniform(4, cols).to_thd(), 'cu_seqlens')[-1], 4 * cols)
        out = uniform(16, 384, 3).to_thd()
        self.assertEqual(out['cu_seqlens'].shape, (49,))
        self.assertEqual(arr(out, 'cu_seqlens')[-1], 16 * 384)

    def test_chunks(self):
        two = Cp.ThdOptions(num_chunks=2)
        out = uniform(4, 6).to_thd(None, two)
        self.assertEqual(out['input_ids'].shape, (2, 12))
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [[0, 6, 12], [0, 6, 12]])
        ids = [[1, 2, 3, 99, 4, 5], [6, 7, 99, 8, 9, 10]] * 2
        out = packed(ids, [[3, 2], [2, 3]] * 2, [[4, 2], [3, 3]] * 2).to_thd(None, two)
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [[0, 3, 5, 7, 10]] * 2)
        one = uniform(2, 3).to_thd(None, Cp.ThdOptions(num_chunks=1))
        np.testing.assert_array_equal(arr(one, 'input_ids'), arr(uniform(2, 3).to_thd(), 'input_ids'))
        for n in (2, 4, 8):
            out = uniform(16, 8).to_thd(None, Cp.ThdOptions(num_chunks=n))
            self.assertEqual(out['input_ids'].shape, (n, 16 // n * 8))
        out = uniform(16, 32).to_thd(None, Cp.ThdOptions(num_chunks=8))
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [[0, 32, 64]] * 8)
        batch = uniform(4, 6)
        batch['input_ids'] = T(np.zeros((4, 6, 128)), np.float32)
        self.assertEqual(batch.to_thd(None, two)['input_ids'].shape, (2, 12, 128))

    def test_chunk_document_counts(self):
        ids = [[1, 2, 3, 99, 4, 5], [6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 99, 99], [16, 17, 99, 18, 19, 20]]
        lens = [[3, 2, SENTINEL], [6, SENTINEL, SENTINEL], [4, SENTINEL, SENTINEL], [2, 3, SENTINEL]]
        padded = [[4, 2, SENTINEL], [6, SENTINEL, SENTINEL], [4, SENTINEL, SENTINEL], [3, 3, SENTINEL]]
        out = packed(ids, lens, padded).to_thd(None, Cp.ThdOptions(num_chunks=2))
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [[0, 3, 5, 11], [0, 4, 6, 9]])
        # Row 2 ends early: its last two tokens are padding of its document,
        # so row 3's documents keep their offsets.
        np.testing.assert_array_equal(arr(out, 'cu_seqlens_padded'), [[0, 4, 6, 12], [0, 6, 9, 12]])

    def test_custom_sentinel_and_padded_rows(self):
        options = Cp.ThdOptions(num_chunks=2, seq_lens_padding_value=-999)
        out = packed(np.arange(12).reshape(4, 3), [[3, -999]] * 4).to_thd(None, options)
        self.assertEqual(out['cu_seqlens'].shape, (2, 3))
        ids = [[1, 2, 3, 99, 4, 5], [6, 7, 8, 9, 10, 11]] * 2
        out = packed(ids, [[3, 2], [6, SENTINEL]] * 2, [[4, 2], [6, SENTINEL]] * 2).to_thd(
            None, Cp.ThdOptions(num_chunks=2))
        self.assertEqual(out['cu_seqlens'].shape[0], 2)
        self.assertEqual(out['cu_seqlens_padded'].shape[0], 2)

    def test_padding_mask_rules(self):
        batch = packed([[0, 1, 2], [3, 0, 5], [0, 0, 8], [9, 10, 11]], [[3]] * 4)
        token = Cp.ThdOptions(num_chunks=2, padding_mask_rule=Cp.PaddingMaskRule.TOKEN_ID, padding_token_id=0)
        mask = arr(batch.to_thd(None, token), 'padding_mask')
        self.assertEqual(mask.shape, (2, 6))
        np.testing.assert_array_equal(mask[0], [True, False, False, False, True, False])
        layout = arr(batch.to_thd(None, Cp.ThdOptions(num_chunks=2)), 'padding_mask')
        self.assertFalse(layout.any())

    def test_absorption(self):
        sub, pack = 112, 1024
        lens = [[sub] * 5 + [SENTINEL] * 4]
        padded = [[sub] * 4 + [sub + pack - 5 * sub] + [SENTINEL] * 4]
        out = packed(np.zeros((1, pack), np.int64), lens, padded).to_thd()
        np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0, 112, 224, 336, 448, 1024])
        self.assertNotIn('cu_seqlens_padded', out)
        self.assertEqual(int(arr(out, 'max_seqlen')), 576)
        np.testing.assert_array_equal(arr(out, 'padding_mask'), np.arange(pack) >= 560)
        full = packed(np.zeros((1, pack), np.int64), [[sub] * 9], [[sub] * 8 + [sub + 16]]).to_thd()
        self.assertEqual(arr(full, 'cu_seqlens')[-1], pack)
        self.assertEqual(int(arr(full, 'max_seqlen')), 128)
        mixed = packed(np.zeros((2, pack), np.int64), [[sub] * 9, lens[0]],
                       [[sub] * 8 + [sub + 16], padded[0]]).to_thd(None, Cp.ThdOptions(num_chunks=2))
        self.assertNotIn('cu_seqlens_padded', mixed)
        np.testing.assert_array_equal(arr(mixed, 'max_seqlen'), [128, 576])
        e8 = packed([[1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0]], [[4, 5]], [[4, 8]]).to_thd()
        np.testing.assert_array_equal(arr(e8, 'cu_seqlens'), [0, 4, 12])
        self.assertEqual(int(arr(e8, 'max_seqlen')), 8)


class ShardTests(unittest.TestCase):

    def test_te_basic(self):
        def rank(mesh):
            out = packed([[1, 2, 3, 4], [5, 6, 7, 8]], [[4], [4]]).to_thd(mesh)
            for key in ('input_ids', 'labels', 'position_ids', 'cu_seqlens', 'max_seqlen', 'padding_mask'):
                self.assertIn(key, out)
            self.assertEqual(out.props.qkv_format, 'thd')
            self.assertEqual(arr(out, 'cu_seqlens').dtype, np.int32)
            expected = [1, 4, 5, 8] if mesh.get_rank() == 0 else [2, 3, 6, 7]
            np.testing.assert_array_equal(arr(out, 'input_ids'), expected)
            self.assertEqual(int(arr(out, 'cp_size')), 2)
            self.assertEqual(int(arr(out, 'cp_rank')), mesh.get_rank())
        run_group([2], rank)

    def test_no_rows(self):
        batch = packed(np.zeros((0, 8), np.int64), np.zeros((0, 2)))

        def rank(mesh):
            out = batch.to_thd(mesh)
            for key in ('input_ids', 'labels', 'position_ids', 'padding_mask'):
                self.assertEqual(out[key].shape, (0,))
            np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0])
            np.testing.assert_array_equal(arr(out, 'local_cu_seqlens'), [0])
            self.assertNotIn('max_seqlen', out)
        run_group([2], rank)

    def test_packed_input(self):
        def rank(mesh):
            batch = Cp.Batch()
            batch['input_ids'] = T([1, 2, 3, 4])
            batch['labels'] = T([10, 20, 30, 40])
            batch['position_ids'] = T([0, 1, 2, 3])
            batch['cu_seqlens'] = T([0, 4], np.int32)
            batch['cu_seqlens_padded'] = T([0, 4], np.int32)
            out = batch.to_thd(mesh)
            self.assertIn('input_ids', out)
            self.assertNotIn('attention_mask', out)
            np.testing.assert_array_equal(arr(out, 'labels'), [10, 40] if mesh.get_rank() == 0 else [20, 30])
        run_group([2], rank)

    def test_packed_input_keeps_sentinels(self):
        # The reference's _shard_thd_chunk_for_te: partition with the bounds
        # that are not the sentinel, hand cu_seqlens_padded back as given.
        def reference(ids, cu_pad, sentinel, c, r):
            f = cu_pad[cu_pad != sentinel]
            index = []
            for start, end in zip(f[:-1], f[1:]):
                h = (end - start) // (2 * c)
                index += list(range(start + r * h, start + (r + 1) * h))
                index += list(range(start + (2 * c - 1 - r) * h, start + (2 * c - r) * h))
            return ids[index], cu_pad

        for bounds in ([0, 4, -999], [0, -999, 4, 8], [0, 4, 8, -999, -999]):
            cu_pad = np.array(bounds, np.int32)
            tokens = int(cu_pad[cu_pad != -999][-1])
            ids = np.arange(1, tokens + 1)

            def rank(mesh):
                batch = Cp.Batch()
                batch['input_ids'] = T(ids)
                batch['labels'] = T(ids)
                batch['position_ids'] = T(np.arange(tokens))
                batch['cu_seqlens'] = T(cu_pad, np.int32)
                batch['cu_seqlens_padded'] = T(cu_pad, np.int32)
                out = batch.to_thd(mesh, Cp.ThdOptions(seq_lens_padding_value=-999))
                want_ids, want_cu = reference(ids, cu_pad, -999, mesh.get_world_size(), mesh.get_rank())
                np.testing.assert_array_equal(arr(out, 'input_ids'), want_ids)
                np.testing.assert_array_equal(arr(out, 'cu_seqlens'), want_cu)
                self.assertEqual(arr(out, 'cu_seqlens').dtype, np.int32)
            run_group([2], rank)

    def test_e6(self):
        def rank(mesh):
            ids = [[101, 102, 103, 104, 105, 106, 0, 0, 201, 202, 203, 0]]
            positions = [list(range(8)) + list(range(4))]
            out = packed(ids, [[6, 3]], [[8, 4]], positions).to_thd(mesh)
            np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [0, 8, 12])
            self.assertEqual(int(arr(out, 'max_seqlen')), 8)
            if mesh.get_rank() == 0:
                np.testing.assert_array_equal(arr(out, 'input_ids'), [101, 102, 0, 0, 201, 0])
                np.testing.assert_array_equal(arr(out, 'position_ids'), [0, 1, 6, 7, 0, 3])
                np.testing.assert_array_equal(arr(out, 'padding_mask'), [0, 0, 1, 1, 0, 1])
                np.testing.assert_array_equal(arr(out, 'local_cu_seqlens'), [0, 2, 3])
            else:
                np.testing.assert_array_equal(arr(out, 'input_ids'), [103, 104, 105, 106, 202, 203])
                np.testing.assert_array_equal(arr(out, 'position_ids'), [2, 3, 4, 5, 1, 2])
                self.assertFalse(arr(out, 'padding_mask').any())
                np.testing.assert_array_equal(arr(out, 'local_cu_seqlens'), [0, 4, 6])
            self.assertEqual(out.get_layout(0).get_imbalance(), 1.0)
        run_group([2], rank)

    def test_e7_chunks(self):
        def rank(mesh):
            out = packed(np.arange(1, 17).reshape(2, 8), [[3, 4], [8, SENTINEL]],
                         [[4, 4], [8, SENTINEL]]).to_thd(mesh, Cp.ThdOptions(num_chunks=2))
            np.testing.assert_array_equal(arr(out, 'cu_seqlens'), [[0, 4, 8], [0, 8, SENTINEL]])
            np.testing.assert_array_equal(arr(out, 'max_seqlen'), [4, 8])
            self.assertNotIn('cu_seqlens_padded', out)
            if mesh.get_rank() == 0:
                np.testing.assert_array_equal(arr(out, 'input_ids'), [[1, 4, 5, 8], [9, 10, 15, 16]])
        run_group([2], rank)

    def test_embeddings_keep_dtype(self):
        def rank(mesh):
            batch = uniform(1, 8)
            del batch['input_ids']
            embeds = np.arange(24, dtype=np.float32).reshape(1, 8, 3)
            batch['inputs_embeds'] = T(embeds, np.float32)
            out = batch.to_thd(mesh)
            index = [0, 1, 6, 7] if mesh.get_rank() == 0 else [2, 3, 4, 5]
            np.testing.assert_array_equal(arr(out, 'inputs_embeds'), embeds[0, index])
        run_group([2], rank)

    def test_random_documents(self):
        """Property: every position held exactly once, head-tail per document,
        the layout mask marks exactly the padding, local cu_seqlens add up."""
        for seed in range(10):
            rng = np.random.default_rng(seed)
            size = int(rng.integers(1, 9))
            rows, docs = int(rng.integers(1, 4)), int(rng.integers(1, 5))
            lens = rng.integers(0, 30, (rows, docs))
            cols = int(lens.sum(axis=1).max()) + 3
            raw = packed(np.zeros((rows, cols), np.int64), lens)
            del raw['seq_lens_padded']
            batch = raw.pad_documents(size)
            total = batch['input_ids'].shape[0] * batch['input_ids'].shape[1]
            batch['input_ids'] = T(np.arange(total).reshape(batch['input_ids'].shape))
            real = lens.ravel()
            seen = np.zeros(total, np.int64)
            local_real = []
            lock = threading.Lock()

            def rank(mesh, batch=batch, real=real, seen=seen, local_real=local_real, size=size):
                out = batch.to_thd(mesh)
                ids = arr(out, 'input_ids')
                # Sharded, cu_seqlens holds the padded bounds; unsharded, the
                # padded ones are cu_seqlens_padded when they differ.
                cu = arr(out, 'cu_seqlens_padded' if 'cu_seqlens_padded' in out else 'cu_seqlens')
                docs = np.searchsorted(cu, ids, side='right') - 1
                offsets = ids - cu[docs]
                np.testing.assert_array_equal(arr(out, 'padding_mask'), offsets >= real[docs])
                if size > 1:
                    h = (cu[docs + 1] - cu[docs]) // (2 * size)
                    chunk = offsets // h
                    r = mesh.get_rank()
                    self.assertTrue(np.all((chunk == r) | (chunk == 2 * size - 1 - r)))
                    local_real.append(int(arr(out, 'local_cu_seqlens')[-1]))
                with lock:
                    seen[ids] += 1
            run_group([size], rank)
            np.testing.assert_array_equal(seen, 1)
            if size > 1:
                self.assertEqual(sum(local_real), int(real.sum()))


class ErrorTests(unittest.TestCase):

    def assert_fails(self, batch, options, size, code, needle, what):
        def rank(mesh):
            with self.assertRaises(GLib.Error) as caught:
                batch.to_thd(mesh, options)
            # Codes of different domains share numbers: match both.
            self.assertTrue(caught.exception.matches(type(code).quark(), code), caught.exception)
            self.assertIn(needle, caught.exception.message)
            record_error(self, 'CpBatch (THD)', what, caught.exception)
        run_group([size], rank)

    def test_errors(self):
        batch = uniform(1, 4)
        self.assert_fails(batch, Cp.ThdOptions(qkv_format='bshd'), 2, Cp.BatchError.UNSUPPORTED_FORMAT,
                          "only 'thd' format is supported",
                          'cp_batch_to_thd with a qkv format other than thd')
        missing = uniform(1, 3)
        del missing['seq_lens']
        self.assert_fails(missing, None, 1, Cp.BatchError.MISSING_KEY, 'seq_lens',
                          'cp_batch_to_thd of a padded batch without seq_lens')
        self.assert_fails(packed(np.arange(8).reshape(1, 8), [[6, 2]]), None, 2,
                          Cp.BatchError.INDIVISIBLE, 'not a multiple of 2·C = 4',
                          'cp_batch_to_thd with a padded document length not a multiple of 2·C')
        self.assert_fails(packed(np.arange(8).reshape(1, 8), [[4, -3]], [[4, 4]]), None, 2,
                          Cp.BatchError.INVALID_SEQ_LENS, 'negative length',
                          'cp_batch_to_thd with a negative sequence length')
        self.assert_fails(uniform(4, 4), Cp.ThdOptions(num_chunks=3), 2, Cp.BatchError.INDIVISIBLE,
                          'num_chunks 3 does not divide the 4 batch rows',
                          'cp_batch_to_thd with num_chunks not dividing the batch rows')
        thd = Cp.Batch()
        thd['input_ids'] = T([1, 2, 3, 4])
        thd['labels'] = T([1, 2, 3, 4])
        thd['position_ids'] = T([0, 1, 2, 3])
        thd['cu_seqlens'] = T([0, 4], np.int64)
        self.assert_fails(thd, None, 2, Cp.BatchError.INVALID_SEQ_LENS, 'int32',
                          'cp_batch_to_thd of a packed batch whose cu_seqlens are not int32')


if __name__ == '__main__':
    unittest.main(verbosity=2)
