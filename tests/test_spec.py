"""TwinSpec: TOML round trip, views, named callables, and bad specs as InputError naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import resolve_spec
from edgetwin.contract.spec import Feature, TwinSpec, role_of, spec_path_for


@pytest.fixture(autouse=True)
def _allow_spec_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specs here name functions of these modules: allowed, as a user would (docs/log-format.md)."""
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "numpy,no_such_module_xyz")

EXAMPLE = """
name = "toy-queue"
step_seconds = 60.0
scenarios = ["web", "batch"]

[[features]]
name = "profile.arrival_rate"
kind = "heavy_tailed"
low = 0.0
unit = "req/s"

[[features]]
name = "profile.tier"
kind = "discrete"
values = [1, 2, 3]

[[features]]
name = "state.queue_len"
low = 0
high = 100

[[features]]
name = "action.cpu_share"
low = 0.0
high = 1.0

[[features]]
name = "action.admit"
kind = "binary"

[[features]]
name = "response.offload"
low = 0.0
high = 1.0

[[features]]
name = "kpi.latency_ms"
low = 0.0

[transition]
function = "numpy:add"

[reward]
weights = { "kpi.latency_ms" = -0.01, "response.offload" = 1.0 }
"""


@pytest.fixture
def example(tmp_path: Path) -> Path:
    path = tmp_path / "toy.spec.toml"
    path.write_text(EXAMPLE)
    return path


def test_load_reads_every_key(example: Path) -> None:
    spec = TwinSpec.load(example)
    assert spec.name == "toy-queue" and spec.step_seconds == 60.0
    assert spec.scenarios == ("web", "batch")
    assert spec.transition == "numpy:add"
    assert dict(spec.reward_weights) == {"kpi.latency_ms": -0.01, "response.offload": 1.0}
    tier = spec.feature("profile.tier")
    assert (tier.kind, tier.values, tier.role, tier.short, tier.is_discrete) == (
        "discrete",
        (1.0, 2.0, 3.0),
        "profile",
        "tier",
        True,
    )
    assert spec.feature("profile.arrival_rate").unit == "req/s"
    assert spec.feature("action.admit").allowed_values() == (0.0, 1.0)
    assert spec.feature("state.queue_len").kind == "continuous"  # the default kind


def test_round_trip_save_load(example: Path, tmp_path: Path) -> None:
    spec = TwinSpec.load(example)
    again = TwinSpec.load(spec.save(tmp_path / "again.spec.toml"))
    assert again == spec
    assert again.hash() == spec.hash() and len(spec.hash()) == 16
    assert TwinSpec.from_dict(spec.to_dict()) == spec
    changed = TwinSpec.from_dict({**spec.to_dict(), "name": "other"})
    assert changed.hash() != spec.hash()


def test_views_follow_spec_order(example: Path) -> None:
    spec = TwinSpec.load(example)
    assert spec.observation_columns == ["profile.arrival_rate", "profile.tier", "state.queue_len"]
    assert spec.action_columns == ["action.cpu_share", "action.admit"]
    low, high = spec.bounds("action")
    np.testing.assert_array_equal(low, [0.0, -np.inf])
    np.testing.assert_array_equal(high, [1.0, np.inf])
    with pytest.raises(KeyError):
        spec.feature("state.nope")


def test_named_callables(example: Path) -> None:
    spec = TwinSpec.load(example)
    assert spec.transition_fn() is np.add
    reward = spec.reward_fn()
    r = reward({"kpi.latency_ms": np.array([100.0, 0.0]), "response.offload": np.array([0.5, 1.0])})
    np.testing.assert_allclose(r, [-0.5, 1.0])
    fn_spec = TwinSpec(features=spec.features, reward_function="numpy:sum")
    assert fn_spec.reward_fn() is np.sum
    bad = TwinSpec(features=spec.features, transition="no_such_module_xyz:f")
    with pytest.raises(InputError, match="cannot be imported"):
        bad.transition_fn()
    with pytest.raises(InputError, match="module:function"):
        TwinSpec(features=spec.features, transition="numpy.add").transition_fn()


