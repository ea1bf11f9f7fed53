"""What validating a log found: its problems, their severities, and the report of what became of its rows.

Split from :mod:`edgetwin.contract.validate` (which finds the problems) so that the report a caller
reads, prints or writes as JSON is one concept in one module; ``validate`` re-exports every name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from rich.markup import escape

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec

Severity = Literal["fatal", "quarantine", "warning"]
SEVERITIES: tuple[Severity, ...] = ("fatal", "quarantine", "warning")

#: Value of ``scenario``/``site`` for every row of a log that has no such column.
DEFAULT_META = "default"
#: How many row numbers a problem lists (its count is always exact).
MAX_ROWS_LISTED = 5


class QuarantineWarning(UserWarning):
    """Some rows of a log were quarantined while loading it (the report says which and why)."""


def quarantine_path_for(log_path: str | Path) -> Path:
    """Where a log's quarantine goes by convention: ``logs.parquet`` -> ``logs.quarantine.csv``."""
    p = Path(log_path)
    return p.with_name(p.name.split(".")[0] + ".quarantine.csv")


@dataclass(frozen=True)
class Problem:
    """One kind of problem in one column (or in the log as a whole), with every row it affects.

    Attributes:
        code: machine-readable kind, e.g. ``"out_of_bounds"``, ``"duplicate_key"``, ``"gap_in_t"``.
        severity: ``fatal`` (log unusable), ``quarantine`` (its rows are set aside) or ``warning``.
        message: what is wrong and what was expected, e.g. ``"12 rows outside [0, 1]"``.
        column: the column (or key) it is about, None for the log as a whole.
        count: exact number of rows affected (0 for problems that are not about rows).
        rows: the first affected rows (0-based data rows), at most ``MAX_ROWS_LISTED``.
    """

    code: str
    severity: Severity
    message: str
    column: str | None = None
    count: int = 0
    rows: tuple[int, ...] = ()

    def describe(self) -> str:
        """``column profile.x: 12 rows outside [0, 1], first at rows 4, 9, 17``."""
        where = f"column {self.column}" if self.column else "log"
        text = f"{where}: {self.message}"
        if self.rows:
            listed = ", ".join(str(r) for r in self.rows)
            if self.count > len(self.rows):
                text += f", first at rows {listed}"
            else:
                text += f", at row{'s' if len(self.rows) > 1 else ''} {listed}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "column": self.column,
            "count": self.count,
            "rows": list(self.rows),
            "message": self.message,
            "text": self.describe(),
        }


