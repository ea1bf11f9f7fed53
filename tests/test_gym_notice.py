"""edgetwin's commands do not open with the old ``gym`` package's deprecation notice (SB3 imports gym,
installed for d3rlpy, only to convert old-gym environments, which edgetwin never passes it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gym") is None, reason="gym is not installed")


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr


def test_importing_sb3_after_edgetwin_prints_no_gym_notice() -> None:
    assert "Gym has been unmaintained" not in _stderr("import edgetwin, stable_baselines3")


def test_gym_imported_before_edgetwin_still_prints_its_notice() -> None:
    # the skip is edgetwin's, not the environment's: without edgetwin first, gym prints its notice
    assert "Gym has been unmaintained" in _stderr("import gym, edgetwin")
