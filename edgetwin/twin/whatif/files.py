"""What-if files: a scenario or KPI file is a TOML (or, with a ``.json`` suffix, JSON) document."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError

__all__ = ["read_document"]


def read_document(path: Path) -> dict[str, Any]:
    """The top-level table of ``path``; an `InputError` naming the file when it cannot be read."""
    if not path.is_file():
        raise InputError("file not found", str(path))
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e})", str(path)) from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"not valid TOML ({e}); JSON files need a .json suffix", str(path)) from None
    if not isinstance(doc, dict):
        raise InputError("expected a table / object at the top level", str(path))
    return doc