@dataclass
class ValidationReport:
    """Everything validation found in one log, and what became of its rows.

    Attributes:
        source: the log's path, or ``"<table>"`` for an in-memory DataFrame.
        spec: the spec the log was checked against.
        spec_source: where the spec came from (its path, ``"given"`` or ``"inferred"``).
        n_rows, n_usable, n_quarantined: row counts; ``n_usable + n_quarantined == n_rows``.
        problems: every problem found, fatal first.
        quarantine_path: the quarantine CSV written, or None if none was written.
        n_episodes, n_agents: distinct episodes / (episode-independent) agents among usable rows.
        scenarios, sites: distinct labels among usable rows, sorted.
        policies: distinct ``policy`` ids among usable rows, sorted; empty when the log has no
            ``policy`` column (one unknown logging policy).
        min_usable_fraction: the share of usable rows below which the log is unusable.
        quarantined: the quarantined rows as they were, with ``row`` and ``reason`` in front.
    """

    source: str
    spec: TwinSpec
    spec_source: str
    n_rows: int
    n_usable: int
    n_quarantined: int
    problems: list[Problem]
    quarantine_path: Path | None = None
    n_episodes: int = 0
    n_agents: int = 0
    scenarios: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    min_usable_fraction: float = 0.5
    quarantined: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    # --- views -------------------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        """True when no problem is fatal: the usable rows can be loaded (exit code 0)."""
        return not self.fatal

    @property
    def fatal(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "fatal"]

    @property
    def quarantine(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "quarantine"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def find(self, code: str, column: str | None = None) -> list[Problem]:
        """The problems of a kind (and column, if given)."""
        return [p for p in self.problems if p.code == code and (column is None or p.column == column)]

    def verdict(self) -> str:
        """One line: usable or not, and what happened to the rows."""
        share = self.n_usable / self.n_rows if self.n_rows else 0.0
        if not self.usable:
            what = "; ".join(p.describe() for p in self.fatal[:3])
            more = f" (+{len(self.fatal) - 3} more)" if len(self.fatal) > 3 else ""
            return f"NOT USABLE: {what}{more}"
        if self.n_quarantined:
            where = f" -> {self.quarantine_path}" if self.quarantine_path else " (not written)"
            return (
                f"USABLE: {self.n_usable:,} of {self.n_rows:,} rows ({share:.1%}); "
                f"{self.n_quarantined:,} quarantined{where}"
            )
        return f"USABLE: all {self.n_rows:,} rows"

    def summary(self, markup: bool = True) -> str:
        """A multi-line report for people; rich markup unless ``markup=False``."""
        e = escape if markup else (lambda s: s)

        def style(text: str, s: str) -> str:
            return f"[{s}]{text}[/{s}]" if markup else text

        origin = {"given": "given by the caller", "inferred": "inferred from the columns"}.get(
            self.spec_source, f"from {self.spec_source}"
        )
        lines = [
            style(e(self.source), "bold")
            + f": {_count(self.n_rows, 'row')}; the usable ones hold {_count(self.n_episodes, 'episode')}, "
            + f"{_count(self.n_agents, 'agent')}, scenarios {e(_listing(self.scenarios))}, "
            + f"sites {e(_listing(self.sites))}"
            + (f", policies {e(_listing(self.policies))}" if self.policies else ""),
            f"spec: {e(self.spec.name)} {e(origin)}, {_count(len(self.spec.features), 'feature')}",
        ]
        if self.problems:
            lines.append("rows are 0-based data rows (in a CSV, row r is on line r + 2)")
        colours = {"fatal": "bold red", "quarantine": "yellow", "warning": "cyan"}
        for p in self.problems:
            tag = f"{p.severity.upper():<10}"
            lines.append("  " + style(e(tag), colours[p.severity]) + " " + e(p.describe()))
        if not self.problems:
            lines.append("no problems found")
        lines.append(
            f"usable: {self.n_usable:,} rows; quarantined: {self.n_quarantined:,} rows"
            + (f" -> {e(str(self.quarantine_path))}" if self.quarantine_path else "")
        )
        verdict = e(self.verdict())
        lines.append(style(verdict, "bold green" if self.usable else "bold red"))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-able data (the quarantined rows are in the quarantine file)."""
        return {
            "source": self.source,
            "usable": self.usable,
            "n_rows": self.n_rows,
            "n_usable": self.n_usable,
            "n_quarantined": self.n_quarantined,
            "quarantine_path": None if self.quarantine_path is None else str(self.quarantine_path),
            "spec": {"name": self.spec.name, "source": self.spec_source, "hash": self.spec.hash()},
            "n_episodes": self.n_episodes,
            "n_agents": self.n_agents,
            "scenarios": list(self.scenarios),
            "sites": list(self.sites),
            "policies": list(self.policies),
            "min_usable_fraction": self.min_usable_fraction,
            "verdict": self.verdict(),
            "problems": [p.to_dict() for p in self.problems],
        }

    def raise_if_unusable(self) -> None:
        """Raise `InputError` naming the log and its fatal problems if it is not usable."""
        if not self.usable:
            what = "; ".join(p.describe() for p in self.fatal)
            raise InputError(
                f"the log is not usable: {what} (run `edgetwin logs validate {self.source}` for every problem)",
                self.source,
            )


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _listing(items: Sequence[Any], cap: int = 8) -> str:
    items = [str(i) for i in items]
    if not items:
        return "none"
    return ", ".join(items[:cap]) + (f", ... ({len(items)} in all)" if len(items) > cap else "")
