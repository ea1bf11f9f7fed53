"""docs/federation.md's defaults and its privacy unit, checked against the code that keeps them.

Each test reads the page's number and checks the default where a user meets it (the CLI, the
library's signature, `FitOptions`, Gaussian DP) and, for `min_agents`, the behaviour: Kish's
effective number of agents, and a scenario over fewer agents than the default left out.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer.main

from edgetwin.cli import app
from edgetwin.federation.aggregation.privacy import GaussianDP
from edgetwin.federation.twin.agents import effective_agents, released_rows
from edgetwin.federation.twin.plan import MIN_AGENTS, FitOptions
from edgetwin.federation.twin.runner import fit_federated_async
from edgetwin.federation.twin.site import SiteFitter

DOC = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[1] / "docs" / "federation.md").read_text())


def _cli_default(command: str, flag: str) -> object:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return next(p for p in cmd.params if flag in p.opts).default


def test_min_agents_is_the_pages_default_everywhere_a_user_sets_it() -> None:
    stated = int(re.search(r"A site's privacy setting `min_agents` \(default (\d+);", DOC).group(1))  # type: ignore[union-attr]
    assert "`edgetwin fit-federated --min-agents N`, `edgetwin agent --fit-twin LOG --min-agents N`" in DOC
    assert stated == MIN_AGENTS
    assert _cli_default("fit-federated", "--min-agents") == stated
    assert _cli_default("agent", "--min-agents") == stated
    assert inspect.signature(fit_federated_async).parameters["min_agents"].default == stated
    assert inspect.signature(SiteFitter).parameters["min_agents"].default == stated


def test_min_agents_counts_kishs_effective_agents() -> None:
    """"one agent's 96 near-identical ticks count as one agent, not 96 rows", and a scenario over
    fewer than the default's agents is left out of every statistic."""
    assert "one agent's 96 near-identical ticks count as one agent, not 96 rows" in DOC
    assert effective_agents(np.array([96.0])) == pytest.approx(1.0)
    assert effective_agents(np.ones(MIN_AGENTS)) == pytest.approx(MIN_AGENTS)
    rows = [{"episode": 0, "t": t, "agent": f"{s}{a}", "scenario": s} for s, n in (("web", MIN_AGENTS), ("iot", MIN_AGENTS - 1))
            for a in range(n) for t in range(4)]  # fmt: skip
    kept, withheld = released_rows(pd.DataFrame(rows), MIN_AGENTS)
    assert withheld == ["iot"] and set(kept["scenario"]) == {"web"}
    # Kish's number, not the count of distinct agents: 10 agents, one of them with 100 episodes, count ~1.2
    assert "Kish's effective number" in DOC
    assert effective_agents(np.array([100.0] + [1.0] * 9)) == pytest.approx(109**2 / 10_009)
    skewed = [{"episode": e, "t": 0, "agent": f"a{a}", "scenario": "web"} for a in range(MIN_AGENTS)
              for e in range(100 if a == 0 else 1)]  # fmt: skip
    assert released_rows(pd.DataFrame(skewed), MIN_AGENTS)[1] == ["web"]


def test_the_fits_schedule_defaults_are_the_pages() -> None:
    opts = FitOptions()
    assert "(5 per round by default" in DOC and opts.local_steps == 5
    assert "`causal_steps` = 600 by default" in DOC and opts.causal_steps == 600
    assert "On the default schedule of 240 rounds" in DOC and opts.rounds == 240
    assert "the default 64 x 64 nets" in DOC and list(opts.net_arch) == [64, 64]
    assert '`FitOptions.response_model = "mail"`, `population_model = "gan-smmsg"`' in DOC
    assert (opts.response_model, opts.population_model) == ("mail", "gan-smmsg")
    assert _cli_default("fit-federated", "--response-model") == "auto"


def test_gaussian_dp_defaults_are_the_pages() -> None:
    z, c = re.search(r"DP at its defaults \(noise multiplier ([\d.]+), clip ([\d.]+)\)", DOC).groups()  # type: ignore[union-attr]
    params = inspect.signature(GaussianDP).parameters
    assert params["noise_multiplier"].default == pytest.approx(float(z))
    assert params["clip_norm"].default == pytest.approx(float(c))


def test_the_rounds_paragraphs_schedules_are_the_fits() -> None:
    """"**Rounds: many short ones, optimiser kept** (`FitOptions.rounds = 240`, `local_steps = 5`,
    `keep_optimizer = True`)"; under `dp_gaussian` "8 rounds of 2 whole epochs" unless `--fed-rounds`;
    `FitOptions.light()` is behaviour-cloned responses and the mixture population."""
    opts = FitOptions()
    assert "(`FitOptions.rounds = 240`, `local_steps = 5`, `keep_optimizer = True`)" in DOC
    assert (opts.rounds, opts.local_steps, opts.keep_optimizer) == (240, 5, True)
    rounds, epochs = (int(v) for v in re.search(r"(\d+) rounds of (\d+) whole epochs", DOC).groups())  # type: ignore[union-attr]
    dp = FitOptions.for_strategy("dp_gaussian")
    assert (dp.rounds, dp.local_epochs, dp.local_steps) == (rounds, epochs, 0)
    assert FitOptions.for_strategy("dp_gaussian", rounds=30).rounds == 30  # --fed-rounds wins
    assert FitOptions.for_strategy("fedavg").rounds == 240
    light = FitOptions.light()
    assert (light.response_model, light.population_model) == ("bc", "gmm")
