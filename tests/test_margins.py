"""One KPI-margin type (issue 46): the gate, the canary plan, the loop and the runtime's watch share
`edgetwin.contract.margins.KPIMargin`; the old types are gone or are the same class."""

from __future__ import annotations

import math

import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin


def test_every_layer_uses_the_one_margin_type() -> None:
    import edgetwin.loop.plan as plan
    import edgetwin.loop.rounds as rounds
    from edgetwin.edge import kpi_watch
    from edgetwin.policies import gate

    assert kpi_watch.KPIMargin is KPIMargin and gate.Guard is KPIMargin
    assert not hasattr(plan, "PlanMargin") and not hasattr(rounds, "_ColumnGuard")
    assert all(isinstance(g, KPIMargin) for g in gate.parse_guards(["return=5%", "kpi.x=0.1:2"]))


def test_both_text_forms_and_the_direction() -> None:
    cost = KPIMargin.parse("kpi.slo_violation<=+10%")
    revenue = KPIMargin.parse("kpi.revenue>=-5%")
    assert (cost.better, cost.max_regression) == ("lower", pytest.approx(0.10))
    assert (revenue.better, revenue.max_regression) == ("higher", pytest.approx(0.05))
    rel = KPIMargin.parse_relative("kpi.revenue=5%:2")
    assert rel.with_direction("higher") == KPIMargin("kpi.revenue", 0.05, 2.0, True)
    assert revenue.breached(100.0, 94.0) and not revenue.breached(100.0, 96.0)
    assert cost.allowed_change(-50.0) == pytest.approx(0.10) and math.isinf(KPIMargin("z", 0.1, 1.0).allowed_change(0.0))
    for bad in ("kpi.x", "kpi.x=-1", "=0.1"):
        with pytest.raises(InputError, match="--max-regression"):
            KPIMargin.parse_relative(bad)
    with pytest.raises(InputError):
        KPIMargin("kpi.x", float("nan"))
    # the edge's former field order (kpi, higher_is_better, max_regression) is refused, not read as a 100 % margin
    with pytest.raises(InputError, match="by keyword"):
        KPIMargin("kpi.x", True, 0.1, 0.0)  # type: ignore[arg-type]
