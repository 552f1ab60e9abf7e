"""File-backed agent memory: key rules, bytes on disk, limits, symlinks, racing creators, tools."""

from __future__ import annotations

import functools
import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fisk_sm.tools.base import Outcome, ToolBox
from fisk_sm.tools.memory import (
    MAX_ENTRIES,
    MEMORY_NOTE,
    MemoryEntry,
    MemoryFileError,
    MemoryFullError,
    MemoryKeyError,
    MemoryLimitError,
    MemoryStore,
    check_key,
    default_memory_directory,
    memory_index,
)
from fisk_sm.tools.memory_tools import memory_tools


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def _call(store: MemoryStore, name: str, **arguments: Any) -> Outcome:
    box = ToolBox.of(memory_tools(store))
    assert box.rejection(name, arguments) is None
    return await box.invoke(name, arguments)


async def _result(store: MemoryStore, name: str, **arguments: Any) -> Any:
    outcome = await _call(store, name, **arguments)
    assert not outcome.is_error, outcome.content
    return json.loads(outcome.content)


@pytest.mark.parametrize("key", ["a", "user.name", "A-b_c=d.9", "x" * 200, "a.b.c", "=", "-"])
def test_good_keys_pass(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "letters, digits"),
        ("a/b", "letters, digits"),
        ("../etc", "letters, digits"),
        ("a b", "letters, digits"),
        ("ünï", "letters, digits"),
        ("x" * 201, "201 characters"),
        (".hidden", "start or end with '.'"),
        ("trailing.", "start or end with '.'"),
        ("a..b", "'..'"),
    ],
)
def test_bad_keys_are_refused_with_a_message_naming_the_key(key: str, problem: str) -> None:
    with pytest.raises(MemoryKeyError) as caught:
        check_key(key)
    assert problem in str(caught.value)
    assert repr(key[:220]) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_store_methods_check_the_key(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m")
    for call in (
        lambda: store.read("../x"),
        lambda: store.create("a..b", "d", "c"),
        lambda: store.overwrite(".x", "d", "c"),
        lambda: store.delete("a/b"),
    ):
        with pytest.raises(MemoryKeyError):
            call()
    assert not (tmp_path / "m").exists()


async def test_write_creates_the_file_with_exact_frontmatter_and_private_modes(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "state" / "memory" / "agent"
    store = MemoryStore(directory)
    result = await _result(
        store, "memory_write", key="user.name", description="The user's name", content="Ada\n"
    )
    assert result == {"written": True}
    path = directory / "user.name.md"
    assert path.read_bytes() == b"---\ndescription: The user's name\n---\n\nAda\n"
    assert _mode(path) == 0o600
    assert _mode(directory) == 0o700
    assert _names(directory) == ["user.name.md"]  # no temp left over
    assert store.read("user.name") == MemoryEntry("user.name", "The user's name", "Ada\n")


def test_parse_is_tolerant_of_a_missing_trailing_newline_and_skips_bad_files(
    tmp_path: Path,
) -> None:
    store = MemoryStore(tmp_path)
    (tmp_path / "empty.md").write_bytes(b"---\ndescription: nothing yet\n---")
    (tmp_path / "bare.md").write_bytes(b"---\ndescription: no blank line\n---\n")
    (tmp_path / "broken.md").write_bytes(b"description: no fences\n\ntext")
    (tmp_path / "notes.txt").write_bytes(b"---\ndescription: not md\n---\n\nx")
    (tmp_path / ".k.0123.tmp").write_bytes(b"---\ndescription: temp\n---\n\nx")
    (tmp_path / "a..b.md").write_bytes(b"---\ndescription: bad key\n---\n\nx")
    assert store.read("empty") == MemoryEntry("empty", "nothing yet", "")
    assert store.read("bare") == MemoryEntry("bare", "no blank line", "")
    assert store.list() == [("bare", "no blank line"), ("empty", "nothing yet")]
    with pytest.raises(MemoryFileError, match=r"broken\.md"):
        store.read("broken")


def test_content_round_trips_byte_for_byte(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    content = "\n\n---\ndescription: fake\n---\n\nlines\r\n ünïcode \n\n"
    assert store.create("k", "d", content)
    assert store.read("k") == MemoryEntry("k", "d", content)


async def test_a_duplicate_key_is_refused_naming_the_stored_description(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    await _result(store, "memory_write", key="editor", description="Prefers vim", content="vim")
    result = await _result(
        store, "memory_write", key="editor", description="Prefers emacs", content="emacs"
    )
    assert result == {
        "written": False,
        "reason": "a memory with key 'editor' already exists (Prefers vim); read it, then write"
        " again with overwrite=true to replace it",
    }
    assert store.read("editor") == MemoryEntry("editor", "Prefers vim", "vim")
    result = await _result(
        store,
        "memory_write",
        key="editor",
        description="Prefers emacs",
        content="emacs",
        overwrite=True,
    )
    assert result == {"written": True}
    assert store.read("editor") == MemoryEntry("editor", "Prefers emacs", "emacs")
    assert _mode(tmp_path / "editor.md") == 0o600


async def test_read_list_and_delete_through_the_tools(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m")
    assert await _result(store, "memory_list") == {"memories": []}
    assert await _result(store, "memory_read", key="nope") == {
        "found": False,
        "reason": "no memory is stored under key 'nope'",
    }
    for key in ("zeta", "alpha", "Mid", "beta.1"):
        await _result(store, "memory_write", key=key, description=f"about {key}", content=key)
    assert await _result(store, "memory_list") == {
        "memories": [
            {"key": k, "description": f"about {k}"} for k in ("Mid", "alpha", "beta.1", "zeta")
        ]
    }
    assert await _result(store, "memory_read", key="alpha") == {
        "found": True,
        "key": "alpha",
        "description": "about alpha",
        "content": "alpha",
    }
    assert await _result(store, "memory_delete", key="alpha") == {"deleted": True}
    assert await _result(store, "memory_delete", key="alpha") == {"deleted": False}
    assert not (tmp_path / "m" / "alpha.md").exists()
    assert [k for k, _ in store.list()] == ["Mid", "beta.1", "zeta"]


def test_delete_is_idempotent_and_a_missing_directory_is_empty(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "never")
    assert store.list() == []
    assert store.read("x") is None
    assert store.delete("x") is False
    assert store.create("x", "d", "c")
    assert store.delete("x") is True
    assert store.delete("x") is False


async def test_content_limit_is_65536_utf8_bytes(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    assert store.create("ok", "d", "x" * 65536)
    assert store.read("ok") == MemoryEntry("ok", "d", "x" * 65536)
    with pytest.raises(MemoryLimitError, match="65537 bytes"):
        store.create("big", "d", "x" * 65537)
    with pytest.raises(MemoryLimitError):
        store.overwrite("ok", "d", "é" * 32769)  # 32769 characters, 65538 bytes
    outcome = await _call(store, "memory_write", key="big", description="d", content="x" * 65537)
    assert outcome.is_error
    assert "'big'" in outcome.content
    assert "65536" in outcome.content
    assert _names(tmp_path) == ["ok.md"]


async def test_description_is_flattened_capped_and_must_not_be_blank(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    assert store.create("a", "  two\nlines\t\tand   tabs \r\n", "c")
    assert store.read("a") == MemoryEntry("a", "two lines and tabs", "c")
    assert (tmp_path / "a.md").read_bytes().startswith(b"---\ndescription: two lines and tabs\n")
    assert store.create("long", "é" * 600, "c")
    entry = store.read("long")
    assert entry is not None
    assert entry.description == "é" * 500
    for blank in ("", "  \n\t "):
        with pytest.raises(MemoryLimitError, match="description"):
            store.create("blank", blank, "c")
        outcome = await _call(store, "memory_write", key="blank", description=blank, content="c")
        assert outcome.is_error
        assert "'blank'" in outcome.content
    assert store.read("blank") is None


def _fill(directory: Path, count: int) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    for i in range(count):
        (directory / f"k{i:04}.md").write_bytes(f"---\ndescription: d{i}\n---\n\nc".encode())


async def test_the_1024_cap_applies_to_create_only(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    _fill(tmp_path, MAX_ENTRIES - 1)
    assert store.create("last", "d", "c")  # the 1024th
    with pytest.raises(MemoryFullError, match="1024"):
        store.create("one-more", "d", "c")
    with pytest.raises(MemoryFullError):
        store.create("last", "d", "c")  # the cap is checked before the key-exists check
    outcome = await _call(store, "memory_write", key="one-more", description="d", content="c")
    assert outcome.is_error
    assert "'one-more'" in outcome.content
    assert "1024" in outcome.content
    # overwrite bypasses the cap, even when it creates (reference subtlety 19)
    assert await _result(
        store, "memory_write", key="one-more", description="d", content="c", overwrite=True
    ) == {"written": True}
    assert len(store.list()) == MAX_ENTRIES + 1
    store.delete("one-more")
    store.delete("last")
    assert store.create("room", "d", "c")


def test_symlinks_are_neither_listed_nor_read_nor_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    outside.write_bytes(b"---\ndescription: secret\n---\n\nsecret content")
    directory = tmp_path / "m"
    store = MemoryStore(directory)
    assert store.create("real", "d", "c")
    (directory / "link.md").symlink_to(outside)
    (directory / "dangling.md").symlink_to(tmp_path / "missing.md")
    assert store.list() == [("real", "d")]
    with pytest.raises(MemoryFileError, match="symlink"):
        store.read("link")
    assert "secret" not in memory_index(store)
    # create does not write through it; overwrite and delete replace the link, not the target
    assert store.create("link", "mine", "mine") is False
    store.overwrite("link", "mine", "mine")
    assert not (directory / "link.md").is_symlink()
    assert store.delete("dangling")
    assert outside.read_bytes() == b"---\ndescription: secret\n---\n\nsecret content"


async def test_a_symlinked_key_is_an_error_result_not_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    outside.write_bytes(b"---\ndescription: secret\n---\n\nsecret content")
    store = MemoryStore(tmp_path / "m")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "link.md").symlink_to(outside)
    outcome = await _call(store, "memory_read", key="link")
    assert outcome.is_error
    assert "secret" not in outcome.content
    assert await _result(store, "memory_list") == {"memories": []}


async def test_bad_keys_and_io_errors_are_error_results(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    for name in ("memory_read", "memory_delete"):
        outcome = await _call(store, name, key="../escape")
        assert outcome.is_error
        assert "'../escape'" in outcome.content
    outcome = await _call(store, "memory_write", key="a/b", description="d", content="c")
    assert outcome.is_error
    assert "'a/b'" in outcome.content
    (tmp_path / "dir.md").mkdir()  # a directory where the file should be: an OSError
    outcome = await _call(
        store, "memory_write", key="dir", description="d", content="c", overwrite=True
    )
    assert outcome.is_error
    assert "'dir'" in outcome.content
    outcome = await _call(store, "memory_write", key="d", description="d", content=7)
    assert outcome.is_error
    assert _names(tmp_path) == ["dir.md"]


def test_tool_definitions_are_hand_written_schemas(tmp_path: Path) -> None:
    tools = {t.name: t for t in memory_tools(MemoryStore(tmp_path))}
    assert list(tools) == ["memory_list", "memory_read", "memory_write", "memory_delete"]
    assert {t.kind for t in tools.values()} == {"memory"}
    for t in tools.values():
        assert t.input_schema["type"] == "object"
        assert t.input_schema["additionalProperties"] is False
        assert all(p.get("description") for p in t.input_schema["properties"].values())
    assert tools["memory_list"].input_schema["properties"] == {}
    assert tools["memory_read"].required == ("key",)
    assert tools["memory_delete"].required == ("key",)
    write = tools["memory_write"].input_schema
    assert tools["memory_write"].required == ("key", "description", "content")
    assert write["properties"]["overwrite"]["type"] == "boolean"
    assert write["properties"]["overwrite"]["default"] is False


def test_memory_index_and_note(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m")
    header = "Memories stored from earlier runs (use memory_read to see one):"
    assert memory_index(store) == f"{header}\n<memory-index>\n(none stored yet)\n</memory-index>"
    store.create("b", "second", "x")
    store.create("a", "first", "x")
    assert memory_index(store) == (
        f"{header}\n<memory-index>\n- a: first\n- b: second\n</memory-index>"
    )
    for word in ("durable", "memory_read", "overwrite", "false", "transient"):
        assert word in MEMORY_NOTE


def test_default_memory_directory(tmp_path: Path) -> None:
    xdg = {"XDG_STATE_HOME": "/state", "HOME": "/home/u"}
    assert default_memory_directory("agent", xdg) == Path("/state/fisk-sm/memory/agent")
    relative = {"XDG_STATE_HOME": "rel", "HOME": "/home/u"}
    expected = Path("/home/u/.local/state/fisk-sm/memory/agent")
    assert default_memory_directory("agent", relative) == expected
    assert default_memory_directory("agent", {"HOME": "/home/u"}) == expected
    for bad in ("", "../x", "a/b", "a.b"):
        with pytest.raises(ValueError, match="identity"):
            default_memory_directory(bad, xdg)


_RACER = """
import sys, time
from pathlib import Path
from fisk_sm.tools.memory import MemoryStore
base, rounds, i = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for r in range(rounds):
    (base / f"ready-{r}-{i}").touch()
    while not (base / f"go-{r}").exists():
        time.sleep(0.001)
    store = MemoryStore(base / f"round-{r}")
    print(store.create("shared", f"desc {i}", f"content {i}" * 1000), flush=True)
"""


def _all_ready(base: Path, round_: int, racers: int) -> bool:
    return len(list(base.glob(f"ready-{round_}-*"))) == racers


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the racers never got ready"
        time.sleep(0.001)


@pytest.mark.parametrize("racers", [2, 3, 8])
def test_processes_creating_one_key_at_once_get_exactly_one_winner(
    tmp_path: Path, racers: int
) -> None:
    rounds = 6
    for r in range(0, rounds, 2):
        (tmp_path / f"round-{r}").mkdir(mode=0o700)  # the other rounds also race to mkdir it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path), str(rounds), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(racers)
    ]
    try:
        for r in range(rounds):
            _wait_for(functools.partial(_all_ready, tmp_path, r, racers))
            (tmp_path / f"go-{r}").touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    said = [out.split() for out, _ in outputs]  # said[racer][round]
    for r in range(rounds):
        results = [said[i][r] for i in range(racers)]
        assert sorted(results) == ["False"] * (racers - 1) + ["True"], (r, results)
        winner = results.index("True")
        directory = tmp_path / f"round-{r}"
        entry = MemoryStore(directory).read("shared")
        assert entry == MemoryEntry("shared", f"desc {winner}", f"content {winner}" * 1000)
        assert _names(directory) == ["shared.md"]  # no temp files left behind
        assert _mode(directory / "shared.md") == 0o600
        assert _mode(directory) == 0o700


def test_overwrite_replaces_and_create_never_clobbers(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    for i in range(50):
        store.overwrite("k", f"d{i}", f"c{i}" * 500)
        assert store.create("k", "new", "new") is False
        assert store.read("k") == MemoryEntry("k", f"d{i}", f"c{i}" * 500)
    assert _names(tmp_path) == ["k.md"]
