#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-or-later
# gpushare: the packaged command. The distribution's python3 runs the packaged core; -I
# keeps PYTHON* variables and the user's site-packages out, as the command often runs as root.
exec @PYTHON3@ -I -c 'import sys; sys.path.insert(0, "@PYTHONDIR@"); from gpushare.cli import main; sys.exit(main())' "$@"
