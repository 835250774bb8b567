"""A member of a subscription over one `Consume` stream: deliveries settle themselves on that
stream (fenced by construction), refusals come back on it, and `close()` leaves only once the
broker has applied every queued settlement."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Optional

import grpc
import grpc.aio

from ..errors import TinybrokerError, UnavailableError, error_from_code, error_from_rpc
from ..events import Active, Delivery, Event, Refused, SettleFn, Standby, SteppedDown
from ..types import AckMode, Activation, SubscriptionOptions, _any, _timestamp
from ..v1 import broker_pb2 as pb

#: What a stream's read() answers at its end.
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from ..v1.broker_pb2_grpc import BrokerStub

__all__ = ["MAX_SETTLE_BATCH", "Subscription"]

#: Settlements ready together travel in one `Settle`, up to this many (and never more than the
#: member's window, which the broker refuses whole).
MAX_SETTLE_BATCH = 1024

#: What a queued settlement asks: `Settle.ack`, `.nack` or `.release`.
_ACK, _NACK, _RELEASE = 0, 1, 2

#: How long `close()` waits for each frame that has already arrived (prefetched) before it
#: gives them back: a frame grpc holds is read in well under this; one still in transit is not
#: waited for and goes back with the member's leave (attempt + 1).
_PREFETCH_READ = 0.01


class Subscription:
    """A member of a subscription. Read it with `next_event()` or `next_delivery()` (or
    `async for delivery in subscription`); wait for the member to be active with `active()`.
    One reader at a time.

    Leave with `close()` (or `async with`): it returns once the broker has applied every
    settlement queued before it. Whatever the broker has not seen acked goes back to the head
    of the queue and is redelivered with `attempt` + 1.

    Cancelling a read (`asyncio.wait_for(sub.next_event(), 1)`) is safe: the frame it waited
    for is kept for the next read, and the stream goes on.
    """

    def __init__(
        self, call: grpc.aio.StreamStreamCall[Any, Any], options: SubscriptionOptions
    ) -> None:
        self._call = call
        self._id = options.subscription_id
        self._ack_free = options.ack_mode is AckMode.NONE
        self._batch = min(MAX_SETTLE_BATCH, options.window)
        self._member_id = 0
        self._epoch = 0
        self._active = False
        self._refused = 0
        # Set once the stream has ended: (None,) cleanly, (error,) when it failed.
        self._ended: Optional[tuple[Optional[TinybrokerError]]] = None
        self._pending: collections.deque[tuple[int, int]] = collections.deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._cancelled = False
        self._writer_failed = False
        self._read_task: Optional[asyncio.Future[Any]] = None
        self._interrupted = False
        self._interrupt = asyncio.Event()
        self._writer: Optional[asyncio.Task[None]] = None
        #: How deliveries queue their settlement; the blocking API swaps in a thread-safe one.
        self._settle_fn: SettleFn = self._queue_settle

    @classmethod
    async def _open(
        cls, stub: BrokerStub, options: SubscriptionOptions, metadata: tuple[tuple[str, str], ...]
    ) -> Subscription:
        request = pb.ConsumeRequest(open=options._to_pb())
        call: grpc.aio.StreamStreamCall[Any, Any] = _any(stub).Consume(metadata=metadata)
        self = cls(call, options)
        try:
            await call.write(request)
            # The broker answers the headers once it accepted the member; a refusal (bad
            # options, settings that differ, a limit) ends the call without them.
            await call.initial_metadata()
            if call.done():
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    raise error_from_rpc(_status_error(code, await call.details()))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        except asyncio.InvalidStateError:
            raise error_from_rpc(_status_error(await call.code(), await call.details())) from None
        except BaseException:
            call.cancel()
            raise
        self._writer = asyncio.ensure_future(self._write_loop())
        return self

    # --- state -----------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def member_id(self) -> int:
        """This member's id, known once it is active or told it is on standby (0 before)."""
        return self._member_id

    @property
    def epoch(self) -> int:
        """This member's epoch, 0 until it is active (after a `SteppedDown`, the epoch that
        ended until it is promoted again; `is_active` tells)."""
        return self._epoch

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def refused_settlements(self) -> int:
        """How many of this stream's acks and nacks the broker refused so far."""
        return self._refused

    @property
    def ended(self) -> bool:
        return self._ended is not None

    # --- settling --------------------------------------------------------------------------

    def _queue_settle(self, nack: bool, system_id: int) -> None:
        if self._ended is not None or self._closing or self._writer_failed or self._cancelled:
            raise UnavailableError(
                "the subscription stream has ended; the message will be redelivered"
            )
        self._pending.append((_NACK if nack else _ACK, system_id))
        self._wake.set()

    async def _write_loop(self) -> None:
        call = self._call
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                # Settlements first, so acks made just before the close still count: the
                # broker applies the settles it read before the half-close.
                while self._pending:
                    lists: tuple[list[int], list[int], list[int]] = ([], [], [])
                    while self._pending and sum(map(len, lists)) < self._batch:
                        kind, system_id = self._pending.popleft()
                        lists[kind].append(system_id)
                    settle = pb.Settle(ack=lists[0], nack=lists[1], release=lists[2])
                    await call.write(pb.ConsumeRequest(settle=settle))
                if self._closing:
                    await call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError, asyncio.CancelledError):
            # The stream ended (or was cancelled): the reader sees why.
            self._writer_failed = True

    # --- reading ---------------------------------------------------------------------------

    async def _read_frame(self, interruptible: bool) -> Any:
        """The next frame, _EOF, or _INTERRUPTED. A cancelled or interrupted caller
        leaves the read running: the frame is kept for the next read."""
        if interruptible and self._interrupted:
            return _INTERRUPTED
        if self._read_task is None:
            self._read_task = asyncio.ensure_future(self._call.read())
        task = self._read_task
        if interruptible:
            stop = asyncio.ensure_future(self._interrupt.wait())
            try:
                await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not task.done():
                return _INTERRUPTED
        else:
            await asyncio.wait({task})
        self._read_task = None
        if task.cancelled():
            # grpc.aio raises CancelledError from a read of a call this side cancelled.
            return _EOF
        return task.result()

    def interrupt(self) -> None:
        """Makes the current and every later `next_event()`, `next_delivery()` and `active()`
        return None at once (iteration stops), without ending the stream: then call `close()`
        to leave with every ack applied. For a signal handler
        (`loop.add_signal_handler(signal.SIGTERM, subscription.interrupt)`); call it on the
        event loop (the blocking API's `interrupt()` may be called from any thread)."""
        self._interrupted = True
        self._interrupt.set()

    async def next_event(self) -> Optional[Event]:
        """The next event: `Active`, `Standby`, `SteppedDown`, `Delivery` or `Refused`; None
        once the stream has ended cleanly (or after `interrupt()`). Raises the error that ended
        the stream (`UnavailableError` when the broker shut down or the connection failed);
        nothing follows it."""
        return await self._next_event(True)

    async def _next_event(self, interruptible: bool) -> Optional[Event]:
        while True:
            if self._ended is not None:
                return None
            try:
                frame = await self._read_frame(interruptible)
            except grpc.RpcError as error:
                failure = error_from_rpc(error)
                self._ended = (failure,)
                self._finish_writer()
                raise failure from None
            if frame is _INTERRUPTED:
                return None
            if frame is _EOF:
                self._ended = (None,)
                if not self._closing:
                    self._finish_writer()
                if self._cancelled:
                    return None
                # A clean end, but the call may still carry a status the read did not raise.
                code = await self._call.code()
                if code != grpc.StatusCode.OK:
                    failure = error_from_rpc(_status_error(code, await self._call.details()))
                    self._ended = (failure,)
                    raise failure
                return None
            event = self._event(frame)
            if event is not None:
                return event

    def _event(self, frame: pb.SubscriptionFrame) -> Optional[Event]:
        kind = frame.WhichOneof("frame")
        if kind == "confirmation":
            c = frame.confirmation
            self._member_id, self._epoch, self._active = c.member_id, c.epoch, True
            return Active(c.member_id, c.epoch)
        if kind == "standby":
            s = frame.standby
            if s.stepped_down_epoch:
                # This member was active: its epoch ended, and it waits in line again
                # (docs/semantics.md#hand-over). `epoch` keeps the one that ended.
                self._active = False
                return SteppedDown(s.member_id, s.stepped_down_epoch, s.position)
            self._member_id = s.member_id
            return Standby(s.member_id, s.position)
        if kind == "message":
            m = frame.message
            return Delivery(
                system_id=m.system_id,
                topic=m.topic,
                payload=m.payload,
                headers=dict(m.headers),
                attempt=m.delivery_attempt,
                epoch=m.epoch,
                published_at=_timestamp(m.published_at.seconds, m.published_at.nanos)
                if m.HasField("published_at")
                else None,
                subscription_id=self._id,
                member_id=self._member_id,
                _settle=None if self._ack_free else self._settle_fn,
            )
        if kind == "refused":
            r = frame.refused
            ids = ((r.system_id,) if r.system_id else ()) + tuple(r.more_system_ids)
            self._refused += max(len(ids), 1)
            return Refused(ids, r.nack, error_from_code(r.code, r.message), r.release)
        return None  # a frame kind newer than this client: skipped

    async def next_delivery(self) -> Optional[Delivery]:
        """The next delivery, skipping other events (a refused settlement is counted in
        `refused_settlements`). None once the stream has ended cleanly."""
        while True:
            event = await self.next_event()
            if event is None or isinstance(event, Delivery):
                return event

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self._deliveries()

    async def _deliveries(self) -> AsyncIterator[Delivery]:
        while True:
            delivery = await self.next_delivery()
            if delivery is None:
                return
            yield delivery

    async def active(self) -> Activation:
        """Waits until this member is active; returns its member id and epoch. At once in queue
        and broadcast mode; on promotion in singleton mode (standby notices are consumed). No
        delivery is skipped: nothing but standby notices comes before the confirmation."""
        while not self._active:
            event = await self.next_event()
            if event is None:
                if self._interrupted and self._ended is None:
                    raise UnavailableError("interrupted before the member was active")
                raise UnavailableError("the stream ended before the member was active")
        return Activation(self._member_id, self._epoch)

    # --- leaving ---------------------------------------------------------------------------

    def _begin_close(self) -> None:
        """Flush what is queued, then half-close (the writer does both, in that order)."""
        self._closing = True
        self._wake.set()

    def _cancel(self) -> None:
        """Leaves at once: the stream is cancelled, queued settlements are dropped."""
        self._cancelled = True
        self._call.cancel()
        self._finish_writer()

    async def close(self) -> None:
        """Leaves once the broker has applied every settlement queued so far: sends them,
        half-closes the stream, and reads it to its end. Deliveries that had arrived but were
        never handed out (prefetched within the window) are released with them: they go back
        to the queue with the same `attempt` (docs/semantics.md#releases). Deliveries still in
        transit, and deliveries handed out but left unsettled, go back with `attempt` + 1. An
        ack-free member has nothing to flush: its stream is simply ended.

        Raises the error that ended the stream if it was not a clean end (queued settlements
        may then not have been applied); after a clean end, the first settlement the broker
        refused while closing. Waits as long as the broker takes to answer (until keepalive
        fails if it vanished): bound it with `asyncio.wait_for` if needed."""
        if self._ended is not None:
            self._finish_writer()
            if self._ended[0] is not None:
                raise self._ended[0]
            return
        if self._ack_free:
            # The broker keeps an ack-free member's stream open after a half-close, and there
            # is nothing to flush: cancelling the stream is how it leaves.
            self._cancel()
            self._ended = (None,)
            self._finish_writer()
            return
        refused: Optional[TinybrokerError] = None
        # What has arrived and was never handed out: released, so that it comes back with the
        # same attempt (docs/semantics.md#releases).
        while self._ended is None:
            if self._read_task is None:
                self._read_task = asyncio.ensure_future(self._call.read())
            done, _ = await asyncio.wait({self._read_task}, timeout=_PREFETCH_READ)
            if not done:
                break  # kept for the reads below
            event = await self._next_event(False)
            if isinstance(event, Delivery):
                self._pending.append((_RELEASE, event.system_id))
            elif isinstance(event, Refused) and refused is None:
                refused = event.error
        self._begin_close()
        while True:
            event = await self._next_event(False)
            if event is None:
                break
            if isinstance(event, Refused) and refused is None:
                refused = event.error
        if self._writer is not None:
            await asyncio.wait({self._writer})
        if refused is not None:
            raise refused

    def _finish_writer(self) -> None:
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is None:
            await self.close()
        else:
            # Leaving on an error: what was queued is still flushed, and the original error
            # is what propagates.
            with contextlib.suppress(TinybrokerError):
                await self.close()


_INTERRUPTED = object()


class _StatusError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: Optional[str]) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> Optional[str]:
        return self._details


def _status_error(code: grpc.StatusCode, details: Optional[str]) -> grpc.RpcError:
    return _StatusError(code, details)
