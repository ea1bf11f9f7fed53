"""`Scenario`: a named list of perturbations applied in order; read from TOML / JSON files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.twin.whatif.files import read_document
from edgetwin.twin.whatif.perturbations import EPISODE_KINDS, Perturbation

__all__ = ["NOMINAL", "Scenario", "load_scenarios", "scenario_from_dict"]


@dataclass(frozen=True)
class Scenario:
    """A named list of perturbations, applied in order (they compose)."""

    name: str
    perturbations: tuple[Perturbation, ...] = ()
    description: str = ""
    source: str = ""

    @property
    def is_nominal(self) -> bool:
        return not self.perturbations

    def episode_level(self) -> list[Perturbation]:
        return [p for p in self.perturbations if p.kind in EPISODE_KINDS]

    def tick_level(self, role: str) -> list[Perturbation]:
        """Perturbations applied at every tick to columns of ``role`` (a shift_time's clock column too)."""
        return [
            p
            for p in self.perturbations
            if p.role == role
            and (p.kind not in EPISODE_KINDS or (p.kind == "shift_time" and p.column is not None))
        ]

    def check(
        self, spec: TwinSpec, columns: Sequence[str], steps: int | None, scenario_labels: Sequence[str]
    ) -> None:
        for p in self.perturbations:
            p.check(spec, columns, steps, scenario_labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "perturbations": [p.to_dict() for p in self.perturbations],
        }


NOMINAL = Scenario("nominal", (), "No perturbation: the system as the twin learned it.")


def scenario_from_dict(d: Mapping[str, Any], source: str, default_name: str) -> Scenario:
    """One scenario from a parsed table ``{name?, description?, perturbation: [...]}``."""
    name = d.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise InputError(f"key 'name': expected a non-empty string, got {name!r}", source)
    unknown = sorted(set(d) - {"name", "description", "perturbation", "perturbations", "kpi"})
    if unknown:
        raise InputError(
            f"scenario {name!r}: unknown key(s) {unknown}; expected name, description, [[perturbation]]",
            source,
        )
    raw = d.get("perturbation", d.get("perturbations", []))
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list):
        raise InputError(f"scenario {name!r}: 'perturbation' must be a list of tables", source)
    perts = tuple(
        Perturbation.from_dict(p, f"{source}: scenario {name!r} perturbation #{i + 1}")
        for i, p in enumerate(raw)
    )
    return Scenario(name, perts, str(d.get("description", "")), source)


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Scenarios of a TOML or JSON file: top-level ``[[perturbation]]`` (one scenario named after
    the file, or ``name = ...``), or several ``[[scenario]]`` tables each with its perturbations.

    Raises:
        InputError: unreadable file, unknown kind or key, bad value (naming file, entry and key).
    """
    path = Path(path)
    doc = read_document(path)
    src = str(path)
    if "scenario" in doc:
        if set(doc) - {"scenario", "kpi"}:
            raise InputError(
                f"a file with [[scenario]] tables may only also hold [[kpi]]; found {sorted(set(doc) - {'scenario', 'kpi'})}",
                src,
            )
        raw = doc["scenario"]
        if not isinstance(raw, list) or not raw:
            raise InputError("'scenario' must be a non-empty list of tables ([[scenario]])", src)
        out = [scenario_from_dict(s, src, f"{path.stem}-{i + 1}") for i, s in enumerate(raw)]
    else:
        out = [scenario_from_dict(doc, src, path.stem)]
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise InputError(f"scenario names must be unique, got {names}", src)
    return out
