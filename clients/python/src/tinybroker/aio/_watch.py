"""Following a SINGLETON subscription's leadership without joining it
(docs/semantics.md#watching-leadership): `Client.watch_leadership` over one `WatchLeadership`
stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Callable, Optional

import grpc
import grpc.aio

from ..errors import NotFoundError, TinybrokerError, UnavailableError, error_from_rpc
from ..types import LeaderState, _any, _leader_state_from_pb
from ._election import INITIAL_BACKOFF, MAX_BACKOFF
from ._subscription import _EOF

if TYPE_CHECKING:
    from ..v1 import broker_pb2 as pb
    from ..v1.broker_pb2_grpc import BrokerStub

__all__ = ["LeadershipWatch"]

log = logging.getLogger("tinybroker")

_Call = grpc.aio.UnaryStreamCall[Any, Any]


class _Calls:
    """A watch's current call, and how to open the next one when it rejoins. Shared with the
    watch's read task, which must not hold the watch itself: a watch dropped with a read
    pending is garbage, and cancels its call."""

    def __init__(self, call: _Call, subscription_id: str, reopen: Optional[Callable[[], _Call]]):
        self.call = call
        self.subscription_id = subscription_id
        self.reopen = reopen
        self.closed = False
        #: (member, epoch, metadata) of the last frame read: a watch opened again does not
        #: repeat the state its predecessor gave last.
        self.last: Optional[tuple[int, int, str]] = None


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

    A watch opened with `rejoin=True` does that itself, as `elect` rejoins its line: after
    `NotFoundError` or a transient error it watches again, waiting 50 ms before the first try
    and doubling up to 2 s (back to 50 ms once a watch answered), and goes on with the state
    the new watch gives first (skipped when it is the one read last). While no subscription
    exists it waits for one. It raises only what a retry would repeat (a subscription not
    SINGLETON, a malformed id, a token), and `UnavailableError` once closed. Epochs still
    never fall: a subscription created again, or a broker restarted, hands out higher ones.

    End it with `close()` (or `async with`): the call is cancelled, later reads raise
    `UnavailableError`, and an `async for` over it stops. A watch dropped without `close()` is
    cancelled when it is garbage. Cancelling a read (`asyncio.wait_for(watch.next(), 1)`) is
    safe: the frame it waited for is kept for the next read, and the watch goes on.
    """

    def __init__(
        self,
        call: _Call,
        subscription_id: str,
        reopen: Optional[Callable[[], _Call]] = None,
    ) -> None:
        self._calls = _Calls(call, subscription_id, reopen)
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
        rejoin: bool = False,
    ) -> LeadershipWatch:
        def start() -> _Call:
            call: _Call = _any(stub).WatchLeadership(request, metadata=metadata)
            return call

        self = cls(start(), request.subscription_id, start if rejoin else None)
        try:
            # The server answers a watch it accepted with the current state at once, and
            # refuses one (unknown id, another mode, a malformed id) without a frame: reading
            # the first frame here makes the refusal this call's (with rejoin, only one a
            # retry would repeat).
            self._first = await self._read()
        except BaseException:
            self._cancel()
            raise
        return self

    @property
    def _call(self) -> _Call:
        """The call the watch reads now (another one after each rejoin)."""
        return self._calls.call

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
            self._read_task = asyncio.ensure_future(_next_frame(self._calls))
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
        except TinybrokerError as error:
            raise self._end(error) from None
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
        """Ends the watch at once: the call is cancelled (and a wait to rejoin); on the event
        loop."""
        if not self._closed:
            self._closed = True
            self._end(UnavailableError("the leadership watch was closed"))
        self._calls.closed = True
        self._calls.call.cancel()
        if self._read_task is not None:
            self._read_task.cancel()

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
        # Garbage: the server stops following the subscription for it, and a read waiting to
        # rejoin opens no other watch. (`_calls` is missing if __init__ never ran.)
        calls = getattr(self, "_calls", None)
        if calls is not None:
            calls.closed = True
            if not calls.call.done():
                with contextlib.suppress(Exception):
                    calls.call.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Marks a read's exception as seen: a watch closed or dropped before its pending read
    ended leaves no "exception was never retrieved" warning."""
    if not task.cancelled():
        task.exception()


def _rejoins_after(error: TinybrokerError) -> bool:
    """Whether a rejoining watch watches again after `error`: the subscription is gone (it
    may be created again), or a retry may succeed."""
    return isinstance(error, NotFoundError) or error.transient


async def _next_frame(calls: _Calls) -> Any:
    """The next frame of the watch; with `calls.reopen`, across watches opened again with
    backoff. Raises the `TinybrokerError` that ended it."""
    backoff = INITIAL_BACKOFF
    rejoined = False
    while True:
        try:
            frame: Any = await calls.call.read()
        except grpc.RpcError as rpc:
            error = error_from_rpc(rpc)
        else:
            if frame is not _EOF:
                key = (frame.active_member_id, frame.epoch, frame.metadata)
                if rejoined and key == calls.last:
                    # The new watch's first state is the one read last: nothing changed.
                    rejoined, backoff = False, INITIAL_BACKOFF
                    continue
                calls.last = key
                return frame
            error = UnavailableError("the server ended the leadership watch")
        if calls.reopen is None or calls.closed or not _rejoins_after(error):
            raise error
        if rejoined:
            backoff = min(backoff * 2, MAX_BACKOFF)
        log.warning(
            "tinybroker: leadership watch %s: watching again in %.2fs: %s",
            calls.subscription_id,
            backoff,
            error,
        )
        await asyncio.sleep(backoff)
        if calls.closed:
            raise UnavailableError("the leadership watch was closed")
        calls.call = calls.reopen()
        rejoined = True
