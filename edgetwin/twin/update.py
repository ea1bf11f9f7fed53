"""`update_twin`: a twin that learns from new rows (a canary's) without a refit.

The new twin keeps its parent's layout (scalers, horizon), population model, engines (the cloned
*logging* policy: canary rows come from other policies, and the engines stand for the system's own
policy in MAIL's training worlds) and site-state model; what the new rows teach it goes into:

- **the response models**, warm-started from the parent's weights and fine-tuned by behaviour
  cloning (``epochs`` passes, at most ``max_steps`` gradient steps per model) on each member's
  parent bootstrap draw of the old episodes plus its own bootstrap draw of the new episodes (so
  the ensemble's spread still reflects both), with the Gaussian std reset to its maximum-likelihood
  value as every fit ends. MAIL's adversarial rounds are not rerun: they are most of a fit's cost,
  and what the new rows add is supervised evidence at actions the logs never held;
- **the causal response model** (`edgetwin.imitation.causal`, a twin fitted with
  ``response_model="causal"``) is refitted on the same rows with each row's ``policy`` id and its
  agent-day, its invariance weight chosen again by cross-fitting: a canary's randomized arms are the
  evidence that model exists for, and a plain regression on them would drop its invariance;
- **each member's output noise model** (`Member.fit_output_noise`, as `Twin.fit` fits one): the
  residuals of its fine-tuned models on the old and new episodes of its draws (on all of them
  for a single member), so that it draws from what the updated models get wrong, not the parent's;
- **the support index, logged initial states and site composition**, rebuilt on old + new rows
  (cheap: they are summaries, not models), so that the candidate's steps that the canary covered
  are no longer out of support.

**Why the old rows are required.** A twin does not keep its raw logs (only a bounded support bank of
standardised rows, without the responses a fine-tune needs), and fine-tuning on the new rows alone
drifts every model toward the slice the canary saw (catastrophic forgetting). So the update takes
the old log too and checks it is the one the twin was fitted on (its ``data_sha256``; for a twin
that was itself updated, the list of parts in ``meta["data_parts"]``, in order). Raw logs stay
where the operator fits twins anyway; a site that cannot pass them keeps the federated fit.

**Calibration** is not part of a twin here (it is computed from held-out logs when a what-if asks,
`edgetwin.twin.calibration`); the updated twin is calibrated the same way, on logs it did not see.

The new twin is sealed as usual by `Twin.save`; its ``meta["parent"]`` names the parent (its
manifest's sha256 when known, its data sha256 and seed), and ``meta["update"]`` what was done.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from stable_baselines3.common.policies import ActorCriticPolicy

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import MANIFEST_FILE
from edgetwin.contract.spec import TwinSpec, spec_path_for
from edgetwin.imitation.causal import CausalResponseModel
from edgetwin.imitation.mail import behaviour_clone, client_rows
from edgetwin.imitation.overlap import overlap_report
from edgetwin.imitation.steps import build_steps
from edgetwin.imitation.world import Composition, InitialStates
from edgetwin.twin.logdata import bootstrap_episodes, data_sha256, episode_hashes, library_versions, load_log
from edgetwin.twin.member import Member
from edgetwin.twin.support import SupportIndex

__all__ = ["manifest_sha256", "update_twin"]

_KEY = ["episode", "t", "agent"]


def manifest_sha256(twin_dir: str | Path) -> str:
    """sha256 of a saved twin's ``MANIFEST.json``: names that exact twin (every file's digest)."""
    p = Path(twin_dir) / MANIFEST_FILE
    try:
        return hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError as e:
        raise InputError(f"cannot read the twin's manifest ({e})", str(p)) from None


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)


def _read(log: Any, spec: TwinSpec, what: str) -> pd.DataFrame:
    if isinstance(log, str | Path):
        beside = spec_path_for(log)
        if beside.is_file():  # a log that brings its own spec must bring this twin's
            other = TwinSpec.load(beside)
            if other.hash() != spec.hash():
                raise InputError(
                    f"{what} was logged under another spec ({beside.name}, hash {other.hash()[:12]}) "
                    f"than the twin's ({spec.hash()[:12]})",
                    str(log),
                )
    missing = [c for c in spec.observation_columns + spec.action_columns if isinstance(log, pd.DataFrame)
               and c not in log.columns]  # fmt: skip
    if missing:
        raise InputError(f"{what} lacks the twin's column(s) {missing[:5]}", what)
    df, _ = load_log(log, spec)
    return _sorted(df)


def _action_bounds(twin: Any, logged: np.ndarray, spec: Any) -> tuple[np.ndarray, np.ndarray]:
    """The updated twin's action box, shape (n_action,) each: the parent's widened to the logged
    actions (old + new rows, ``logged`` (n_rows, n_action)), then the spec's finite bounds win."""
    a_low = np.minimum(twin.action_low, logged.min(axis=0))
    a_high = np.maximum(twin.action_high, logged.max(axis=0))
    lo_spec, hi_spec = spec.bounds("action")
    return np.where(np.isfinite(lo_spec), lo_spec, a_low), np.where(np.isfinite(hi_spec), hi_spec, a_high)


