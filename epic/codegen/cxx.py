"""Printing values and user text into generated C++ safely.

Nothing a user wrote reaches generated code raw: names become identifiers or go through `comment`
(printable ASCII only, so a carriage return or a backslash-newline cannot end a `//` comment early)
or `string` (an escaped C string literal), and numbers print exactly (signed zero, infinities, NaN,
values rounded to float32 the way the kernel will hold them).
"""
from __future__ import annotations

import hashlib
import math
import re
import struct

FLT_MAX = 3.4028234663852886e38


def literal(x: float) -> str:
    """An exact C++ float literal of float(x) rounded to float32 (hex float: no digits lost)."""
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x) or abs(x) > FLT_MAX * (1 + 2**-25):       # beyond float32: the kernel holds inf
        return "INFINITY" if x > 0 else "(-INFINITY)"
    f = struct.unpack("<f", struct.pack("<f", x))[0]          # the float32 the kernel computes with
    if f == 0:
        return "(-0.0f)" if math.copysign(1.0, f) < 0 else "0.0f"
    if f == int(f) and abs(f) < 2**24:
        return f"{int(f)}.0f" if f > 0 else f"(-{int(-f)}.0f)"
    return f"{float.hex(f)}f" if f > 0 else f"(-{float.hex(-f)}f)"


def comment(text: str, limit: int = 120) -> str:
    """Text safe inside a // comment: printable ASCII, no trailing backslash, bounded length."""
    out = "".join(c if " " <= c <= "~" else "?" for c in str(text))
    out = out.replace("\\", "/")
    return out if len(out) <= limit else out[:limit - 3] + "..."


def string(text: str) -> str:
    """A C string literal holding text exactly (octal escapes for everything not plain ASCII)."""
    out = []
    for b in str(text).encode("utf-8"):
        c = chr(b)
        if c in "\\\"":
            out.append("\\" + c)
        elif " " <= c <= "~" and c != "?":        # '?' avoids trigraphs
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def identifier(name: str, limit: int = 48) -> str:
    """A C identifier (and file-name part) for a user name: [A-Za-z0-9_] only, never a keyword, and
    bounded in length (a long name keeps a prefix plus a hash, so names stay distinct)."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    # any name that could equal another's escaped form (too long, changed, a keyword, or shaped like an
    # escaped name) gets a hash of itself: two different names never map to one identifier
    escaped = re.fullmatch(r".*_[0-9a-f]{8}", safe) or safe.startswith("epic_")
    if len(safe) > limit or safe != name or safe in _KEYWORDS or safe[0].isdigit() or escaped:
        safe = "epic_" + safe[:limit - 14] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return safe


_KEYWORDS = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t
char8_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq main""".split())
