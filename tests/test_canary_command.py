"""The canary command interface (edgetwin.edge.canary_command): signed, verified, round-tripped."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary_command import (
    CanaryStart,
    CanaryStatus,
    CanaryStop,
    CommandRefused,
    command_subject,
    outcome_envelope,
    outcome_rows,
    outcome_subject,
    sign_start,
    sign_stop,
    status_reply,
    status_subject,
    verify_command,
)
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.edge.messages import decode, encode
from edgetwin.edge.signing import Signer, TrustStore


def _start(**kw: object) -> CanaryStart:
    base = dict(run="run1", candidate="v2", sha256="ab" * 32, slice=CanarySlice(sites=("s1",)), hours=2.0,
                margins=(KPIMargin("kpi.slo"),), current="v1")
    base.update(kw)
    return CanaryStart(**base)  # type: ignore[arg-type]


def test_signed_start_and_stop_round_trip_through_the_frame() -> None:
    key = Signer.generate()
    trust = TrustStore([key.public_key])
    cmd = _start()
    assert verify_command(decode(encode(sign_start(cmd, key))), trust) == cmd
    stop = CanaryStop("run1")
    assert verify_command(decode(encode(sign_stop(stop, key))), trust) == stop
    assert cmd.config().canary_id == "run1"


def test_tampered_unsigned_and_untrusted_commands_are_refused_with_their_reason() -> None:
    key = Signer.generate()
    trust = TrustStore([key.public_key])
    env = decode(encode(sign_start(_start(), key)))
    env.payload["sha256"] = "cd" * 32  # another artifact under the same signature
    with pytest.raises(CommandRefused) as e:
        verify_command(env, trust)
    assert e.value.reason == "bad_signature"
    with pytest.raises(CommandRefused) as e:
        verify_command(decode(encode(sign_start(_start(), Signer.generate()))), trust)
    assert e.value.reason == "untrusted_key"
    env = decode(encode(sign_start(_start(), key)))
    del env.payload["sig"]
    with pytest.raises(CommandRefused) as e:
        verify_command(env, trust)
    assert e.value.reason == "unsigned"


def test_a_start_that_does_not_make_a_canary_is_refused_at_the_sender() -> None:
    with pytest.raises(InputError):
        _start(sha256="nothex")
    with pytest.raises(InputError):
        _start(margins=())
    with pytest.raises(InputError):
        _start(run="a.b")


def test_subjects_status_and_outcome_messages() -> None:
    assert command_subject() == "edgetwin.canary.command"
    assert status_subject("s1") == "edgetwin.status.canary.s1"  # not in the JetStream stream's subjects
    assert outcome_subject("s1") == "edgetwin.canary.outcome.s1"
    st = CanaryStatus("s1", run="run1", phase="running", arms={"candidate": 3}, guard={"kpi.slo": {"lower": float("nan")}})
    got = CanaryStatus.from_dict(decode(encode(status_reply(st, "runtime/s1"))).payload)
    assert got.arms == {"candidate": 3} and got.guard == {"kpi.slo": {"lower": None}}
    assert dataclasses.replace(got, guard={}) == dataclasses.replace(st, guard={})
    rows = pd.DataFrame({"agent": ["a", "b"], "kpi.slo": [0.1, 0.2]})
    back = outcome_rows(decode(encode(outcome_envelope("s1", 7, rows, "system/s1"))))
    assert back["t"].tolist() == [7, 7] and back["kpi.slo"].tolist() == [0.1, 0.2]
