"""Policies trained in the twin: SB3 / sb3-contrib training, rewards, the shield, heuristics,
evaluation, export and the promotion gate.

Import-light: a submodule pulls in torch / SB3 only when one of its names is first used.

* `edgetwin.policies.rewards`: reward components of the source papers and `MultiObjectiveReward`.
* `edgetwin.policies.shield`: `Shield.project(obs, actions)`, gym / VecEnv wrappers, action masks.
* `edgetwin.policies.heuristics`: round-robin, least-loaded, best fit, SJF, LJF, lowest carbon, random.
* `edgetwin.policies.regularised`: the action-norm regulariser (seed 004 eq. 8).
* `edgetwin.policies.dual_critic`: `DualCriticPPO` (seed 000 eqs. 10-17).
* `edgetwin.policies.priority`: the priority-weighted softmax (seed 001 eq. 10).
* `edgetwin.policies.train`: `train_policy`; `edgetwin.policies.evaluate`: KPIs with CIs.
* `edgetwin.policies.export`: `export_policy`, `load_policy` (data only: safetensors, JSON, npz),
  `register_policy_kind` (a heuristic class of your own, exportable and loadable in this process).
* `edgetwin.policies.gate`: `promote`, the twin-gated promotion of a policy (the canary loop that
  follows an abstention is `edgetwin.loop`).
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "Shield": "edgetwin.policies.shield",
    "ShieldConfig": "edgetwin.policies.shield",
    "evaluate_policy": "edgetwin.policies.evaluate",
    "export_policy": "edgetwin.policies.export",
    "load_policy": "edgetwin.policies.export",
    "promote": "edgetwin.policies.gate",
    "register_policy_kind": "edgetwin.policies.export",
    "train_policy": "edgetwin.policies.train",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
