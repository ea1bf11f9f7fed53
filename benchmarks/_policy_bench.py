"""Shared pieces of the policy benchmarks (table2_generalisation, heuristics_vs_rl, energy_carbon).

Logs of the emulated cluster under its random logging policy, twins fitted on them (cached by
their arguments under ``--work``), the cluster's scheduling view for the heuristics, and writing a
section of its page, docs/benchmarks/<name>/README.md.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgetwin.cli import cluster_kpi_columns
from edgetwin.contract.policy import NoisyPolicy
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import SLOAwarePolicy, cluster_view, generate_logs  # noqa: F401  (cluster_view: re-exported to the benchmarks that import it from here)
from edgetwin.policies.evaluate import ArraySystem
from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
FIG = ROOT / "docs" / "benchmarks"
KPIS = cluster_kpi_columns()


def machine() -> str:
    return (f"{torch.get_num_threads()} torch thread(s) on a {platform.machine()} machine with 2 CPU cores "
            f"shared with other jobs, Python {platform.python_version()}, torch {torch.__version__}")


def logging_policy(name: str, seed: int) -> str | NoisyPolicy:
    """``"random"`` or ``"heuristic-noise"``: the SLO-aware heuristic with 10 % exploration noise."""
    if name == "random":
        return "random"
    if name == "heuristic-noise":
        spec = EdgeCluster(ClusterConfig(n_agents=1, steps=1)).spec
        return NoisyPolicy(SLOAwarePolicy(spec), spec, 0.1, seed)
    raise SystemExit(f"--logging: expected random or heuristic-noise, got {name!r}")


def fit_twin(work: Path, agents: int, days: int, seed: int, response_model: str = "mail", members: int = 2,
             rounds: int = 4, bc_epochs: int = 15, population_steps: int = 1000, logging: str = "random",
             scale: dict[str, Any] | None = None) -> Twin:
    """A twin of ``days`` days of cluster logs under the ``logging`` policy (cached in ``work``).

    ``scale``: `_scale_args.scale_kwargs` (where the members are fitted; the twin does not depend on it).
    """
    key = f"twin-{response_model}-a{agents}-d{days}-s{seed}-m{members}-r{rounds}-e{bc_epochs}-p{population_steps}"
    if logging != "random":
        key += f"-{logging}"
    path = work / key
    if (path / "meta.json").is_file():
        try:
            return Twin.load(path)
        except Exception:  # a half-written cache: fit again
            pass
    cfg = ClusterConfig(n_agents=agents, steps=96, drift="0d")
    log, spec = generate_logs(cfg, episodes=days, policy=logging_policy(logging, seed), seed=seed)
    twin = Twin.fit(log, spec, seed=seed, members=members, progress=True, response_model=response_model,
                    rounds=rounds, bc_epochs=bc_epochs, checkpoint_dir=work / f"{key}-ckpt",
                    population_hyper={"steps": population_steps}, **(scale or {}))
    twin.save(path)
    return twin


def cluster_system(drift: str, agents: int, steps: int = 96) -> ArraySystem:
    cluster = EdgeCluster(ClusterConfig(n_agents=agents, steps=steps, drift=drift))
    return ArraySystem(cluster, cluster.spec)


def dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def pct(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{100 * x:+.2f} %"
