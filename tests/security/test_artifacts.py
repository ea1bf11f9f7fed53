"""Artifacts are data, never code; twins carry a chain of custody (issue 37, items 2 and 3).

Each test plays someone who can write files (a twin or a policy passed around, a shared disk) and
re-seal the manifest, which proves integrity, not authorship. The promises, one test each:

* a twin whose model files are swapped for a pickle payload (re-sealed) is refused by `Twin.load`
  and by every command that loads a twin; the payload never runs;
* a policy whose model file or ``policy.json`` class is swapped is refused by `load_policy` and
  ``evaluate``; the payload never runs;
* a network file names its class from a fixed registry only (a safetensors header naming another
  class, or an argument naming an unknown class, is refused);
* artifacts of the pickling format are refused with the line that says to refit / re-export;
* a spec's function reference runs only where the user allowed its module (and then it runs);
* ``--trust KEYS`` refuses an unsigned, wrongly signed or re-sealed twin and accepts a signed one,
  on ``whatif``, ``train``, ``evaluate --on twin``, ``fidelity`` and ``promote --twin``;
  ``registry publish / show --trust / fetch`` carry a twin's signature;
* the data formats round-trip: a twin (supervised clients, site model) rolls out identically after
  save/load, and every exportable SB3 algorithm acts identically after export/load.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import io
import json
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.cli import main
from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.manifest import write_manifest
from edgetwin.contract.policy import RandomPolicy
from edgetwin.contract.spec import spec_path_for
from edgetwin.edge.signing import Signer, save_private_key, save_public_key
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.export import ActionTransform, export_policy, load_policy
from edgetwin.policies.heuristics import UniformRandom
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

EVIL_MODULE = "edgetwin_test_evil_spec_module"


# ------------------------------------------------------------------------------------- helpers
class Payload:
    """Unpickling this writes ``marker``: what an attacker's pickle would do (harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def run(*argv: str) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


def refused(result: tuple[int, str, str], *words: str) -> str:
    """Exit 2, one line, no traceback, naming ``words``; returns the line."""
    code, out, err = result
    assert code == 2, out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


def reseal(path: Path, kind: str) -> None:
    """What an attacker who can write the directory does after swapping a file."""
    (path / "MANIFEST.json").unlink()
    write_manifest(path, kind)


