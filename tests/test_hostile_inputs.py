"""Hostile input and tampering (issue 20): the chain of custody, every value kept, one exit-code contract.

Two halves:

* named tests, one per case the hostile probe found (and the ones it did not try: extra, renamed,
  symlinked, truncated files, a manifest that lies about its kind or escapes the directory);
* property-based tests (hypothesis) that corrupt valid logs, specs, twins and policies at random
  and assert the contract: exit code 2 with the file named and never a traceback; usable +
  quarantined = all rows; no value changed in a row reported usable; no tampered artifact loaded,
  published or signed.

The default run keeps hypothesis small (a few seconds per property); ``-m slow`` runs the same
properties with many more examples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetwin.cli import main
from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import read_table, write_table
from edgetwin.contract.manifest import MANIFEST_FILE, ArtifactTampered, verify_manifest, write_manifest
from edgetwin.contract.spec import TwinSpec, resolve_function_ref, spec_path_for
from edgetwin.contract.validate import load_valid_log, validate_log
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.signing import (
    ArtifactRejected,
    RejectReason,
    Signer,
    TrustStore,
    pack_directory,
    save_private_key,
    save_public_key,
    sign_artifact,
)
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.export import ActionTransform, export_policy, load_policy
from edgetwin.policies.gate import resolve_policy
from edgetwin.policies.heuristics import UniformRandom
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

#: examples per property in the default run (fast) and under ``-m slow``
FAST, MANY = 12, 150
HYPO = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


# ------------------------------------------------------------------------------------- fixtures
class _BoxEnv(gym.Env):
    """The smallest env with the spec's observation and action widths (PPO needs one to exist)."""

    def __init__(self, n_obs: int, n_act: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (n_obs,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (n_act,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(self.observation_space.shape, np.float32), 0.0, True, False, {}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small real log, its twin, a heuristic and an SB3 policy, a signing key: all sealed."""
    from stable_baselines3 import PPO

    d = tmp_path_factory.mktemp("hostile")
    log, spec = generate_logs(ClusterConfig(n_agents=6, steps=6), episodes=3, policy="random", seed=1)
    write_table(log, d / "log.csv")
    spec.save(spec_path_for(d / "log.csv"))
    twin = Twin.fit(
        log,
        spec,
        members=1,
        seed=0,
        progress=False,
        population_model="empirical",
        response_model="bc",
        bc_epochs=1,
    )
    twin.save(d / "twin")
    export_policy(UniformRandom(spec, seed=0), d / "heuristic", spec)
    low, high = spec.bounds("action")
    model = PPO(
        "MlpPolicy",
        _BoxEnv(len(spec.observation_columns), len(low)),
        n_steps=16,
        batch_size=16,
        seed=0,
        device="cpu",
    )
    export_policy(
        model, d / "ppo", spec, action_transform=ActionTransform("box", low.tolist(), high.tolist())
    )
    signer = Signer.generate()
    save_private_key(signer.private_key, d / "key.pem")
    save_public_key(signer.public_key, d / "pub.pem")
    return {"dir": d, "log": log, "spec": spec, "twin": twin, "signer": signer}


def copy_of(world: dict[str, Any], name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(world["dir"] / name, target, symlinks=True)
    return target


def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(argv))
                code = 0
            except SystemExit as e:
                code = int(e.code or 0)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), err.getvalue()


def assert_bad_input(result: tuple[int, str, str], *names: str) -> str:
    """Exit 2, one error line naming each of ``names``, no traceback; returns stderr."""
    code, _, err = result
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err  # printed once, on one line
    for n in names:
        assert n in err, (n, err)
    return err


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at % len(data)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def registry_is_empty(reg_dir: Path) -> bool:
    return not (reg_dir / "versions").is_dir() or not any((reg_dir / "versions").iterdir())


# ------------------------------------------------------------------------------------- 1. chain of custody
def test_sealed_artifacts_load(world: dict[str, Any]) -> None:
    d = world["dir"]
    assert verify_manifest(d / "twin", "twin")["kind"] == "twin"
    for name in ("heuristic", "ppo"):
        pol = load_policy(d / name)
        obs = np.zeros((3, len(world["spec"].observation_columns)))
        assert pol.act(obs).shape == (3, len(world["spec"].action_columns))
    assert Twin.load(d / "twin").spec.hash() == world["spec"].hash()


def test_policy_json_files_map_deleted_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    """The probe deleted policy.json's "files" map to switch the check off: now policy.json is itself sealed."""
    p = copy_of(world, "ppo", tmp_path)
    doc = json.loads((p / "policy.json").read_text())
    doc.pop("files", None)
    doc["note"] = "checks off"
    (p / "policy.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactTampered, match="sha256 does not match") as e:
        load_policy(p)
    assert e.value.file == p / "policy.json"
    flip_byte(p / "model.safetensors")  # ... and altered the actor's weights
    with pytest.raises(ArtifactTampered) as e:
        load_policy(p)
    assert e.value.file == p / "model.safetensors"
    assert_bad_input(
        run("evaluate", str(p), "--episodes", "1", "--agents", "4", "--episode-steps", "2"), "model.safetensors"
    )


def test_policy_without_manifest_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    """Unsealed (an older edgetwin's export, or the manifest deleted): refused, never trusted by default."""
    p = copy_of(world, "heuristic", tmp_path)
    (p / MANIFEST_FILE).unlink()
    with pytest.raises(ArtifactTampered, match="unsealed"):
        load_policy(p)
    assert_bad_input(run("evaluate", str(p), "--episodes", "1"), MANIFEST_FILE)


def test_action_transform_edit_is_refused_even_if_resealed(world: dict[str, Any], tmp_path: Path) -> None:
    """action_transform.high raised to 20 where the spec says 2: the manifest refuses it; an attacker
    who also rewrites the manifest meets the bounds check."""
    p = copy_of(world, "ppo", tmp_path)
    doc = json.loads((p / "policy.json").read_text())
    doc["action_transform"]["high"] = [20.0] * len(doc["action_transform"]["high"])
    (p / "policy.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactTampered, match="sha256 does not match"):
        load_policy(p)
    write_manifest(p, "policy")  # the attacker reseals
    with pytest.raises(InputError, match="outside the spec's bounds"):
        load_policy(p)


def test_altered_weights_are_never_evaluated_published_or_promoted(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """model.safetensors that does not match its recorded sha256: evaluate, registry publish and promote all
    exit 2 naming model.safetensors, and nothing is signed."""
    d = world["dir"]
    p = copy_of(world, "ppo", tmp_path)
    flip_byte(p / "model.safetensors")
    reg = tmp_path / "reg"
    assert_bad_input(run("evaluate", str(p), "--episodes", "1"), "model.safetensors")
    assert_bad_input(
        run("registry", "publish", str(p), "--registry", str(reg), "--key", str(d / "key.pem")), "model.safetensors"
    )
    assert registry_is_empty(reg)
    code, _, err = run(
        "promote", str(p), "--registry", str(reg), "--log", str(d / "log.csv"), "--twin", str(d / "twin"),
        "--key", str(d / "key.pem"), "--episodes", "1", "--steps", "2", "--out", str(tmp_path / "report"),
    )  # fmt: skip
    assert code == 2 and "model.safetensors" in err and "Traceback" not in err, err
    assert registry_is_empty(reg)


def test_registry_refuses_a_tampered_twin_and_a_bare_directory(world: dict[str, Any], tmp_path: Path) -> None:
    """Twins are published like policies (issue 37), but only sealed and intact."""
    d = world["dir"]
    reg, key = str(tmp_path / "reg"), str(d / "key.pem")
    twin = copy_of(world, "twin", tmp_path)
    flip_byte(twin / "layout.json")
    assert_bad_input(run("registry", "publish", str(twin), "--registry", reg, "--key", key), "layout.json")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "weights.bin").write_bytes(b"\x00" * 64)
    assert_bad_input(run("registry", "publish", str(bare), "--registry", reg, "--key", key), MANIFEST_FILE)
    assert registry_is_empty(tmp_path / "reg")


def test_registry_refuses_to_serve_a_signed_but_unsealed_artifact(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """An artifact signed by a publisher that skipped the check (an older edgetwin): signature fine,
    contents not: `fetch` (what `serve` and `registry show --trust` use) refuses it."""
    p = copy_of(world, "heuristic", tmp_path)
    flip_byte(p / "spec.toml", at=3)
    reg = FileRegistry(tmp_path / "reg")
    signer = world["signer"]
    packed = pack_directory(p)
    md = {"name": "old", "version": "v1", "metrics": {}, "spec_hash": None, "algorithm": None,
          "training_data_hash": None, "created": "2026-01-01T00:00:00+00:00", "parent_version": None}  # fmt: skip
    reg._store("v1", packed, sign_artifact(packed, md, signer))
    with pytest.raises(ArtifactRejected) as e:
        reg.fetch("v1", tmp_path / "out", TrustStore([signer.public_key]))
    assert e.value.reason is RejectReason.UNSEALED and "spec.toml" in e.value.detail
    assert not (tmp_path / "out").exists()
    err = assert_bad_input(
        run(
            "registry",
            "show",
            "v1",
            "--registry",
            str(tmp_path / "reg"),
            "--trust",
            str(world["dir"] / "pub.pem"),
        ),
        "spec.toml",
    )
    assert "intact" not in err


def test_rejected_artifact_is_printed_once(world: dict[str, Any], tmp_path: Path) -> None:
    d = world["dir"]
    reg = str(tmp_path / "reg")
    assert (
        run("registry", "publish", str(d / "heuristic"), "--registry", reg, "--key", str(d / "key.pem"))[0]
        == 0
    )
    other = Signer.generate()
    save_public_key(other.public_key, tmp_path / "other.pem")
    err = assert_bad_input(
        run("registry", "show", "v1", "--registry", reg, "--trust", str(tmp_path / "other.pem"))
    )
    assert err.count("rejected") == 1 and err.startswith("refused:") and "failed" not in err


def test_edited_twin_spec_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    t = copy_of(world, "twin", tmp_path)
    text = (t / "spec.toml").read_text()
    (t / "spec.toml").write_text(text.replace("high = 1.0", "high = 100.0", 1) + "\n# edited\n")
    with pytest.raises(ArtifactTampered, match="spec.toml"):
        Twin.load(t)
    write_manifest(t, "twin")  # resealed: the spec is still not the one the twin was fitted with
    with pytest.raises(InputError, match="spec.toml"):
        Twin.load(t)
    p = world["dir"] / "heuristic"
    assert_bad_input(run("evaluate", str(p), str(t), "--on", "twin", "--episodes", "1"), "spec.toml")


def test_policy_for_another_spec_is_refused_by_the_twin(world: dict[str, Any], tmp_path: Path) -> None:
    """Same columns, another spec hash: refused where it would act (evaluate --on twin, what-if, promote)."""
    other = dataclasses.replace(world["spec"], name="another-system")
    assert (
        other.observation_columns == world["spec"].observation_columns
        and other.hash() != world["spec"].hash()
    )
    p = export_policy(UniformRandom(other, seed=0), tmp_path / "foreign", other)
    with pytest.raises(InputError, match="spec"):
        resolve_policy(str(p), world["twin"])
    err = assert_bad_input(
        run("evaluate", str(p), str(world["dir"] / "twin"), "--on", "twin", "--episodes", "1"), str(p)
    )
    assert other.hash() in err and world["spec"].hash() in err


TAMPERINGS: dict[str, Callable[[Path], str]] = {}


def tampering(fn: Callable[[Path], str]) -> Callable[[Path], str]:
    TAMPERINGS[fn.__name__] = fn
    return fn


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


@tampering
def extra_file(root: Path) -> str:
    (root / "backdoor.py").write_text("import os\n")
    return "backdoor.py"


@tampering
def renamed_file(root: Path) -> str:
    f = _files(root)[0]
    f.rename(f.with_name(f.name + ".bak"))
    return f.name


@tampering
def deleted_file(root: Path) -> str:
    f = _files(root)[-1]
    f.unlink()
    return f.name


@tampering
def truncated_file(root: Path) -> str:
    f = max(_files(root), key=lambda p: p.stat().st_size)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return f.name


@tampering
def symlink_swap(root: Path) -> str:
    f = _files(root)[0]
    outside = root.parent / f"outside-{f.name}"
    shutil.copy(f, outside)  # same bytes: only the link itself is wrong
    f.unlink()
    f.symlink_to(outside)
    return f.name


@tampering
def manifest_kind_swapped(root: Path) -> str:
    m = json.loads((root / MANIFEST_FILE).read_text())
    m["kind"] = "twin" if m["kind"] == "policy" else "policy"
    (root / MANIFEST_FILE).write_text(json.dumps(m))
    return MANIFEST_FILE


@tampering
def manifest_escapes(root: Path) -> str:
    m = json.loads((root / MANIFEST_FILE).read_text())
    m["files"]["../../etc/passwd"] = "0" * 64
    (root / MANIFEST_FILE).write_text(json.dumps(m))
    return MANIFEST_FILE


@tampering
def manifest_not_json(root: Path) -> str:
    (root / MANIFEST_FILE).write_text("{not json")
    return MANIFEST_FILE


@pytest.mark.parametrize("how", sorted(TAMPERINGS))
@pytest.mark.parametrize("artifact", ["ppo", "twin"])
def test_every_tampering_is_refused_naming_the_file(
    world: dict[str, Any], tmp_path: Path, artifact: str, how: str
) -> None:
    root = copy_of(world, artifact, tmp_path)
    named = TAMPERINGS[how](root)
    load: Callable[[Path], Any] = load_policy if artifact == "ppo" else Twin.load
    with pytest.raises(InputError) as e:
        load(root)
    assert named in str(e.value), str(e.value)
    if artifact == "ppo":  # nor is it ever signed
        reg = tmp_path / "reg"
        code, _, err = run(
            "registry", "publish", str(root), "--registry", str(reg), "--key", str(world["dir"] / "key.pem")
        )
        assert code == 2 and named in err and "Traceback" not in err, err
        assert registry_is_empty(reg)


# ------------------------------------------------------------------------------------- 2. values
def test_duplicate_csv_header_is_fatal_before_pandas_renames_it(
    world: dict[str, Any], tmp_path: Path
) -> None:
    log = world["log"]
    path = tmp_path / "dup.csv"
    log.to_csv(path, index=False)
    lines = path.read_text().splitlines()
    lines = [f"{ln},{ln.split(',')[1]}" for ln in lines]  # repeat the 't' column at the end
    path.write_text("\n".join(lines) + "\n")
    shutil.copy(spec_path_for(world["dir"] / "log.csv"), spec_path_for(path))
    with pytest.raises(InputError, match="'t'"):
        read_table(path)
    assert_bad_input(run("logs", "validate", str(path)), str(path), "'t'")
    code, _, err = run("fit", str(path), "--out", str(tmp_path / "tw"), "--members", "1")
    assert code == 2 and "'t'" in err


def test_duplicate_parquet_column_is_one_line(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = ["episode", "t", "agent", "t"] + [f"state.x{i}" for i in range(40)]
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2])] * len(cols), names=cols), tmp_path / "dup.parquet")
    assert_bad_input(run("logs", "validate", str(tmp_path / "dup.parquet")), "dup.parquet", "'t'")


def test_huge_t_is_quarantined_not_wrapped(world: dict[str, Any], tmp_path: Path) -> None:
    df = world["log"].copy()
    df["t"] = df["t"].astype(object)
    df.loc[5, "t"] = "1e20"
    path = tmp_path / "big.csv"
    df.to_csv(path, index=False)
    shutil.copy(spec_path_for(world["dir"] / "log.csv"), spec_path_for(path))
    report = validate_log(path, write_quarantine=False)
    assert report.n_usable + report.n_quarantined == report.n_rows
    assert report.find("t_too_large", "t") and 5 in report.find("t_too_large", "t")[0].rows
    table, _, _ = load_valid_log(path)
    assert (table["t"] >= 0).all() and table["t"].max() < 10**6


def test_nan_bound_is_refused_naming_spec_and_feature(world: dict[str, Any], tmp_path: Path) -> None:
    text = spec_path_for(world["dir"] / "log.csv").read_text()
    spec = tmp_path / "nan.spec.toml"
    spec.write_text(re.sub(r"^low = .*$", "low = nan", text, count=1, flags=re.MULTILINE))
    assert "low = nan" in spec.read_text()
    with pytest.raises(InputError, match="not a finite number") as e:
        TwinSpec.load(spec)
    assert str(spec) in str(e.value) and "feature '" in str(e.value)
    assert_bad_input(
        run("logs", "validate", str(world["dir"] / "log.csv"), "--spec", str(spec)), str(spec), "nan"
    )


# ------------------------------------------------------------------------------------- 3. exit codes
def test_truncated_csv_gz_is_bad_input_naming_the_file(world: dict[str, Any], tmp_path: Path) -> None:
    raw = world["log"].to_csv(index=False).encode()
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(gzip.compress(raw)[: len(gzip.compress(raw)) * 2 // 3])
    assert_bad_input(run("logs", "validate", str(path)), str(path))
    code, _, err = run("logs", "validate", str(path), env={"EDGETWIN_DEBUG": "1"})
    assert code == 2 and str(path) in err  # debug adds the traceback, never changes the code


@pytest.mark.parametrize("command", ["fit", "train", "whatif"])
def test_out_that_is_a_file_or_unwritable_is_bad_input(
    world: dict[str, Any], tmp_path: Path, command: str
) -> None:
    d = world["dir"]
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    args = {
        "fit": ["fit", str(d / "log.csv"), "--members", "1"],
        "train": ["train", str(d / "twin"), "--steps", "8"],
        "whatif": ["whatif", str(d / "twin"), "--policy", "random"],
    }[command]
    for out in (a_file, a_file / "below-a-file"):
        err = assert_bad_input(run(*args, "--out", str(out)), "--out", str(out))
        assert "Error" not in err.split(":")[0]


def test_corrupt_twin_directory_names_the_file(world: dict[str, Any], tmp_path: Path) -> None:
    t = copy_of(world, "twin", tmp_path / "a")
    flip_byte(t / "arrays.npz")
    assert_bad_input(run("train", str(t), "--out", str(tmp_path / "p"), "--steps", "8"), "arrays.npz")
    t = copy_of(world, "twin", tmp_path / "b")
    (t / "meta.json").write_text("{ malformed")
    write_manifest(t, "twin")  # even sealed, malformed metadata is named
    assert_bad_input(run("train", str(t), "--out", str(tmp_path / "p"), "--steps", "8"), "meta.json")
    t = copy_of(world, "twin", tmp_path / "c")
    shutil.rmtree(t / "member_0")
    assert_bad_input(run("train", str(t), "--out", str(tmp_path / "p"), "--steps", "8"), "member_0")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["fit", "LOG", "--rounds", "-1"], "--rounds"),
        (["fit", "LOG", "--members", "0"], "--members"),
        (["fit", "LOG", "--bc-epochs", "-3"], "--bc-epochs"),
        (["train", "TWIN", "--steps", "-5"], "--steps"),
        (["train", "TWIN", "--episode-steps", "0"], "--episode-steps"),
        (["whatif", "TWIN", "--policy", "random", "--seeds", "0"], "--seeds"),
        (["evaluate", "random", "--episodes", "-1"], "--episodes"),
        (["fit", "LOG", "--response-model", "oracle"], "--response-model"),
        (["fit", "LOG", "--population-model", "dice"], "--population-model"),
    ],
)
def test_nonsense_numbers_and_names_are_rejected_naming_the_flag(
    world: dict[str, Any], tmp_path: Path, args: list[str], flag: str
) -> None:
    d = world["dir"]
    argv = [{"LOG": str(d / "log.csv"), "TWIN": str(d / "twin")}.get(a, a) for a in args]
    if argv[0] != "evaluate":
        argv += ["--out", str(tmp_path / "out")]
    assert_bad_input(run(*argv), flag)
    assert not (tmp_path / "out" / "meta.json").exists()  # nothing was written on a rejected flag


def test_unimportable_function_refs_fail_validation(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "json,no_such_module_xyz")  # allowed: then the import is checked
    base = spec_path_for(world["dir"] / "log.csv").read_text()
    no_weights = base.split("[reward.weights]")[0]
    for name, extra, entry in (
        ("reward", '\n[reward]\nfunction = "no_such_module_xyz:reward"\n', "[reward] function"),
        ("transition", '\n[transition]\nfunction = "json:no_such_function"\n', "[transition] function"),
        ("uncallable", '\n[transition]\nfunction = "json:__doc__"\n', "[transition] function"),
    ):
        spec = tmp_path / f"{name}.spec.toml"
        spec.write_text((no_weights if name == "reward" else base) + extra)
        code, out, err = run("logs", "validate", str(world["dir"] / "log.csv"), "--spec", str(spec))
        assert code == 2 and entry in out + err and str(spec) in out + err, out + err
    with pytest.raises(InputError, match=r"x\.toml.*\[reward\] function"):
        resolve_function_ref("nope", spec_path="x.toml", entry="[reward] function")
    assert resolve_function_ref("json:dumps", entry="e") is json.dumps


# ------------------------------------------------------------------------------------- 4. messages
def test_brackets_in_names_are_printed_literally(tmp_path: Path) -> None:
    assert_bad_input(run("logs", "validate", str(tmp_path / "x[bold]y.csv")), "x[bold]y.csv")
    empty = tmp_path / "empty[1].spec.toml"
    empty.write_text("")
    log = tmp_path / "l.csv"
    log.write_text("episode,t,agent\n")
    assert_bad_input(
        run("logs", "validate", str(log), "--spec", str(empty)), "[[features]]", "empty[1].spec.toml"
    )


def test_undecodable_byte_names_the_line(world: dict[str, Any], tmp_path: Path) -> None:
    raw = world["log"].to_csv(index=False).encode().splitlines(keepends=True)
    raw[4] = raw[4].replace(b",", b",\xff", 1)
    path = tmp_path / "latin.csv"
    path.write_bytes(b"".join(raw))
    assert_bad_input(run("logs", "validate", str(path)), str(path), "line 5")


# ------------------------------------------------------------------------------------- hypothesis: logs
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e20",
            "-1",
            "1e400",
            "9223372036854775808",
            "0x1F",
            "[bold]",
            "\u00e9t\u00e9",
            "1,5",
            '"',
            "None",
            "true",
            " 3 ",
            "007",
            "-0",
        ]
    ),  # fmt: skip
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=6),
)


