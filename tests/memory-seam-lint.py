#!/usr/bin/env python3
# Fails when code above the memory interface touches tensor bytes itself, or
# when the memory interface or the transports reach up into the layers above.
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
# Below the tensors, the layering goes the other way:
#
# - the memory interface (libcpmesh/cp-memory*.c) takes regions and storage
#   (libcpmesh/cp-region-private.h) and never looks a tensor up: no
#   cp_tensor_*() call, no CpTensor;
# - the transports never call up into the mesh or the asynchronous calls:
#   no _cp_mesh_*() call but the configuration's (_cp_mesh_config_*,
#   _cp_mesh_escape_text), no _cp_task_*() call, no cp-mesh-private.h or
#   cp-task-private.h; a wait learns of a cancellation from its
#   cancellable argument.
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

MEMORY_INTERFACE = re.compile(r'^libcpmesh/cp-memory[^/]*\.c$')
TENSOR_LOOKUP = re.compile(r'\bcp_tensor_\w+\s*\(|\bCpTensor\b')
TRANSPORTS = re.compile(r'^libcpmesh/transports/')
MESH_CALL = re.compile(r'\b_cp_mesh_(?!config_|escape_text\b)\w+\s*\(')
TASK_CALL = re.compile(r'\b_cp_task_\w+\s*\(')
UPWARD_INCLUDE = re.compile(r'#\s*include\s*"(?:[^"]*/)?cp-(?:mesh|task)-private\.h"')


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


def layering_problems_in(relpath, text):
    """What the memory interface and the transports must not reach up to."""
    text = COMMENT.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    for number, line in enumerate(text.split('\n'), 1):
        where = '%s:%d' % (relpath, number)
        if MEMORY_INTERFACE.search(relpath) and TENSOR_LOOKUP.search(line):
            yield where, 'the memory interface looks a tensor up; take a region (cp-region-private.h)'
        if TRANSPORTS.search(relpath):
            if MESH_CALL.search(line) or UPWARD_INCLUDE.search(line):
                yield where, 'a transport calls up into the mesh'
            if TASK_CALL.search(line):
                yield where, ('a transport asks the asynchronous call; take the cancellable its '
                              'wait is given')


def main():
    root = sys.argv[1]
    found = []
    for relpath, path in sources(root):
        with open(path, encoding='utf-8') as source:
            text = source.read()
        found.extend(layering_problems_in(relpath, text))
        if any(pattern.search(relpath) for pattern in ALLOWED):
            continue
        found.extend(problems_in(relpath, text))
    for where, what in found:
        print('%s: %s' % (where, what), file=sys.stderr)
    if found:
        print('%d place(s) touch tensor bytes above the memory interface or reach up from below '
              'it (see libcpmesh/cp-memory-private.h, transports/cp-transport-private.h)'
              % len(found), file=sys.stderr)
        return 1
    print('no check_host, no ops-> and no raw tensor-byte copies above the memory interface; '
          'no tensor look-ups in it and no calls up from the transports')
    return 0


if __name__ == '__main__':
    sys.exit(main())
