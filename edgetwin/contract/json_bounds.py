"""Reading JSON that someone else wrote, bounded: its size and its nesting depth, checked first.

Every JSON edgetwin reads from outside — an artifact's ``SIGNATURE.json``, ``MANIFEST.json`` and
``policy.json``, a Prometheus server's answer — could be written by an attacker. Python's ``json``
parser has two ways to fail that are not a clean "this is not valid JSON":

* **depth**: ``[[[[...]]]]`` a few thousand deep makes the decoder (and later ``repr``, comparisons,
  anything that walks the value) raise `RecursionError` — an uncaught traceback, not a refusal;
* **size**: it reads what it is given; a 1.5 GB answer is 3-4 GB of Python objects.

`loads_bounded` refuses both *before* parsing: the byte count against ``max_bytes``, and the
deepest nesting of ``[`` / ``{`` outside strings against ``max_depth`` (a scan in C: a regular
expression removes the string literals, numpy counts the brackets, block by block). What it raises
is a `JSONRefused`, a `ValueError`, so the callers' existing ``except ValueError`` turns it into their
one-line error naming the file (exit 2).

Why our own check and not a library: the standard library has no depth limit, and the streaming
parsers (ijson) would add a dependency to bound what a 30-line pre-scan bounds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "JSONRefused", "json_depth", "loads_bounded", "read_json"]

#: The deepest nesting accepted. edgetwin's own documents nest at most ~6 levels (a Prometheus
#: answer: data → result → [i] → values → [j]); 64 leaves room for any honest writer and stays far
#: below the interpreter's recursion limit (1,000).
MAX_DEPTH = 64
#: Bytes scanned per block of the depth check (bounds the scan's own memory: ~9 bytes per byte).
_BLOCK = 1 << 22
#: A JSON string literal (escapes included); what is inside one is not structure.
#: (Friedl's unrolled loop: runs of plain characters are matched in one step, so a 50 MB string
#: takes ~0.2 s where the alternation ``(?:[^"\\]|\\.)*`` takes ~15 s.)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


class JSONRefused(ValueError):
    """The document is larger or deeper than the reader accepts (the message says which)."""


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in ``data`` (0 for a scalar), ignoring strings.

    Unbalanced input (which the parser will refuse anyway) is measured as written.
    """
    stripped = _STRING.sub(b'""', data)
    deepest, level = 0, 0
    for k in range(0, len(stripped), _BLOCK):
        delta = _OPEN[np.frombuffer(stripped, dtype=np.uint8, count=min(_BLOCK, len(stripped) - k), offset=k)]
        if not delta.any():
            continue
        running = np.cumsum(delta, dtype=np.int64) + level
        deepest = max(deepest, int(running.max()))
        level = int(running[-1])
    return deepest


def loads_bounded(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)`` after checking its size (bytes) and depth.

    NaN and ±Infinity literals parse as Python's own ``json`` does; callers that must refuse them
    pass the value through their own checks.

    Raises:
        JSONRefused: more than ``max_bytes`` bytes, or nested deeper than ``max_depth``.
        ValueError: not valid JSON (``json.JSONDecodeError``) or not UTF-8.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JSONRefused(f"{len(raw):,} bytes of JSON, more than the {max_bytes:,} accepted")
    depth = json_depth(raw)
    if depth > max_depth:
        raise JSONRefused(f"JSON nested {depth:,} levels deep, more than the {max_depth} accepted")
    try:
        return json.loads(raw)
    except RecursionError:  # cannot happen below MAX_DEPTH; kept so that it never becomes a traceback
        raise JSONRefused("JSON nested too deep to read") from None


def read_json(path: str | Path, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """`loads_bounded` of a file, its size checked before it is read.

    Raises:
        JSONRefused, ValueError: as `loads_bounded`.
        OSError: the file cannot be read.
    """
    p = Path(path)
    size = p.stat().st_size
    if size > max_bytes:
        raise JSONRefused(f"{size:,} bytes of JSON, more than the {max_bytes:,} accepted")
    with p.open("rb") as f:
        return loads_bounded(f.read(max_bytes + 1), max_bytes=max_bytes, max_depth=max_depth)