def _check_log_contract(path: Path, raw: pd.DataFrame) -> None:
    """Validate a hostile CSV; whatever happens, the contract holds."""
    try:
        report = validate_log(path, write_quarantine=False)
    except InputError as e:
        assert str(path) in str(e)
        return
    # all rows = the rows in the file; pandas writes a bare '\r' in a cell unquoted, and every CSV
    # reader then sees a line break there, so count the written file, not the frame we wrote
    rows_in_file = (
        len(raw) if not raw.map(lambda v: "\r" in str(v)).to_numpy().any() else len(read_table(path))
    )
    assert report.n_usable + report.n_quarantined == report.n_rows == rows_in_file
    if not report.usable:
        return
    table, spec, _ = load_valid_log(path)
    assert len(table) <= report.n_usable
    # no value changed in a row reported usable: compare with the text as written
    written = pd.read_csv(path, dtype=str, keep_default_na=False)
    t_written = pd.to_numeric(written["t"], errors="coerce")
    by_key: dict[tuple[str, float, str], int] = {}
    for i, (e, t, a) in enumerate(zip(written["episode"], t_written, written["agent"], strict=True)):
        by_key.setdefault((e, float(t), a), i)  # a repeated key keeps its first row
    vals = {f.name: table[f.name].to_numpy() for f in spec.features}
    idx = [
        by_key[(e, float(t), a)] for e, t, a in zip(table["episode"], table["t"], table["agent"], strict=True)
    ]
    for name, v in vals.items():
        raw_text = written.loc[idx, name].to_numpy()
        expected = np.array([float(x) for x in raw_text])
        assert np.array_equal(expected, v), name
        assert np.isfinite(v).all(), name


