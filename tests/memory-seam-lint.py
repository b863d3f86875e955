#!/usr/bin/env python3
# Fails when code above the memory interface touches tensor bytes itself.
#
# Usage: memory-seam-lint.py SOURCE-ROOT
#
# Tensor bytes move only through libcpmesh/cp-memory-private.h: a device's
# memory is not host-dereferenceable, and the test device
# (CP_DEVICE_KIND_TEST) crashes any code that tries.  Outside the memory
# interface itself (libcpmesh/cp-memory*.c), the transports
# (libcpmesh/transports/) and the kernels (kernels/), no C file may
#
# - define or call a check_host helper: _cp_tensor_require_device() is the
#   one device check;
# - reach into an operations table with ops->: transports are called
#   through the _cp_comm_*() wrappers, memory through _cp_memory_*();
# - copy or fill with memcpy, memmove, memset or _cp_copy a pointer that
#   came from cp_tensor_get_data() or cp_storage_get_data(), in the same
#   statement or through a variable assigned from it.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import re
import sys

ALLOWED = (
    re.compile(r'^libcpmesh/cp-memory[^/]*\.c$'),
    re.compile(r'^libcpmesh/transports/'),
    re.compile(r'^kernels/'),
)

CHECK_HOST = re.compile(r'\bcheck_host\b')
OPS = re.compile(r'\bops->')
TENSOR_BYTES = re.compile(r'\bcp_(?:tensor|storage)_get_data\s*\(')
BYTE_MOVE = re.compile(r'\b(?:memcpy|memmove|memset|_cp_copy)\s*\(')
# "name = cp_tensor_get_data (...)", with an optional cast.
ASSIGNED = re.compile(r'(\w+)\s*=\s*(?:\([^()]*\)\s*)?cp_(?:tensor|storage)_get_data\s*\(')
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)


def sources(root):
    for top in ('libcpmesh', 'kernels'):
        for directory, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(('.c', '.h')):
                    path = os.path.join(directory, name)
                    yield os.path.relpath(path, root).replace(os.sep, '/'), path


def statements(text):
    """Yields (line number of its first word, statement) for every statement
    or block boundary."""
    start = 0
    for match in re.finditer(r'[;{}]', text):
        statement = text[start:match.end()]
        first = start + len(statement) - len(statement.lstrip())
        yield text.count('\n', 0, first) + 1, statement
        start = match.end()


def problems_in(relpath, text):
    text = COMMENT.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    tainted = set(ASSIGNED.findall(text))
    for line, statement in statements(text):
        where = '%s:%d' % (relpath, line)
        if CHECK_HOST.search(statement):
            yield where, 'a check_host helper; call _cp_tensor_require_device()'
        if OPS.search(statement):
            yield where, 'ops-> outside the transports and the memory interface'
        if BYTE_MOVE.search(statement):
            words = set(re.findall(r'\w+', statement))
            if TENSOR_BYTES.search(statement) or words & tainted:
                yield where, ('a raw copy of tensor bytes; move them with _cp_memory_copy(), '
                              '_cp_memory_copy_2d(), _cp_memory_fill() or a download/upload')


def main():
    root = sys.argv[1]
    found = []
    for relpath, path in sources(root):
        if any(pattern.search(relpath) for pattern in ALLOWED):
            continue
        with open(path, encoding='utf-8') as source:
            found.extend(problems_in(relpath, source.read()))
    for where, what in found:
        print('%s: %s' % (where, what), file=sys.stderr)
    if found:
        print('%d place(s) above the memory interface touch tensor bytes themselves '
              '(see libcpmesh/cp-memory-private.h)' % len(found), file=sys.stderr)
        return 1
    print('no check_host, no ops-> and no raw tensor-byte copies above the memory interface')
    return 0


if __name__ == '__main__':
    sys.exit(main())
