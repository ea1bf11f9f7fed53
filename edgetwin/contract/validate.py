"""Validate a log against the contract and its twin spec; quarantine the rows that cannot be used.

Every problem is found in one pass and reported grouped by kind and column, with exact counts and
the first few row numbers (``column profile.x: 12 rows outside [0, 1], first at rows 4, 9, 17``).
Rows are numbered from 0 over the data rows of the file, header excluded: row ``r`` of a CSV is on
line ``r + 2``. Problems have one of three severities:

``fatal``
    the log as a whole cannot be used: a key column (``episode``, ``t``, ``agent``) or a column that
    the spec names is missing (also ``scenario`` when the spec lists scenarios), column names
    repeat, no row is usable, or fewer than ``min_usable_fraction`` of the rows are.
``quarantine``
    the rows it names are moved to the quarantine file (CSV: ``row``, ``reason``, then the row as it
    was) and left out of the usable table. Row-level: an empty key, ``t`` that is not an integer or
    is negative, a value that is not a number, NaN or infinite, outside the spec's bounds or not among
    a discrete feature's values, an empty scenario or site, a scenario the spec does not list, a
    repeated ``(episode, t, agent)`` key (the first occurrence is kept), an empty ``policy``, a
    ``propensity`` that is not a number, infinite, not above 0, or above 1 when every ``action.*``
    feature is discrete (then it is a probability; with a continuous action it is a density). Episode-level, judged on
    the rows that passed the row-level checks: a gap in an episode's steps quarantines the episode
    from the first gap on (the contiguous beginning is kept), and an episode left with a single step
    is quarantined whole (a trajectory needs two steps for a transition).
``warning``
    reported, nothing removed: columns that are not in the contract or the spec (ignored), an absent
    ``scenario``/``site`` column (every row gets ``"default"``), a spec inferred because none was
    found, an agent absent for some steps in the middle of its episode, a ``propensity`` left empty
    (unknown for that row: kept, as the contract allows).

Nothing is dropped silently: ``n_usable + n_quarantined == n_rows`` always, and the log is *usable*
(CLI exit 0) when no problem is fatal, even if some rows were quarantined.

Everything is vectorised with pandas/numpy: a million rows validate in seconds.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import read_table
from edgetwin.contract.spec import (
    KEY_COLUMNS,
    META_COLUMNS,
    POLICY_COLUMN,
    PROPENSITY_COLUMN,
    PROVENANCE_COLUMNS,
    REWARD_COLUMN,
    Feature,
    TwinSpec,
    function_refs,
    resolve_function_ref,
    role_of,
    spec_path_for,
)
from edgetwin.contract.validation_report import (  # noqa: F401  (re-exported: callers import them from here)
    DEFAULT_META,
    MAX_ROWS_LISTED,
    SEVERITIES,
    Problem,
    QuarantineWarning,
    Severity,
    ValidationReport,
    _count,
    _listing,
    quarantine_path_for,
)


# ------------------------------------------------------------------------------------- API
def validate_log(
    log: str | Path | pd.DataFrame,
    spec: str | Path | TwinSpec | None = None,
    quarantine_path: str | Path | None = None,
    *,
    write_quarantine: bool = True,
    min_usable_fraction: float = 0.5,
) -> ValidationReport:
    """Check a log against the contract and its spec; write the rows that cannot be used aside.

    Args:
        log: a ``.parquet``/``.csv`` path, or an in-memory table in the contract.
        spec: the spec (object or TOML path); default ``LOG.spec.toml`` beside the log, else one is
            inferred from the role columns (every feature continuous and unbounded).
        quarantine_path: where the quarantined rows go; default ``LOG.quarantine.csv`` beside the
            log (no default for an in-memory table). Written only when some rows are quarantined.
        write_quarantine: False to only report (the rows are still in ``report.quarantined``).
        min_usable_fraction: the log is unusable when fewer than this share of its rows are usable.

    Returns:
        The report; ``report.usable`` says whether the usable rows can be loaded.

    Raises:
        InputError: the log or spec cannot be read, or the quarantine file cannot be written.
    """
    report, _ = _run(log, spec, quarantine_path, write_quarantine, min_usable_fraction, want_table=False)
    return report


def load_valid_log(
    path: str | Path | pd.DataFrame,
    spec: str | Path | TwinSpec | None = None,
    *,
    quarantine_path: str | Path | None = None,
    min_usable_fraction: float = 0.5,
) -> tuple[pd.DataFrame, TwinSpec, ValidationReport]:
    """Load the usable rows of a log, typed and sorted, with its spec and validation report.

    The table has the contract's columns only: ``episode``, ``t`` (int64), ``agent``, ``scenario``,
    ``site`` (str; ``"default"`` when the log has no such column), every spec feature in spec order
    (float64), ``reward`` (float64) if the log has it, ``policy`` (str) and ``propensity`` (float64,
    NaN where unknown) if the log has them; sorted by ``(episode, t, agent)`` with a
    fresh RangeIndex. Every episode in it has contiguous steps and at least two of them.

    Quarantined rows are written to ``quarantine_path`` only if one is given (a library call does
    not write beside someone's data uninvited); they are always in ``report.quarantined`` and a
    `QuarantineWarning` says how many there were.

    Raises:
        InputError: the log or spec cannot be read, or the log is not usable (names its problems).
    """
    report, table = _run(
        path, spec, quarantine_path, quarantine_path is not None, min_usable_fraction, want_table=True
    )
    report.raise_if_unusable()
    if report.n_quarantined:
        warnings.warn(f"{report.source}: {report.verdict()}", QuarantineWarning, stacklevel=2)
    assert table is not None
    return table, report.spec, report


# ------------------------------------------------------------------------------------- engine
def _run(
    log: str | Path | pd.DataFrame,
    spec: str | Path | TwinSpec | None,
    quarantine_path: str | Path | None,
    write_quarantine: bool,
    min_usable_fraction: float,
    want_table: bool,
) -> tuple[ValidationReport, pd.DataFrame | None]:
    if not 0.0 <= min_usable_fraction <= 1.0:
        raise InputError(f"must be in [0, 1], got {min_usable_fraction}", "min_usable_fraction")
    if isinstance(log, pd.DataFrame):
        table, source, log_path = log, "<table>", None
    else:
        log_path = Path(log)
        table, source = read_table(log_path), str(log_path)
    spec_obj, spec_source = _resolve_spec(log_path, spec, [str(c) for c in table.columns], source)

    check = _Checker(table, spec_obj, min_usable_fraction)
    check.run()
    for entry, ref in function_refs(spec_obj):  # now, not when `train` first calls it
        try:
            where = None if spec_source in ("given", "inferred") else spec_source
            fn = resolve_function_ref(ref, spec_path=where, entry=entry)
            check.probe_function(entry, ref, fn, where or "spec")
        except InputError as e:
            check.fatal("bad_function", str(e))
    if spec_source == "inferred":
        beside = f" ({spec_path_for(log_path)} not found)" if log_path is not None else ""
        check.warn(
            "spec_inferred",
            f"no spec given{beside}: inferred one with every role column continuous and unbounded, "
            "so bounds and allowed values were not checked",
        )

    quarantined = check.quarantine_frame()
    written: Path | None = None
    if write_quarantine and len(quarantined):
        target = (
            quarantine_path
            if quarantine_path is not None
            else (quarantine_path_for(log_path) if log_path is not None else None)
        )
        if target is not None:
            written = _write_quarantine(quarantined, Path(target))

    usable = check.usable_mask()
    problems = sorted(check.problems, key=lambda p: SEVERITIES.index(p.severity))
    report = ValidationReport(
        source=source,
        spec=spec_obj,
        spec_source=spec_source,
        n_rows=check.n,
        n_usable=int(usable.sum()),
        n_quarantined=len(quarantined),
        problems=problems,
        quarantine_path=written,
        min_usable_fraction=min_usable_fraction,
        quarantined=quarantined,
        **check.population_stats(),
    )
    assert report.n_usable + report.n_quarantined == report.n_rows
    table_out = check.typed_table() if want_table and report.usable else None
    return report, table_out


def _resolve_spec(
    log_path: Path | None, spec: str | Path | TwinSpec | None, columns: list[str], source: str
) -> tuple[TwinSpec, str]:
    """Like `logs.resolve_spec`, but also says where the spec came from."""
    if isinstance(spec, TwinSpec):
        return spec, "given"
    if spec is not None:
        return TwinSpec.load(spec), str(spec)
    if log_path is not None and spec_path_for(log_path).is_file():
        beside = spec_path_for(log_path)
        return TwinSpec.load(beside), str(beside)
    try:
        name = log_path.name.split(".")[0] if log_path is not None else "inferred"
        return TwinSpec.infer(columns, name=name), "inferred"
    except InputError as e:
        expected = f" (expected {spec_path_for(log_path)})" if log_path is not None else ""
        raise InputError(
            f"no spec given or found{expected}, and none can be inferred from the columns: "
            f"{str(e).removeprefix('spec: ')}",
            source,
        ) from None


def _write_quarantine(quarantined: pd.DataFrame, path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        quarantined.to_csv(path, index=False)
    except OSError as e:
        raise InputError(f"cannot write the quarantine file ({e.strerror or e})", str(path)) from None
    return path


class _Checker:
    """One validation pass over a table: fills `problems` and the per-row quarantine reasons."""

    def __init__(self, table: pd.DataFrame, spec: TwinSpec, min_usable_fraction: float) -> None:
        self.table = table
        self.spec = spec
        self.min_usable_fraction = min_usable_fraction
        self.n = len(table)
        self.problems: list[Problem] = []
        self.bad = np.zeros(self.n, dtype=bool)
        # (mask over all rows, reason: str or per-row object array) for the quarantine file
        self._reasons: list[tuple[np.ndarray, str | np.ndarray]] = []
        self.keys_ok = False  # all three key columns present
        self.key_bad = np.zeros(self.n, dtype=bool)
        self.cols: dict[str, Any] = {}  # normalised columns: str Series or float64 arrays

    # --- recording ---------------------------------------------------------------------------
    def fatal(self, code: str, message: str, column: str | None = None) -> None:
        self.problems.append(Problem(code, "fatal", message, column))

    def warn(
        self, code: str, message: str, column: str | None = None, mask: np.ndarray | None = None
    ) -> None:
        count, rows = _count_rows(mask)
        self.problems.append(Problem(code, "warning", message, column, count, rows))

    def quarantine(
        self, code: str, column: str | None, mask: np.ndarray, what: str, reason: str | np.ndarray
    ) -> None:
        """Quarantine the rows of ``mask``; ``what`` follows the row count in the report."""
        count, rows = _count_rows(mask)
        if count == 0:
            return
        self.problems.append(Problem(code, "quarantine", f"{_rows(count)} {what}", column, count, rows))
        self.bad |= mask
        self._reasons.append((mask, reason))

    # --- the checks --------------------------------------------------------------------------
    def run(self) -> None:
        self.check_columns()
        self.check_keys()
        self.check_meta()
        self.check_provenance()
        for f in self.spec.features:
            if f.name in self.table.columns:
                self.check_feature(f)
        if REWARD_COLUMN in self.table.columns:
            self.check_numeric(REWARD_COLUMN)
        if self.keys_ok:
            self.factorize_keys()
            self.check_duplicates()
            self.check_episodes()
            self.check_agent_gaps()
            self.check_site_scope()
        self.check_enough_rows()
        if self.spec.dynamics and not self.fatal_found and self.keys_ok:
            self.check_declared_dynamics()

    @property
    def fatal_found(self) -> bool:
        return any(p.severity == "fatal" for p in self.problems)

    def check_columns(self) -> None:
        cols = [str(c) for c in self.table.columns]
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            self.fatal("duplicate_column", f"column names repeat: {', '.join(dup)}")
            # Selecting a repeated name gives a frame, not a column: keep the first of each.
            self.table = self.table.loc[:, ~self.table.columns.duplicated()]
        missing_keys = [k for k in KEY_COLUMNS if k not in cols]
        for k in missing_keys:
            self.fatal("missing_column", "key column is missing (every log needs episode, t, agent)", k)
        self.keys_ok = not missing_keys
        for f in self.spec.features:
            if f.name not in cols:
                self.fatal("spec_column_missing", "named by the spec but absent from the log", f.name)
        if REWARD_COLUMN in self.spec.reward_weights and REWARD_COLUMN not in cols:
            self.fatal(
                "spec_column_missing",
                "the spec's reward weights name it, but the log lacks it",
                REWARD_COLUMN,
            )
        known = {*KEY_COLUMNS, *META_COLUMNS, REWARD_COLUMN, *PROVENANCE_COLUMNS, *(f.name for f in self.spec.features)}
        unknown_role = [c for c in cols if c not in known and role_of(c) is not None]
        outside = [c for c in cols if c not in known and role_of(c) is None]
        if unknown_role:
            self.warn(
                "unknown_column", f"role columns not named by the spec, ignored: {_listing(unknown_role)}"
            )
        if outside:
            self.warn("unknown_column", f"columns outside the contract, ignored: {_listing(outside)}")

    def check_keys(self) -> None:
        for k in ("episode", "agent"):
            if k not in self.table.columns:
                continue
            values, empty = _key_strings(self.table[k])
            self.cols[k] = values
            self.quarantine("empty_key", k, empty, "with an empty key", f"empty {k}")
            self.key_bad |= empty
        if "t" not in self.table.columns:
            return
        raw = self.table["t"]
        t = _as_float(raw)
        missing = raw.isna().to_numpy()
        bad_type = np.isnan(t) & ~missing
        finite = np.isfinite(t)
        non_integer = ~np.isnan(t) & (
            ~finite | (np.floor(np.where(finite, t, 0.0)) != np.where(finite, t, 0.0))
        )
        negative = finite & ~non_integer & (t < 0)
        # beyond 2**53 a float no longer holds every integer, and beyond 2**63 int64 wraps
        # (1e20 became -9223372036854775808): such a t is not a step count
        too_large = finite & ~non_integer & ~negative & (t >= 2.0**53)
        self.quarantine("empty_key", "t", missing, "with an empty key", "empty t")
        self.quarantine(
            "bad_type", "t", bad_type, "not a number (expected an integer step)", "t is not a number"
        )
        self.quarantine("non_integer_t", "t", non_integer, "not an integer", "t is not an integer")
        self.quarantine("negative_t", "t", negative, "negative (steps count from 0)", "t is negative")
        self.quarantine("t_too_large", "t", too_large, "too large for a step (>= 2**53)", "t is too large")
        self.key_bad |= missing | bad_type | non_integer | negative | too_large
        self.cols["t"] = np.where(self.key_bad, 0, np.where(finite, t, 0.0)).astype(np.int64)

    def check_meta(self) -> None:
        for m in META_COLUMNS:
            if m not in self.table.columns:
                if m == "scenario" and self.spec.scenarios:
                    self.fatal(
                        "missing_column", "the spec lists scenarios but the log has no scenario column", m
                    )
                else:
                    self.warn("missing_column", f"absent: every row gets {m} {DEFAULT_META!r}", m)
                self.cols[m] = None
                continue
            values, empty = _key_strings(self.table[m])
            self.cols[m] = values
            self.quarantine("empty_value", m, empty, "empty", f"empty {m}")
            if m == "scenario" and self.spec.scenarios:
                unknown = ~empty & ~values.isin(list(self.spec.scenarios)).to_numpy()
                self.quarantine(
                    "unknown_scenario",
                    m,
                    unknown,
                    f"not one of the spec's scenarios {{{_listing(self.spec.scenarios)}}}",
                    "scenario not in the spec",
                )

    def check_provenance(self) -> None:
        """The optional ``policy`` and ``propensity`` columns: who decided, and how likely it was.

        ``policy`` must be a non-empty id on every row (a row whose decision nobody owns cannot be
        weighed against the others). ``propensity`` may be empty (unknown for that row: a warning,
        kept); when given it must be a finite number above 0 (the logged action happened, so its
        probability under its own policy cannot be 0), and at most 1 when every ``action.*`` feature
        is discrete (a probability). With a continuous action feature it is a density and can
        exceed 1 (a policy with 10 % Gaussian noise on a [0, 1] knob has densities near 4).
        """
        if POLICY_COLUMN in self.table.columns:
            values, empty = _key_strings(self.table[POLICY_COLUMN])
            self.cols[POLICY_COLUMN] = values
            self.quarantine("empty_value", POLICY_COLUMN, empty, "empty", "empty policy")
        if PROPENSITY_COLUMN not in self.table.columns:
            return
        raw = self.table[PROPENSITY_COLUMN]
        v = _as_float(raw)
        blank = raw.isna().to_numpy() | (raw.astype(str).str.strip().eq("").to_numpy(dtype=bool))
        bad_type = np.isnan(v) & ~blank
        finite = np.isfinite(v)
        name = PROPENSITY_COLUMN
        self.quarantine("bad_type", name, bad_type, "not a number", "propensity is not a number")
        self.quarantine("non_finite", name, np.isinf(v), "infinite", "propensity is infinite")
        self.quarantine(
            "propensity_not_positive",
            name,
            finite & (v <= 0),
            "not above 0 (the logged action cannot have probability 0 under the policy that took it)",
            "propensity <= 0",
        )
        if self.spec.discrete_actions():
            self.quarantine(
                "propensity_above_one",
                name,
                finite & (v > 1.0 + 1e-9),
                "above 1 (every action.* feature is discrete, so it is a probability)",
                "propensity > 1 with discrete actions",
            )
        unknown = blank & ~bad_type
        if unknown.any():
            self.warn(
                "propensity_unknown",
                f"empty in {_rows(int(unknown.sum()))}: unknown there (kept; weighting methods skip them)",
                name,
                unknown,
            )
        self.cols[name] = np.where(blank, np.nan, v)

    def check_numeric(self, name: str) -> np.ndarray:
        """Type, NaN and infinity checks of a numeric column; returns it as float64."""
        raw = self.table[name]
        v = _as_float(raw)
        missing = raw.isna().to_numpy()
        bad_type = np.isnan(v) & ~missing
        self.quarantine("missing_value", name, missing, "empty (NaN)", f"{name} is empty")
        self.quarantine("bad_type", name, bad_type, "not a number", f"{name} is not a number")
        self.quarantine("non_finite", name, np.isinf(v), "infinite", f"{name} is infinite")
        self.cols[name] = v
        return v

    def check_feature(self, f: Feature) -> None:
        v = self.check_numeric(f.name)
        finite = np.isfinite(v)
        if f.low is not None or f.high is not None:
            low = -np.inf if f.low is None else f.low
            high = np.inf if f.high is None else f.high
            out = finite & ((v < low) | (v > high))
            text = _bounds_text(f.low, f.high)
            self.quarantine("out_of_bounds", f.name, out, text, f"{f.name} {text}")
        allowed = f.allowed_values()
        if allowed:
            not_allowed = finite & ~_isin_close(v, np.asarray(allowed, dtype=np.float64))
            text = f"not one of {{{_listing([_num(a) for a in allowed], 10)}}}"
            self.quarantine("not_allowed", f.name, not_allowed, text, f"{f.name} {text}")

    def factorize_keys(self) -> None:
        """Integer codes of episode and agent: the group checks below sort ints, not strings."""
        self.ep_code, self.ep_names = pd.factorize(self.cols["episode"])
        self.ag_code, _ = pd.factorize(self.cols["agent"])
        self.ep_code = np.where(self.key_bad, 0, self.ep_code)  # never index with -1 (NaN)
        self.ag_code = np.where(self.key_bad, 0, self.ag_code)

    def check_duplicates(self) -> None:
        rows = np.flatnonzero(~self.key_bad)
        e, t, a = self.ep_code[rows], self.cols["t"][rows], self.ag_code[rows]
        order = np.lexsort((rows, a, t, e))  # by key, then file order: a run starts at its first row
        e, t, a, rows = e[order], t[order], a[order], rows[order]
        same = np.r_[False, (e[1:] == e[:-1]) & (t[1:] == t[:-1]) & (a[1:] == a[:-1])]
        if not same.any():
            return
        run_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(same))))
        dup = np.zeros(self.n, dtype=bool)
        dup[rows[same]] = True
        reason = np.empty(self.n, dtype=object)
        reason[rows[same]] = ["duplicate (episode, t, agent) of row " + str(r) for r in rows[run_start][same]]
        self.quarantine(
            "duplicate_key",
            "(episode, t, agent)",
            dup,
            "repeating the (episode, t, agent) key of an earlier row (the first is kept)",
            reason,
        )

    def check_episodes(self) -> None:
        """Gaps and single-step episodes, judged on the rows that passed the row-level checks."""
        ok = ~self.bad
        if not ok.any():
            return
        ep, t = self.ep_code, self.cols["t"]
        e, tt = ep[ok], t[ok]
        order = np.lexsort((tt, e))
        e, tt = e[order], tt[order]
        new = np.r_[True, (e[1:] != e[:-1]) | (tt[1:] != tt[:-1])]
        ue, ut = e[new], tt[new]  # the distinct (episode, t) steps, sorted
        n_eps = len(self.ep_names)
        cut_by_ep = np.full(n_eps, np.iinfo(np.int64).max, dtype=np.int64)
        jump = np.flatnonzero(np.r_[False, (ue[1:] == ue[:-1]) & (ut[1:] - ut[:-1] > 1)])
        if len(jump):
            gap_eps, first = np.unique(ue[jump], return_index=True)  # sorted by t: the first gap
            after, cut = ut[jump - 1][first], ut[jump][first]
            cut_by_ep[gap_eps] = cut
            label_by_ep = np.empty(n_eps, dtype=object)
            label_by_ep[gap_eps] = [
                f"gap in t: the episode jumps from t={a} to t={c}; rows from t={c} on quarantined"
                for a, c in zip(after, cut, strict=True)
            ]
            examples = ", ".join(
                f"{self.ep_names[g]} (t {a}->{c})" for g, a, c in zip(gap_eps[:3], after, cut, strict=False)
            )
            self.quarantine(
                "gap_in_t",
                "t",
                ok & (t >= cut_by_ep[ep]),
                f"of {_count(len(gap_eps), 'episode')} with a gap in t, from the first gap on "
                f"(e.g. episode {examples})",
                label_by_ep[ep],
            )
        n_steps = np.bincount(ue[ut < cut_by_ep[ue]], minlength=n_eps)
        single = np.flatnonzero(n_steps == 1)
        if len(single):
            self.quarantine(
                "single_step",
                "episode",
                ~self.bad & (n_steps[ep] == 1),
                f"of {_count(len(single), 'episode')} with a single step "
                f"(e.g. {_listing(self.ep_names[single[:3]])}); a trajectory needs at least two",
                "episode has a single step",
            )

    def check_agent_gaps(self) -> None:
        """An agent missing at some steps in the middle of its episode: reported, kept."""
        rows = np.flatnonzero(self.usable_mask())
        e, a, t = self.ep_code[rows], self.ag_code[rows], self.cols["t"][rows]
        order = np.lexsort((t, a, e))
        e, a, t, rows = e[order], a[order], t[order], rows[order]
        jump = np.r_[False, (e[1:] == e[:-1]) & (a[1:] == a[:-1]) & (t[1:] - t[:-1] > 1)]
        if not jump.any():
            return
        mask = np.zeros(self.n, dtype=bool)
        mask[rows[jump]] = True
        n_traj = len(np.unique(e[jump].astype(np.int64) * (int(a.max()) + 1) + a[jump]))
        self.warn(
            "agent_gap",
            f"{_count(n_traj, 'agent trajectory', 'agent trajectories')} with a step missing in the middle, "
            f"{_rows(int(mask.sum()))} right after the gap (kept: valid rows, but no t -> t+1 transition "
            "across the gap)",
            "agent",
            mask,
        )

    def check_site_scope(self) -> None:
        """A ``scope = "site"`` column must take one value per (episode, site, t): fatal if not.

        Fatal rather than quarantine: the spec says the column is the site's, and the log says it is
        not; removing rows would not make either right, and the twin would compute the column from
        a declaration or keep it equal across a site's agents, silently away from the log.
        """
        scoped = [f for f in self.spec.features if f.scope == "site" and f.name in self.cols]
        site = self.cols.get("site")
        if not scoped or site is None:
            return
        ok = ~self.bad
        rows = np.flatnonzero(ok)
        if not len(rows):
            return
        site_code, _ = pd.factorize(site)
        group = pd.factorize(
            pd.MultiIndex.from_arrays([self.ep_code[rows], site_code[rows], self.cols["t"][rows]])
        )[0]
        for f in scoped:
            v = np.asarray(self.cols[f.name], dtype=np.float64)[rows]
            finite = np.isfinite(v)
            g, vv = group[finite], v[finite]
            if not len(vv):
                continue
            lo = np.full(g.max() + 1, np.inf)
            hi = np.full(g.max() + 1, -np.inf)
            np.minimum.at(lo, g, vv)
            np.maximum.at(hi, g, vv)
            tol = 1e-9 * np.maximum(np.abs(hi), 1.0)
            bad_groups = np.flatnonzero(hi - lo > tol)
            if len(bad_groups):
                mask = np.zeros(self.n, dtype=bool)
                mask[rows[finite][np.isin(g, bad_groups)]] = True
                count, first = _count_rows(mask)
                self.problems.append(
                    Problem(
                        "site_scope_differs",
                        "fatal",
                        f"declared scope = \"site\" but differs between agents of one site at one tick in "
                        f"{len(bad_groups):,} (episode, site, t) groups",
                        f.name,
                        count,
                        first,
                    )
                )

    def check_declared_dynamics(self) -> None:
        """Fatal where a ``[[dynamics]]`` declaration raises, or gives a value that is not finite, on
        the log's usable rows (NaN or ±inf past its bounds: the twin would compute it at every tick
        and the fit would train on it); warn where the declarations do not reproduce the log's
        transitions."""
        from edgetwin.contract.dynamics import agreement, replay

        dynamics = self.spec.declared_dynamics()
        if dynamics is None:
            return
        try:
            table, rows = self.typed_table(with_rows=True)
            replayed = replay(table, dynamics)
            result = agreement(table, dynamics, replayed=replayed)
        except InputError as e:  # a declaration that raises on the log's own rows
            self.fatal("dynamics_failed", str(e).removeprefix("spec: "))
            return
        except Exception as e:  # noqa: BLE001 - a user's function failing on the log is a finding, not a crash
            self.warn("dynamics_failed", f"the declared dynamics could not be checked on the log ({type(e).__name__}: {e})")
            return
        for i, d in enumerate(self.spec.dynamics, start=1):
            bad = ~np.isfinite(replayed.predicted[d.column])
            if bad.any():
                at = np.sort(rows[replayed.order[bad]])
                self.problems.append(Problem(
                    "dynamics_not_finite",
                    "fatal",
                    f"[[dynamics]] entry {i} ({d.column}) gives a value that is not a finite number (NaN or "
                    f"inf) on {_rows(int(bad.sum()))} of {len(bad):,} usable; a declaration must be defined "
                    "on every row of its log",
                    d.column,
                    int(bad.sum()),
                    tuple(int(r) for r in at[:MAX_ROWS_LISTED]),
                ))
        for column, (n, bad, median) in result.items():
            if n and bad:
                self.warn(
                    "dynamics_disagree",
                    f"the declared dynamics give a next value more than 0.1 % away from the logged one in "
                    f"{bad:,} of {n:,} transitions ({bad / n:.1%}; median relative error {median:.2%}); the "
                    "twin will compute this column from the declaration, not from the log",
                    column,
                )

    def check_enough_rows(self) -> None:
        n_usable = int(self.usable_mask().sum())
        if self.n == 0:
            self.fatal("no_usable_rows", "the log has no rows")
        elif n_usable == 0:
            self.fatal("no_usable_rows", f"none of the {self.n:,} rows is usable")
        elif n_usable < self.min_usable_fraction * self.n:
            self.fatal(
                "too_few_usable_rows",
                f"only {n_usable:,} of {self.n:,} rows ({n_usable / self.n:.1%}) are usable; "
                f"at least {self.min_usable_fraction:.0%} are needed",
            )

    # --- results -----------------------------------------------------------------------------
    def usable_mask(self) -> np.ndarray:
        return ~self.bad

    def quarantine_frame(self) -> pd.DataFrame:
        """The quarantined rows as they were read, with ``row`` and ``reason`` in front."""
        idx = np.flatnonzero(self.bad)
        reasons = np.full(len(idx), "", dtype=object)
        for mask, reason in self._reasons:
            hit = mask[idx]
            add = reason if isinstance(reason, str) else reason[idx[hit]]
            reasons[hit] = np.where(reasons[hit] == "", add, reasons[hit] + "; " + add)
        out = self.table.iloc[idx].reset_index(drop=True)
        row_col, reason_col = _free_name("row", out.columns), _free_name("reason", out.columns)
        out.insert(0, reason_col, reasons)
        out.insert(0, row_col, idx.astype(np.int64))
        return out

    def population_stats(self) -> dict[str, Any]:
        ok = self.usable_mask()
        stats: dict[str, Any] = {}
        if self.keys_ok and ok.any():
            stats["n_episodes"] = int(self.cols["episode"][ok].nunique())
            stats["n_agents"] = int(self.cols["agent"][ok].nunique())
        policy = self.cols.get(POLICY_COLUMN)
        if policy is not None:
            stats["policies"] = tuple(sorted(str(s) for s in policy[ok].unique()))
        for m, key in (("scenario", "scenarios"), ("site", "sites")):
            values = self.cols.get(m)
            if values is None:
                stats[key] = (DEFAULT_META,) if ok.any() else ()
            else:
                stats[key] = tuple(sorted(str(s) for s in values[ok].unique()))
        return stats

    @overload
    def typed_table(self, with_rows: Literal[False] = False) -> pd.DataFrame: ...

    @overload
    def typed_table(self, with_rows: Literal[True]) -> tuple[pd.DataFrame, np.ndarray]: ...

    def typed_table(self, with_rows: bool = False) -> pd.DataFrame | tuple[pd.DataFrame, np.ndarray]:
        """The usable rows in the contract's columns and types, sorted by (episode, t, agent);
        ``with_rows``: also each of its rows' data row in the log (``(n,)`` 0-based)."""
        ok = self.usable_mask()
        n = int(ok.sum())
        out: dict[str, Any] = {}
        for c in ("episode", "t", "agent", *META_COLUMNS):
            values = self.cols[c]
            if values is None:  # absent scenario/site
                out[c] = pd.Series(np.full(n, DEFAULT_META, dtype=object), dtype=str)
            elif c == "t":
                out[c] = values[ok].astype(np.int64)
            else:
                out[c] = values[ok].reset_index(drop=True).astype(str)
        for f in self.spec.features:
            out[f.name] = self.cols[f.name][ok]
        if REWARD_COLUMN in self.cols:
            out[REWARD_COLUMN] = self.cols[REWARD_COLUMN][ok]
        if POLICY_COLUMN in self.cols:
            out[POLICY_COLUMN] = self.cols[POLICY_COLUMN][ok].reset_index(drop=True).astype(str)
        if PROPENSITY_COLUMN in self.cols:
            out[PROPENSITY_COLUMN] = self.cols[PROPENSITY_COLUMN][ok]
        df = pd.DataFrame(out)
        # Sorting integer ranks is much faster than sorting strings; ranks keep string order.
        ep_rank = pd.factorize(df["episode"], sort=True)[0]
        ag_rank = pd.factorize(df["agent"], sort=True)[0]
        order = np.lexsort((ag_rank, df["t"].to_numpy(), ep_rank))
        typed = df.take(order).reset_index(drop=True)
        return (typed, np.flatnonzero(ok)[order]) if with_rows else typed

    def probe_function(self, entry: str, ref: str, fn: Any, where: str) -> None:
        """Call a ``[transition]`` or ``[reward]`` function as the twin will, on 3 of the log's usable
        rows, and refuse it (`InputError` naming the entry) if it cannot be called so, fails, or
        returns another shape than the twin needs or values that are not finite.

        The import alone says nothing of the signature (``math:sqrt`` imports and is callable, and
        then fails in ``fit`` with a TypeError); 3 rows, because a function of a scalar accepts a
        1-element array and would pass a probe of one.
        """
        ok = np.flatnonzero(self.usable_mask())
        if len(ok) == 0:
            return  # no usable row: fatal anyway, nothing to call it on
        pick = np.resize(ok, 3)
        cols = {f.name: self.cols[f.name][pick] for f in self.spec.features if self.cols.get(f.name) is not None}
        if REWARD_COLUMN in self.cols:
            cols[REWARD_COLUMN] = self.cols[REWARD_COLUMN][pick]
        cols = {c: np.asarray(v, np.float64) for c, v in cols.items()}
        n = 3
        if entry.startswith("[transition]"):
            if any(c not in cols for r in ("state", "action", "response") for c in self.spec.names(r)):
                return  # a column is missing from the log: fatal anyway
            role_arrays = [np.column_stack([cols[c] for c in self.spec.names(r)]) if self.spec.names(r)
                           else np.zeros((n, 0)) for r in ("state", "action", "response")]
            args: tuple[Any, ...] = tuple(role_arrays)
            want, shape_text = n * len(self.spec.names("state")), f"({n}, {len(self.spec.names('state'))}): next state per agent"
            calling = "fn(state (N, S), action (N, A), response (N, R))"
        else:
            args = (cols,)
            want, shape_text = n, f"({n},): one reward per agent"
            calling = "fn(columns: {name: (N,) array})"
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as e:
            raise InputError(f"{entry} {ref!r} cannot be called as {calling} ({e})", where) from None
        except ValueError:
            pass  # no signature to read (some builtins): the call below decides
        try:
            out = np.asarray(fn(*args), dtype=np.float64)
        except Exception as e:  # noqa: BLE001 - the user's function: report anything it raises
            raise InputError(
                f"{entry} {ref!r} failed when called as {calling} on {n} of the log's rows "
                f"({type(e).__name__}: {e})",
                where,
            ) from None
        if out.size != want:
            raise InputError(f"{entry} {ref!r} returned shape {out.shape} for {n} agents; it must return {shape_text}", where)
        if not np.isfinite(out).all():
            raise InputError(f"{entry} {ref!r} returned values that are not finite numbers on {n} of the log's rows", where)