@settings(max_examples=FAST, **HYPO)
@given(data=st.data())
def test_property_hostile_cells_keep_the_contract(world: dict[str, Any], data: st.DataObject) -> None:
    _hostile_cells(world, data)


@pytest.mark.slow
@settings(max_examples=MANY, **HYPO)
@given(data=st.data())
def test_property_hostile_cells_keep_the_contract_many(world: dict[str, Any], data: st.DataObject) -> None:
    _hostile_cells(world, data)


def _hostile_cells(world: dict[str, Any], data: st.DataObject) -> None:
    raw = world["log"].astype(str).reset_index(drop=True)
    raw["t"] = world["log"]["t"].astype(str).to_numpy()
    n_cells = data.draw(st.integers(1, 4))
    for _ in range(n_cells):
        r = data.draw(st.integers(0, len(raw) - 1))
        c = data.draw(st.sampled_from(list(raw.columns)))
        raw.at[r, c] = data.draw(HOSTILE_VALUES)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hostile.csv"
        raw.to_csv(path, index=False)
        shutil.copy(spec_path_for(world["dir"] / "log.csv"), spec_path_for(path))
        _check_log_contract(path, raw)


@settings(max_examples=FAST, **HYPO)
@given(data=st.data())
def test_property_corrupt_log_bytes_exit_0_or_2_naming_the_file(
    world: dict[str, Any], data: st.DataObject
) -> None:
    _corrupt_bytes(world, data)


