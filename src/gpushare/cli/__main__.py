# SPDX-License-Identifier: GPL-2.0-or-later
"""``python3 -m gpushare.cli``: the same as the ``gpushare`` command."""

import sys

from gpushare.cli import main

sys.exit(main())
