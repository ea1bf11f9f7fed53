"""Allowing a module allows the functions it defines, nothing reachable through it (issue 45, item 1).

A user allows only their own module (``--allow-code mymod``). A spec that names
``mymod:subprocess.getoutput``, ``mymod:os.system``, ``mymod:__builtins__.get`` or a function
``mymod`` merely imports must be refused before anything is called: with a feature name such as
``profile.z;touch X;true``, ``subprocess.getoutput`` would hand it to a shell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.functions import allow_code, resolve_function_ref

MOD = "edgetwin_allowlist_probe"


@pytest.fixture
def mymod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{MOD}.py").write_text(
        "import os\nimport subprocess\nfrom subprocess import getoutput\n"
        "def next_load(columns, site):\n    return columns\n"
        "class Rules:\n    @staticmethod\n    def reward(columns):\n        return 0.0\n"
        "def _private(columns):\n    return columns\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "")
    monkeypatch.setenv("EDGETWIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delitem(sys.modules, MOD, raising=False)
    allow_code([MOD])
    return MOD


@pytest.mark.parametrize(
    "attr, says",
    [
        ("subprocess.getoutput", "goes through the module 'subprocess'"),
        ("os.system", "goes through the module 'os'"),
        ("__builtins__.get", "not a public name"),
        ("getoutput", "defined in 'subprocess'"),
        ("_private", "not a public name"),
        ("os", "names a module"),
    ],
)
def test_what_an_allowed_module_merely_reaches_is_refused(mymod: str, attr: str, says: str, tmp_path: Path) -> None:
    marker = tmp_path / "X"
    with pytest.raises(InputError) as e:
        fn = resolve_function_ref(f"{mymod}:{attr}", spec_path="spec.toml", entry="[[dynamics]] function")
        fn(f"profile.z;touch {marker};true")  # what `logs validate` would do with the resolved callable
    assert says in str(e.value) and e.value.where == "spec.toml"
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_what_an_allowed_module_defines_is_allowed(mymod: str) -> None:
    assert resolve_function_ref(f"{mymod}:next_load")({"a": 1}, "s") == {"a": 1}
    assert resolve_function_ref(f"{mymod}:Rules.reward")({}) == 0.0
