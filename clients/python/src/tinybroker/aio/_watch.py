"""Following a SINGLETON subscription's leadership without joining it
(docs/semantics.md#watching-leadership): `Client.watch_leadership` over one `WatchLeadership`
stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Optional

import grpc
import grpc.aio

from ..errors import TinybrokerError, UnavailableError, error_from_rpc
from ..types import LeaderState, _any, _leader_state_from_pb
from ._subscription import _EOF

if TYPE_CHECKING:
    from ..v1 import broker_pb2 as pb
    from ..v1.broker_pb2_grpc import BrokerStub

__all__ = ["LeadershipWatch"]


class LeadershipWatch:
    """A watch of one SINGLETON subscription's leadership: `next()` returns the state when the
    watch was opened, then one state per change (a member made active, or the active member
    gone with no one to follow it). Standbys joining or leaving send nothing. A watch that is
    not read costs the server one state: read again, it gets the latest one (changes meanwhile
    may be skipped; epochs never fall). `async for state in watch` reads it the same way. One
    reader at a time.

    The stream ends only with an error, which `next()` raises (and every later `next()`
    again): `NotFoundError` once the subscription expired or was deleted, `UnavailableError`
    when the server shuts down or the connection fails (watch again, at any gateway in
    cluster mode).

    End it with `close()` (or `async with`): the call is cancelled, later reads raise
    `UnavailableError`, and an `async for` over it stops. A watch dropped without `close()` is
    cancelled when it is garbage. Cancelling a read (`asyncio.wait_for(watch.next(), 1)`) is
    safe: the frame it waited for is kept for the next read, and the watch goes on.
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, Any], subscription_id: str) -> None:
        self._call = call
        self._id = subscription_id
        self._read_task: Optional[asyncio.Future[Any]] = None
        # The first state, read by `_open`, until `next()` hands it out.
        self._first: Optional[LeaderState] = None
        # The error that ended the watch (or the close), raised by every later read.
        self._ended: Optional[TinybrokerError] = None
        self._closed = False

    @classmethod
    async def _open(
        cls,
        stub: BrokerStub,
        request: pb.WatchLeadershipRequest,
        metadata: tuple[tuple[str, str], ...],
    ) -> LeadershipWatch:
        call: grpc.aio.UnaryStreamCall[Any, Any] = _any(stub).WatchLeadership(
            request, metadata=metadata
        )
        self = cls(call, request.subscription_id)
        try:
            # The server answers a watch it accepted with the current state at once, and
            # refuses one (unknown id, another mode, a malformed id) without a frame: reading
            # the first frame here makes the refusal this call's.
            self._first = await self._read()
        except BaseException:
            self._cancel()
            raise
        return self

    @property
    def subscription_id(self) -> str:
        return self._id

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (the watch then reads nothing more)."""
        return self._closed

    async def next(self) -> LeaderState:
        """The next state: the one when the watch was opened first, then one per change.
        Raises the error that ended the watch (`NotFoundError`: the subscription expired or was
        deleted; `UnavailableError`: the server shut down, the connection failed, or the watch
        was closed)."""
        if self._ended is not None:
            raise self._ended
        if self._first is not None:
            state, self._first = self._first, None
            return state
        return await self._read()

    async def _read(self) -> LeaderState:
        if self._read_task is None:
            self._read_task = asyncio.ensure_future(self._call.read())
            self._read_task.add_done_callback(_retrieve)
        task = self._read_task
        # A cancelled caller leaves the read running (grpc.aio cancels the whole call when a
        # read is cancelled): the frame is kept for the next read.
        await asyncio.wait({task})
        if self._read_task is task:
            self._read_task = None
        if self._ended is not None:
            raise self._ended
        if task.cancelled():
            # grpc.aio raises CancelledError from a read of a call this side cancelled.
            raise self._end(UnavailableError("the leadership watch was cancelled"))
        try:
            frame = task.result()
        except grpc.RpcError as error:
            raise self._end(error_from_rpc(error)) from None
        if frame is _EOF:
            raise self._end(UnavailableError("the server ended the leadership watch"))
        return _leader_state_from_pb(frame)

    def _end(self, error: TinybrokerError) -> TinybrokerError:
        if self._ended is None:
            self._ended = error
        return self._ended

    def __aiter__(self) -> AsyncIterator[LeaderState]:
        return self._states()

    async def _states(self) -> AsyncIterator[LeaderState]:
        while True:
            try:
                state = await self.next()
            except TinybrokerError:
                if self._closed:
                    return
                raise
            yield state

    def _cancel(self) -> None:
        """Ends the watch at once: the call is cancelled; on the event loop."""
        if not self._closed:
            self._closed = True
            self._end(UnavailableError("the leadership watch was closed"))
        self._call.cancel()

    async def close(self) -> None:
        """Ends the watch: cancels its call and returns once its read has stopped. Idempotent;
        a read waiting meanwhile raises `UnavailableError` (an `async for` stops)."""
        self._cancel()
        task = self._read_task
        if task is not None:
            await asyncio.wait({task})

    async def __aenter__(self) -> LeadershipWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __del__(self) -> None:
        # Garbage: the server stops following the subscription for it. (`_call` is missing if
        # __init__ never ran.)
        call = getattr(self, "_call", None)
        if call is not None and not call.done():
            with contextlib.suppress(Exception):
                call.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Marks a read's exception as seen: a watch closed or dropped before its pending read
    ended leaves no "exception was never retrieved" warning."""
    if not task.cancelled():
        task.exception()
