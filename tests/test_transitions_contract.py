"""The evaluator's speed subclasses keep to `transitions`, in every release pyproject.toml allows.

`fisk_sm.machine.contract` checks that what its speed subclasses (`_State`, `_Condition`,
`_Transition`, `_Event`, `_Machine`) override exists in transitions' base classes with the same
signature, that the base methods the evaluator calls (the public `Event.trigger` among them)
keep theirs, and that a machine built from the table steps. Here it runs against the installed
`transitions`, and then against each allowed release's wheel, imported from the wheel file
(zipimport) in a subprocess. `make test` fills the wheel cache (tests/transitionskit.py); an
allowed release without a cached wheel fails here, so
that a new release is tested before a run meets it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transitions
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transitionskit import CACHE, ROOT, allowed, released, wheel

from fisk_sm.machine import contract, evaluator


def allowed_versions() -> list[str]:
    """The releases to check: those the index listed when the cache was filled, plus the
    installed one, within the range pyproject.toml gives."""
    spec = allowed()
    versions = {*released(), transitions.__version__}
    return sorted((v for v in versions if Version(v) in spec), key=Version)


def run_contract(path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m fisk_sm.machine.contract` with `path` (a wheel or a directory) importable
    before anything installed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "fisk_sm.machine.contract"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_the_range_is_read_from_pyproject(tmp_path: Path) -> None:
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\ndependencies = ["attrs>=23", "transitions>=0.8,!=0.8.5,<0.9"]\n')
    assert allowed(other) == SpecifierSet(">=0.8,!=0.8.5,<0.9")
    assert transitions.__version__ in allowed()  # the installed release is one it allows


def test_the_installed_transitions_keeps_the_contract() -> None:
    assert contract.problems() == []


def test_the_wheel_cache_was_filled() -> None:
    assert released(), f"no {CACHE}/released.txt: run `make test`, or tests/transitionskit.py"


@pytest.mark.parametrize("version", allowed_versions())
def test_each_allowed_release_keeps_the_contract(version: str) -> None:
    found = wheel(version)
    assert found is not None, (
        f"transitions {version} is allowed by pyproject.toml but has no wheel in {CACHE}: "
        "run `.venv/bin/python tests/transitionskit.py` (make test does)"
    )
    done = run_contract(found)
    assert done.returncode == 0, done.stdout + done.stderr
    # the wheel's transitions was the one checked, not the installed one
    assert done.stdout.startswith(f"transitions {version} {found}{os.sep}transitions"), done.stdout
    assert "\nok: " in done.stdout


def test_an_override_with_another_signature_is_reported() -> None:
    class Drifted(evaluator._State):  # type: ignore[misc]
        def enter(self, event_data: object, extra: object = None) -> None:
            pass

        def on_nothing(self) -> None:
            pass

    found = contract._override_problems(Drifted, transitions.State)
    assert len(found) == 2, found
    assert found[0] == (
        "Drifted (over transitions.State).enter(self, event_data, extra=None): "
        "transitions has enter(self, event_data)"
    )
    assert "transitions.State has no on_nothing" in found[1]


@pytest.mark.parametrize(
    ("line", "drifted", "reported"),
    [
        (  # Event.trigger without keywords: the evaluator's call is no longer the base's
            "    def trigger(self, model, *args, **kwargs):",
            "    def trigger(self, model, *args):\n        kwargs = {}",
            [
                "BROKEN transitions.Event.trigger(self, model, *args): the evaluator calls "
                "trigger(self, model, *args, **kwargs)"
            ],
        ),
        (  # a private method _Event._trigger calls, renamed: missing, and a fire fails
            "    def _is_valid_source(self, state):",
            "    def _is_source(self, state):",
            [
                "BROKEN transitions.Event._is_valid_source: missing",
                "BROKEN a machine built from the table does not step: AttributeError: ",
            ],
        ),
        (  # a private method _Transition overrides, renamed: the override overrides nothing
            "    def _change_state(self, event_data):",
            "    def _set_state(self, event_data):",
            [
                "BROKEN _Transition (over transitions.Transition)._change_state: "
                "transitions.Transition has no _change_state",
            ],
        ),
    ],
    ids=["trigger-without-keywords", "valid-source-renamed", "change-state-renamed"],
)
def test_a_drifted_release_fails_its_check(
    tmp_path: Path, line: str, drifted: str, reported: list[str]
) -> None:
    # a fake release: the installed package's source with one line changed
    fake = tmp_path / "transitions"
    shutil.copytree(Path(transitions.__file__).parent, fake)
    core = fake / "core.py"
    source = core.read_text()
    assert source.count(line) == 1
    core.write_text(source.replace(line, drifted))
    done = run_contract(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""  # findings, not a traceback
    assert done.stdout.startswith(f"transitions {transitions.__version__} {fake}"), done.stdout
    for text in reported:
        assert text in done.stdout
