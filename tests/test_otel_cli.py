"""`fisk-sm run --otel` and `telemetry:` in agent.yaml: real subprocesses exporting OTLP/HTTP to a
small receiver on 127.0.0.1, as a collector would receive them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from crashkit import Lines
from ctlkit import DEADLINE, http, wait_until
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fisk_sm.testing import FakeMessagesAPI, Reply

CLI = [sys.executable, "-m", "fisk_sm.cli"]
SECRET = "zebra-secret"
PRINT_ARGV = "import sys; print(sys.argv[1])"
ARGV = f"[{json.dumps(sys.executable)}, '-c', '{PRINT_ARGV}', '{{text}}']"
TOOL = (
    "tools:\n"
    f"  - name: show\n    command: {ARGV}\n"
    "    arguments: [{name: text, type: string, required: true}]\n"
)


class Receiver:
    """An OTLP/HTTP trace receiver: keeps the body of every POST to /v1/traces."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[dict[str, Any]]:
        """Every span received: its name, attributes, and its resource's attributes."""
        found = []
        for path, body in self.posts:
            assert path == "/v1/traces"
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: a.value for a in span.attributes}
                        found.append(
                            {
                                "name": span.name,
                                "span_id": span.span_id,
                                "parent": span.parent_span_id,
                                "attributes": attributes,
                                "resource": resource,
                            }
                        )
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    rx.thread.start()
    yield rx
    rx.server.shutdown()
    rx.server.server_close()


def env_for(api: FakeMessagesAPI, receiver: Receiver) -> dict[str, str]:
    """The child's whole environment: the fake API, and the receiver as the OTLP endpoint."""
    kept = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return {
        **kept,
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_BASE_URL": api.base_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
    }


def agent(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"identity: teller\nllm: {{model: claude-test}}\n{TOOL}{extra}")
    return path


def run(path: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, "run", "-c", str(path), *flags, "go"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def script(api: FakeMessagesAPI) -> None:
    api.add(
        Reply.tool_use("show", {"text": SECRET}, id="toolu_07", input_tokens=21, output_tokens=8),
        Reply.text("all shown", input_tokens=34, output_tokens=2),
    )


def test_run_with_otel_exports_the_span_tree_to_the_collector(
    api: FakeMessagesAPI, receiver: Receiver, tmp_path: Path
) -> None:
    script(api)
    done = run(agent(tmp_path), env_for(api, receiver), "--otel")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all shown"
    spans = receiver.spans()
    names = sorted(s["name"] for s in spans)
    assert names == [
        "chat claude-test",
        "chat claude-test",
        "execute_tool show",
        "invoke_agent teller",
    ]
    root = next(s for s in spans if s["name"] == "invoke_agent teller")
    assert all(s["parent"] == root["span_id"] for s in spans if s is not root)
    assert root["resource"]["service.name"] == "fisk-sm"
    calls = [s["attributes"] for s in spans if s["name"].startswith("chat")]
    assert sorted(c["gen_ai.usage.input_tokens"].int_value for c in calls) == [21, 34]
    tool_span = next(s for s in spans if s["name"] == "execute_tool show")
    assert tool_span["attributes"]["gen_ai.tool.call.id"].string_value == "toolu_07"
    # No content unless asked for: the tool's argument and output are nowhere in what was sent.
    assert all(SECRET.encode() not in body for _, body in receiver.posts)


def test_without_otel_nothing_is_sent(
    api: FakeMessagesAPI, receiver: Receiver, tmp_path: Path
) -> None:
    script(api)
    done = run(agent(tmp_path), env_for(api, receiver))
    assert done.returncode == 0, done.stderr
    assert len(api.requests) == 2  # the run did call the model, and the tool
    assert receiver.posts == []


def test_telemetry_in_agent_yaml_exports_and_captures_content(
    api: FakeMessagesAPI, receiver: Receiver, tmp_path: Path
) -> None:
    script(api)
    path = agent(tmp_path, "telemetry: {otel: true, capture_content: true}\n")
    done = run(path, env_for(api, receiver))
    assert done.returncode == 0, done.stderr
    tool_span = next(s for s in receiver.spans() if s["name"] == "execute_tool show")
    attributes = tool_span["attributes"]
    assert json.loads(attributes["gen_ai.tool.call.arguments"].string_value) == {"text": SECRET}
    assert SECRET in attributes["gen_ai.tool.call.result"].string_value


def test_otel_without_the_extra_is_one_line_and_exit_2(
    api: FakeMessagesAPI, receiver: Receiver, tmp_path: Path
) -> None:
    hide = "import sys; sys.modules['opentelemetry'] = None"  # as if fisk-sm[otel] were missing
    main = "from fisk_sm.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", f"{hide}; {main}", "run", "-c", str(agent(tmp_path)), "--otel"]
    done = subprocess.run(
        [*argv, "go"], capture_output=True, text=True, env=env_for(api, receiver), timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "fisk-sm: --otel needs OpenTelemetry: pip install 'fisk-sm[otel]'"
    ]
    assert api.requests == []


def test_supervise_with_otel_exports_one_tree_per_run(
    api: FakeMessagesAPI, receiver: Receiver, tmp_path: Path
) -> None:
    for prompt in ("first job", "second job"):
        api.add_conversation(
            prompt, Reply.tool_use("show", {"text": prompt}), Reply.text(f"{prompt} done")
        )
    argv = [*CLI, "supervise", "-c", str(agent(tmp_path)), "--listen", "127.0.0.1:0", "--otel"]
    state = tmp_path / "state"
    process = subprocess.Popen(
        [*argv, "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(api, receiver),
    )
    try:
        assert process.stderr is not None
        line = Lines(process.stderr).wait_for("listening on", DEADLINE)
        url = line.rsplit(" ", 1)[-1].strip()
        ids = []
        for prompt in ("first job", "second job"):
            status, body = http("POST", url + "/api/runs", {"prompt": prompt})
            assert status == 201, body
            ids.append(body["run_id"])
        for run_id in ids:
            wait_until(
                lambda r=run_id: http("GET", f"{url}/api/runs/{r}")[1]["status"] == "completed",
                f"run {run_id} to complete",
            )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0
    spans = receiver.spans()
    roots = {
        s["attributes"]["gen_ai.conversation.id"].string_value: s
        for s in spans
        if s["name"] == "invoke_agent teller"
    }
    assert set(roots) == set(ids)
    for run_id, root in roots.items():
        mine = [s for s in spans if s["parent"] == root["span_id"]]
        assert sorted(s["name"] for s in mine) == [
            "chat claude-test",
            "chat claude-test",
            "execute_tool show",
        ]
        conversation = {s["attributes"]["gen_ai.conversation.id"].string_value for s in mine}
        assert conversation == {run_id}