class _BoxEnv(gym.Env):
    def __init__(self, n_obs: int, n_act: int, discrete: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (n_obs,), np.float32)
        self.action_space = (
            gym.spaces.MultiDiscrete([3] * n_act) if discrete else gym.spaces.Box(-1.0, 1.0, (n_act,), np.float32)
        )

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(self.observation_space.shape, np.float32), 0.0, True, False, {}

    def action_masks(self) -> np.ndarray:
        return np.ones(3 * int(np.prod(self.action_space.shape)), bool)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small emulated log (spec beside it), its twin, an SB3 and a heuristic policy, two key pairs."""
    from stable_baselines3 import PPO

    d = tmp_path_factory.mktemp("artifacts")
    log, spec = generate_logs(ClusterConfig(n_agents=6, steps=6), episodes=3, policy="random", seed=1)
    write_table(log, d / "log.csv")
    spec.save(spec_path_for(d / "log.csv"))
    twin = Twin.fit(log, spec, members=1, seed=0, progress=False, population_model="empirical",
                    response_model="bc", bc_epochs=1)  # fmt: skip
    twin.save(d / "twin")
    export_policy(UniformRandom(spec, seed=0), d / "heuristic", spec)
    low, high = spec.bounds("action")
    model = PPO("MlpPolicy", _BoxEnv(len(spec.observation_columns), len(low)), n_steps=16, batch_size=16, seed=0,
                device="cpu")  # fmt: skip
    export_policy(model, d / "ppo", spec, action_transform=ActionTransform("box", low.tolist(), high.tolist()))
    keys = {}
    for who in ("publisher", "stranger"):
        (d / who).mkdir()
        s = Signer.generate()
        save_private_key(s.private_key, d / who / "key.pem")
        save_public_key(s.public_key, d / who / "pub.pem")
        keys[who] = s
    return {"dir": d, "log": log, "spec": spec, "twin": twin, "keys": keys}


def copy_of(world: dict[str, Any], name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(world["dir"] / name, target)
    return target


def poisoned_twin(world: dict[str, Any], dest: Path, marker: Path) -> Path:
    """The twin with every model file of member 0 replaced by a pickle payload, plus the pickled
    files an older edgetwin read (``.pt`` / ``.pkl``), re-sealed."""
    p = copy_of(world, "twin", dest)
    member = p / "member_0"
    for f in sorted(member.iterdir()):
        if f.suffix in (".pt", ".pkl", ".safetensors", ".npz"):
            torch.save(Payload(marker), f)
    torch.save(Payload(marker), member / "engine_0.pt")
    (member / "site_model.pkl").write_bytes(__import__("pickle").dumps(Payload(marker)))
    reseal(p, "twin")
    return p


def sb3_zip_payload(path: Path, marker: Path) -> None:
    """An SB3 ``model.zip`` whose ``data`` holds a ``:serialized:`` cloudpickle (what SB3's load
    unpickles before it looks at anything else)."""
    import cloudpickle

    blob = base64.b64encode(cloudpickle.dumps(Payload(marker))).decode()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data", json.dumps({"policy_class": {":type:": "x", ":serialized:": blob}}))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "PWNED"


# ----------------------------------------------------------------------- 1. twins are data
def test_a_twin_with_swapped_model_files_is_refused_and_the_payload_never_runs(
    world: dict[str, Any], tmp_path: Path, marker: Path
) -> None:
    p = poisoned_twin(world, tmp_path, marker)
    with pytest.raises(InputError) as e:
        Twin.load(p)
    assert not marker.exists()  # first: the payload never ran
    assert "refit" in str(e.value) and "engine_0.pt" in str(e.value)
    # without the old-format files: the safetensors that now hold a pickle are refused as data
    (p / "member_0" / "engine_0.pt").unlink()
    (p / "member_0" / "site_model.pkl").unlink()
    reseal(p, "twin")
    with pytest.raises(InputError, match="member_0"):
        Twin.load(p)
    assert not marker.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ("train", "TWIN", "--out", "OUT", "--steps", "16", "--no-select"),
        ("whatif", "TWIN", "--policy", "logging", "--out", "OUT", "--episodes", "1", "--seeds", "1"),
        ("evaluate", "random", "TWIN", "--on", "twin", "--episodes", "1", "--agents", "4", "--episode-steps", "2"),
        ("fidelity", "TWIN", "LOG", "--episodes", "1"),
        ("promote", "PPO", "--registry", "REG", "--key", "KEY", "--twin", "TWIN", "--log", "LOG", "--out", "OUT"),
    ],
    ids=lambda a: a[0],
)
def test_commands_refuse_a_poisoned_twin_before_its_payload_runs(
    world: dict[str, Any], tmp_path: Path, marker: Path, argv: tuple[str, ...]
) -> None:
    twin = poisoned_twin(world, tmp_path, marker)
    d = world["dir"]
    sub = {"TWIN": str(twin), "OUT": str(tmp_path / "out"), "LOG": str(d / "log.csv"), "PPO": str(d / "ppo"),
           "REG": str(tmp_path / "reg"), "KEY": str(d / "publisher" / "key.pem")}  # fmt: skip
    refused(run(*[sub.get(a, a) for a in argv]), str(twin / "member_0"))
    assert not marker.exists()


def test_old_format_twins_are_refused_with_refit(world: dict[str, Any], tmp_path: Path) -> None:
    p = copy_of(world, "twin", tmp_path)
    meta = json.loads((p / "meta.json").read_text())
    meta["format_version"] = 1  # what every twin written before this format says
    (p / "meta.json").write_text(json.dumps(meta))
    reseal(p, "twin")
    with pytest.raises(InputError, match="refit it with `edgetwin fit`"):
        Twin.load(p)
    refused(run("fidelity", str(p), str(world["dir"] / "log.csv")), "refit")


def test_a_network_file_cannot_name_its_own_class(world: dict[str, Any], tmp_path: Path) -> None:
    """The safetensors header is JSON: its class must be one of the registry's, its arguments
    may name only known classes; anything else is refused before a network is built."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    p = copy_of(world, "twin", tmp_path)
    f = p / "member_0" / "engine_0.safetensors"
    with safe_open(str(f), framework="pt") as sf:
        tensors = {k: sf.get_tensor(k) for k in sf.keys()}  # noqa: SIM118 - safe_open has no __iter__
        header = json.loads(sf.metadata()["edgetwin"])
    for bad in ({**header, "class": "os:system"},
                {**header, "kwargs": {**header["kwargs"], "activation_fn": {"__class__": "subprocess.Popen"}}}):  # fmt: skip
        save_file(tensors, str(f), metadata={"edgetwin": json.dumps(bad)})
        reseal(p, "twin")
        with pytest.raises(InputError, match="is not one of"):
            Twin.load(p)


