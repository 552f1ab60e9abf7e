"""The stream behind JetStream sessions: connecting, checking its settings, creating it.

The session backend (`fisk_sm.journal.jetstream`) binds to an existing stream and refuses one
whose settings would break its guarantees (REFERENCE §3.6):

- exactly one subject, the wildcard `<prefix>.>`;
- `max_msgs_per_subject` 1 with `discard` new and `discard_new_per_subject`: a record's subject
  takes one message and refuses a second, so a record is written once;
- no `max_age`: a journal never expires;
- `max_msg_size` unlimited or at least 4096 bytes.

`init_stream` creates such a stream (`fisk-sm session init-stream -c agent.yaml`). nats-py is an
optional dependency, imported only here and only when a JetStream backend is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fisk_sm.config.errors import one_line
from fisk_sm.config.harness import stream_name_problem
from fisk_sm.config.names import SUBJECT_RE
from fisk_sm.journal.base import JournalError
from fisk_sm.journal.filejournal import JournalIOError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig

__all__ = [
    "MIN_MSG_SIZE",
    "JetStreamConfigError",
    "JetStreamIOError",
    "bind_stream",
    "connect_nats",
    "init_stream",
    "nats_errors",
    "stream_problems",
]

#: The smallest `max_msg_size` a session stream may have (a record is one message).
MIN_MSG_SIZE = 4096
NEEDS_NATS = "sessions.backend jetstream needs nats-py: pip install 'fisk-sm[nats]'"


class JetStreamConfigError(JournalError):
    """The stream is missing or set up wrongly, or nats-py is not installed: bad input."""


class JetStreamIOError(JournalIOError):
    """The NATS server could not be reached or did not answer in time: not bad input."""


@contextlib.contextmanager
def nats_errors(what: str) -> Iterator[None]:
    """Re-raise a NATS failure (no answer, a lost connection) as `JetStreamIOError` on `what`."""
    from nats.errors import Error as NatsError

    try:
        yield
    except (NatsError, TimeoutError, OSError) as exc:
        raise JetStreamIOError(f"{what} failed: {one_line(exc) or type(exc).__name__}") from None


async def _quiet(error: Exception) -> None:
    """nats-py prints a traceback for every failed attempt unless given an error callback."""


async def connect_nats(url: str, seconds: float) -> Client:
    """A connection to `url`; `JetStreamIOError` naming the URL if there is none."""
    try:
        import nats
    except ImportError:
        raise JetStreamConfigError(NEEDS_NATS) from None
    try:
        nc: Client = await nats.connect(
            url,
            connect_timeout=seconds,
            allow_reconnect=False,
            max_reconnect_attempts=1,  # nats-py: 0 would mean "retry forever"
            error_cb=_quiet,
        )
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        why = one_line(exc) or type(exc).__name__
        raise JetStreamIOError(f"cannot reach the NATS server at {url}: {why}") from None
    return nc


def stream_problems(name: str, prefix: str, config: StreamConfig) -> list[str]:
    """Each setting of stream `name` that sessions under `prefix` cannot use, as a phrase."""
    wanted = [f"{prefix}.>"]
    problems = []
    if list(config.subjects or []) != wanted:
        problems.append(f"subjects must be {wanted}, got {list(config.subjects or [])}")
    if config.max_msgs_per_subject != 1:
        problems.append(f"max_msgs_per_subject must be 1, got {config.max_msgs_per_subject}")
    discard = getattr(config.discard, "value", config.discard)
    if discard != "new":
        problems.append(f"discard must be 'new', got {discard!r}")
    if not config.discard_new_per_subject:
        problems.append(
            f"discard_new_per_subject must be true, got {config.discard_new_per_subject}"
        )
    if config.max_age:
        problems.append(f"max_age must be unset (0), got {config.max_age:g}s")
    size = config.max_msg_size
    if size is not None and 0 <= size < MIN_MSG_SIZE:
        problems.append(f"max_msg_size must be unlimited (-1) or >= {MIN_MSG_SIZE}, got {size}")
    return [f"stream {name!r}: {problem}" for problem in problems]


def _check_names(stream: str, prefix: str) -> None:
    problem = stream_name_problem(stream)
    if problem:
        raise JetStreamConfigError(f"sessions.options.stream: {problem}")
    if not SUBJECT_RE.fullmatch(prefix):
        raise JetStreamConfigError(
            f"sessions.options.prefix: not a NATS subject without wildcards: {prefix!r}"
        )


async def bind_stream(js: JetStreamContext, url: str, stream: str, prefix: str) -> None:
    """Check that `stream` exists on `url` with settings fit for sessions under `prefix`."""
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    _check_names(stream, prefix)
    with nats_errors(f"{url}: stream {stream!r}: stream info"):
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            raise JetStreamConfigError(
                f"stream {stream!r} not found on {url}:"
                " create it with `fisk-sm session init-stream -c agent.yaml`"
            ) from None
        except ServiceUnavailableError:
            raise JetStreamConfigError(f"JetStream is not enabled on {url}") from None
    problems = stream_problems(stream, prefix, info.config)
    if problems:
        raise JetStreamConfigError("; ".join(problems))


async def init_stream(url: str, *, stream: str, prefix: str, seconds: float = 5.0) -> bool:
    """Create `stream` for sessions under `prefix` on `url`; False if it already existed (its
    settings are then checked as `bind_stream` does)."""
    from nats.js.api import DiscardPolicy, StorageType, StreamConfig
    from nats.js.errors import APIError, NotFoundError

    _check_names(stream, prefix)
    nc = await connect_nats(url, seconds)
    try:
        js = nc.jetstream(timeout=seconds)
        with nats_errors(f"{url}: stream {stream!r}: create"):
            try:
                await js.stream_info(stream)
            except NotFoundError:
                config = StreamConfig(
                    name=stream,
                    subjects=[f"{prefix}.>"],
                    max_msgs_per_subject=1,
                    discard=DiscardPolicy.NEW,
                    discard_new_per_subject=True,
                    storage=StorageType.FILE,
                )
                try:
                    await js.add_stream(config)
                except APIError as exc:  # a refusal (overlapping subjects), not a failing link
                    why = one_line(exc.description or exc)
                    raise JetStreamConfigError(f"stream {stream!r} on {url}: {why}") from None
                return True
        await bind_stream(js, url, stream, prefix)
        return False
    finally:
        await nc.close()
