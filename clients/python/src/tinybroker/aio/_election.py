"""Leader election on a singleton subscription: `Client.elect()` resolves when this replica
becomes the active member and hands back a `Leadership` whose epoch fences side effects and
whose `lost()` resolves the moment the broker could have promoted someone else."""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import TinybrokerError, UnavailableError
from ..events import Active, Delivery, Refused, Standby, SteppedDown
from ..types import Message, Published
from ._subscription import Subscription

if TYPE_CHECKING:
    from ._client import Client

__all__ = [
    "INITIAL_BACKOFF",
    "MAX_BACKOFF",
    "MAX_BUFFERED_MESSAGES",
    "Leadership",
    "Lost",
    "LostCause",
]

log = logging.getLogger("tinybroker")

#: First wait before rejoining after a failed attempt (seconds); doubles up to MAX_BACKOFF.
INITIAL_BACKOFF = 0.05
#: Longest wait between rejoin attempts.
MAX_BACKOFF = 2.0
#: Messages a Leadership holds that the job has not taken with `next_message()`. Past it the
#: leader stops reading its stream, so HTTP/2 flow control pushes back to the broker.
MAX_BUFFERED_MESSAGES = 64


class LostCause(enum.Enum):
    """What ended a leadership."""

    #: This replica stepped down: `resign()` or `close()`. (A raw gRPC client sees its own
    #: cancel here: CANCELLED.)
    RESIGNED = "resigned"
    #: The member's stream ended: the broker went away or shut down, the connection's
    #: keepalive failed, or the stream was reset (UNAVAILABLE on the wire). `Lost.error` says.
    ENDED = "ended"
    #: The broker asked this leader to step down and it did, at a message boundary: a hand-over
    #: was requested (`Client.hand_over`), or a member of higher priority joined
    #: (docs/semantics.md#hand-over). The member's stream is closed, so it leaves the line;
    #: elect again to stand in line (`leaderships()` does).
    HANDED_OVER = "handed over"


@dataclass(frozen=True)
class Lost:
    """Why a leadership ended."""

    #: The epoch that ended.
    epoch: int
    cause: LostCause
    #: Set when `cause` is ENDED: the error that ended the stream.
    error: Optional[TinybrokerError] = None

    @property
    def resigned(self) -> bool:
        return self.cause is LostCause.RESIGNED

    @property
    def handed_over(self) -> bool:
        return self.cause is LostCause.HANDED_OVER

    def __str__(self) -> str:
        if self.error is not None:
            why = str(self.error)
        elif self.cause is LostCause.HANDED_OVER:
            why = "stepped down: the leadership was handed over"
        else:
            why = "resigned"
        return f"leadership of epoch {self.epoch} lost: {why}"


