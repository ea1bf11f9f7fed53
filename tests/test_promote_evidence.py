"""`edgetwin promote POLICY --evidence verdict.json`: the registry records the canary's verdict,
its inputs' digests and the twin's version beside the signed policy; evidence about another
policy, twin or fleet (the registry moved on, or never held the canary's version) is one line and
exit 2, nothing published. The system is the warehouse of tests/test_cli_canary_verdict.py (not
the emulated cluster)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_cli_canary_verdict import _verdict, warehouse  # noqa: F401  (the module fixture)

from edgetwin.cli import main
from edgetwin.edge.registry import metadata_from_policy_dir, open_registry
from edgetwin.edge.signing import Signer, TrustStore, save_private_key


@pytest.fixture()
def site(warehouse, tmp_path: Path):  # type: ignore[no-untyped-def]  # noqa: F811
    """A registry holding the current policy as v1 (global's current) and the canary's candidate
    as v2, as `edgetwin canary start` needs them; the key that signed them; the verdicts."""
    d = warehouse["dir"]
    if not (d / "fast.json").is_file():
        assert _verdict(d, "fast", "--out", str(d / "fast.json")) == 0
        assert _verdict(d, "slow", "--out", str(d / "slow.json")) == 1
    signer = Signer.generate()
    save_private_key(signer.private_key, tmp_path / "key.pem")
    with open_registry(str(tmp_path / "reg")) as reg:
        for version, name in (("v1", "current"), ("v2", "fast")):
            reg.publish(d / name, {**metadata_from_policy_dir(d / name), "name": name, "version": version}, signer)
        reg.set_current("global", "v1", expected=None)
    return {"d": d, "reg": tmp_path / "reg", "key": tmp_path / "key.pem", "tmp": tmp_path}


def _promote(s: dict[str, Path], policy: str, evidence: Path, twin: Path | None = None) -> int:
    try:
        main(["promote", policy, "--registry", str(s["reg"]), "--twin", str(twin or s["d"] / "twin"), "--key",
              str(s["key"]), "--evidence", str(evidence), "--out", str(s["tmp"] / "out"), "--json"])  # fmt: skip
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_promote_records_the_evidence_beside_the_signed_policy(site, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    d = site["d"]
    assert _promote(site, str(d / "fast"), d / "fast.json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["promoted"] and doc["evidence"]["verdict"] == "promote"
    ev = json.loads((d / "fast.json").read_text())
    with open_registry(str(site["reg"])) as reg:
        version = reg.current("global")
        assert version == doc["version"] and version not in ("v1", "v2")
        md = reg.manifest(version).metadata
        # fetched with the signer's key: the evidence is in the signed metadata
        reg.fetch(version, site["tmp"] / "fetched", TrustStore([Signer.from_pem(site["key"]).public_key]))
    rec = md["evidence"]
    assert rec["verdict"] == "promote" and rec["twin"] == ev["twin_digest"] and md["parent_version"] == "v2"
    assert rec["canary_log_sha256"] == ev["canary_log_sha256"] and rec["fleet_log_sha256"] == ev["fleet_log_sha256"]
    assert set(rec["guards"]) == {"kpi.late"}


def test_a_refusing_verdict_publishes_nothing_and_exits_1(site, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    d = site["d"]
    with open_registry(str(site["reg"])) as reg:
        reg.publish(d / "slow", {**metadata_from_policy_dir(d / "slow"), "name": "slow", "version": "v3"},
                    Signer.from_pem(site["key"]))  # fmt: skip
    ev = json.loads((d / "slow.json").read_text())
    ev["candidate_version"] = "v3"  # the slow candidate as this registry names it
    (site["tmp"] / "slow.json").write_text(json.dumps(ev))
    assert _promote(site, str(d / "slow"), site["tmp"] / "slow.json") == 1
    with open_registry(str(site["reg"])) as reg:
        assert reg.current("global") == "v1" and sorted(reg.list_versions()) == ["v1", "v2", "v3"]


def _one_line_exit_2(site, capsys, policy: str, evidence: Path, needle: str, twin: Path | None = None) -> None:  # type: ignore[no-untyped-def]
    assert _promote(site, policy, evidence, twin) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
    with open_registry(str(site["reg"])) as reg:
        assert reg.current("global") == "v1" and sorted(reg.list_versions()) == ["v1", "v2"]


def test_evidence_about_another_policy_is_refused(site, capsys) -> None:  # type: ignore[no-untyped-def]
    _one_line_exit_2(site, capsys, str(site["d"] / "slow"), site["d"] / "fast.json", "another policy")


def test_evidence_of_another_twin_is_refused(site, capsys) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.twin.twin import Twin

    other = site["tmp"] / "twin2"
    shutil.copytree(site["d"] / "twin", other)
    tw = Twin.load(other)
    tw.meta["note"] = "another fit"
    shutil.rmtree(other)
    tw.save(other)
    _one_line_exit_2(site, capsys, str(site["d"] / "fast"), site["d"] / "fast.json", "another twin", twin=other)


def test_evidence_the_registry_does_not_match_is_refused(site, capsys) -> None:  # type: ignore[no-untyped-def]
    ev = json.loads((site["d"] / "fast.json").read_text())
    (site["tmp"] / "v9.json").write_text(json.dumps({**ev, "candidate_version": "v9"}))
    _one_line_exit_2(site, capsys, str(site["d"] / "fast"), site["tmp"] / "v9.json", "no version 'v9'")
    (site["tmp"] / "moved.json").write_text(json.dumps({**ev, "current_version": "v0"}))
    _one_line_exit_2(site, capsys, str(site["d"] / "fast"), site["tmp"] / "moved.json", "moved on")
    (site["tmp"] / "junk.json").write_text(json.dumps({"verdict": "promote"}))
    _one_line_exit_2(site, capsys, str(site["d"] / "fast"), site["tmp"] / "junk.json", "not canary evidence")


def test_promote_keeps_the_emulator_s_knobs_off_its_flags() -> None:
    import inspect

    from edgetwin.cli.policy import promote_cmd

    params = inspect.signature(promote_cmd).parameters
    options = [n for n, p in params.items() if "typer.Argument" not in str(p.annotation)]  # POLICY is an argument
    assert len(options) <= 20, options
    assert not [p for p in params if p.startswith("canary") and p != "canary_config"]


@pytest.mark.parametrize("toml", ["default_margin = -1", "wobble = 2", "seeds = 1.5", "scenario = 'x'", "not toml ["])
def test_a_bad_gate_config_is_one_line_and_exit_2(site, toml: str, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    (site["tmp"] / "gate.toml").write_text(toml + "\n")
    try:
        main(["promote", str(site["d"] / "fast"), "--registry", str(site["reg"]), "--twin", str(site["d"] / "twin"),
              "--key", str(site["key"]), "--log", str(site["d"] / "fleet.parquet"), "--gate-config",
              str(site["tmp"] / "gate.toml")])  # fmt: skip
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--gate-config" in err, err
