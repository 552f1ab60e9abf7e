"""The client's errors: each with the HTTP status (None when no answer came) and the exit code
it means, the same as `fisk-sm ctl`'s (standard library only)."""

from __future__ import annotations

__all__ = [
    "EXIT_NOPERM",
    "EXIT_UNAVAILABLE",
    "BadAnswer",
    "BadRequest",
    "ClientError",
    "Conflict",
    "NotFound",
    "StreamLost",
    "Unauthorized",
    "Unavailable",
    "WrongHost",
    "error_for",
    "exit_code",
]

#: No supervisor answered (sysexits.h EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: The supervisor refused the token (sysexits.h EX_NOPERM).
EXIT_NOPERM = 77


class ClientError(Exception):
    """A request the supervisor refused or never answered: one line, `.status` (the HTTP
    status, None without an answer) and `.exit_code` (what `ctl` exits with)."""

    exit_code = 1

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unavailable(ClientError):
    """No supervisor answered at the URL (refused, unreachable, timed out, broke off)."""

    exit_code = EXIT_UNAVAILABLE


class StreamLost(Unavailable):
    """The event stream broke off and every reconnection failed; `.last_event_id` is the id
    of the last event read (resume from it later)."""

    def __init__(self, message: str, last_event_id: str | None) -> None:
        super().__init__(message)
        self.last_event_id = last_event_id


class Unauthorized(ClientError):
    """No token, or a wrong one (401), or a cross-origin request (403)."""

    exit_code = EXIT_NOPERM


class BadRequest(ClientError):
    """The input was refused (400; 413 too large), or refused before sending (`.status` None)."""

    exit_code = 2


class NotFound(ClientError):
    """No such run or approval (404)."""


class Conflict(ClientError):
    """The run is in the wrong state for that, or the approval is already answered (409)."""


class WrongHost(ClientError):
    """The supervisor does not answer under this URL's host (421)."""


class BadAnswer(ClientError):
    """The answer is not what the control API gives (not JSON, a field missing): is the URL
    a fisk-sm supervisor's?"""


_BY_STATUS: dict[int, type[ClientError]] = {
    400: BadRequest,
    413: BadRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    421: WrongHost,
}


def error_for(status: int, message: str) -> ClientError:
    """The typed error of an answer with `status` (any other status: a plain ClientError)."""
    return _BY_STATUS.get(status, ClientError)(message, status)


def exit_code(status: int) -> int:
    """The exit code an answer with `status` means: 2 bad input, 77 the token, 1 the rest."""
    return _BY_STATUS.get(status, ClientError).exit_code
