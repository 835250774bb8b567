"""Pipelined publishing over one `PublishStream`: `send()` queues a message and hands back a
future of the broker's answer, so thousands of publishes can be in flight on one stream."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import TYPE_CHECKING, Any, Optional

import grpc
import grpc.aio

from ..errors import (
    ResourceExhaustedError,
    TinybrokerError,
    UnavailableError,
    error_from_code,
    error_from_rpc,
)
from ..types import Message, Published, _any
from ._subscription import _EOF

if TYPE_CHECKING:
    from ..v1.broker_pb2_grpc import BrokerStub

__all__ = ["MAX_PENDING_PUBLISHES", "Publisher"]

#: Publishes a `Publisher` may have sent and not yet had answered; past it `send()` waits.
MAX_PENDING_PUBLISHES = 4096


class Publisher:
    """A streaming publisher. Answers come back in send order; a refused message does not end
    the stream. Safe to share between tasks (their messages interleave in `send` order)."""

    def __init__(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        self._call = call
        self._pending: collections.deque[asyncio.Future[Published]] = collections.deque()
        self._room = asyncio.Semaphore(MAX_PENDING_PUBLISHES)
        self._lock = asyncio.Lock()
        self._failure: Optional[TinybrokerError] = None
        self._closed = False
        self._reader = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def _open(cls, stub: BrokerStub, metadata: tuple[tuple[str, str], ...]) -> Publisher:
        call: grpc.aio.StreamStreamCall[Any, Any] = _any(stub).PublishStream(metadata=metadata)
        return cls(call)

    async def send(self, message: Message) -> asyncio.Future[Published]:
        """Queues `message` and returns its pending answer (await it for the `Published`, or
        the refusal as an exception). Waits only while `MAX_PENDING_PUBLISHES` are unanswered.
        Raises `UnavailableError` when the stream has ended."""
        request = message._to_pb()
        await self._room.acquire()
        async with self._lock:
            if self._failure is not None or self._closed:
                self._room.release()
                raise UnavailableError(
                    f"the publish stream ended{f' ({self._failure})' if self._failure else ''}"
                )
            answer: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
            self._pending.append(answer)
            try:
                await self._call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError):
                # The reader gives every pending answer the stream's end.
                pass
        return answer

    async def publish(self, message: Message) -> Published:
        """Publishes `message` and waits for its answer (no pipelining)."""
        return await (await self.send(message))

    def _answered(self) -> asyncio.Future[Published]:
        self._room.release()
        return self._pending.popleft()

    async def _read_loop(self) -> None:
        failure: TinybrokerError
        try:
            while True:
                response: Any = await self._call.read()
                if response is _EOF:
                    failure = UnavailableError("the broker ended the publish stream")
                    break
                if not self._pending:
                    failure = UnavailableError("the broker answered a publish that was not sent")
                    break
                answer = self._answered()
                if answer.done():
                    continue
                if response.code == 0:
                    answer.set_result(Published(response.system_id, response.queued_for))
                else:
                    answer.set_exception(error_from_code(response.code, response.message))
        except grpc.RpcError as error:
            failure = error_from_rpc(error)
        except asyncio.CancelledError:
            failure = UnavailableError("the publisher was closed")
        self._failure = failure
        # The broker answers every request it read before ending a stream over one too large
        # to read (RESOURCE_EXHAUSTED): that is the oldest unanswered one, and those after it
        # were never read, so never published. Any other end goes to every pending send.
        rest: TinybrokerError = failure
        if isinstance(failure, ResourceExhaustedError) and self._pending:
            oldest = self._answered()
            if not oldest.done():
                oldest.set_exception(failure)
            rest = UnavailableError(
                f"not published: the publish stream ended ({failure}) "
                "before the broker read this message"
            )
        while self._pending:
            answer = self._answered()
            if not answer.done():
                answer.set_exception(rest)

    async def close(self) -> None:
        """Waits for every pending answer, then ends the stream."""
        async with self._lock:
            self._closed = True
        pending = list(self._pending)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.done_writing()
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), 5)
        except asyncio.TimeoutError:
            self._call.cancel()

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