@pytest.mark.slow
@settings(max_examples=MANY, **HYPO)
@given(data=st.data())
def test_property_corrupt_log_bytes_many(world: dict[str, Any], data: st.DataObject) -> None:
    _corrupt_bytes(world, data)


def _corrupt_bytes(world: dict[str, Any], data: st.DataObject) -> None:
    suffix = data.draw(st.sampled_from([".csv", ".csv.gz", ".parquet"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"log{suffix}"
        write_table(world["log"], path) if suffix != ".csv.gz" else path.write_bytes(
            gzip.compress(world["log"].to_csv(index=False).encode())
        )
        blob = bytearray(path.read_bytes())
        op = data.draw(st.sampled_from(["truncate", "flip", "insert"]))
        at = data.draw(st.integers(0, len(blob) - 1))
        if op == "truncate":
            blob = blob[:at]
        elif op == "flip":
            blob[at] ^= data.draw(st.integers(1, 255))
        else:
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        path.write_bytes(bytes(blob))
        shutil.copy(spec_path_for(world["dir"] / "log.csv"), spec_path_for(path))
        code, out, err = run("logs", "validate", str(path), "--json")
        assert "Traceback" not in err and code in (0, 2), err
        if code == 2 and not out.strip():
            assert str(path) in err, err
        if out.strip():
            rep = json.loads(out)
            assert rep["n_usable"] + rep["n_quarantined"] == rep["n_rows"]


# ------------------------------------------------------------------------------------- hypothesis: specs
BAD_TOML_VALUES = ["nan", "inf", "-inf", '"x"', "[]", "1e400", "{}", "true", "-0.0", "1e308"]


@settings(max_examples=FAST * 2, **HYPO)
@given(data=st.data())
def test_property_corrupt_specs_are_input_errors_naming_the_file(
    world: dict[str, Any], data: st.DataObject
) -> None:
    lines = spec_path_for(world["dir"] / "log.csv").read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "value", "garble"]))
        if op == "drop":
            lines.pop(i)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "value" and "=" in lines[i]:
            key = lines[i].split("=")[0]
            lines[i] = f"{key}= {data.draw(st.sampled_from(BAD_TOML_VALUES))}"
        else:
            lines[i] = data.draw(st.text(max_size=12))
        if not lines:
            break
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s[1].spec.toml"
        blob = bytearray("\n".join(lines).encode())
        if blob and data.draw(st.booleans()):  # and a byte that need not be text at all
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(blob))
        try:
            spec = TwinSpec.load(path)
        except InputError as e:
            assert str(path) in str(e), str(e)
            return
        for f in spec.features:  # what loads is sound: finite bounds, low <= high
            assert f.low is None or np.isfinite(f.low)
            assert f.high is None or np.isfinite(f.high)
            assert f.low is None or f.high is None or f.low <= f.high