def test_infer_and_conventions(tmp_path: Path) -> None:
    cols = ["episode", "t", "agent", "scenario", "site", "profile.a", "action.b", "kpi.c", "reward", "note"]
    spec = TwinSpec.infer(cols, name="x")
    assert [f.name for f in spec.features] == ["profile.a", "action.b", "kpi.c"]
    assert all(f.kind == "continuous" and f.low is None and f.high is None for f in spec.features)
    assert [role_of(c) for c in ("profile.a", "reward", "foo.bar", "state.")] == ["profile", None, None, None]
    assert spec_path_for("/data/day1.parquet") == Path("/data/day1.spec.toml")
    assert spec_path_for("logs.csv.gz") == Path("logs.spec.toml")
    # resolve_spec: the given one, else LOG.spec.toml beside the log, else inferred.
    log = tmp_path / "day1.csv"
    assert resolve_spec(log, None, cols).name == "day1"
    TwinSpec(features=(Feature("action.b", low=0.0),), name="beside").save(spec_path_for(log))
    assert resolve_spec(log, None, cols).name == "beside"


BAD_SPECS = [
    ("not toml", "name = = 3", "not valid TOML"),
    ("no features", 'name = "x"', r"no \[\[features\]\] table"),
    ("feature without name", "[[features]]\nkind = 'continuous'", "entry 1 has no 'name'"),
    ("unknown key", "[[features]]\nname = 'action.a'\nlow = 0\nmax = 3", r"unknown keys \['max'\]"),
    ("bad prefix", "[[features]]\nname = 'actions.a'", "must start with one of"),
    ("unknown kind", "[[features]]\nname = 'action.a'\nkind = 'gaussian'", "kind 'gaussian' is not one of"),
    ("discrete without values", "[[features]]\nname = 'action.a'\nkind = 'discrete'", "needs 'values'"),
    ("low above high", "[[features]]\nname = 'action.a'\nlow = 2\nhigh = 1", "low 2.0 > high 1.0"),
    ("twice", "[[features]]\nname = 'action.a'\n[[features]]\nname = 'action.a'", "listed twice"),
    ("no action", "[[features]]\nname = 'state.a'", r"at least one action\.\* feature"),
    (
        "weight on a non-feature",
        "[[features]]\nname = 'action.a'\n[reward]\nweights = { 'kpi.x' = 1.0 }",
        "not a feature",
    ),
    (
        "weights and function",
        "[[features]]\nname = 'action.a'\n[reward]\nfunction = 'm:f'\nweights = { 'action.a' = 1.0 }",
        "either 'weights' or 'function'",
    ),
]


@pytest.mark.parametrize(("case", "text", "match"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_spec_is_an_input_error_naming_the_file(tmp_path: Path, case: str, text: str, match: str) -> None:
    path = tmp_path / "bad.spec.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=match) as err:
        TwinSpec.load(path)
    assert err.value.where == str(path)
    assert str(err.value).startswith(f"{path}: ")


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="spec file not found") as err:
        TwinSpec.load(tmp_path / "nope.spec.toml")
    assert err.value.where == str(tmp_path / "nope.spec.toml")


# Values of the wrong TOML type reach float()/dict.get() in TwinSpec.from_dict and escape as a
# ValueError/TypeError/AttributeError without the file's name (edgetwin/contract/spec.py is not this
# suite's to change; the fix is reported to the lead). strict: these start passing once it is fixed.
WRONG_TYPES = [
    ("low is text", "[[features]]\nname = 'action.a'\nlow = 'abc'"),
    ("value is text", "[[features]]\nname = 'action.a'\nkind = 'discrete'\nvalues = ['x']"),
    ("step_seconds is text", "step_seconds = 'fast'\n[[features]]\nname = 'action.a'"),
    ("features not tables", "features = [1, 2]"),
    ("reward not a table", "reward = 3\n[[features]]\nname = 'action.a'"),
    ("transition function not text", "[transition]\nfunction = 5\n[[features]]\nname = 'action.a'"),
]


@pytest.mark.parametrize(("case", "text"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_wrongly_typed_values_are_input_errors(tmp_path: Path, case: str, text: str) -> None:
    path = tmp_path / "bad.spec.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        TwinSpec.load(path)
    assert err.value.where == str(path)
