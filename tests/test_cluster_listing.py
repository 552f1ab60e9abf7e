"""The listing of a 3-supervisor cluster: every supervisor shows every run with its name, its
owner and, once done, its answer, whichever supervisor drove it (issue 23: 126 of 200 runs lost
their name once their lease was gone).

Real parts only: three `fisk-sm supervise --nats` processes on one real nats-server, the fake
Messages API in this process answering each run by its prompt, HTTP to each supervisor's API.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ctlkit
import natskit
import pytest
from clusterkit import Member, make_stream, script, write_agent

from fisk_sm.testing import FakeMessagesAPI

RUNS = 200
DEADLINE = 240.0
OWNERS = ("sup-a", "sup-b", "sup-c")


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    with natskit.nats_server(tmp_path) as url:
        make_stream(url)
        yield url


def submit(member: Member, prompt: str) -> str:
    """Submit `prompt` named `name-<prompt>` to `member`; the run id."""
    status, run = member.api("POST", "/api/runs", {"prompt": prompt, "name": f"name-{prompt}"})
    assert status == 201, (status, run)
    assert run["name"] == f"name-{prompt}"
    return str(run["run_id"])


def listing(member: Member) -> dict[str, dict[str, Any]]:
    status, body = member.api("GET", "/api/runs")
    assert status == 200, (status, body)
    return {run["run_id"]: run for run in body["runs"]}


def all_done(member: Member, ids: dict[str, str]) -> dict[str, dict[str, Any]] | None:
    """`member`'s listing, once it lists every run completed."""
    shown = listing(member)
    done = [r for r in ids if shown.get(r, {}).get("status") == "completed"]
    return shown if len(done) == len(ids) else None


def test_every_supervisor_lists_every_run_with_its_name_owner_and_answer(
    tmp_path: Path, nats_url: str
) -> None:
    prompts = [f"q{i:03d}" for i in range(RUNS)]
    with FakeMessagesAPI(conversations={p: script(p, turns=0) for p in prompts}) as api:
        write_agent(tmp_path, api.base_url)
        members = [Member(tmp_path, name, nats_url, concurrency=20).start() for name in OWNERS]
        try:
            with ThreadPoolExecutor(12) as pool:  # spread over the three supervisors
                found = pool.map(lambda ip: (submit(members[ip[0] % 3], ip[1]), ip[1]),
                                 enumerate(prompts))  # fmt: skip
                ids = dict(found)
            shown = [
                ctlkit.wait_until(
                    lambda m=m: all_done(m, ids), f"{m.name} to list all done", DEADLINE
                )
                for m in members
            ]
        finally:
            codes = [member.stop() for member in members]
    assert codes == [0, 0, 0]
    every_done = (
        "stopped; 0 run(s) released to the other supervisors, 0 parked for an approval,"
        " 0 suspended by an operator"
    )
    assert [every_done in member.lines() for member in members] == [True] * 3
    assert {p: len(api.requests_for(p)) for p in prompts} == dict.fromkeys(prompts, 1)
    owners = []
    for member, rows in zip(members, shown, strict=True):
        wrong = {
            run_id: (row["name"], row["answer"], row.get("owner"))
            for run_id, row in rows.items()
            if run_id in ids
            and (
                row["name"] != f"name-{ids[run_id]}"
                or row["answer"] != f"{ids[run_id]} done"
                or row.get("owner") not in OWNERS
            )
        }
        assert wrong == {}, (
            f"{member.name}: {len(wrong)} rows wrong, e.g. {list(wrong.items())[:3]}"
        )
        owners.append({run_id: rows[run_id]["owner"] for run_id in ids})
    # every supervisor names the same owner of each run (the one that drove it)...
    assert owners[0] == owners[1] == owners[2]
    # ...and the runs were spread: more than one supervisor drove some
    assert len(set(owners[0].values())) > 1