def update_twin(
    twin: Any,
    new_log: str | Path | pd.DataFrame,
    old_logs: Sequence[str | Path | pd.DataFrame],
    *,
    seed: int = 0,
    epochs: int = 5,
    max_steps: int = 1000,
    parent_manifest: str | None = None,
) -> Any:
    """A new twin: ``twin`` fine-tuned on its own data plus ``new_log`` (see the module docstring).

    Args:
        twin: the parent `Twin`.
        new_log: the new rows (a canary's log: the log contract, under the twin's spec).
        old_logs: the parent's training data: its one log, or for an updated twin each part in
            ``meta["data_parts"]`` order.
        seed: the same seed, twin and logs give the same new twin.
        epochs, max_steps: the fine-tune's budget per response model.
        parent_manifest: the parent's `manifest_sha256` (recorded as its name; None when the
            parent was never saved).

    Raises:
        InputError: a log under another spec or with other scenarios, old logs that are not the
            twin's data, new rows that repeat rows of the twin's data, no usable new row.
    """
    if epochs < 1 or max_steps < 1:
        raise InputError(f"epochs and max_steps must be >= 1, got {epochs}, {max_steps}", "--update")
    t0 = time.perf_counter()
    layout, spec = twin.layout, twin.spec
    parts_expected = list(twin.meta.get("data_parts") or [twin.meta.get("data_sha256")])
    if len(old_logs) != len(parts_expected):
        raise InputError(
            f"the twin was fitted on {len(parts_expected)} log part(s); give each with --log, in order "
            f"(got {len(old_logs)})",
            "--log",
        )
    old_parts = []
    for i, (lg, want) in enumerate(zip(old_logs, parts_expected, strict=True)):
        df = _read(lg, spec, f"--log #{i + 1}")
        if data_sha256(df) != want:
            raise InputError(
                f"this log is not the twin's training data (its sha256 {data_sha256(df)[:12]}..., the twin's "
                f"part {i + 1} {str(want)[:12]}...)",
                str(lg) if not isinstance(lg, pd.DataFrame) else f"--log #{i + 1}",
            )
        old_parts.append(df)
    new = _read(new_log, spec, "the new log")
    if new.empty:
        raise InputError("the new log has no usable row", str(new_log) if not isinstance(new_log, pd.DataFrame) else "new log")
    unknown = sorted(set(new["scenario"].astype(str)) - set(layout.scenarios))
    if unknown:
        raise InputError(f"the new log has scenarios the twin does not know: {unknown}", "scenario")
    new_sha = data_sha256(new)
    if new_sha in parts_expected:
        raise InputError("the new log is already part of the twin's data", "new log")
    # rows repeated from the twin's data (same key and same values) are not new evidence
    old_all = pd.concat(old_parts, ignore_index=True)
    common = [c for c in new.columns if c in old_all.columns]
    dup = new[common].merge(old_all[common], how="inner", on=common)
    if len(dup):
        r = dup.iloc[0]
        raise InputError(
            f"the new log repeats {len(dup)} row(s) of the twin's data (first: episode {r['episode']}, t {r['t']}, "
            f"agent {r['agent']})",
            "new log",
        )
    # Episodes of different parts are different trajectories even when their ids coincide.
    renamed = [p.assign(episode=p["episode"].astype(str)) for p in old_parts[:1]]
    for sha, p in zip([*parts_expected[1:], new_sha], [*old_parts[1:], new], strict=True):
        renamed.append(p.assign(episode=sha[:8] + ":" + p["episode"].astype(str)))
    old_df = _sorted(pd.concat(renamed[:-1], ignore_index=True))
    new_df = renamed[-1]
    union = _sorted(pd.concat([old_df, new_df], ignore_index=True))

    old_eps = old_df["episode"].unique()
    new_eps = new_df["episode"].unique()
    union_eps = np.concatenate([old_eps, new_eps])  # a member's draws index into this, old then new
    parent_seed = int(twin.meta.get("seed", 0))
    members: list[Member] = []
    fit_stats: list[dict[str, float]] = []
    for m, parent in enumerate(twin.members):
        # the member's draw of the old episodes (as its parent drew them) + its own of the new ones
        if twin.n_members == 1:
            pick_old, pick_new = np.arange(len(old_eps)), np.arange(len(new_eps))
        else:
            pick_old = np.random.default_rng([parent_seed, m]).choice(len(old_eps), size=len(old_eps), replace=True)
            pick_new = np.random.default_rng([seed, 7919, m]).choice(len(new_eps), size=len(new_eps), replace=True)
        sub = pd.concat(
            [bootstrap_episodes(old_df, old_eps, pick_old),
             bootstrap_episodes(new_df, new_eps, pick_new).assign(episode=lambda d: "new:" + d["episode"].astype(str))],
            ignore_index=True,
        )  # fmt: skip
        steps = build_steps(_sorted(sub), layout)
        clients: dict[int, Any] = {}
        for s, c in parent.clients.items():
            rows = client_rows(steps, layout, s)
            if isinstance(c, CausalResponseModel):
                # refit (it is a few hundred Adam steps) with the rows' policy ids, so that the new
                # rows (a canary's randomized arms) inform the invariance, not only the regression;
                # the parent's invariance setting ("cv": chosen again by cross-fitting) is kept
                pol, days = steps.policy_ids(), steps.agent_days()
                clients[s] = copy.deepcopy(c).fit(
                    steps.x_client[rows], steps.y_client[rows], None if pol is None else pol[rows], groups=days[rows]
                )
                continue
            if not isinstance(c, ActorCriticPolicy):  # the supervised baseline: refit on the rows
                clients[s] = copy.deepcopy(c).fit(steps.x_client[rows], steps.y_client[rows])
                continue
            tuned = copy.deepcopy(c)  # warm start: the parent's weights
            if len(rows):
                fit_stats.append(behaviour_clone(
                    steps.x_client[rows], steps.y_client[rows], tuned, epochs=epochs,
                    seed=seed * 1000 + m * 10 + s, max_steps=max_steps,
                ))  # fmt: skip
            clients[s] = tuned
        member = Member(clients, parent.engines, parent.history, parent.transition, parent.site_model)
        # its output noise model on the union's episodes of its draws (as `Twin.fit` gives one)
        pick = np.concatenate([pick_old, len(old_eps) + pick_new])
        members.append(member.fit_output_noise(union, union_eps, pick, layout, seed * 1000 + m * 10 + 700))

    steps_all = build_steps(union, layout)
    z = np.concatenate([steps_all.x_engine, steps_all.za], axis=1)
    support = SupportIndex.fit(z, seed=seed, groups=steps_all.episode, n_action=steps_all.za.shape[1])
    composition = Composition.fit(union, layout)
    initial = InitialStates.fit(union, layout)
    a_low, a_high = _action_bounds(twin, union[layout.action].to_numpy(np.float64), spec)
    meta = dict(twin.meta)
    if "overlap" in meta:  # what the data now says about the actions' effects (the canary's arms add to it)
        meta["overlap"] = overlap_report(union, spec, seed=seed).to_dict()
    if meta.get("episode_hash_columns"):  # the new rows are training data too: the gate must see them
        meta["episode_sha256"] = {
            **dict(meta.get("episode_sha256") or {}),
            **episode_hashes(new_df, list(meta["episode_hash_columns"])),
        }
    meta.update({
        "data_sha256": data_sha256(union),
        "data_parts": [*parts_expected, new_sha],
        "n_rows": len(union),
        "n_episodes": int(union["episode"].nunique()),
        "versions": library_versions(),
        "parent": {"manifest_sha256": parent_manifest, "data_sha256": twin.meta.get("data_sha256"),
                   "seed": parent_seed},
        "update": {"seed": seed, "epochs": epochs, "max_steps": max_steps, "new_rows": len(new),
                   "new_episodes": len(new_eps), "new_data_sha256": new_sha,
                   "neglogp": float(np.mean([f["neglogp"] for f in fit_stats])) if fit_stats else None,
                   "seconds": time.perf_counter() - t0},
    })  # fmt: skip
    # the parent's class (`edgetwin.twin.twin.Twin`), which this module does not import: Twin.update calls it
    return type(twin)(layout, members, twin.population, composition, initial, support, a_low, a_high, meta)
