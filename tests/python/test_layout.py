# Cp.Layout from Python: the reference examples, round trips, costs and
# errors.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ET

import numpy as np

from cptest import Cp, GLib, record_error
from layout_svg import assert_picture, read_picture

HEAD_TAIL = Cp.LoadBalance.HEAD_TAIL
CONTIGUOUS = Cp.LoadBalance.CONTIGUOUS


def indices(layout, rank):
    t = layout.get_local_indices(rank)
    assert t.get_dtype() == Cp.DType.INT64
    return t.numpy().tolist()


def head_tail_positions(seq_len, cp_size, rank):
    k = seq_len // (2 * cp_size)
    return list(range(rank * k, (rank + 1) * k)) + \
        list(range((2 * cp_size - 1 - rank) * k, (2 * cp_size - rank) * k))


class TestHeadTail(unittest.TestCase):

    # SEED-SEMANTICS E1.
    EXAMPLES = {
        1: (4, [[0, 1, 2, 3]]),
        2: (8, [[0, 1, 6, 7], [2, 3, 4, 5]]),
        3: (12, [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]]),
        4: (16, [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]),
        8: (32, [[2 * r, 2 * r + 1, 30 - 2 * r, 31 - 2 * r] for r in range(8)]),
    }

    def test_reference_examples(self):
        for cp_size, (seq_len, expected) in self.EXAMPLES.items():
            layout = Cp.Layout.new(HEAD_TAIL, seq_len, cp_size)
            self.assertEqual(layout.get_cp_size(), cp_size)
            self.assertEqual(layout.get_seq_len(), seq_len)
            self.assertEqual(layout.get_balance(), HEAD_TAIL)
            self.assertEqual(layout.get_n_documents(), 1)
            self.assertEqual([indices(layout, r) for r in range(cp_size)], expected)

    def test_every_position_on_exactly_one_rank(self):
        for cp_size in (1, 2, 3, 4, 8):
            for seq_len in (2 * cp_size, 6 * cp_size, 64 * cp_size):
                layout = Cp.Layout.new(HEAD_TAIL, seq_len, cp_size)
                held = []
                for r in range(cp_size):
                    mine = indices(layout, r)
                    self.assertEqual(mine, head_tail_positions(seq_len, cp_size, r))
                    self.assertEqual(layout.get_local_len(r), seq_len // cp_size)
                    held += mine
                self.assertEqual(sorted(held), list(range(seq_len)))

    def test_contiguous(self):
        layout = Cp.Layout.new(CONTIGUOUS, 6, 3)
        self.assertEqual([indices(layout, r) for r in range(3)], [[0, 1], [2, 3], [4, 5]])

    # SEED-SEMANTICS E5.
    def test_restore_indices(self):
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        restore = layout.get_restore_indices().numpy()
        self.assertEqual(restore.tolist(), [0, 1, 4, 5, 6, 7, 2, 3])
        gathered = np.array(indices(layout, 0) + indices(layout, 1))
        self.assertEqual(gathered[restore].tolist(), list(range(8)))


class TestThd(unittest.TestCase):

    # SEED-SEMANTICS E6: two packed documents of padded lengths 8 and 4.
    def test_reference_partition(self):
        layout = Cp.Layout.new_thd([0, 8, 12], 2)
        self.assertEqual(layout.get_n_documents(), 2)
        self.assertEqual(indices(layout, 0), [0, 1, 6, 7, 8, 11])
        self.assertEqual(indices(layout, 1), [2, 3, 4, 5, 9, 10])
        ids = np.array([101, 102, 103, 104, 105, 106, 0, 0, 201, 202, 203, 0], dtype=np.int64)
        full = Cp.Tensor.from_numpy(ids)
        self.assertEqual(layout.shard(full, 0, 0).numpy().tolist(), [101, 102, 0, 0, 201, 0])
        self.assertEqual(layout.shard(full, 0, 1).numpy().tolist(), [103, 104, 105, 106, 202, 203])

    def test_other_partitions(self):
        self.assertEqual(indices(Cp.Layout.new_thd([0, 4, 8], 2), 0), [0, 3, 4, 7])
        four = Cp.Layout.new_thd([0, 8, 16], 4)
        self.assertEqual([indices(four, r) for r in range(4)],
                         [[0, 7, 8, 15], [1, 6, 9, 14], [2, 5, 10, 13], [3, 4, 11, 12]])

    def test_from_tensor(self):
        bounds = Cp.Tensor.from_numpy(np.array([0, 8, 12], dtype=np.int32))
        self.assertTrue(Cp.Layout.new_thd_from_tensor(bounds, 2).equal(Cp.Layout.new_thd([0, 8, 12], 2)))


class TestShard(unittest.TestCase):

    def test_round_trip_every_dtype_and_dim(self):
        cp_size = 4
        for np_name, dtype in [('bool', Cp.DType.BOOL), ('uint8', Cp.DType.UINT8),
                               ('int32', Cp.DType.INT32), ('int64', Cp.DType.INT64),
                               ('float16', Cp.DType.FLOAT16), ('uint16', Cp.DType.BFLOAT16),
                               ('float32', Cp.DType.FLOAT32), ('float64', Cp.DType.FLOAT64)]:
            for seq_dim in range(4):
                shape = [2, 3, 2, 5]
                shape[seq_dim] = 16
                full = (np.arange(np.prod(shape)) % 97).astype(np_name).reshape(shape)
                tensor = Cp.Tensor.from_numpy(full, dtype=dtype)
                layout = Cp.Layout.new(HEAD_TAIL, 16, cp_size)
                pieces = []
                for r in range(cp_size):
                    piece = layout.shard(tensor, seq_dim, r)
                    expected = np.take(full, indices(layout, r), axis=seq_dim)
                    self.assertTrue(np.array_equal(piece.numpy(), expected), (np_name, seq_dim, r))
                    pieces.append(piece)
                back = layout.unshard_pieces(pieces, seq_dim)
                self.assertTrue(back.equal(tensor), (np_name, seq_dim))

    def test_negative_seq_dim(self):
        full = np.arange(16, dtype=np.int32).reshape(2, 8)
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        piece = layout.shard(Cp.Tensor.from_numpy(full), -1, 1)
        self.assertEqual(piece.numpy().tolist(), [[2, 3, 4, 5], [10, 11, 12, 13]])

    # SEED-SEMANTICS E4.
    def test_backward_scatters_into_zeros(self):
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        ones = Cp.Tensor.new_full(Cp.DType.FLOAT32, [1, 4, 1], 1.0)
        grad = layout.shard_backward(ones, 1, 1)
        self.assertEqual(grad.get_shape(), [1, 8, 1])
        self.assertEqual(grad.numpy().ravel().tolist(), [0, 0, 1, 1, 1, 1, 0, 0])


class TestCost(unittest.TestCase):

    def test_head_tail_is_balanced(self):
        for cp_size in (1, 2, 3, 4, 8):
            seq_len = 64 * cp_size
            ht = Cp.Layout.new(HEAD_TAIL, seq_len, cp_size)
            contiguous = Cp.Layout.new(CONTIGUOUS, seq_len, cp_size)
            costs = [ht.get_cost(r) for r in range(cp_size)]
            self.assertEqual(len(set(costs)), 1)
            self.assertEqual(ht.get_imbalance(), 1.0)
            total = sum(contiguous.get_cost(r) for r in range(cp_size))
            self.assertEqual(total, seq_len * (seq_len + 1) / 2)
            self.assertEqual(sum(costs), total)
            self.assertAlmostEqual(contiguous.get_imbalance(), (2 * cp_size - 1) / cp_size, delta=0.02)

    def test_small_example(self):
        # C=2, S=8: rank 0 holds [0,1,6,7] -> 1+2+7+8 pairs, rank 1 [2..5] -> 3+4+5+6.
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        self.assertEqual([layout.get_cost(0), layout.get_cost(1)], [18.0, 18.0])
        contiguous = Cp.Layout.new(CONTIGUOUS, 8, 2)
        self.assertEqual([contiguous.get_cost(0), contiguous.get_cost(1)], [10.0, 26.0])
        self.assertEqual(contiguous.get_imbalance(), 26 / 18)


class TestChunks(unittest.TestCase):

    def test_touching_chunks_stay_apart(self):
        layout = Cp.Layout.new(HEAD_TAIL, 16, 4)
        self.assertEqual(layout.get_chunks(3).numpy().tolist(), [[6, 2], [8, 2]])
        self.assertEqual(indices(layout, 3), [6, 7, 8, 9])
        self.assertEqual(Cp.Layout.new(CONTIGUOUS, 16, 4).get_chunks(1).numpy().tolist(), [[4, 4]])

    def test_documents_head_then_tail(self):
        layout = Cp.Layout.new_thd([0, 8, 8, 20], 2)
        self.assertEqual(layout.get_chunks(1).numpy().tolist(),
                         [[2, 2], [4, 2], [8, 0], [8, 0], [11, 3], [14, 3]])


def drawn_chunks(layout):
    """rank -> [(part, document, start, length)] the picture must show,
    from get_chunks; checked against the local indices on the way."""
    per_document = 1 if layout.get_balance() == CONTIGUOUS else 2
    expected = {}
    for rank in range(layout.get_cp_size()):
        rows = layout.get_chunks(rank).numpy().tolist()
        positions = [p for start, length in rows for p in range(start, start + length)]
        assert positions == indices(layout, rank), 'chunks and local indices disagree'
        expected[rank] = [('whole' if per_document == 1 else ('head', 'tail')[i % 2],
                           i // per_document, start, length)
                          for i, (start, length) in enumerate(rows) if length > 0]
    return expected


def costs(layout):
    return [layout.get_cost(r) for r in range(layout.get_cp_size())]


class TestPicture(unittest.TestCase):
    """Cp.Layout's _repr_svg_ and _repr_html_, which notebooks show."""

    def assertPicture(self, layout, svg):
        return assert_picture(self, svg, drawn_chunks(layout), costs(layout),
                              layout.get_n_documents())

    def test_head_tail(self):
        for cp_size in (1, 2, 3, 4, 8, 16):
            with self.subTest(cp_size=cp_size):
                layout = Cp.Layout.new(HEAD_TAIL, 8 * cp_size, cp_size)
                self.assertPicture(layout, layout._repr_svg_())

    def test_rank_three_of_four_shows_its_head_and_tail(self):
        layout = Cp.Layout.new(HEAD_TAIL, 16, 4)
        picture = self.assertPicture(layout, layout._repr_svg_())
        rank3 = [(c['part'], c['start'], c['length']) for c in picture['chunks'] if c['rank'] == 3]
        self.assertEqual(rank3, [('head', 6, 2), ('tail', 8, 2)])

    def test_contiguous(self):
        layout = Cp.Layout.new(CONTIGUOUS, 16, 4)
        picture = self.assertPicture(layout, layout._repr_svg_())
        self.assertEqual(picture['hatches'], set())
        self.assertEqual([round(c) for c in costs(layout)],
                         [picture['costs'][r][0] for r in range(4)])

    def test_packed_documents(self):
        layout = Cp.Layout.new_thd([0, 8, 24, 24, 32], 2)
        picture = self.assertPicture(layout, layout._repr_svg_())
        self.assertEqual(picture['document_bounds'], 3)
        self.assertEqual({c['document'] for c in picture['chunks']}, {0, 1, 3})

    def test_large_layout_is_summarised(self):
        # A notebook shows _repr_svg_ of whatever it is given: 8192
        # documents over 64 ranks once made 308 MB.
        layout = Cp.Layout.new_thd([128 * d for d in range(8193)], 64)
        svg = layout._repr_svg_()
        self.assertLess(len(svg.encode('utf-8')), 256 * 1024)
        root = ET.fromstring(svg.encode('utf-8'))
        summaries = [e for e in root.iter('{http://www.w3.org/2000/svg}rect')
                     if e.get('class') == 'summary']
        self.assertGreater(len(summaries), 1)
        self.assertEqual(sum(int(e.get('data-length')) for e in summaries), 128 * 8192)
        self.assertEqual(read_picture(svg)['chunks'], [])

    def test_html_is_the_same_picture_inline(self):
        layout = Cp.Layout.new_thd([0, 8, 24, 32], 2)
        html = layout._repr_html_()
        self.assertTrue(html.startswith('<div class="cp-layout"><svg '))
        self.assertNotIn('<?xml', html)
        self.assertEqual(ET.fromstring(html)[0].tag, '{http://www.w3.org/2000/svg}svg')
        svg = layout._repr_svg_()
        self.assertIn(svg[svg.index('<svg'):], html)
        self.assertPicture(layout, html[len('<div class="cp-layout">'):-len('</div>')])

    def test_the_same_picture_as_cpmesh(self):
        cpmesh = os.path.join(os.environ.get('CPMESH_BUILDDIR', ''), 'tools', 'cpmesh')
        if not os.path.exists(cpmesh):
            self.skipTest('the cpmesh program is not built')
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'layout.svg')
            subprocess.run([cpmesh, 'layout', '--cp', '2', '--thd', '0,8,24,32', '--svg', path],
                           check=True, capture_output=True, timeout=60)
            with open(path, encoding='utf-8') as drawn:
                self.assertEqual(drawn.read(), Cp.Layout.new_thd([0, 8, 24, 32], 2).to_svg())

    def test_repr(self):
        self.assertEqual(repr(Cp.Layout.new(HEAD_TAIL, 16, 4)),
                         '<Cp.Layout head-tail, 16 positions over 4 ranks>')
        self.assertEqual(repr(Cp.Layout.new_thd([0, 8, 12], 2)),
                         '<Cp.Layout 2 documents, 12 positions over 2 ranks>')


class TestFingerprint(unittest.TestCase):

    def test_stable_and_discriminating(self):
        a = Cp.Layout.new(HEAD_TAIL, 16, 4)
        self.assertEqual(a.fingerprint(), 0x60d6407a50e9d88e)  # the same as in C
        self.assertEqual(a.fingerprint(), Cp.Layout.new(HEAD_TAIL, 16, 4).fingerprint())
        self.assertNotEqual(a.fingerprint(), Cp.Layout.new(HEAD_TAIL, 16, 2).fingerprint())
        self.assertNotEqual(a.fingerprint(), Cp.Layout.new(CONTIGUOUS, 16, 4).fingerprint())
        thd = Cp.Layout.new_thd([0, 16], 4)
        self.assertTrue(a.equal(thd))
        self.assertEqual(a.fingerprint(), thd.fingerprint())


class TestErrors(unittest.TestCase):

    def assertShapeError(self, what, fragment, func, *args):
        with self.assertRaises(GLib.Error) as caught:
            func(*args)
        self.assertTrue(caught.exception.matches(Cp.tensor_error_quark(), Cp.TensorError.SHAPE))
        self.assertIn(fragment, caught.exception.message)
        record_error(self, 'CpLayout', what, caught.exception)

    def test_indivisible_lengths(self):
        self.assertShapeError('cp_layout_new head-tail with a length not a multiple of 2·cp_size',
                              'sequence length 6 is not a non-negative multiple of 4',
                              Cp.Layout.new, HEAD_TAIL, 6, 2)
        self.assertShapeError('cp_layout_new contiguous with a length not a multiple of cp_size',
                              '10', Cp.Layout.new, CONTIGUOUS, 10, 4)
        self.assertShapeError('cp_layout_new_thd with a document not a multiple of 2·cp_size',
                              'document 1 has padded length 6, not a multiple of 4',
                              Cp.Layout.new_thd, [0, 4, 10], 2)
        self.assertShapeError('cp_layout_new_thd with decreasing bounds',
                              'decreases', Cp.Layout.new_thd, [0, 8, 4], 2)

    def test_bad_cp_size(self):
        with self.assertRaises(GLib.Error) as caught:
            Cp.Layout.new(HEAD_TAIL, 8, 0)
        self.assertTrue(caught.exception.matches(Cp.tensor_error_quark(), Cp.TensorError.OUT_OF_RANGE))
        record_error(self, 'CpLayout', 'cp_layout_new with cp_size 0', caught.exception)

    def test_shard_of_the_wrong_length(self):
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        wrong = Cp.Tensor.new(Cp.DType.INT64, [2, 10])
        self.assertShapeError('cp_layout_shard of a tensor whose sequence length differs from the layout',
                              'dimension 1 of int64[2, 10] on host has length 10, the layout needs 8',
                              layout.shard, wrong, 1, 0)

    def test_unshard_pieces_mismatch(self):
        layout = Cp.Layout.new(HEAD_TAIL, 8, 2)
        piece = Cp.Tensor.new(Cp.DType.INT64, [4])
        self.assertShapeError('cp_layout_unshard_pieces with fewer pieces than cp_size',
                              '1 pieces were given for cp_size 2',
                              layout.unshard_pieces, [piece], 0)
        self.assertShapeError('cp_layout_unshard_pieces with a piece of the wrong shape',
                              'piece 1', layout.unshard_pieces,
                              [piece, Cp.Tensor.new(Cp.DType.INT64, [3])], 0)


if __name__ == '__main__':
    unittest.main(verbosity=2)
