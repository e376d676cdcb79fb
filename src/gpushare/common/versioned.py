# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare's own JSON files (state files, journals) carry a version: one reader of that
frame, so each file's parser starts from a mapping it knows the version of."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["versioned_json"]


def versioned_json(text: str, path: str, what: str, version: int,
                   error: type[Exception]) -> dict[str, Any]:
    """The object in ``text``, a ``what`` of ``version``; ``error`` naming ``path`` else."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise error(f"{path}: not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("version") != version:
        raise error(f"{path}: not a {what} of version {version}")
    return raw
