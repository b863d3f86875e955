# Records of the bad-input and fault cases the Python tests check, for
# doc/reliability.md.  Importable without gi, so the cpmesh program's tests
# use it too.
#
# Each record is a JSON line appended to the file named by
# $CP_RELIABILITY_LOG (set per test by tests/meson.build); without that
# variable nothing is written.  The first record of a process empties the
# file, so it holds one run's records, unless CP_RELIABILITY_APPEND is set:
# start processes that record on a test's behalf (ranks of a multi-process
# test) with CP_RELIABILITY_APPEND=1.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import json
import os
import sys
import threading

__all__ = ['record_error', 'record_outcome']

_lock = threading.Lock()
_started = False

# Error domains whose codes are registered enums, by quark string.
_DOMAIN_ENUMS = {
    'cp-tensor-error-quark': 'TensorError',
    'cp-mesh-error-quark': 'MeshError',
    'cp-batch-error-quark': 'BatchError',
    'cp-attention-error-quark': 'AttentionError',
}


def _append(record):
    global _started
    path = os.environ.get('CP_RELIABILITY_LOG')
    if not path:
        return
    line = json.dumps(record, ensure_ascii=False) + '\n'
    with _lock:
        if not _started:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        mode = 'a' if _started or os.environ.get('CP_RELIABILITY_APPEND') else 'w'
        _started = True
        with open(path, mode, encoding='utf-8') as out:
            out.write(line)


def _code_name(error):
    enum_name = _DOMAIN_ENUMS.get(error.domain)
    if enum_name is not None:
        from gi.repository import Cp
        try:
            return getattr(Cp, enum_name)(error.code).value_name
        except ValueError:
            pass
    return '%s %d' % (error.domain, error.code)


def _test_name(test):
    """test.id(), naming the file rather than __main__ for a test run as
    a script."""
    module = type(test).__module__
    if module == '__main__':
        path = getattr(sys.modules[module], '__file__', module)
        module = os.path.splitext(os.path.basename(path))[0]
    return '%s.%s' % (module, test.id().split('.', 1)[1])


def record_error(test, subject, what, error):
    """Records that test (a unittest.TestCase) tried what against subject
    and got error, a GLib.Error with a non-empty message."""
    test.assertTrue(error.message, 'the error has an empty message')
    _append({'subject': subject, 'case': what, 'error': _code_name(error),
             'message': error.message, 'test': _test_name(test)})


def record_outcome(test, subject, what, outcome, message):
    """The same for a failure that is not a GError, such as a program's
    exit status: outcome reads like "exit status 2"."""
    test.assertTrue(message, 'the failure has no message')
    _append({'subject': subject, 'case': what, 'error': outcome,
             'message': message, 'test': _test_name(test)})
