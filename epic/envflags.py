"""Boolean environment switches (EPIC_NO_BUILD, EPIC_VERIFY, EPIC_DEBUG): one parser, so that
`EPIC_NO_BUILD=0` means off everywhere."""
from __future__ import annotations

import os

_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


def enabled(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    value = value.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    from .diagnostics import error
    raise error("E706", f"{name}={os.environ.get(name)!r} is neither on nor off", None,
                "use 1/true/yes/on or 0/false/no/off (or unset it)")
