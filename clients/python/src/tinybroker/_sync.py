"""The blocking API: a thin wrapper that runs the asyncio client (`tinybroker.aio`) on a
private event loop thread, one per `Client`. Every behaviour is the asyncio client's; each
call here hands a coroutine to that loop and waits for its result.

Timeouts (`timeout=` seconds) raise the builtin `TimeoutError` and leave the stream as it was:
a read that timed out keeps its frame for the next read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, Callable, Optional, TypeVar, Union

from . import aio
from .aio._client import _election_options, _message
from .errors import TinybrokerError
from .events import Delivery, Event
from .types import (
    Activation,
    HandedOver,
    LeaderState,
    Listing,
    Message,
    Payload,
    Published,
    SubscriptionInfo,
    SubscriptionOptions,
)

__all__ = ["Client", "Leadership", "LeadershipWatch", "Publisher", "Subscription"]

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="tinybroker-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a blocking tinybroker call was made on the client's own loop thread (from a "
                "callback such as on_standby): use the asyncio API there"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout} s") from None
        except BaseException:
            # KeyboardInterrupt or an exception from a signal handler: stop the coroutine too.
            future.cancel()
            raise

    def call(self, function: Callable[..., Any], *args: Any) -> None:
        """Runs `function(*args)` on the loop, in order with every other call and `run`."""
        self.loop.call_soon_threadsafe(function, *args)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            try:
                self.run(_cancel_all(), timeout=5)
            except (TimeoutError, RuntimeError):
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_all() -> None:
    """Ends every task still running on the loop (readers, writers of streams left open)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Client:
    """A blocking connection to one broker: `Client(url)` connects at once. Close it with
    `close()` or `with Client(url) as client:`. Methods raise `TinybrokerError` subclasses."""

    def __init__(self, url: str, options: Optional[aio.ClientOptions] = None) -> None:
        self._loop = _Loop()
        try:
            self._client = self._loop.run(aio.Client.connect(url, options))
        except BaseException:
            self._loop.stop()
            raise

    @classmethod
    def connect(cls, url: str, options: Optional[aio.ClientOptions] = None) -> Client:
        """Same as `Client(url, options)`, named like the asyncio API's."""
        return cls(url, options)

    @property
    def url(self) -> str:
        return self._client.url

    @property
    def aio(self) -> aio.Client:
        """The asyncio client underneath (use it only on `self.loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop.loop

    def close(self) -> None:
        """Closes the connection and stops the loop thread (close subscriptions first: their
        queued settlements are lost)."""
        if not self._loop.loop.is_closed():
            try:
                self._loop.run(self._client.close(), timeout=10)
            finally:
                self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- publishing ------------------------------------------------------------------------

    def publish(
        self,
        message: Union[Message, str],
        payload: Payload = b"",
        headers: Optional[dict[str, str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> Published:
        """Publishes one message: `publish(Message(...))` or `publish(topic, payload)`."""
        return self._loop.run(self._client.publish(_message(message, payload, headers)), timeout)

    def publish_batch(
        self, messages: Iterable[Message], *, timeout: Optional[float] = None
    ) -> list[Published]:
        """Publishes many messages in one call, in order; one invalid message refuses them all."""
        return self._loop.run(self._client.publish_batch(list(messages)), timeout)

    def publisher(self) -> Publisher:
        """Opens a streaming publisher for pipelined publishes."""
        return Publisher(self._loop, self._loop.run(self._client.publisher()))

    # --- consuming -------------------------------------------------------------------------

    def subscribe(
        self, options: SubscriptionOptions, *, timeout: Optional[float] = None
    ) -> Subscription:
        """Joins a subscription over a `Consume` stream (see `tinybroker.aio.Client.subscribe`)."""
        return Subscription(self._loop, self._loop.run(self._client.subscribe(options), timeout))

    def ack(
        self,
        subscription_id: str,
        system_id: int,
        member_id: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Unary ack, fenced by `member_id` (pass it) or by the connection."""
        self._loop.run(self._client.ack(subscription_id, system_id, member_id), timeout)

    def nack(
        self,
        subscription_id: str,
        system_id: int,
        member_id: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Unary nack, fenced like `ack`."""
        self._loop.run(self._client.nack(subscription_id, system_id, member_id), timeout)

    # --- leader election -------------------------------------------------------------------

    def proclaim(
        self,
        subscription_id: str,
        member_id: int,
        epoch: int,
        metadata: str,
        *,
        timeout: Optional[float] = None,
    ) -> None:
        """Replaces an active member's metadata (see `tinybroker.aio.Client.proclaim`)."""
        self._loop.run(self._client.proclaim(subscription_id, member_id, epoch, metadata), timeout)

    def elect(
        self,
        subscription_id: str,
        group: str,
        on_standby: Optional[Callable[[int], None]] = None,
        *,
        priority: int = 0,
        metadata: str = "",
        timeout: Optional[float] = None,
    ) -> Leadership:
        """Waits in line and returns once this replica leads (see
        `tinybroker.aio.Client.elect`: the same settings as the Rust client's `elect`, on the
        topic `election.<id>`, and a rejoin with backoff while the broker is away; `priority`
        orders the line, `metadata` is what watchers see of this leader). `on_standby` runs on
        the client's loop thread. With `timeout`, raises `TimeoutError` and leaves the line."""
        return Leadership(
            self._loop,
            self._loop.run(
                self._client.elect(
                    subscription_id, group, on_standby, priority=priority, metadata=metadata
                ),
                timeout,
            ),
        )

    def elect_with(
        self,
        options: SubscriptionOptions,
        on_standby: Optional[Callable[[int], None]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> Leadership:
        """As `elect`, for a singleton subscription on real topics."""
        return Leadership(
            self._loop, self._loop.run(self._client.elect_with(options, on_standby), timeout)
        )

    def leaderships(
        self,
        subscription_id: str,
        group: str,
        on_standby: Optional[Callable[[int], None]] = None,
        *,
        priority: int = 0,
        metadata: str = "",
    ) -> Iterator[Leadership]:
        """Every leadership this replica gets, one after the other, forever (each lost,
        resigned or handed over, then elected again with `priority` and `metadata`, as
        `elect`)::

        for leader in client.leaderships("report", "reporters"):
            with leader:  # an exception (KeyboardInterrupt on SIGTERM too) resigns at once
                while not leader.wait_lost(timeout=60):
                    run_the_job(leader.epoch)
        """
        return self.leaderships_with(
            _election_options(subscription_id, group, priority, metadata), on_standby
        )

    def leaderships_with(
        self,
        options: SubscriptionOptions,
        on_standby: Optional[Callable[[int], None]] = None,
    ) -> Iterator[Leadership]:
        """As `leaderships`, each leadership elected with `elect_with(options, on_standby)`."""
        while True:
            leader = self.elect_with(options, on_standby)
            try:
                yield leader
            finally:
                if not leader.is_lost:
                    with contextlib.suppress(TinybrokerError):
                        leader.close()

    def hand_over(self, subscription_id: str, *, timeout: Optional[float] = None) -> HandedOver:
        """Has the active member of a SINGLETON subscription hand over at a message boundary and
        returns who took over (see `tinybroker.aio.Client.hand_over`). `timeout` bounds the
        wait: the hand-over itself goes on (a `TimeoutError` here does not call it off)."""
        return self._loop.run(self._client.hand_over(subscription_id), timeout)

    # --- inspection ------------------------------------------------------------------------

    def describe(
        self, subscription_id: str, *, timeout: Optional[float] = None
    ) -> SubscriptionInfo:
        return self._loop.run(self._client.describe(subscription_id), timeout)

    def list(self, *, timeout: Optional[float] = None) -> Listing:
        return self._loop.run(self._client.list(), timeout)

    def watch_leadership(
        self, subscription_id: str, *, rejoin: bool = False, timeout: Optional[float] = None
    ) -> LeadershipWatch:
        """Follows a SINGLETON subscription's leadership without joining it (see
        `tinybroker.aio.Client.watch_leadership`); with `rejoin=True` it watches again after a
        broker restart or the subscription's end, with backoff, as `elect` rejoins. `timeout`
        bounds the wait for the server's first answer."""
        return LeadershipWatch(
            self._loop,
            self._loop.run(self._client.watch_leadership(subscription_id, rejoin=rejoin), timeout),
        )

    def delete_subscription(self, subscription_id: str, *, timeout: Optional[float] = None) -> int:
        """See `tinybroker.aio.Client.delete_subscription`."""
        return self._loop.run(self._client.delete_subscription(subscription_id), timeout)


class Subscription:
    """A member of a subscription (see `tinybroker.aio.Subscription`). Iterate it for its
    deliveries; `close()` (or leaving a `with` block) returns once the broker applied every
    ack. `Delivery.ack()` may be called from any thread."""

    def __init__(self, loop: _Loop, subscription: aio.Subscription) -> None:
        self._loop = loop
        self._sub = subscription
        sub = subscription

        def settle(nack: bool, system_id: int) -> None:
            # Checked here for a clear error, applied on the loop in call order, so a close()
            # made after an ack sees the ack queued.
            if sub.ended or sub._closing or sub._writer_failed or sub._cancelled:
                sub._queue_settle(nack, system_id)  # raises UnavailableError
            loop.call(_settle_quietly, sub, nack, system_id)

        subscription._settle_fn = settle

    @property
    def id(self) -> str:
        return self._sub.id

    @property
    def member_id(self) -> int:
        return self._sub.member_id

    @property
    def epoch(self) -> int:
        return self._sub.epoch

    @property
    def is_active(self) -> bool:
        return self._sub.is_active

    @property
    def refused_settlements(self) -> int:
        return self._sub.refused_settlements

    def active(self, timeout: Optional[float] = None) -> Activation:
        """Waits until this member is active; returns its member id and epoch."""
        return self._loop.run(self._sub.active(), timeout)

    def next_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None once the stream ended cleanly or after `interrupt()`."""
        return self._loop.run(self._sub.next_event(), timeout)

    def next_delivery(self, timeout: Optional[float] = None) -> Optional[Delivery]:
        """The next delivery; None once the stream ended cleanly or after `interrupt()`."""
        return self._loop.run(self._sub.next_delivery(), timeout)

    def __iter__(self) -> Iterator[Delivery]:
        while True:
            delivery = self.next_delivery()
            if delivery is None:
                return
            yield delivery

    def interrupt(self) -> None:
        """Stops the iteration (the current and later reads return None) without ending the
        stream. Safe from a signal handler and from any thread; then call `close()`."""
        self._loop.call(self._sub.interrupt)

    def close(self, timeout: Optional[float] = None) -> None:
        """Leaves once the broker has applied every settlement queued so far."""
        self._loop.run(self._sub.close(), timeout)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            with contextlib.suppress(TinybrokerError):
                self.close()


class LeadershipWatch:
    """A watch of a SINGLETON subscription's leadership (see `tinybroker.aio.LeadershipWatch`).
    `next(timeout)` returns the next state (the current one first); iterate it for every state.
    The watch ends with the error `next()` raises (`NotFoundError` once the subscription is
    gone, `UnavailableError` when the server shuts down), unless opened with `rejoin=True`,
    which watches again instead. `close()` (or leaving a `with` block)
    ends it from any thread, and an iteration over it then stops; a watch dropped without
    `close()` is cancelled when it is garbage."""

    def __init__(self, loop: _Loop, watch: aio.LeadershipWatch) -> None:
        self._loop = loop
        self._watch = watch

    @property
    def subscription_id(self) -> str:
        return self._watch.subscription_id

    @property
    def closed(self) -> bool:
        return self._watch.closed

    def next(self, timeout: Optional[float] = None) -> LeaderState:
        """The next state; with `timeout`, `TimeoutError` when none came (the watch goes on)."""
        return self._loop.run(self._watch.next(), timeout)

    def __iter__(self) -> Iterator[LeaderState]:
        while True:
            try:
                state = self.next()
            except TinybrokerError:
                if self._watch.closed:
                    return
                raise
            yield state

    def close(self, timeout: Optional[float] = None) -> None:
        """Ends the watch (its call is cancelled); nothing to do once the client is closed."""
        if not self._loop.loop.is_closed():
            self._loop.run(self._watch.close(), timeout)

    def __enter__(self) -> LeadershipWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Cancelled on the loop thread, where the call lives.
        loop, watch = getattr(self, "_loop", None), getattr(self, "_watch", None)
        if loop is not None and watch is not None and not watch.closed:
            with contextlib.suppress(RuntimeError):  # the loop has been closed meanwhile
                loop.call(watch._cancel)


def _settle_quietly(sub: aio.Subscription, nack: bool, system_id: int) -> None:
    try:
        sub._queue_settle(nack, system_id)
    except TinybrokerError:
        pass  # the stream ended meanwhile: the message is redelivered


class Leadership:
    """This replica leads (see `tinybroker.aio.Leadership`). `wait_lost(timeout)` is the lost
    signal for blocking code.

    `with leadership:` leaves on exit: it closes when the block ends normally, and resigns at
    once when the block raises an exception (a `KeyboardInterrupt` from Ctrl-C or SIGTERM
    too), which goes on. Leaving a leadership that is already lost (an outage, a hand-over) is
    quiet: `wait_lost()` returns the `Lost` that says why."""

    def __init__(self, loop: _Loop, leadership: aio.Leadership) -> None:
        self._loop = loop
        self._leader = leadership
        self._lost_event = threading.Event()
        self._lost: Optional[aio.Lost] = None
        self._callbacks: list[Callable[[aio.Lost], None]] = []
        self._lock = threading.Lock()
        loop.call(leadership.on_lost, self._on_lost)

    def _on_lost(self, lost: aio.Lost) -> None:
        with self._lock:
            self._lost = lost
            callbacks, self._callbacks = self._callbacks, []
        self._lost_event.set()
        for callback in callbacks:
            callback(lost)

    @property
    def subscription_id(self) -> str:
        return self._leader.subscription_id

    @property
    def epoch(self) -> int:
        """The fencing token: pass it with side effects so a store can refuse a deposed
        leader's late writes."""
        return self._leader.epoch

    @property
    def member_id(self) -> int:
        return self._leader.member_id

    @property
    def is_lost(self) -> bool:
        return self._lost_event.is_set()

    @property
    def refused_settlements(self) -> int:
        return self._leader.refused_settlements

    def proclaim(self, metadata: str, *, timeout: Optional[float] = None) -> None:
        """Replaces the metadata watchers and `describe` show for this leader (see
        `tinybroker.aio.Leadership.proclaim`)."""
        self._loop.run(self._leader.proclaim(metadata), timeout)

    def fence(self, message: Message) -> Message:
        """`message`, fenced by this leadership (see `tinybroker.aio.Leadership.fence`)."""
        return self._leader.fence(message)

    def publish(self, message: Message, *, timeout: Optional[float] = None) -> Published:
        """Publishes `message` fenced by this leadership (see
        `tinybroker.aio.Leadership.publish`)."""
        return self._loop.run(self._leader.publish(message), timeout)

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[aio.Lost]:
        """Waits up to `timeout` seconds for leadership to be lost: returns the `Lost` (its
        `cause` tells a resignation from an outage or a hand-over), or None if still leading."""
        if self._lost_event.wait(timeout):
            return self._lost
        return None

    def on_lost(self, callback: Callable[[aio.Lost], None]) -> None:
        """Calls `callback(lost)` when leadership is lost (on the loop thread; at once, on
        this thread, if it is already)."""
        with self._lock:
            if self._lost is None:
                self._callbacks.append(callback)
                return
            lost = self._lost
        callback(lost)

    def next_message(self, timeout: Optional[float] = None) -> Optional[Delivery]:
        """The next message delivered to this leader (for `elect_with` on real topics)."""
        delivery = self._loop.run(self._leader.next_message(), timeout)
        if delivery is not None and delivery._settle is not None:
            inner, loop = delivery._settle, self._loop
            delivery._settle = lambda nack, system_id: loop.call(_quietly, inner, nack, system_id)
        return delivery

    def resign(self) -> None:
        """Steps down at once: the earliest standby is promoted, and `wait_lost()` returns a
        `Lost` with `LostCause.RESIGNED` (unless it was lost before)."""
        self._loop.run(_call(self._leader.resign))
        self._lost_event.wait(10)

    def close(self, timeout: Optional[float] = None) -> None:
        """Steps down once the broker applied every settlement queued so far. Raises the
        error that ended the stream if leadership was lost before (queued settlements may not
        have been applied; see `tinybroker.aio.Leadership.close`)."""
        self._loop.run(self._leader.close(), timeout)

    def __enter__(self) -> Leadership:
        return self

    def __exit__(self, *exc: object) -> None:
        """Resigns at once on an exception; otherwise closes, unless leadership was already
        lost (then quietly: the cause is on the `Lost`, and `close()` would raise the outage)."""
        if exc[0] is not None:
            self.resign()
        else:
            self._loop.run(self._leader.__aexit__(None, None, None))


def _quietly(settle: Callable[[bool, int], None], nack: bool, system_id: int) -> None:
    with contextlib.suppress(TinybrokerError):
        settle(nack, system_id)


async def _call(function: Callable[[], T]) -> T:
    return function()


class Publisher:
    """A blocking streaming publisher: `send()` queues a message and returns a
    `concurrent.futures.Future` of its answer; `publish()` waits for it."""

    def __init__(self, loop: _Loop, publisher: aio.Publisher) -> None:
        self._loop = loop
        self._publisher = publisher

    def send(self, message: Message) -> concurrent.futures.Future[Published]:
        """Queues `message` (waits while 4096 are unanswered) and returns its pending answer."""
        answer: concurrent.futures.Future[Published] = concurrent.futures.Future()

        async def queue() -> None:
            pending = await self._publisher.send(message)

            def copy(done: asyncio.Future[Published]) -> None:
                if done.cancelled():
                    answer.cancel()
                elif done.exception() is not None:
                    answer.set_exception(done.exception())
                else:
                    answer.set_result(done.result())

            pending.add_done_callback(copy)

        self._loop.run(queue())
        return answer

    def publish(self, message: Message, timeout: Optional[float] = None) -> Published:
        """Publishes `message` and waits for its answer."""
        return self._loop.run(self._publisher.publish(message), timeout)

    def close(self, timeout: Optional[float] = None) -> None:
        """Waits for every pending answer, then ends the stream."""
        self._loop.run(self._publisher.close(), timeout)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
