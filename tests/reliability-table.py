#!/usr/bin/env python3
# Turns the reliability records the tests wrote into doc/reliability.md.
#
# Usage: reliability-table.py RECORDS-DIR OUTPUT [--check COMMITTED]
#
# RECORDS-DIR holds one NAME.jsonl per test (NAME is the Meson test name),
# each line a case the test checked: subject, what was tried, the error it
# got and the test path inside that program.  Distinct cases are keyed by
# (subject, what was tried); one case must get the same error wherever it
# is checked, from C, Python or gjs.
#
# With --check, fails if the written table lists fewer cases than were
# recorded or differs from COMMITTED, the table in the source tree.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import argparse
import collections
import difflib
import json
import os
import sys

HEADER = """\
Title: Reliability

# Reliability: bad input and faults

Every row is a case the test suite checks: what was tried against which
subject, the error it gets, and the tests that check it.  The suite
writes this file (Meson test `reliability`); it is not edited by hand.
After changing the cases, run the whole suite, then
`meson compile -C build reliability-doc` to copy the new table here.

Errors are GError codes of the library's domains unless stated otherwise.

"""

FIELDS = ('subject', 'case', 'error', 'message', 'test')


class RecordError(Exception):
    pass


def read_records(records_dir):
    """Yields (meson test name, record) for every line of every file."""
    for name in sorted(os.listdir(records_dir)):
        if not name.endswith('.jsonl'):
            continue
        path = os.path.join(records_dir, name)
        with open(path, encoding='utf-8') as lines:
            for number, line in enumerate(lines, 1):
                record = json.loads(line)
                missing = [f for f in FIELDS if not record.get(f)]
                if missing:
                    raise RecordError('%s:%d: empty %s' % (path, number, ', '.join(missing)))
                yield name[:-len('.jsonl')], record


def collect_cases(records):
    """(subject, case) -> {'error': ..., 'tests': set of "name path"}."""
    cases = {}
    for test_name, record in records:
        key = (record['subject'], record['case'])
        where = '%s `%s`' % (test_name, record['test'])
        case = cases.setdefault(key, {'error': record['error'], 'tests': set(), 'where': where})
        if case['error'] != record['error']:
            raise RecordError('“%s” on %s gets %s in %s but %s in %s'
                              % (key[1], key[0], case['error'], case['where'],
                                 record['error'], where))
        case['tests'].add(where)
    return cases


def cell(text):
    return text.replace('|', '\\|').replace('\n', ' ')


def render(cases):
    rows = ['| Subject | What was tried | Error it gets | Checked by |',
            '|---|---|---|---|']
    for (subject, what), case in sorted(cases.items()):
        rows.append('| %s | %s | `%s` | %s |' % (
            cell(subject), cell(what), cell(case['error']),
            '<br>'.join(cell(t) for t in sorted(case['tests']))))
    summary = '%d distinct cases.\n\n' % len(cases)
    return HEADER + summary + '\n'.join(rows) + '\n'


def count_rows(text):
    return sum(1 for line in text.splitlines() if line.startswith('| ')) - 1


def check(output_text, n_cases, committed_path):
    problems = []
    if count_rows(output_text) < n_cases:
        problems.append('the table lists %d cases, the tests recorded %d'
                        % (count_rows(output_text), n_cases))
    try:
        with open(committed_path, encoding='utf-8') as committed:
            committed_text = committed.read()
    except FileNotFoundError:
        committed_text = ''
    if committed_text != output_text:
        diff = difflib.unified_diff(committed_text.splitlines(True), output_text.splitlines(True),
                                    'committed', 'generated')
        problems.append('the committed table differs from the one the suite generates;\n'
                        'run `meson compile -C <build> reliability-doc` after a full run:\n'
                        + ''.join(diff))
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('records_dir')
    parser.add_argument('output')
    parser.add_argument('--check', metavar='COMMITTED')
    args = parser.parse_args()

    if not os.path.isdir(args.records_dir):
        print('no records in %s: run the whole test suite first' % args.records_dir,
              file=sys.stderr)
        return 1
    try:
        cases = collect_cases(read_records(args.records_dir))
    except (RecordError, ValueError) as e:
        print(e, file=sys.stderr)
        return 1
    text = render(cases)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, 'w', encoding='utf-8') as out:
        out.write(text)
    print('%d distinct cases written to %s' % (len(cases), args.output))
    if args.check:
        problems = check(text, len(cases), args.check)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