# ------------------------------------------------------------------------------------- helpers
def _as_float(col: pd.Series) -> np.ndarray:
    """A column as float64; anything that is not a number becomes NaN."""
    if pd.api.types.is_numeric_dtype(col.dtype):
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _key_strings(col: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """A key/label column as strings (``7.0`` -> ``"7"`` for whole floats) and its empty mask."""
    missing = col.isna().to_numpy()
    if pd.api.types.is_float_dtype(col.dtype):
        v = col.to_numpy(dtype=np.float64, na_value=np.nan)
        fin = v[np.isfinite(v)]
        if len(fin) and np.all(fin == np.floor(fin)) and np.all(np.abs(fin) < 2.0**53):
            col = col.astype("Int64")
    values = col.astype(str).reset_index(drop=True)
    empty = missing | values.str.strip().eq("").fillna(True).to_numpy(dtype=bool)
    return values, empty


def _isin_close(v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Whether each value equals one of ``allowed`` up to float round-off (sorted-search, O(n log k))."""
    s = np.sort(allowed)
    i = np.searchsorted(s, v)
    below, above = s[np.clip(i - 1, 0, len(s) - 1)], s[np.clip(i, 0, len(s) - 1)]
    d = np.minimum(np.abs(v - below), np.abs(v - above))
    return d <= 1e-9 * np.maximum(1.0, np.abs(v))


def _count_rows(mask: np.ndarray | None) -> tuple[int, tuple[int, ...]]:
    if mask is None:
        return 0, ()
    idx = np.flatnonzero(mask)
    return len(idx), tuple(int(i) for i in idx[:MAX_ROWS_LISTED])


def _bounds_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"outside [{_num(low)}, {_num(high)}]"
    if low is not None:
        return f"below {_num(low)}"
    return f"above {_num(high)}"


def _num(x: float | None) -> str:
    return "none" if x is None else f"{x:g}"


def _rows(n: int) -> str:
    return _count(n, "row")


def _free_name(name: str, taken: Sequence[Any]) -> str:
    while name in taken:
        name = "_" + name
    return name
