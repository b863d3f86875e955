# Reads back the picture of a layout that cp_layout_to_svg() draws (what
# `cpmesh layout --svg` writes and Cp.Layout shows in a notebook) with
# xml.etree, and checks it against the chunks and costs it should show.
# Importable without gi, so the cpmesh program's tests use it too.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import xml.etree.ElementTree as ET

__all__ = ['assert_picture', 'read_picture']

SVG = '{http://www.w3.org/2000/svg}'


def read_picture(text):
    """The parsed picture: {'chunks': [dict per chunk rect, in document
    order], 'hatches': {(x, width)}, 'costs': {rank: (cost, fill)},
    'document_bounds': count}. Raises ET.ParseError unless well-formed."""
    root = ET.fromstring(text.encode('utf-8'))
    if root.tag != SVG + 'svg':
        raise AssertionError('the root element is %s, not an SVG svg' % root.tag)
    picture = {'chunks': [], 'hatches': set(), 'costs': {}, 'document_bounds': 0}
    for element in root.iter():
        classes = element.get('class', '').split()
        if element.tag == SVG + 'rect' and 'chunk' in classes:
            picture['chunks'].append({
                'rank': int(element.get('data-rank')),
                'document': int(element.get('data-document')),
                'start': int(element.get('data-start')),
                'length': int(element.get('data-length')),
                'part': classes[1],
                'fill': element.get('fill'),
                'box': (element.get('x'), element.get('width')),
            })
        elif element.tag == SVG + 'rect' and 'hatch' in classes:
            picture['hatches'].add((element.get('x'), element.get('width')))
        elif element.tag == SVG + 'rect' and 'cost' in classes:
            picture['costs'][int(element.get('data-rank'))] = (
                int(element.get('data-cost')), element.get('fill'))
        elif element.tag == SVG + 'line' and 'document-bound' in classes:
            picture['document_bounds'] += 1
    return picture


def assert_picture(test, text, chunks, costs, n_documents=1):
    """Checks an SVG document against what it should show: chunks[rank]
    lists that rank's (part, document, start, length) in local order,
    parts "head", "tail" or "whole"; costs[rank] is its causal cost.
    Every rank has one colour of its own, shared by its chunks and its
    cost bar, and exactly its tail chunks are hatched."""
    picture = read_picture(text)
    drawn = {}
    for chunk in picture['chunks']:
        drawn.setdefault(chunk['rank'], []).append(chunk)
    test.assertEqual(sorted(drawn), sorted(r for r in chunks if chunks[r]))
    test.assertEqual(sorted(picture['costs']), list(range(len(costs))))
    for rank, expected in chunks.items():
        cost, fill = picture['costs'][rank]
        test.assertEqual(cost, round(costs[rank]))
        rank_chunks = drawn.get(rank, [])
        test.assertEqual([(c['part'], c['document'], c['start'], c['length']) for c in rank_chunks],
                         list(expected), 'rank %d' % rank)
        for chunk in rank_chunks:
            test.assertEqual(chunk['fill'], fill, 'rank %d: a chunk not in its colour' % rank)
            test.assertEqual(chunk['box'] in picture['hatches'], chunk['part'] == 'tail',
                             'rank %d: hatching is for tail chunks' % rank)
    fills = [fill for _, fill in picture['costs'].values()]
    test.assertEqual(len(set(fills)), len(fills), 'two ranks share a colour')
    test.assertEqual(picture['document_bounds'], n_documents - 1)
    return picture
