"""What the README and docs say a user types or reads back is what the code takes and writes.

Each test reads the claim from the page: the Python calls it shows with keyword arguments and the
``from edgetwin... import ...`` lines (the names and keywords exist), the validator's ``--json`` fields
and its quarantine file's lines (docs/log-format.md), the interval labels the README quotes, and the
keys `edgetwin agent-keys` writes (docs/federation.md, docs/bus.md). docs/canary.md is another
helper's page and is left out here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import io
import json
import re
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_claims_log_format import _fenced

from edgetwin.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "canary.md")]
LOG_FORMAT = (ROOT / "docs" / "log-format.md").read_text()


def _prose(doc: Path) -> str:
    """The page with its fenced blocks blanked (line numbers kept)."""
    return re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), doc.read_text(), flags=re.S)


@functools.cache
def _definitions() -> dict[str, list[str]]:
    """Top-level name (a def or a class) -> the modules of the package that define it, found by parsing."""
    out: dict[str, list[str]] = {}
    for f in sorted((ROOT / "edgetwin").rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for n in ast.parse(f.read_text()).body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(n.name, []).append(module)
    return out


def _defining_modules(name: str) -> list[str]:
    return _definitions().get(name, [])


def _calls() -> list[tuple[str, str, tuple[str, ...]]]:
    """(where, callee, keywords) of each inline span that is one call with keyword arguments (the keywords
    sorted: xdist's workers must collect the same test ids, and a set's order changes with the hash seed)."""
    out = []
    for doc in DOCS:
        text = _prose(doc)
        for m in re.finditer(r"`([^`]+)`", text):
            call = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", " ".join(m.group(1).split()))
            keywords = set(re.findall(r"(?<![=\w])([A-Za-z_]\w*)\s*=(?!=)", call.group(2))) if call else set()
            if call and keywords:
                where = f"{doc.relative_to(ROOT).as_posix()}:{text[: m.start()].count(chr(10)) + 1}"
                out.append((where, call.group(1), tuple(sorted(keywords))))
    return out


def test_the_docs_show_calls_with_keywords() -> None:
    calls = _calls()
    assert len(calls) >= 10 and any(c == "load_valid_log" for _, c, _ in calls)


@pytest.mark.parametrize(("where", "callee", "keywords"), _calls(), ids=lambda v: str(v)[:40])
def test_a_documented_call_takes_its_keywords(where: str, callee: str, keywords: tuple[str, ...]) -> None:
    """`personalise(twin, local_log, site_alone=...)`: the callable exists (its dotted module, or the one
    module of the package that defines the bare name) and accepts every keyword the page passes."""
    module, _, name = callee.rpartition(".")
    modules = [module] if module else _defining_modules(name)
    assert modules, f"{where}: nothing in edgetwin defines {callee}"
    for mod in modules:
        sig = inspect.signature(getattr(importlib.import_module(mod), name))
        try:
            sig.bind_partial(**dict.fromkeys(keywords))
            return
        except TypeError:
            continue
    pytest.fail(f"{where}: {callee} (in {', '.join(modules)}) takes none of {sorted(keywords)} as written")


def _imports() -> list[tuple[str, str, list[str]]]:
    out = []
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            for m in re.finditer(r"from (edgetwin[\w.]*) import ([A-Za-z_][\w, ]*)", line):
                names = [n.strip() for n in m.group(2).split(",") if n.strip()]
                out.append((f"{doc.relative_to(ROOT).as_posix()}:{no}", m.group(1), names))
    return out


def test_the_docs_import_what_the_packages_export() -> None:
    """"A user imports from the packages: `from edgetwin.twin import Twin`, ..." and every other
    ``from edgetwin... import`` line of the pages: each name is there."""
    found = _imports()
    assert len(found) >= 5 and ("edgetwin.policies", ["load_policy", "train_policy"]) in [(m, n) for _, m, n in found]
    for where, module, names in found:
        mod = importlib.import_module(module)
        missing = [n for n in names if not hasattr(mod, n)]
        assert not missing, f"{where}: {module} has no {missing}"


def test_the_plain_interval_labels_are_the_readmes() -> None:
    """README "Trust": without a held-out log "the output says so ("plain bootstrap interval (not
    calibrated)" on `edgetwin train`'s scores, "... (members x episodes; not calibrated)" on `edgetwin
    evaluate --on twin`'s table)": the labels those two outputs print."""
    from edgetwin.policies.candidates import CandidateScore
    from edgetwin.policies.evaluate import EvalResult

    readme = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r'the output says so \("([^"]+)" on `edgetwin train`\'s scores, "([^"]+)" on `edgetwin evaluate '
                  r"--on twin`'s table\)", readme)  # fmt: skip
    assert m, "the README no longer says what the uncalibrated output prints"
    score = CandidateScore("p", 1.0, 0.5, 1.5, 0.0)
    assert m.group(1) in score.interval_label() and not score.calibrated
    on_twin = EvalResult("p", "twin", 2, 0, per_episode={"kpi.x": [1.0, 2.0]},
                         per_member={"kpi.x": [[1.0, 2.0], [1.5, 2.5]]})  # fmt: skip
    assert m.group(2) in on_twin.table().splitlines()[0]


