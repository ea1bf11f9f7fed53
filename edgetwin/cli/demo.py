"""``edgetwin demo``: the main job on the embedded defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgetwin.cli.common import (
    JsonOpt,
    SeedOpt,
    app,
    console,
    emit_json,
    out,
    out_dir_arg,
)


@app.command("demo")
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for everything the demo writes.")] = Path(
        "edgetwin-demo"
    ),
    agents: Annotated[int, typer.Option(min=10, help="Service groups in the emulated cluster.")] = 100,
    episodes: Annotated[int, typer.Option(min=2, help="Episodes (days) of logs to learn from.")] = 3,
    steps: Annotated[int, typer.Option(min=8, help="Steps per episode.")] = 96,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """The main job on the embedded defaults: emulated cluster -> logs -> twin -> policy -> what-if report."""
    import torch
    from threadpoolctl import threadpool_limits

    from edgetwin.demo import run_demo

    out_dir_arg(out_dir)
    # one thread for torch and for the native pools (BLAS, scikit-learn's OpenMP): the demo's networks
    # are small (64 units), and on a shared 2-core machine a second thread spin-waits for the first
    # (20 GAN-SMMSG steps at load 12: 27 s with torch's default 2 threads, 4.5-6.2 s with one)
    torch.set_num_threads(1)
    with threadpool_limits(1):
        result = run_demo(out_dir, seed=seed, agents=agents, episodes=episodes, steps=steps, log=console.print)
    if as_json:
        emit_json(result.to_dict())
        return
    for name, path in result.artifacts.items():
        out.print(f"{name:>16}: {path}")
    n = result.numbers
    if "cluster_offload_trained" in n:
        out.print(
            f"on the emulated cluster (episodes the twin never saw): offload ratio {n['cluster_offload_trained']:.3f} "
            f"with the twin-trained policy vs {n['cluster_offload_random']:.3f} with the random logging policy "
            f"({100 * n['offload_improvement_over_random']:+.1f} %)"
        )
    if n.get("cluster_change"):
        from edgetwin.demo import trade_off_line

        out.print(f"the trade-off on the cluster (vs the logging policy, 90 % paired intervals in the summary): "
                  f"{trade_off_line(n['cluster_change'])}")  # fmt: skip
    if n.get("promoted_version"):
        out.print(f"promoted {n['promoted_version']}; the edge runtime served {n['served_decisions']:,} decisions")
    elif "gate_refused" in n:
        out.print(f"the promotion gate refused the policy: {n['gate_refused']}")
    for key, word in (("cluster_refused", "refused"), ("cluster_undecided", "undecided")):
        if key in n:
            out.print(f"not promoted ({word} on the cluster's own evidence): {n[key]}; "
                      f"the twin's gate alone said {n['twin_gate']['verdict']}")  # fmt: skip
    if "whatif_report" in result.artifacts:
        out.print(f"what-if report: {result.artifacts['whatif_report']}")
    out.print(f"summary written to {result.artifacts['summary']}")


