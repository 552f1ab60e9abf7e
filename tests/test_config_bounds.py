"""Reading an agent.yaml costs little whatever the file holds (`fisk_sm.config.yamlfile`).

A 478-byte YAML alias bomb, 100,000 nested brackets, a 2 MB file, a FIFO, a symlink where none
may be, an integer of 5,000 digits: each is one `ConfigError` line naming the file, raised
without expanding, recursing or blocking. `show()` (the value quoted in an error) does bounded
work on any value. `fisk-sm supervise -c deep.yaml` exits 2 with one line, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fisk_sm.config.agent import load_config
from fisk_sm.config.errors import ConfigError, show

CLI = [sys.executable, "-m", "fisk_sm.cli"]
VALID = "llm: {model: m}\n"


def alias_bomb() -> str:
    """478 bytes of YAML whose tree, expanded, has 9**10 leaves."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, 10):
        lines.append(f"a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def refusal(path: Path, **kwargs: bool) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def test_an_alias_bomb_is_refused_unexpanded(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert len(bomb.read_bytes()) < 500
    message = refusal(bomb)
    assert message == f"{bomb}: (yaml): YAML aliases are not allowed (line 2, column 10)"
    anchored = tmp_path / "anchor.yaml"  # an anchor alone expands nothing
    anchored.write_text("llm: &l {model: m}\n")
    assert load_config(anchored).llm.model == "m"


def test_show_is_bounded_on_an_expanded_alias_tree() -> None:
    tree = yaml.safe_load(alias_bomb())  # shared lists: small in memory, 9**10 leaves walked
    assert len(show(tree)) <= 60
    assert len(show(tree["a9"])) <= 60
    assert show(10**5000) == "<int too long to show>"
    assert show("x" * 10**6) == "'" + "x" * 56 + "..."
    assert show({"a": 1}) == "{'a': 1}"


def test_deep_nesting_is_refused_before_the_stack_runs_out(tmp_path: Path) -> None:
    for text in ("[" * 100_000, "a:\n" + "".join(" " * n + "- \n" for n in range(1, 200))):
        deep = tmp_path / "deep.yaml"
        deep.write_text(text)
        message = refusal(deep)
        assert message.startswith(f"{deep}: (yaml): nested deeper than 64 levels"), message
    shallow = tmp_path / "shallow.yaml"
    shallow.write_text("llm: {model: m}\nx: " + "[" * 60 + "]" * 60 + "\n")
    assert "x" in refusal(shallow)  # past the reader: an unknown key, named


def test_a_config_over_1_mib_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(VALID + ("# padding\n" * 200_000))  # 2 MB of comments: valid YAML
    assert refusal(big) == f"{big}: (file): larger than 1 MiB"


def test_only_a_regular_file_is_read_and_a_symlink_only_when_followed(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: an open without O_NONBLOCK would wait forever
    assert refusal(fifo) == f"{fifo}: (file): not a regular file"
    assert refusal(fifo, follow=False) == f"{fifo}: (file): not a regular file"
    real = tmp_path / "real.yaml"
    real.write_text(VALID)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert load_config(link).llm.model == "m"  # the command line may name a symlink
    assert refusal(link, follow=False).startswith(f"{link}: (file): ")


def test_an_integer_too_long_is_a_config_error(tmp_path: Path) -> None:
    long = tmp_path / "long.yaml"
    long.write_text("llm: {model: m, max_tokens: " + "1" * 5000 + "}\n")
    assert refusal(long).startswith(f"{long}: (yaml): invalid value: ")


def test_supervise_with_a_deep_config_exits_2_with_one_line(tmp_path: Path) -> None:
    for name, text in (("deep.yaml", "[" * 100_000), ("bomb.yaml", alias_bomb())):
        config = tmp_path / name
        config.write_text(text)
        argv = [*CLI, "supervise", "-c", str(config), "--listen", "127.0.0.1:0"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and str(config) in lines[0], done.stderr
        assert "Traceback" not in done.stderr