def _bad_example(where: Path) -> Path:
    """docs/log-format.md's bad log: the page's example with "a negative queue length, a CPU share of
    1.75, `tue`'s last step logged as `t=3`, a repeated row and an extra `note` column"."""
    (where / "bad.spec.toml").write_text(_fenced("toml"))
    (where / "queue.csv").write_text(_fenced("csv"))
    bad = pd.read_csv(where / "queue.csv")
    bad.loc[1, "state.queue_len"] = -1
    bad.loc[2, "action.cpu_share"] = 1.75
    bad.loc[bad["episode"].eq("tue") & bad["t"].eq(2), "t"] = 3
    bad = pd.concat([bad, bad.iloc[[4]]], ignore_index=True)
    bad["note"] = "x"
    bad.to_csv(where / "bad.csv", index=False)
    return where / "bad.csv"


def test_the_validators_json_and_quarantine_file_are_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """"`--json` (the report as JSON on stdout: `usable`, `n_rows`, ... `problems` with `code`, ...)",
    "Exit code 0: usable; 2: not usable", and "The quarantine file": its header and the page's example
    lines (each up to its `...`) are the bad example's quarantine file."""
    monkeypatch.chdir(tmp_path)
    _bad_example(tmp_path)
    flat = " ".join(LOG_FORMAT.split())
    span = re.search(r"`--json` \(the report as JSON on stdout: (.*?)\)\. Exit code", flat).group(1)  # type: ignore[union-attr]
    top_part, _, problem_part = span.partition("`problems` with")
    top = re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", top_part)) + ["problems"]  # not "(the distinct `policy` ids ...)"
    per_problem = re.findall(r"`(\w+)`", problem_part)
    assert len(top) >= 8 and len(per_problem) >= 6
    with pytest.raises(SystemExit) as done:
        main(["logs", "validate", "bad.csv", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert done.value.code in (0, None) and report["usable"] is True
    assert set(top) <= set(report), set(top) - set(report)
    assert all(set(per_problem) <= set(p) for p in report["problems"]) and report["problems"]
    assert report["quarantine_path"] == "bad.quarantine.csv" and report["n_usable"] + report["n_quarantined"] == report["n_rows"]
    assert "Exit code 0: usable; 2: not usable, or the log or spec cannot be read." in flat
    with pytest.raises(SystemExit) as done:
        main(["logs", "validate", "bad.csv", "--min-usable", "0.9"])
    out, err = capsys.readouterr()
    assert done.value.code == 2 and "Traceback" not in out + err

    section = LOG_FORMAT[LOG_FORMAT.index("### The quarantine file"):LOG_FORMAT.index("## Running the validator")]
    example = section[section.index("```csv\n") + 7:section.index("```", section.index("```csv\n") + 7)].splitlines()
    written = (tmp_path / "bad.quarantine.csv").read_text().splitlines()
    assert written[0].startswith(example[0].removesuffix("...")) and written[0].startswith("row,reason,")
    for line in example[1:]:
        assert any(w.startswith(line.removesuffix("...")) for w in written[1:]), line


def test_the_validators_python_signature_is_the_pages() -> None:
    """"`load_valid_log(path_or_dataframe, spec=None, *, quarantine_path=None, min_usable_fraction=0.5)`":
    the same parameters, kinds and defaults (the first one's name aside)."""
    from edgetwin.contract.validate import load_valid_log

    shown = re.search(r"`load_valid_log\(([^)]*)\)`", LOG_FORMAT).group(1)  # type: ignore[union-attr]
    stated = ast.parse(f"def f({shown}): pass").body[0].args  # type: ignore[attr-defined]
    params = list(inspect.signature(load_valid_log).parameters.values())
    positional, keyword_only = params[: len(stated.args)], params[len(stated.args):]
    assert [p.kind for p in positional] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(stated.args)
    assert [p.name for p in positional[1:]] == [a.arg for a in stated.args[1:]]
    assert [p.default for p in positional[len(positional) - len(stated.defaults):]] == [ast.literal_eval(d) for d in stated.defaults]
    assert [(p.name, p.default) for p in keyword_only] == [
        (a.arg, ast.literal_eval(d)) for a, d in zip(stated.kwonlyargs, stated.kw_defaults, strict=True)  # type: ignore[arg-type]
    ]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keyword_only)


def test_agent_keys_writes_the_files_the_pages_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/federation.md's `edgetwin agent-keys twin/coordinator site-a site-b --out keys/`, run as
    written: one pair per identity, `/` written `--` (docs/bus.md: `esa--site-3.key.pem`), the private
    key mode 0600, and the coordinator's public key is the file the page's `--trust` names."""
    fed = (ROOT / "docs" / "federation.md").read_text()
    command = re.search(r"^(edgetwin agent-keys [^#\n]*?)\s+#", fed, flags=re.M).group(1)  # type: ignore[union-attr]
    trust = re.search(r"`--trust (keys/[^`\s]+)`", fed).group(1)  # type: ignore[union-attr]
    bus = " ".join((ROOT / "docs" / "bus.md").read_text().split())
    assert "(`/` in an identity is written `--`: `esa--site-3.key.pem`)" in bus and "(mode 0600)" in bus
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(command.split()[1:])
    assert done.value.code in (0, None)
    identities = [w for w in command.split()[2:] if not w.startswith("-") and w != "keys/"]
    want = {f"{i.replace('/', '--')}.{kind}.pem" for i in identities for kind in ("pub", "key")}
    assert {p.name for p in Path("keys").iterdir()} == want
    assert Path(trust).is_file() and trust.endswith(".pub.pem")
    for key in Path("keys").glob("*.key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_the_refused_spec_functions_line_is_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """"Spec functions run only where you allow them": `edgetwin logs validate queue.csv` on the page's
    example whose spec declares `state.credits` by `mypkg.accounting:next_credits` prints the page's
    line, exit 2, and never imports the module (it does not even exist here)."""
    block = LOG_FORMAT[LOG_FORMAT.index("```console\n$ edgetwin logs validate queue.csv\nerror:"):]
    command, line = block.splitlines()[1:3]
    declared = re.search(r"\[\[dynamics\]\] entry 1 \((state\.\w+)\): function '([\w.]+:\w+)'", line)
    assert command == "$ edgetwin logs validate queue.csv" and declared
    column, function = declared.groups()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "")
    monkeypatch.delenv("EDGETWIN_CONFIG_DIR", raising=False)  # the default allow-list file, as the page prints it
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty one: nothing allowed
    spec = _fenced("toml").replace("# [transition]", f'[[features]]\nname = "{column}"\n\n# [transition]', 1)
    Path("queue.spec.toml").write_text(f'{spec}\n[[dynamics]]\ncolumn = "{column}"\nfunction = "{function}"\n')
    log = pd.read_csv(io.StringIO(_fenced("csv")))
    log[column] = 0.0
    log.to_csv("queue.csv", index=False)
    with pytest.raises(SystemExit) as done:
        main(command.removeprefix("$ edgetwin ").split())
    out, err = capsys.readouterr()
    printed = [ln.replace(str(tmp_path / "home"), "~") for ln in (out + err).splitlines() if ln.strip()]
    assert done.value.code == 2 and printed == [line]  # the page writes the user's home as ~
    assert function.split(":")[0] not in sys.modules


def test_the_readmes_keygen_writes_the_key_its_promote_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline's `edgetwin registry keygen --out runs/keys`, run as written, writes the private key
    `edgetwin promote ... --key runs/keys/publisher.key.pem` names, and `serve --trust runs/keys` finds
    a public key in that directory."""
    readme = (ROOT / "README.md").read_text()
    keygen = re.search(r"^(edgetwin registry keygen [^#\n]*?)\s*$", readme, flags=re.M).group(1)  # type: ignore[union-attr]
    key = re.search(r"^edgetwin promote [^\n]*--key (\S+)", readme, flags=re.M).group(1)  # type: ignore[union-attr]
    trust = re.search(r"^edgetwin serve [^\n]*--trust (\S+)", readme, flags=re.M).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(keygen.split()[1:])
    assert done.value.code in (0, None)
    assert Path(key).is_file() and stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    assert Path(trust).is_dir() and list(Path(trust).glob("*.pub.pem"))


def test_the_artifact_formats_are_the_pages() -> None:
    """"Twins are format 2 (`meta.json` `format_version`), policies `edgetwin-policy/2`.": what a twin's
    meta.json and a policy's policy.json are written with."""
    from edgetwin.policies.export import FORMAT
    from edgetwin.twin.twin import FORMAT_VERSION

    m = re.search(r"Twins are format (\d+) \(`meta\.json` `format_version`\), policies `([^`]+)`\.", " ".join(LOG_FORMAT.split()))
    assert m and int(m.group(1)) == FORMAT_VERSION and m.group(2) == FORMAT


def test_a_problem_lists_as_many_rows_as_the_page_says(tmp_path: Path) -> None:
    """"Counts are exact; each problem lists its first 5 rows.": eight rows out of bounds are counted
    eight times and listed by their first N, in file order."""
    from edgetwin.contract.validate import validate_log

    n = int(re.search(r"Counts are exact; each problem lists its first (\d+) rows\.", " ".join(LOG_FORMAT.split())).group(1))  # type: ignore[union-attr]
    (tmp_path / "queue.spec.toml").write_text(_fenced("toml"))
    log = pd.read_csv(io.StringIO(_fenced("csv")))
    bad = [0, 2, 3, 5, 6, 8, 9, 11]
    log.loc[bad, "state.queue_len"] = -1.0
    log.to_csv(tmp_path / "queue.csv", index=False)
    report = validate_log(tmp_path / "queue.csv", write_quarantine=False)
    (problem,) = report.find("out_of_bounds", "state.queue_len")
    assert len(bad) > n and problem.count == len(bad) and list(problem.rows) == bad[:n]
