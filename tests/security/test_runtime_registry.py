"""The edge runtime trusts the registry's record, not a version name (issue 37, item 6).

A registry whose store is lost and rebuilt can give a *different* policy an old version name. The
runtime keys what it has loaded by the artifact's signed digest and checks it against the
registry's record on every refresh, so it switches to the new bytes; when the registry's pointers
and artifacts are gone it keeps serving (fail-static) and says so once.

The policies here are data (a constant action in ``policy.json``) read by a loader of the test's
own, so the test does not depend on the export format's policy kinds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgetwin.contract.manifest import write_manifest
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig, cluster_spec

SITE = "s1"
SCOPE = f"site/{SITE}"
SPEC = cluster_spec(ClusterConfig(n_agents=4))


class _Constant:
    def __init__(self, spec: TwinSpec, action: list[float]) -> None:
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


def load_constant(path: Path) -> _Constant:
    doc = json.loads((path / "policy.json").read_text())
    return _Constant(TwinSpec.load(path / "spec.toml"), doc["action"])


def constant_dir(root: Path, name: str, action: list[float]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "policy.json").write_text(json.dumps({"format": "test-constant/1", "action": action}))
    SPEC.save(d / "spec.toml")
    write_manifest(d, "policy", require=("policy.json",))
    return d


def publish(reg: FileRegistry, root: Path, version: str, action: list[float], signer: Signer) -> str:
    d = constant_dir(root, f"{version}-{'-'.join(map(str, action))}", action)
    return reg.publish(d, {"name": "constant", "version": version}, signer)


def refresh(rt: EdgeRuntime) -> None:
    asyncio.run_coroutine_threadsafe(rt.refresh(), rt._loop).result(30)  # type: ignore[arg-type]


def obs(n: int = 3) -> np.ndarray:
    return np.zeros((n, len(SPEC.observation_columns)))


def test_a_rebuilt_registry_reusing_a_version_name_switches_the_runtime_to_the_new_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer = Signer.generate()
    trust = TrustStore([signer.public_key])
    root = tmp_path / "registry"
    reg = FileRegistry(root)
    publish(reg, tmp_path / "src", "v1", [0.1, 0.5, 0.1], signer)
    publish(reg, tmp_path / "src", "v2", [0.2, 0.6, 0.2], signer)
    reg.set_current(SCOPE, "v1", expected=None)
    reg.set_current(SCOPE, "v2", expected="v1")
    rt = EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=3600, loader=load_constant)
    with rt.running_in_thread():
        assert rt.version == "v2"
        np.testing.assert_allclose(rt.decide(obs()), np.tile([0.2, 0.6, 0.2], (3, 1)))
        old_sha = rt.active.manifest.sha256  # type: ignore[union-attr]

        # The store is lost: the runtime keeps serving, and says so once (not at every poll).
        shutil.rmtree(root)
        FileRegistry(root)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="edgetwin.runtime"):
            for _ in range(3):
                refresh(rt)
        gone = [r for r in caplog.records if "fail-static" in r.getMessage()]
        assert len(gone) == 1, [r.getMessage() for r in caplog.records]
        assert rt.version == "v2"
        np.testing.assert_allclose(rt.decide(obs()), np.tile([0.2, 0.6, 0.2], (3, 1)))

        # Rebuilt: a different policy gets the old names v1 and v2 and is promoted.
        publish(reg, tmp_path / "src2", "v1", [0.7, 0.9, 0.3], signer)
        publish(reg, tmp_path / "src2", "v2", [0.9, 1.1, 0.4], signer)
        reg.set_current(SCOPE, "v1", expected=None)
        reg.set_current(SCOPE, "v2", expected="v1")
        refresh(rt)
        a = rt.active
        assert a is not None and a.version == "v2"
        assert a.manifest.sha256 == reg.manifest("v2").sha256 != old_sha
        np.testing.assert_allclose(rt.decide(obs()), np.tile([0.9, 1.1, 0.4], (3, 1)))


def test_same_name_same_bytes_is_not_reloaded(tmp_path: Path) -> None:
    """Checking the digest on every refresh must not reload an unchanged version."""
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path / "src", "v1", [0.1, 0.5, 0.1], signer)
    reg.set_current(SCOPE, "v1", expected=None)
    loads: list[Any] = []

    def counting(path: Path) -> _Constant:
        loads.append(path)
        return load_constant(path)

    rt = EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), kpi_guard=None, poll_interval=3600, loader=counting)
    with rt.running_in_thread():
        for _ in range(3):
            refresh(rt)
        assert rt.version == "v1" and len(loads) == 1 and rt.stats.swaps == 0


@pytest.mark.nats
def test_over_nats_a_lost_and_rebuilt_store_with_a_reused_name_is_served_by_its_new_bytes(
    nats_server: Any, tmp_path: Path
) -> None:
    """The reported case: `edgetwin serve` on a NATS registry whose JetStream store is lost and
    rebuilt, and `promote` gives other bytes the old name v2."""
    import nats

    from edgetwin.edge.registry import DeferredNatsRegistry, NatsRegistry

    signer = Signer.generate()
    trust = TrustStore([signer.public_key])

    async def publish_all(src: str, actions: list[list[float]]) -> str:
        nc = await nats.connect(nats_server.url)
        admin = NatsRegistry(nc)
        for version, action in zip(("v1", "v2"), actions, strict=True):
            d = constant_dir(tmp_path / src, version, action)
            await admin.publish(d, {"name": "constant", "version": version}, signer)
        await admin.set_current(SCOPE, "v1", expected=None)
        await admin.set_current(SCOPE, "v2", expected="v1")
        sha = (await admin.manifest("v2")).sha256
        await nc.close()
        return sha

    async def wait_for(cond: Any, timeout: float = 60.0) -> bool:
        for _ in range(int(timeout / 0.05)):
            if cond():
                return True
            await asyncio.sleep(0.05)
        return bool(cond())

    async def main() -> None:
        old_sha = await publish_all("a", [[0.1, 0.5, 0.1], [0.2, 0.6, 0.2]])
        reg = DeferredNatsRegistry(nats_server.url)
        await reg.open()
        rt = EdgeRuntime(SITE, reg, trust, kpi_guard=None, poll_interval=0.1, registry_timeout=1.0, loader=load_constant)
        async with rt:
            assert await wait_for(lambda: rt.version == "v2")
            assert rt.active is not None and rt.active.manifest.sha256 == old_sha
            # the store is lost: same server address, an empty JetStream store
            nats_server.stop()
            shutil.rmtree(nats_server.store, ignore_errors=True)
            nats_server.start()
            np.testing.assert_allclose(rt.decide(obs()), np.tile([0.2, 0.6, 0.2], (3, 1)))  # fail-static
            new_sha = await publish_all("b", [[0.7, 0.9, 0.3], [0.9, 1.1, 0.4]])
            assert new_sha != old_sha
            assert await wait_for(lambda: rt.active is not None and rt.active.manifest.sha256 == new_sha), (
                "the runtime kept serving the lost registry's v2"
            )
            assert rt.version == "v2"
            np.testing.assert_allclose(rt.decide(obs()), np.tile([0.9, 1.1, 0.4], (3, 1)))
        await reg.close()

    asyncio.run(asyncio.wait_for(main(), timeout=240))