# ------------------------------------------------------------------------------------- hypothesis: artifacts
def _random_tamper(root: Path, data: st.DataObject) -> str:
    files = _files(root) + [root / MANIFEST_FILE]
    f = data.draw(st.sampled_from(files))
    op = data.draw(st.sampled_from(["flip", "truncate", "append", "delete", "add", "rename", "symlink"]))
    rel = f.relative_to(root).as_posix()
    if op == "flip" and f.stat().st_size:
        flip_byte(f, data.draw(st.integers(0, f.stat().st_size - 1)))
    elif op in ("truncate", "flip"):
        # at least two bytes go: the manifest's trailing newline alone is no tampering
        f.write_bytes(f.read_bytes()[: data.draw(st.integers(0, max(f.stat().st_size - 2, 0)))])
    elif op == "append":
        with f.open("ab") as fh:  # (whitespace after the manifest's JSON would change nothing)
            fh.write(data.draw(st.binary(min_size=1, max_size=16).filter(lambda b: bool(b.strip()))))
    elif op == "delete":
        f.unlink()
    elif op == "add":
        name = data.draw(st.sampled_from(["extra.bin", "model.zip.orig", ".hidden", "member_9/x.pt"]))
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
        rel = name
    elif op == "rename":
        f.rename(f.with_name(f.name + "~"))
    else:
        outside = root.parent / "elsewhere"
        shutil.copy(f, outside)
        f.unlink()
        f.symlink_to(outside)
    return rel


