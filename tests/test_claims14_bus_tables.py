"""docs/bus.md's subject and message tables are the code's subjects, durability and schemas.

The page's "Subjects" table names, per row, the subject, the function that builds it and whether
it is durable (JetStream) or not; its "Message schema" table names each kind's required and optional
payload fields and its tensors. Here each row is read from the page and checked against what the
builders return, `NatsConfig.durable_subjects` and the registered `KindSchema`s: a subject, field or
kind the code adds without the page (the page lacked the rollback subject, `policy_rollback`,
`kpi_report`, a request's tick `t` and a reply's `arms`) fails, as does a page row the code lacks.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUS = (ROOT / "docs" / "bus.md").read_text()
#: modules that register the kinds the runtime, the canaries and the federation speak
REGISTRARS = ("edgetwin.edge.runtime", "edgetwin.edge.canary", "edgetwin.edge.canary_command",
              "edgetwin.federation.compression", "edgetwin.federation.twin.runner")  # fmt: skip


def _table(header: str) -> list[list[str]]:
    start = BUS.index(header)
    rows = []
    for line in BUS[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _names(cell: str) -> set[str]:
    """The backticked identifiers of a cell outside its parentheses (which explain, not list)."""
    prev = None
    while prev != cell:
        prev, cell = cell, re.sub(r"\([^()]*\)", "", cell)
    return set(re.findall(r"`([A-Za-z_]\w*)`", cell))


def _build(call: str) -> str:
    """Evaluate a builder as the page writes it (`Subjects.intent(cluster, site)`), each bare
    argument standing for itself: ``intent("cluster", "site")``."""
    m = re.fullmatch(r"([\w.]+)\((.*)\)", call)
    assert m, call
    dotted, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
    owner, _, name = dotted.rpartition(".")
    if owner == "Subjects":
        fn = getattr(importlib.import_module("edgetwin.edge.bus").Subjects, name)
    else:
        module = owner if owner.startswith("edgetwin.") else f"edgetwin.edge.{owner}"
        fn = getattr(importlib.import_module(module), name)
    return str(fn(*(ast.literal_eval(a) if a.startswith('"') else a for a in args)))


SUBJECTS = _table("| subject | built by | kind(s) | delivery | from → to |")


def test_the_subjects_table_is_read() -> None:
    assert len(SUBJECTS) >= 14 and all(len(r) == 5 for r in SUBJECTS)


@pytest.mark.parametrize("row", SUBJECTS, ids=lambda r: r[0][:40])
def test_a_subject_is_what_its_builder_returns_and_as_durable_as_the_page_says(row: list[str]) -> None:
    from edgetwin.edge.bus import NatsConfig

    subjects = re.findall(r"`([^`]+)`", row[0])
    builders = re.findall(r"`([^`]+\))`", row[1])
    assert subjects and len(subjects) == len(builders), row
    durable = NatsConfig().durable_subjects
    for subject, builder in zip(subjects, builders, strict=True):
        built = _build(builder)
        assert built == re.sub(r"<(\w+)>", r"\1", subject), (builder, built, subject)
        stored = any(re.fullmatch(p.replace(".", r"\.").replace("*", r"[^.]+").replace(">", r".+"), built) for p in durable)
        assert stored == ("**durable**" in row[3]), (subject, row[3], durable)


KINDS = _table("| kind | required payload fields | optional | tensors |")


def _schemas() -> dict[str, object]:
    for module in REGISTRARS:
        importlib.import_module(module)
    return dict(importlib.import_module("edgetwin.edge.messages").KINDS)


@pytest.mark.parametrize("row", KINDS, ids=lambda r: r[0])
def test_a_kinds_fields_are_its_schemas(row: list[str]) -> None:
    """Required fields: exactly the schema's; every optional field and tensor the schema checks is on
    the page (the page may name more: what a sender adds that no receiver requires)."""
    kind = row[0].strip("`")
    schema = _schemas().get(kind)
    assert schema is not None, f"docs/bus.md documents {kind!r}, which no module registers"
    assert _names(row[1]) == set(schema.required), (kind, _names(row[1]), set(schema.required))  # type: ignore[attr-defined]
    assert set(schema.optional) <= _names(row[2]), (kind, set(schema.optional) - _names(row[2]))  # type: ignore[attr-defined]
    assert set(schema.tensors) <= _names(row[3]), (kind, schema.tensors)  # type: ignore[attr-defined]


def test_every_registered_kind_is_on_the_page() -> None:
    """A kind a site or the cloud sends is named in the page's tables: the message schema, or the
    subjects table (the canary's commands, outcomes and status have their own section)."""
    in_schema = {r[0].strip("`") for r in KINDS}
    in_subjects = {k for r in SUBJECTS for k in re.findall(r"`([a-z_]+)`", r[2])}
    assert len(KINDS) >= 12
    missing = sorted(set(_schemas()) - in_schema - in_subjects)
    assert not missing, f"registered kinds docs/bus.md does not name: {missing}"
    assert not (in_subjects - set(_schemas())), in_subjects - set(_schemas())


def test_the_status_table_and_the_reason_lists_are_the_codes() -> None:
    """"Status": the fields of `CanaryStatus.to_dict()`, its phases and stop reasons; "Refusal
    reasons: ..." of a canary command; the reasons a KPI or outcome report is not used."""
    import dataclasses

    from edgetwin.edge.canary import STOP_REASONS
    from edgetwin.edge.canary_command import PHASES, REFUSALS, CanaryStatus
    from edgetwin.edge.metrics import _REPORT_REASONS

    rows = _table("| field | meaning |")
    fields = [n for r in rows for n in re.findall(r"`(\w+)`", r[0])]
    assert fields == [f.name for f in dataclasses.fields(CanaryStatus)], fields
    meaning = {n: r[1] for r in rows for n in re.findall(r"`(\w+)`", r[0])}
    assert re.findall(r"`(\w+)`", meaning["phase"]) == list(PHASES)
    assert re.findall(r"`(\w+)`", meaning["stop_reason"]) == list(STOP_REASONS)
    assert set(re.findall(r"`(\w+)`", meaning["arms"])) == set(importlib.import_module("edgetwin.edge.metrics").ARMS)
    flat = " ".join(BUS.split())
    refusals = re.search(r"Refusal reasons: (.*?)\. A redelivered start", flat).group(1)  # type: ignore[union-attr]
    assert re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", refusals)) == list(REFUSALS)
    rejected = re.search(r"`kpi_report` / `canary_outcome` not used: ([^|]*)\|", flat).group(1)  # type: ignore[union-attr]
    assert re.findall(r"`(\w+)`", rejected) == list(_REPORT_REASONS)
