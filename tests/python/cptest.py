# Shared fixtures of the Python tests: the Cp namespace and the
# reliability records.  Ranks are run by ranks.py.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import gi

gi.require_version('Cp', '1')
from gi.repository import Cp, GLib  # noqa: E402

from reliability import record_error, record_outcome  # noqa: E402

__all__ = ['Cp', 'GLib', 'record_error', 'record_outcome']
