"""Every refusal as an exception class, and which ones a retry can fix.

::

    TinybrokerError                 .code (grpc.StatusCode), .message, .transient
    ├── TransientError              a retry later may succeed
    │   ├── UnavailableError        broker gone, unreachable or shutting down; stream ended
    │   │   └── TransportError      the connection could not be made
    │   └── (CANCELLED, DEADLINE_EXCEEDED, ABORTED, UNKNOWN: TransientError itself)
    └── RefusedError                the broker refused it; the same call will be refused again
        ├── InvalidArgumentError    bad topic, pattern, option, URL or token
        ├── NotFoundError           no such subscription, or the message is not in flight
        ├── AlreadyExistsError      a live broadcast subscription has this id
        ├── FailedPreconditionError stale ack (another member holds it), settings mismatch
        ├── ResourceExhaustedError  a limit: full queue, message too large, too many members
        └── UnauthenticatedError    the broker wants a (different) bearer token

The split is the Rust client's `Error::is_transient`: `except TransientError` is where a retry
loop belongs.
"""

from __future__ import annotations

from typing import Optional

import grpc

__all__ = [
    "AlreadyExistsError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "RefusedError",
    "ResourceExhaustedError",
    "TinybrokerError",
    "TransientError",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
    "error_from_code",
    "error_from_rpc",
]


class TinybrokerError(Exception):
    """Why a call failed. `message` is the broker's own text, which names the problem."""

    #: Whether retrying the same call later may succeed.
    transient: bool = False

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = (
            code if code is not None else _DEFAULT_CODE.get(type(self), grpc.StatusCode.UNKNOWN)
        )

    def __str__(self) -> str:
        return f"{self.code.name.lower().replace('_', ' ')}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code})"


class TransientError(TinybrokerError):
    """A retry later may succeed: the broker or the connection was unavailable."""

    transient = True


class UnavailableError(TransientError):
    """The broker is gone, unreachable or shutting down, or the stream ended."""


class TransportError(UnavailableError):
    """The connection could not be made (refused, timed out, TLS handshake failed)."""


class RefusedError(TinybrokerError):
    """The broker refused the request; sending it again gets the same answer."""


class InvalidArgumentError(RefusedError):
    """Malformed: bad topic or pattern, missing field, bad URL or token, settled twice."""


class NotFoundError(RefusedError):
    """No such subscription, or the message is not in flight (acked, or back in the queue)."""


class AlreadyExistsError(RefusedError):
    """A live broadcast subscription already has this id."""


class FailedPreconditionError(RefusedError):
    """Refused in the current state: a stale ack or nack (another member holds the message
    now), an ack on an ack-free subscription, or a join whose settings differ from the live
    subscription's."""


class ResourceExhaustedError(RefusedError):
    """Refused by a limit: a full queue, a message over the size limit, too many subscriptions
    or members. The message names the limit."""


class UnauthenticatedError(RefusedError):
    """The broker wants a (different) bearer token."""


_BY_CODE: dict[grpc.StatusCode, type[TinybrokerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    # A decode limit answers OUT_OF_RANGE; to a caller it is the same limit.
    grpc.StatusCode.OUT_OF_RANGE: ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: TransientError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransientError,
    grpc.StatusCode.ABORTED: TransientError,
    grpc.StatusCode.UNKNOWN: TransientError,
}

_DEFAULT_CODE: dict[type[TinybrokerError], grpc.StatusCode] = {
    cls: code for code, cls in reversed(list(_BY_CODE.items()))
}
_DEFAULT_CODE[TransportError] = grpc.StatusCode.UNAVAILABLE

_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def error_for(code: grpc.StatusCode, message: str) -> TinybrokerError:
    """The exception for a gRPC status."""
    return _BY_CODE.get(code, RefusedError)(message, code)


def error_from_code(code: int, message: str) -> TinybrokerError:
    """The exception for a numeric gRPC status code carried in a frame (a refused settle or a
    refused streaming publish)."""
    return error_for(_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN), message)


def error_from_rpc(error: grpc.RpcError) -> TinybrokerError:
    """The exception for a failed gRPC call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else None
    return error_for(code, details or str(code.name))
