"""The asyncio client: connection, publishing, subscriptions, elections, inspection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, TypeVar, Union

import grpc
import grpc.aio

from ..errors import (
    InvalidArgumentError,
    TinybrokerError,
    TransportError,
    UnavailableError,
    error_from_rpc,
)
from ..events import Active, Standby
from ..types import (
    HandedOver,
    Listing,
    Message,
    Mode,
    Payload,
    Published,
    SubscriptionInfo,
    SubscriptionOptions,
    _broker_from_pb,
    _info_from_pb,
)
from ..v1 import broker_pb2 as pb
from ..v1.broker_pb2_grpc import BrokerStub
from ._election import INITIAL_BACKOFF, MAX_BACKOFF, Leadership
from ._publisher import Publisher
from ._subscription import Subscription
from ._watch import LeadershipWatch

__all__ = ["Client", "ClientOptions", "channel_options"]

log = logging.getLogger("tinybroker")

T = TypeVar("T")


@dataclass(frozen=True)
class ClientOptions:
    """How to reach the broker. The defaults are the Rust client's: HTTP/2 keepalive on (a ping
    every 10 s, 10 s to answer, also while no call is open), so a client behind a partition
    notices within about 20 s, as the broker does; 5 s to connect."""

    #: Sent as `authorization: Bearer <token>` on every call.
    token: Optional[str] = None
    #: PEM of the CA to trust for an `https://` URL; None uses the system's roots.
    ca_pem: Optional[bytes] = None
    #: PEM certificate chain and key for mutual TLS.
    client_cert_pem: Optional[bytes] = None
    client_key_pem: Optional[bytes] = None
    #: Keepalive ping interval in seconds; None turns keepalive off (a vanished broker then
    #: goes unnoticed until TCP gives up, which can take many minutes).
    keepalive_interval: Optional[float] = 10.0
    #: How long a keepalive ping may go unanswered before the connection, and every stream on
    #: it, fails.
    keepalive_timeout: float = 10.0
    #: Bound on establishing the connection in `connect()`.
    connect_timeout: float = 5.0
    #: Give this client a connection of its own, as the Rust client has (grpcio otherwise
    #: shares one TCP connection between channels to the same target with the same settings,
    #: which changes what the two-field ack's connection fence means). See docs/clients.md.
    own_connection: bool = True
    #: Extra grpcio channel arguments, appended last (they win).
    channel_args: tuple[tuple[str, Any], ...] = ()


def channel_options(options: ClientOptions) -> list[tuple[str, Any]]:
    """The grpcio channel arguments a client uses: keepalive, reconnect backoff, sizes."""
    args: list[tuple[str, Any]] = [
        # Messages are bounded by the broker's own limit, not grpcio's 4 MiB default.
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        # Reconnect quickly after a broker restart (grpcio's default starts at 1 s and grows
        # to 120 s); the election's own rejoin backoff is 50 ms doubling to 2 s.
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if options.keepalive_interval is not None:
        args += [
            ("grpc.keepalive_time_ms", int(options.keepalive_interval * 1000)),
            ("grpc.keepalive_timeout_ms", int(options.keepalive_timeout * 1000)),
            # grpcio (checked on 1.85) times the keepalive ping's answer with the ping timeout,
            # 60 s by default, not with keepalive_timeout_ms alone: set both.
            ("grpc.http2.ping_timeout_ms", int(options.keepalive_timeout * 1000)),
            # Ping while no call is open too (tonic's keep_alive_while_idle), and without a
            # limit on pings between data frames (grpcio stops after 2 by default).
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    if options.own_connection:
        args.append(("grpc.use_local_subchannel_pool", 1))
    args += list(options.channel_args)
    return args


def _target(url: str) -> tuple[str, bool]:
    """`http://host:port` (or bare `host:port`) → ("host:port", False); `https://` → True."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"bad broker URL {url!r}: expected http://HOST:PORT")
    secure = False
    rest = url
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if scheme not in ("http", "https"):
            raise InvalidArgumentError(f"bad broker URL {url!r}: the scheme is http or https")
        secure = scheme == "https"
    rest = rest.rstrip("/")
    if not rest or "/" in rest or any(c.isspace() for c in rest):
        raise InvalidArgumentError(f"bad broker URL {url!r}: expected http://HOST:PORT")
    host, sep, port = rest.rpartition(":")
    if sep and host and not host.endswith("]") and ":" in host:
        raise InvalidArgumentError(f"bad broker URL {url!r}: put an IPv6 address in brackets")
    if not sep or not host:
        port_number = 443 if secure else 80
        host = rest
    else:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"bad broker URL {url!r}: bad port {port!r}")
        port_number = int(port)
    return f"{host}:{port_number}", secure