# ----------------------------------------------------------------------- 2. policies are data
def test_a_policy_with_a_swapped_model_or_class_is_refused_and_the_payload_never_runs(
    world: dict[str, Any], tmp_path: Path, marker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a) the SB3 model swapped for a zip whose data SB3 would unpickle (policy.json as it was
    # written before this format) and (b) the same payload in place of the safetensors file
    p = copy_of(world, "ppo", tmp_path / "a")
    sb3_zip_payload(p / "model.zip", marker)
    doc = json.loads((p / "policy.json").read_text())
    (p / "policy.json").write_text(json.dumps({**doc, "format": "edgetwin-policy/1"}))
    reseal(p, "policy")
    with pytest.raises(InputError) as e:
        load_policy(p)
    assert not marker.exists()  # first: the payload never ran
    assert "re-export" in str(e.value)
    refused(run("evaluate", str(p), "--episodes", "1", "--agents", "4", "--episode-steps", "2"), "re-export")
    q = copy_of(world, "ppo", tmp_path / "b")
    torch.save(Payload(marker), q / "model.safetensors")
    reseal(q, "policy")
    with pytest.raises(InputError, match="model.safetensors"):
        load_policy(q)
    assert not marker.exists()
    # (c) a heuristic's class swapped for an importable one that runs code when built
    (tmp_path / "evil_policy_mod.py").write_text(
        "class Evil:\n"
        f"    def __init__(self, spec, **kw):\n        open({str(marker)!r}, 'w').write('pwned')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for fmt in ("edgetwin-policy/1", "edgetwin-policy/2"):
        h = copy_of(world, "heuristic", tmp_path / fmt.replace("/", "_"))
        doc = json.loads((h / "policy.json").read_text())
        doc.update(format=fmt, heuristic={"class": "evil_policy_mod:Evil", "kind": "evil_policy_mod:Evil", "config": {}})
        (h / "policy.json").write_text(json.dumps(doc))
        reseal(h, "policy")
        with pytest.raises(InputError):
            load_policy(h)
        refused(run("evaluate", str(h), "--episodes", "1", "--agents", "4", "--episode-steps", "2"), "policy.json")
    assert not marker.exists()
    assert "evil_policy_mod" not in sys.modules


def poisoned_policy(world: dict[str, Any], dest: Path, marker: Path) -> Path:
    """The SB3 policy with its model file (whichever format it is in) swapped for a payload, re-sealed."""
    p = copy_of(world, "ppo", dest)
    if (p / "model.zip").exists():  # the format SB3's own load read
        sb3_zip_payload(p / "model.zip", marker)
    if (p / "model.safetensors").exists():
        torch.save(Payload(marker), p / "model.safetensors")
    reseal(p, "policy")
    return p


def test_promote_refuses_a_poisoned_policy(world: dict[str, Any], tmp_path: Path, marker: Path) -> None:
    p = poisoned_policy(world, tmp_path, marker)
    d = world["dir"]
    refused(run("promote", str(p), "--registry", str(tmp_path / "reg"), "--key", str(d / "publisher" / "key.pem"),
                "--twin", str(d / "twin"), "--log", str(d / "log.csv"), "--out", str(tmp_path / "out")),
            str(p / "model."))  # fmt: skip
    assert not marker.exists()


def test_the_edge_runtime_refuses_a_poisoned_policy_signed_by_a_trusted_key(
    world: dict[str, Any], tmp_path: Path, marker: Path
) -> None:
    """A publisher's key signs whatever sealed directory it is given: the runtime must still load
    only data (what `edgetwin serve` runs)."""
    import asyncio

    from edgetwin.edge.registry import FileRegistry
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import TrustStore

    p = poisoned_policy(world, tmp_path, marker)
    signer = world["keys"]["publisher"]
    reg = FileRegistry(tmp_path / "registry")
    reg.publish(p, {"name": "ppo", "version": "v1"}, signer)
    reg.set_current("global", "v1", expected=None)

    async def serve() -> None:
        async with EdgeRuntime("s1", reg, TrustStore([signer.public_key]), kpi_guard=None) as rt:
            assert rt.version is None
            assert rt.status()["refused"]["v1"].startswith("incompatible")

    asyncio.run(serve())
    assert not marker.exists()


def test_exported_sb3_policies_are_data_and_act_identically(tmp_path: Path, world: dict[str, Any]) -> None:
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, PPO, SAC, TD3

    from edgetwin.policies.dual_critic import DualCriticPPO

    spec = world["spec"]
    n_obs, n_act = len(spec.observation_columns), len(spec.action_columns)
    low, high = spec.bounds("action")
    obs = np.random.default_rng(0).normal(size=(7, n_obs))
    for cls in (PPO, A2C, SAC, TD3, RecurrentPPO, DualCriticPPO, MaskablePPO):
        grid = cls is MaskablePPO
        env = _BoxEnv(n_obs, n_act, discrete=grid)
        model = cls("MlpLstmPolicy" if cls is RecurrentPPO else "MlpPolicy", env, seed=0, device="cpu")
        tr = (ActionTransform("grid", grid=[list(np.linspace(lo, hi, 3)) for lo, hi in zip(low, high, strict=True)])
              if grid else ActionTransform("box", low.tolist(), high.tolist()))  # fmt: skip
        d = export_policy(model, tmp_path / cls.__name__, spec, action_transform=tr)
        assert sorted(f.name for f in d.iterdir()) == ["MANIFEST.json", "model.safetensors", "policy.json", "spec.toml"]
        kw: dict[str, Any] = {"deterministic": True}
        if cls is RecurrentPPO:
            kw.update(state=None, episode_start=np.ones(len(obs), bool))
        want = tr.apply(np.asarray(model.predict(obs.astype(np.float32), **kw)[0]).reshape(len(obs), -1))
        np.testing.assert_array_equal(load_policy(d).act(obs), want, err_msg=cls.__name__)


# ----------------------------------------------------------------------- 3. spec code needs an allowance
@pytest.fixture
def evil_spec(tmp_path: Path, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch, marker: Path) -> Path:
    """A log whose spec declares a state column by a function of a module that writes ``marker``
    when imported; the module is on sys.path (as any installed package would be)."""
    (tmp_path / f"{EVIL_MODULE}.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "import numpy as np\n"
        "def next_latency(columns, site):\n"
        "    return np.asarray(columns['state.latency_ms'], dtype=float)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # set (empty) rather than deleted, so that what --allow-code adds in-process is undone after the test
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "")
    monkeypatch.setenv("EDGETWIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delitem(sys.modules, EVIL_MODULE, raising=False)
    d = world["spec"].to_dict()
    d["dynamics"] = [{"column": "state.latency_ms", "function": f"{EVIL_MODULE}:next_latency"}]
    log = tmp_path / "log.csv"
    write_table(world["log"], log)
    spec_path_for(log).write_text(_toml(d))
    return log


def _toml(d: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(json.loads(json.dumps(d)))


def test_a_spec_function_runs_only_where_its_module_is_allowed(
    evil_spec: Path, marker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = refused(run("logs", "validate", str(evil_spec)), EVIL_MODULE, f"--allow-code {EVIL_MODULE}",
                   "EDGETWIN_ALLOW_CODE")  # fmt: skip
    assert "is not allowed to run on this machine" in line
    assert not marker.exists() and EVIL_MODULE not in sys.modules
    # allowed on the command line, for the user's own spec: it runs
    code, out, err = run("logs", "validate", str(evil_spec), "--allow-code", EVIL_MODULE)
    assert code == 0, out + err
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("how", ["env", "file"])
def test_a_twin_naming_a_module_loads_only_once_it_is_allowed(
    evil_spec: Path, marker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    from edgetwin.contract.spec import TwinSpec

    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", EVIL_MODULE)
    spec = TwinSpec.load(spec_path_for(evil_spec))
    twin = Twin.fit(pd.read_csv(evil_spec), spec, members=1, seed=0, progress=False, population_model="empirical",
                    response_model="bc", bc_epochs=1)  # fmt: skip
    twin.save(tmp_path / "tw")
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "")
    monkeypatch.delitem(sys.modules, EVIL_MODULE)
    marker.unlink()
    with pytest.raises(InputError, match="not allowed to run on this machine"):
        Twin.load(tmp_path / "tw")
    refused(run("fidelity", str(tmp_path / "tw"), str(evil_spec)), "--allow-code")
    assert not marker.exists()
    if how == "env":
        monkeypatch.setenv("EDGETWIN_ALLOW_CODE", f"numpy,{EVIL_MODULE}")
    else:
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "allow-code").write_text(f"# modules this machine runs for specs\n{EVIL_MODULE}\n")
    assert Twin.load(tmp_path / "tw").spec.hash() == spec.hash()
    assert marker.read_text() == "ran"


# ----------------------------------------------------------------------- 4. signed twins
def test_trust_refuses_an_unsigned_or_foreign_twin_and_accepts_a_signed_one(
    world: dict[str, Any], tmp_path: Path, marker: Path
) -> None:
    from edgetwin.edge.signed_dirs import sign_directory, verify_directory
    from edgetwin.edge.signing import ArtifactRejected, TrustStore

    d = world["dir"]
    twin = copy_of(world, "twin", tmp_path)
    trust = str(d / "publisher" / "pub.pem")
    whatif = ("whatif", str(twin), "--policy", "logging", "--out", str(tmp_path / "w"), "--episodes", "1",
              "--seeds", "1", "--steps", "2", "--agents", "4", "--trust", trust)  # fmt: skip
    refused(run(*whatif), "SIGNATURE.json", "unsigned")
    # every command that loads a twin takes --trust, and checks before anything else
    for argv in (
        ("train", str(twin), "--out", str(tmp_path / "p"), "--steps", "16", "--trust", trust),
        ("evaluate", "random", str(twin), "--on", "twin", "--episodes", "1", "--trust", trust),
        ("fidelity", str(twin), str(d / "log.csv"), "--trust", trust),
        ("promote", str(d / "ppo"), "--registry", str(tmp_path / "reg"), "--key", str(d / "stranger" / "key.pem"),
         "--twin", str(twin), "--log", str(d / "log.csv"), "--out", str(tmp_path / "o"), "--trust", trust),
    ):
        refused(run(*argv), "SIGNATURE.json")
    # signed by a key nobody trusts
    sign_directory(twin, "twin", world["keys"]["stranger"])
    refused(run(*whatif), "untrusted_key", world["keys"]["stranger"].key_id)
    # signed by the publisher: accepted (CLI and library)
    code, out, err = run("registry", "sign", str(twin), "--key", str(d / "publisher" / "key.pem"))
    assert code == 0, out + err
    code, out, err = run(*whatif)
    assert code == 0, out + err
    assert verify_directory(twin, "twin", TrustStore.from_paths([trust]))["publisher"] == world["keys"]["publisher"].key_id
    # swapped after signing and re-sealed: the signature no longer holds, and nothing was unpickled
    torch.save(Payload(marker), twin / "member_0" / "engine_0.safetensors")
    reseal(twin, "twin")
    refused(run(*whatif), "bad_signature", "re-sealed")
    with pytest.raises(ArtifactRejected):
        verify_directory(twin, "twin", TrustStore.from_paths([trust]))
    assert not marker.exists()


def test_registry_publishes_shows_and_fetches_a_signed_twin(world: dict[str, Any], tmp_path: Path) -> None:
    d = world["dir"]
    reg, key, trust = str(tmp_path / "reg"), str(d / "publisher" / "key.pem"), str(d / "publisher" / "pub.pem")
    code, out, err = run("registry", "publish", str(d / "twin"), "--registry", reg, "--key", key, "--name", "twin",
                         "--json")  # fmt: skip
    assert code == 0, out + err
    version = json.loads(out)["version"]
    assert not (d / "twin" / "SIGNATURE.json").exists()  # the source directory is not touched
    code, out, err = run("registry", "show", version, "--registry", reg, "--trust", trust, "--json")
    assert code == 0, out + err
    shown = json.loads(out)
    assert shown["verified"] and shown["kind"] == "twin" and shown["spec_hash"] == world["twin"].spec.hash()
    refused(run("registry", "show", version, "--registry", reg, "--trust", str(d / "stranger" / "pub.pem")),
            "untrusted_key")  # fmt: skip
    code, out, err = run("registry", "fetch", version, "--registry", reg, "--out", str(tmp_path / "got"), "--trust", trust)
    assert code == 0, out + err
    code, out, err = run("whatif", str(tmp_path / "got"), "--policy", "logging", "--out", str(tmp_path / "w"),
                         "--episodes", "1", "--seeds", "1", "--steps", "2", "--agents", "4", "--trust", trust)  # fmt: skip
    assert code == 0, out + err


# ----------------------------------------------------------------------- 5. round trips
def test_a_twin_with_supervised_clients_and_a_site_model_round_trips_as_data(
    world: dict[str, Any], tmp_path: Path
) -> None:
    twin = Twin.fit(world["log"], world["spec"], members=1, seed=0, progress=False, population_model="gmm",
                    response_model="supervised", site_model=True, population_hyper={"n_components": 1})  # fmt: skip
    assert twin.members[0].site_model is not None
    back = Twin.load(twin.save(tmp_path / "tw"))
    suffixes = {f.suffix for f in (tmp_path / "tw").rglob("*") if f.is_file()}
    assert not suffixes & {".pt", ".pkl", ".pickle", ".zip"}, suffixes
    a = twin.rollout(RandomPolicy(twin.spec, 0), episodes=1, seed=3)
    b = back.rollout(RandomPolicy(twin.spec, 0), episodes=1, seed=3)
    pd.testing.assert_frame_equal(a, b)


def test_population_models_are_data_and_old_ones_are_refused(world: dict[str, Any], tmp_path: Path) -> None:
    from edgetwin.generative import agent_profiles, fit_population, load_population

    spec = world["spec"]
    pm = fit_population(agent_profiles(world["log"], spec), spec, model="gan", seed=0, progress=False, steps=2)
    path = pm.save(tmp_path / "pop")
    assert (path / "weights.safetensors").is_file() and not (path / "weights.pt").exists()
    pd.testing.assert_frame_equal(load_population(path).sample(5, seed=1), pm.sample(5, seed=1))
    meta = json.loads((path / "population.json").read_text())
    (path / "population.json").write_text(json.dumps({**meta, "format": "edgetwin.population/1"}))
    with pytest.raises(InputError, match="refit it"):
        load_population(path)


def test_train_resumes_from_checkpoints_as_data_only(
    world: dict[str, Any], tmp_path: Path, marker: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Checkpoints live inside the exported policy directory, which travels: resuming reads only
    their tensors. A checkpoint of this run (its directory names the run) whose pickled ``data``
    carries a payload is refused, unrun; one of no recorded run is removed, unread."""
    out = tmp_path / "policy"
    argv = ("train", str(world["dir"] / "twin"), "--out", str(out), "--steps", "16", "--no-select", "--checkpoint-every", "8")
    assert run(*argv)[0] == 0 and (out / "checkpoints" / "run.json").is_file()
    sb3_zip_payload(out / "checkpoints" / "ckpt_1000_steps.zip", marker)
    (out / "checkpoints" / "ckpt_vecnormalize_1000_steps.pkl").write_bytes(__import__("pickle").dumps(Payload(marker)))
    refused(run(*argv), "ckpt_1000_steps.zip")
    assert not marker.exists()
    # planted in a directory that records no run: not this run's, so never read, and removed
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    sb3_zip_payload(other / "checkpoints" / "ckpt_4_steps.zip", marker)
    with caplog.at_level("WARNING", logger="edgetwin.train"):
        assert run(*argv[:3], str(other), *argv[4:])[0] == 0
    assert "checkpoint(s) of another run" in caplog.text
    assert not marker.exists() and not (other / "checkpoints" / "ckpt_4_steps.zip").exists()