class Leadership:
    """This replica is the active member of a singleton subscription. Leave with `close()`
    (every settlement queued is applied first) or `resign()` (at once); either way the
    earliest standby is promoted.

    `async with leadership:` leaves on exit: it closes when the block ends normally, and
    resigns at once when the block raises an exception (a cancel too, as a task cancelled on
    SIGTERM is), which goes on. Leaving a leadership that is already lost (an outage, a
    hand-over) is quiet: `lost()` says why."""

    def __init__(
        self, subscription: Subscription, member_id: int, epoch: int, client: Client
    ) -> None:
        self._subscription = subscription
        self._client = client
        self._member_id = member_id
        self._epoch = epoch
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._item = asyncio.Event()
        self._space = asyncio.Event()
        self._wake = asyncio.Event()  # set by close()/resign() to unstall the reader
        self._lost: asyncio.Future[Lost] = asyncio.get_running_loop().create_future()
        self._closed: asyncio.Future[Optional[TinybrokerError]] = (
            asyncio.get_running_loop().create_future()
        )
        self._closing = False
        self._ended = False
        self._callbacks: list[Callable[[Lost], None]] = []
        self._done = asyncio.Event()
        subscription._call.add_done_callback(lambda _call: self._done.set())
        self._reader = asyncio.ensure_future(self._run())

    # --- what the job reads ----------------------------------------------------------------

    @property
    def subscription_id(self) -> str:
        return self._subscription.id

    @property
    def epoch(self) -> int:
        """The fencing token: strictly higher than any earlier leader's on this subscription.
        Pass it with side effects so a store can refuse a deposed leader's late writes."""
        return self._epoch

    @property
    def member_id(self) -> int:
        return self._member_id

    @property
    def is_lost(self) -> bool:
        return self._lost.done()

    async def proclaim(self, metadata: str) -> None:
        """Replaces the metadata watchers and `describe` show for this leader (an address, a
        host name; at most 1024 bytes): the first thing to do after promotion when the address
        is only known then. Returns once the metadata is in place (through gateways: once the
        cluster's line holds it). Raises `NotFoundError` once this leadership is over (a deposed
        leader's member is gone), `InvalidArgumentError` over 1024 bytes,
        `ResourceExhaustedError` when a cluster line's metadata is full
        (docs/semantics.md#member-metadata)."""
        await self._client.proclaim(self.subscription_id, self._member_id, self._epoch, metadata)

    def fence(self, message: Message) -> Message:
        """`message`, fenced by this leadership (for `publish_batch` and publisher streams):
        the broker stores it only while this epoch leads (docs/semantics.md#fenced-publish)."""
        return message.fenced(self.subscription_id, self._epoch)

    async def publish(self, message: Message) -> Published:
        """Publishes `message` fenced by this leadership: stored only while this epoch is the
        subscription's active epoch, checked by the broker as it stores it, so a deposed
        leader's late publish reaches nobody. Raises `FailedPreconditionError` once another
        epoch leads (or none does), naming it (docs/semantics.md#fenced-publish); through
        gateways, `UnavailableError` while this epoch's fence record waits for room in a full
        stream (docs/semantics.md#cluster-fenced-publish)."""
        return await self._client.publish(self.fence(message))

    @property
    def refused_settlements(self) -> int:
        return self._subscription.refused_settlements

    @property
    def buffered_messages(self) -> int:
        return len(self._buffer)

    async def lost(self) -> Lost:
        """Resolves the moment leadership is lost: the stream ended (`LostCause.ENDED`, with
        the error), this replica stepped down (`LostCause.RESIGNED`), or the broker had it hand
        over at a message boundary (`LostCause.HANDED_OVER`: a `Client.hand_over`, or a member
        of higher priority joined; it has left the line). Stop the job when it does. Safe to
        cancel and to await from many tasks."""
        return await asyncio.shield(self._lost)

    async def wait_lost(self, timeout: Optional[float] = None) -> Optional[Lost]:
        """Waits up to `timeout` seconds (None: for ever) for leadership to be lost: returns
        the `Lost`, or None while still leading, as the blocking API's `wait_lost` does. A job
        that runs every interval: `while not await leader.wait_lost(interval): run()`."""
        await asyncio.wait({self._lost}, timeout=timeout)
        return self._lost.result() if self._lost.done() else None

    def on_lost(self, callback: Callable[[Lost], None]) -> None:
        """Calls `callback(lost)` on the event loop when leadership is lost (at once if it is
        already)."""
        if self._lost.done():
            callback(self._lost.result())
        else:
            self._callbacks.append(callback)

    async def next_message(self) -> Optional[Delivery]:
        """The next message delivered to this leader, in the subscription's order; None once
        leadership is lost and every received message was taken."""
        while True:
            if self._buffer:
                delivery = self._buffer.popleft()
                self._space.set()
                return delivery
            if self._ended:
                return None
            self._item.clear()
            await self._item.wait()

    # --- stepping down ---------------------------------------------------------------------

    def resign(self) -> None:
        """Steps down at once: the member's stream is cancelled and the earliest standby is
        promoted. Settlements still queued are dropped (their messages are redelivered)."""
        if not self._lost.done():
            self._set_lost(Lost(self._epoch, LostCause.RESIGNED))
        self._subscription._cancel()
        self._wake.set()

    async def close(self) -> None:
        """Steps down once the broker has applied every settlement queued so far; `lost()`
        resolves with RESIGNED as it starts. Messages not taken are redelivered to the next
        leader. Raises the error that ended the stream if leadership was lost before (queued
        settlements may not have been applied), or the first settlement refused meanwhile;
        returns at once after a hand-over (the member has already left)."""
        if self._lost.done() and not self._closing:
            lost = self._lost.result()
            if lost.error is not None:
                raise lost.error
            return  # resigned before
        if not self._closing:
            self._closing = True
            self._set_lost(Lost(self._epoch, LostCause.RESIGNED))
            self._subscription._begin_close()
            self._wake.set()
        error = await asyncio.shield(self._closed)
        if error is not None:
            raise error

    async def __aenter__(self) -> Leadership:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Resigns at once on an exception; otherwise closes, unless leadership was already
        lost (then quietly: the cause is on `lost()`, and `close()` would raise the outage)."""
        if exc[0] is not None:
            self.resign()
        elif not self._lost.done():
            await self.close()

    # --- the reader ------------------------------------------------------------------------

    def _set_lost(self, lost: Lost) -> None:
        if self._lost.done():
            return
        self._lost.set_result(lost)
        for callback in self._callbacks:
            try:
                callback(lost)
            except Exception:  # a callback's failure must not stop the reader
                log.exception("tinybroker: on_lost callback failed")
        self._callbacks.clear()

    async def _run(self) -> None:
        sub = self._subscription
        failure: Optional[TinybrokerError] = None
        refused: Optional[TinybrokerError] = None
        try:
            while True:
                # A free slot first, then a frame: while the job takes no messages, no frame is
                # read, so the broker sees the pushback; only a dead stream is watched meanwhile.
                while (
                    not self._closing
                    and not sub._cancelled
                    and len(self._buffer) >= MAX_BUFFERED_MESSAGES
                ):
                    self._space.clear()
                    waits = [
                        asyncio.ensure_future(e.wait())
                        for e in (self._space, self._wake, self._done)
                    ]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waits:
                            w.cancel()
                    if self._done.is_set() and not self._closing and not sub._cancelled:
                        raise UnavailableError(
                            "the leader's stream was reset or its connection failed"
                        )
                event = await sub._next_event(False)
                if event is None:
                    if not self._closing and not sub._cancelled:
                        failure = UnavailableError("the broker ended the member's stream")
                    break
                if isinstance(event, Delivery):
                    if self._closing or sub._cancelled:
                        continue  # not handed out: redelivered to the next leader
                    self._buffer.append(event)
                    self._item.set()
                elif isinstance(event, Refused):
                    log.warning(
                        "tinybroker: settlement refused: %s %s", event.system_ids, event.error
                    )
                    if self._closing and refused is None:
                        refused = event.error
                elif isinstance(event, SteppedDown) and not self._closing:
                    # Handed over at a message boundary: the broker saw every ack of this
                    # epoch (or gave what was still held to the successor). Leaving the line
                    # as the Rust client does: a Leadership that ended is not confirmed again.
                    self._set_lost(Lost(self._epoch, LostCause.HANDED_OVER))
                    sub._cancel()
                    break
                elif isinstance(event, (Active, Standby, SteppedDown)):
                    pass  # a step-down while closing: the close reads the stream to its end
        except TinybrokerError as error:
            failure = error
        finally:
            self._ended = True
            self._item.set()
            if failure is not None:
                self._set_lost(Lost(self._epoch, LostCause.ENDED, failure))
            else:
                self._set_lost(Lost(self._epoch, LostCause.RESIGNED))
            if not self._closed.done():
                self._closed.set_result(failure if self._closing and failure else refused)