def _build(message: Callable[..., T], **fields: Any) -> T:
    """A request message; a field of the wrong type or out of range is InvalidArgumentError."""
    try:
        return message(**fields)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"bad request: {error}") from None


def _metadata(token: Optional[str]) -> tuple[tuple[str, str], ...]:
    if token is None:
        return ()
    value = f"Bearer {token}"
    if not isinstance(token, str) or not all(32 <= ord(c) < 127 for c in value):
        raise InvalidArgumentError("the token must be printable ASCII")
    return (("authorization", value),)


class Client:
    """A connection to one broker. Create it with `await Client.connect(url)`; close it with
    `await client.close()` or `async with`. Every method raises a `TinybrokerError` subclass."""

    def __init__(
        self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...], url: str
    ) -> None:
        self._channel = channel
        self._stub = BrokerStub(channel)
        self._metadata = metadata
        self._url = url

    @classmethod
    async def connect(cls, url: str, options: Optional[ClientOptions] = None) -> Client:
        """Connects (and waits until connected, up to `connect_timeout`). Raises
        `InvalidArgumentError` for a bad URL, token or TLS setting, `TransportError` when the
        broker cannot be reached."""
        options = options or ClientOptions()
        target, secure = _target(url)
        metadata = _metadata(options.token)
        args = channel_options(options)
        if secure or options.ca_pem is not None:
            try:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=options.ca_pem,
                    private_key=options.client_key_pem,
                    certificate_chain=options.client_cert_pem,
                )
            except (TypeError, ValueError) as error:
                raise InvalidArgumentError(f"TLS settings: {error}") from None
            channel = grpc.aio.secure_channel(target, credentials, options=args)
        else:
            channel = grpc.aio.insecure_channel(target, options=args)
        try:
            await _wait_connected(channel, options.connect_timeout, url)
        except BaseException:
            await channel.close(None)
            raise
        return cls(channel, metadata, url)

    @property
    def url(self) -> str:
        return self._url

    @property
    def stub(self) -> BrokerStub:
        """The generated stub, for calls this class does not wrap (pass `metadata=` yourself)."""
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries (the bearer token)."""
        return self._metadata

    async def close(self) -> None:
        """Closes the connection; streams still open on it end at once (their queued
        settlements are lost: close subscriptions first)."""
        await self._channel.close(None)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, call: Callable[..., Any], request: Any) -> Any:
        try:
            return await call(request, metadata=self._metadata)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    # --- publishing ------------------------------------------------------------------------

    async def publish(
        self,
        message: Union[Message, str],
        payload: Payload = b"",
        headers: Optional[dict[str, str]] = None,
    ) -> Published:
        """Publishes one message: `publish(Message(...))` or `publish(topic, payload)`.
        Raises `InvalidArgumentError` for a bad topic, `ResourceExhaustedError` when a queue is
        full or the message is too large, `UnavailableError` when the broker is gone."""
        message = _message(message, payload, headers)
        reply = await self._unary(self._stub.Publish, message._to_pb())
        return Published(reply.system_id, reply.queued_for)

    async def publish_batch(self, messages: Iterable[Message]) -> list[Published]:
        """Publishes many messages in one call, in order; one invalid message refuses them all."""
        request = pb.PublishBatchRequest(messages=[m._to_pb() for m in messages])
        reply = await self._unary(self._stub.PublishBatch, request)
        return [Published(r.system_id, r.queued_for) for r in reply.results]

    async def publisher(self) -> Publisher:
        """Opens a streaming publisher (`PublishStream`) for pipelined publishes."""
        try:
            return await Publisher._open(self._stub, self._metadata)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    # --- consuming -------------------------------------------------------------------------

    async def subscribe(self, options: SubscriptionOptions) -> Subscription:
        """Joins a subscription over a `Consume` stream. Returns once the broker accepted the
        member, before its confirmation is read (`member_id` is 0 until then): await
        `active()` for the member id and epoch. Raises `InvalidArgumentError` for bad options,
        `FailedPreconditionError` when they differ from the live subscription's,
        `AlreadyExistsError` for a live broadcast id, `ResourceExhaustedError` at a limit."""
        return await Subscription._open(self._stub, options, self._metadata)

    async def ack(
        self, subscription_id: str, system_id: int, member_id: Optional[int] = None
    ) -> None:
        """Acks with the unary `Ack`, for acks that travel apart from the member's stream (a
        `Delivery` acks itself on its stream). Pass `member_id` (from the confirmation) as the
        fence; without it the broker fences by connection (see docs/clients.md). Raises
        `NotFoundError` when the message is not in flight, `FailedPreconditionError` when the
        ack is stale."""
        await self._unary(
            self._stub.Ack,
            _build(
                pb.Ack,
                subscription_id=subscription_id,
                system_id=system_id,
                member_id=member_id or 0,
            ),
        )

    async def nack(
        self, subscription_id: str, system_id: int, member_id: Optional[int] = None
    ) -> None:
        """Gives a message back for redelivery with the unary `Nack`; fenced like `ack`."""
        await self._unary(
            self._stub.Nack,
            _build(
                pb.Nack,
                subscription_id=subscription_id,
                system_id=system_id,
                member_id=member_id or 0,
            ),
        )

    # --- leader election -------------------------------------------------------------------

    async def proclaim(
        self, subscription_id: str, member_id: int, epoch: int, metadata: str
    ) -> None:
        """Replaces the metadata of member `member_id`, active at `epoch` on SINGLETON
        subscription `subscription_id` (the confirmation's ids): what `Leadership.proclaim`
        does for a subscription joined by hand (docs/semantics.md#member-metadata). Raises
        `FailedPreconditionError` when that member is not active at that epoch (a standby, a
        deposed leader, another epoch), `NotFoundError` for an unknown member or subscription,
        `InvalidArgumentError` for metadata over 1024 bytes or a subscription not SINGLETON,
        `ResourceExhaustedError` when a cluster line's metadata is full."""
        if not isinstance(metadata, str):
            raise InvalidArgumentError(f"metadata is a str, not {type(metadata).__name__}")
        await self._unary(
            self._stub.Proclaim,
            _build(
                pb.ProclaimRequest,
                subscription_id=subscription_id,
                member_id=member_id,
                epoch=epoch,
                metadata=metadata,
            ),
        )

    async def elect(
        self,
        subscription_id: str,
        group: str,
        on_standby: Optional[Callable[[int], None]] = None,
        *,
        priority: int = 0,
        metadata: str = "",
    ) -> Leadership:
        """Joins the line for leadership of `subscription_id` among the replicas of `group`
        and resolves when this replica leads. The settings are exactly the Rust client's
        `elect()`: `SubscriptionOptions.election(subscription_id, group)` (the topic
        `election.<id>`), so Python and Rust replicas share one line. `on_standby(position)`
        hears the place in line (1 = next).
        `priority` is this replica's place in the line's order (`SubscriptionOptions.priority`:
        one above the leader's takes over from it at a message boundary, and the leader's
        `lost()` says HANDED_OVER; docs/semantics.md#priority). `metadata` is what watchers and
        `describe` show of this replica while it leads (an address; at most 1024 bytes;
        docs/semantics.md#member-metadata).
        If the stream fails while waiting (the broker restarts, the connection drops) the
        replica rejoins the end of the line, backing off from 50 ms to 2 s. Raises only
        refusals a retry would repeat (`RefusedError`: settings that differ, a bad id, a
        token, a limit; `InvalidArgumentError` for a bad priority or metadata)."""
        return await self.elect_with(
            _election_options(subscription_id, group, priority, metadata), on_standby
        )

    async def elect_with(
        self,
        options: SubscriptionOptions,
        on_standby: Optional[Callable[[int], None]] = None,
    ) -> Leadership:
        """As `elect`, for a singleton subscription on real topics (ordered consumption of a
        firehose: `Leadership.next_message()` yields its messages). Its mode is forced to
        singleton, with standby notices."""
        options = replace(options, mode=Mode.SINGLETON, notify_standby=True)
        backoff = INITIAL_BACKOFF
        while True:
            joined = False
            try:
                subscription = await self.subscribe(options)
                joined = True
                leadership = await _await_promotion(self, subscription, on_standby)
                if leadership is not None:
                    return leadership
                error: TinybrokerError = UnavailableError("the stream ended before promotion")
            except TinybrokerError as failure:
                if not failure.transient:
                    raise
                error = failure
            if joined:
                # It was in line, so the broker was reachable: start over gently.
                backoff = INITIAL_BACKOFF
            log.warning(
                "tinybroker: election %s: rejoining in %.2fs: %s",
                options.subscription_id,
                backoff,
                error,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def leaderships(
        self,
        subscription_id: str,
        group: str,
        on_standby: Optional[Callable[[int], None]] = None,
        *,
        priority: int = 0,
        metadata: str = "",
    ) -> AsyncIterator[Leadership]:
        """Every leadership this replica gets, one after the other, forever: elects (with
        `priority` and `metadata`, as `elect`), yields the leadership, and once the loop body
        is done with it (typically: it was lost, resigned, or handed over) steps down if needed
        and joins the line again. The shortest correct scheduler::

            async for leader in client.leaderships("report", "reporters"):
                async with leader:  # an exception (a cancel) resigns at once
                    await run_until_lost(leader)
        """
        return self.leaderships_with(
            _election_options(subscription_id, group, priority, metadata), on_standby
        )

    async def leaderships_with(
        self,
        options: SubscriptionOptions,
        on_standby: Optional[Callable[[int], None]] = None,
    ) -> AsyncIterator[Leadership]:
        """As `leaderships`, each leadership elected with `elect_with(options, on_standby)`:
        any settings (`SubscriptionOptions.election(id, group).with_(...)`), or a singleton
        subscription on real topics."""
        while True:
            leader = await self.elect_with(options, on_standby)
            try:
                yield leader
            finally:
                if not leader.is_lost:
                    with contextlib.suppress(TinybrokerError):
                        await leader.close()

    async def hand_over(self, subscription_id: str) -> HandedOver:
        """Asks the active member of SINGLETON subscription `subscription_id` to hand over at a
        message boundary, and returns once it did (docs/semantics.md#hand-over): the active
        member is sent nothing more, settles what it holds (within the broker's
        `--handover-timeout`, past which what it still holds goes to its successor with
        `attempt` + 1), steps down to the back of its priority in line (its stream gets a
        `SteppedDown`; a `Leadership` is lost with `LostCause.HANDED_OVER` and leaves the
        line), and the first standby in line is promoted with a higher epoch. Raises
        `FailedPreconditionError` with no active member, no standby of the active member's
        priority or higher, when the standbys left meanwhile, or for a subscription not
        SINGLETON; `NotFoundError` for an unknown id, `InvalidArgumentError` for a malformed
        one; through gateways also `UnavailableError` when the answering gateway could not see
        the outcome (it may still happen)."""
        reply = await self._unary(
            self._stub.HandOver,
            _build(pb.HandOverRequest, subscription_id=subscription_id),
        )
        return HandedOver(
            reply.previous_member_id,
            reply.previous_epoch,
            reply.member_id,
            reply.epoch,
            reply.failed_over,
        )

    # --- inspection ------------------------------------------------------------------------

    async def describe(self, subscription_id: str) -> SubscriptionInfo:
        """One subscription: members, who is active, epoch, depths, counters. Raises
        `NotFoundError` when there is none."""
        reply = await self._unary(
            self._stub.DescribeSubscription,
            _build(pb.DescribeSubscriptionRequest, subscription_id=subscription_id),
        )
        return _info_from_pb(reply)

    async def watch_leadership(
        self, subscription_id: str, *, rejoin: bool = False
    ) -> LeadershipWatch:
        """Follows SINGLETON subscription `subscription_id`'s leadership without joining it
        (docs/semantics.md#watching-leadership): a router that sends writes to the current
        leader, a dashboard. Returns once the server sent the current state, which the first
        `next()` returns; then one state per change. Through gateways the watch follows the
        whole cluster from any gateway. Raises `NotFoundError` for an unknown subscription,
        `FailedPreconditionError` for a BROADCAST or QUEUE one, `InvalidArgumentError` for a
        malformed id.

        With `rejoin=True` the watch outlives broker restarts and the subscription's end, as
        `elect` outlives them: after `NotFoundError` or a transient error it watches again
        with the same backoff (50 ms doubling to 2 s), and waits (here too) while no such
        subscription exists; only refusals a retry would repeat are raised (see
        `LeadershipWatch`)."""
        request = _build(pb.WatchLeadershipRequest, subscription_id=subscription_id)
        return await LeadershipWatch._open(self._stub, request, self._metadata, rejoin)

    async def delete_subscription(self, subscription_id: str) -> int:
        """Deletes a subscription no member is joined to: its settings and the messages it
        holds are gone, so its id can be joined again with other settings. Returns how many
        messages were discarded with it. Raises `FailedPreconditionError` while a member is
        joined (at any gateway, in cluster mode; nothing changes), `NotFoundError` for an
        unknown id, `InvalidArgumentError` for a malformed one."""
        reply = await self._unary(
            self._stub.DeleteSubscription,
            _build(pb.DeleteSubscriptionRequest, subscription_id=subscription_id),
        )
        return int(reply.discarded_messages)

    async def list(self) -> Listing:
        """Every subscription (every page followed) and the broker-wide counters."""
        subscriptions: list[SubscriptionInfo] = []
        token = ""
        counters = None
        for _ in range(100_000):  # bounded: never trust a server's paging to end
            reply = await self._unary(
                self._stub.ListSubscriptions,
                pb.ListSubscriptionsRequest(page_size=1000, page_token=token),
            )
            subscriptions += [_info_from_pb(s) for s in reply.subscriptions]
            counters = reply.broker
            token = reply.next_page_token
            if not token:
                break
        assert counters is not None
        return Listing(tuple(subscriptions), _broker_from_pb(counters))


async def _await_promotion(
    client: Client, subscription: Subscription, on_standby: Optional[Callable[[int], None]]
) -> Optional[Leadership]:
    """Reads until the confirmation; None when the stream ended cleanly before it."""
    try:
        while True:
            event = await subscription.next_event()
            if event is None:
                return None
            if isinstance(event, Active):
                return Leadership(subscription, event.member_id, event.epoch, client)
            if isinstance(event, Standby) and on_standby is not None:
                on_standby(event.position)
    except BaseException:
        subscription._cancel()
        raise


def _election_options(
    subscription_id: str, group: str, priority: int, metadata: str
) -> SubscriptionOptions:
    """What `elect` and `leaderships` join with."""
    return SubscriptionOptions.election(subscription_id, group).with_(
        priority=priority, metadata=metadata
    )


def _message(
    message: Union[Message, str], payload: Payload, headers: Optional[dict[str, str]]
) -> Message:
    if isinstance(message, Message):
        return message
    return Message(message, payload, headers)


async def _wait_connected(channel: grpc.aio.Channel, timeout: float, url: str) -> None:
    deadline = time.monotonic() + timeout
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise TransportError(
                f"cannot connect to {url}: connection failed (refused or unreachable)"
            )
        if state == grpc.ChannelConnectivity.SHUTDOWN:
            raise TransportError(f"cannot connect to {url}: the channel was shut down")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransportError(f"cannot connect to {url} within {timeout:g} s")
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        except asyncio.TimeoutError:
            raise TransportError(f"cannot connect to {url} within {timeout:g} s") from None
        state = channel.get_state(try_to_connect=True)
