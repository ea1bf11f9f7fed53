"""Policy training in the twin (SB3), rewards, the safety shield, heuristics, evaluation, export.

Import-light: the submodules pull in torch / SB3 only when used.

* `edgetwin.policies.rewards`: reward components of the source papers and `MultiObjectiveReward`.
* `edgetwin.policies.shield`: `Shield.project(obs, actions)`, gym / VecEnv wrappers, action masks.
* `edgetwin.policies.heuristics`: round-robin, least-loaded, best fit, SJF, LJF, lowest carbon, random.
* `edgetwin.policies.regularised`: the action-norm regulariser (seed 004 eq. 8).
* `edgetwin.policies.dual_critic`: `DualCriticPPO` (seed 000 eqs. 10-17).
* `edgetwin.policies.priority`: the priority-weighted softmax (seed 001 eq. 10).
* `edgetwin.policies.train`: `train_policy`; `edgetwin.policies.evaluate`: KPIs with CIs.
* `edgetwin.policies.export`: `export_policy`, `load_policy`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate_policy", "export_policy", "load_policy", "train_policy"]


def __getattr__(name: str) -> Any:
    if name in ("export_policy", "load_policy"):
        from edgetwin.policies import export

        return getattr(export, name)
    if name == "train_policy":
        from edgetwin.policies.train import train_policy

        return train_policy
    if name == "evaluate_policy":
        from edgetwin.policies.evaluate import evaluate_policy

        return evaluate_policy
    raise AttributeError(name)