def _tampered_artifacts(world: dict[str, Any], data: st.DataObject) -> None:
    artifact = data.draw(st.sampled_from(["ppo", "heuristic", "twin"]))
    with tempfile.TemporaryDirectory() as tmp:
        root = copy_of(world, artifact, Path(tmp))
        rel = _random_tamper(root, data)
        name = Path(rel).name
        with pytest.raises(InputError) as e:
            (Twin.load if artifact == "twin" else load_policy)(root)
        msg = str(e.value)
        assert name.rstrip("~") in msg or MANIFEST_FILE in msg or "MANIFEST" in msg, (rel, msg)
        reg = Path(tmp) / "reg"
        code, _, err = run(
            "registry", "publish", str(root), "--registry", str(reg), "--key", str(world["dir"] / "key.pem")
        )
        assert code == 2 and "Traceback" not in err, err
        assert registry_is_empty(reg)  # never signed


@settings(max_examples=FAST * 2, **HYPO)
@given(data=st.data())
def test_property_no_tampered_artifact_is_loaded_or_signed(
    world: dict[str, Any], data: st.DataObject
) -> None:
    _tampered_artifacts(world, data)


@pytest.mark.slow
@settings(max_examples=MANY, **HYPO)
@given(data=st.data())
def test_property_no_tampered_artifact_is_loaded_or_signed_many(
    world: dict[str, Any], data: st.DataObject
) -> None:
    _tampered_artifacts(world, data)
