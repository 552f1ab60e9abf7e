"""`fisk-sm tui` on the command line: `--help` (modes and keys) without Textual, a missing
extra in one line naming the install command (exit 2), and flags that do not go together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str, hide_textual: bool = False) -> subprocess.CompletedProcess[str]:
    """`fisk-sm ARGV` in a subprocess (Textual made unimportable with `hide_textual`); its
    stderr ends with the textual modules it loaded, as JSON."""
    code = (
        "import sys, json\n"
        + ("sys.modules['textual'] = None\n" if hide_textual else "")
        + "from fisk_sm.cli.main import main\n"
        + "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
        + "loaded = sorted(m for m in sys.modules if m.startswith('textual') and sys.modules[m])\n"
        + "print(json.dumps(loaded), file=sys.stderr)\nsys.exit(code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_help_names_the_modes_and_keys_and_loads_no_textual() -> None:
    done = cli("tui", "--help")
    assert done.returncode == 0, done.stderr
    for told in ("--chat", "--step", "--url", "s step", "o once, a always, n deny", "/reset"):
        assert told in done.stdout
    assert json.loads(done.stderr.splitlines()[-1]) == []


def test_a_missing_extra_is_one_line_naming_the_install_command(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\n")
    for argv in (("-c", str(agent), "hi"), ("--url", "http://127.0.0.1:9")):
        done = cli("tui", *argv, hide_textual=True)
        assert done.returncode == 2
        said = done.stderr.splitlines()[:-1]
        assert said == ["fisk-sm: tui needs the tui extra: pip install 'fisk-sm[tui]'"]
        assert "Traceback" not in done.stderr


def test_flags_that_do_not_go_together_are_one_line(tmp_path: Path) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text("llm: {model: m}\n")
    for argv, told in (
        (("--url", "http://127.0.0.1:9", "-c", str(agent)), "operating a supervisor takes no -c"),
        (("hi",), "-c agent.yaml is needed (or --url to operate a supervisor)"),
        (("-c", str(agent), "--token", "t"), "--token needs --url (or --operate)"),
        (("-c", str(agent), "--resume", "x", "hi"), "--resume continues a session"),
        (("-c", str(agent), "--name", "n"), "--name needs --checkpoint"),
    ):
        done = cli("tui", *argv)
        assert done.returncode == 2, (argv, done.stderr)
        (line,) = done.stderr.splitlines()[:-1]
        assert told in line and "Traceback" not in done.stderr
