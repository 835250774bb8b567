"""The client's value types: what is published, what a member joins with, what inspection answers.

Shared by the asyncio API (`tinybroker.aio`) and the blocking one (`tinybroker`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional, TypeVar, Union

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .v1 import broker_pb2 as pb

__all__ = [
    "AckMode",
    "Activation",
    "BrokerCounters",
    "Counters",
    "HandedOver",
    "LeaderState",
    "Listing",
    "MemberInfo",
    "Message",
    "Mode",
    "Overflow",
    "Published",
    "SubscriptionInfo",
    "SubscriptionOptions",
    "UpstreamBacklog",
]


class Mode(enum.Enum):
    """Delivery mode (`DeliveryMode`)."""

    #: Every stream gets every matching message; each stream is its own member.
    BROADCAST = 1
    #: Competing consumers: each message goes to exactly one member.
    QUEUE = 2
    #: One active member; the others wait on standby, promoted in line order (priority, highest
    #: first, then join order).
    SINGLETON = 3


class AckMode(enum.Enum):
    """Acked (at-least-once) or ack-free (at-most-once) delivery."""

    EXPLICIT = 1
    NONE = 2


class Overflow(enum.Enum):
    """What a full queue does to a new message."""

    REJECT_PUBLISH = 1
    DROP_OLDEST = 2


Payload = Union[bytes, bytearray, memoryview, str]


def _payload(payload: Payload) -> bytes:
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    raise InvalidArgumentError(f"a payload is bytes or str, not {type(payload).__name__}")


@dataclass(frozen=True)
class Message:
    """A message to publish. A `str` payload is sent as UTF-8. `fence`, when set, is
    `(subscription_id, epoch)`: the broker stores the message only while that epoch leads that
    SINGLETON subscription (docs/semantics.md#fenced-publish); `fenced()` sets it."""

    topic: str
    payload: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    fence: Optional[tuple[str, int]] = None

    def __init__(
        self,
        topic: str,
        payload: Payload = b"",
        headers: Optional[Mapping[str, str]] = None,
        fence: Optional[tuple[str, int]] = None,
    ) -> None:
        if not isinstance(topic, str):
            raise InvalidArgumentError(f"a topic is a str, not {type(topic).__name__}")
        if fence is not None and not (
            isinstance(fence, tuple)
            and len(fence) == 2
            and isinstance(fence[0], str)
            and isinstance(fence[1], int)
            and not isinstance(fence[1], bool)
        ):
            raise InvalidArgumentError("a fence is a (subscription_id: str, epoch: int) pair")
        object.__setattr__(self, "fence", fence)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "payload", _payload(payload))
        try:
            object.__setattr__(self, "headers", dict(headers or {}))
        except (TypeError, ValueError):
            raise InvalidArgumentError("headers are a mapping of str to str") from None

    def header(self, key: str, value: str) -> Message:
        """A copy with one more header."""
        return Message(self.topic, self.payload, {**self.headers, key: value}, self.fence)

    def fenced(self, subscription_id: str, epoch: int) -> Message:
        """A copy fenced by `epoch` of SINGLETON subscription `subscription_id`: stored only
        while that epoch leads, else refused with `FailedPreconditionError` naming the epoch
        now (docs/semantics.md#fenced-publish)."""
        return Message(self.topic, self.payload, self.headers, (subscription_id, epoch))

    def _to_pb(self) -> pb.PublishRequest:
        from .v1 import broker_pb2 as pb

        for key, value in self.headers.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise InvalidArgumentError("header keys and values are str")
        try:
            request = pb.PublishRequest(
                topic=self.topic, payload=self.payload, headers=self.headers
            )
            if self.fence is not None:
                request.fence.subscription_id, request.fence.epoch = self.fence
            return request
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(f"bad message: {error}") from None


@dataclass(frozen=True)
class Published:
    """What the broker answered to a publish."""

    #: Broker-wide id, increasing in publish order.
    system_id: int
    #: How many subscriptions queued it. 0: it matched none and is not kept.
    queued_for: int


@dataclass(frozen=True)
class Activation:
    """The confirmation frame: this member is active."""

    #: This member's id: the fence for unary acks (`Client.ack(..., member_id=)`).
    member_id: int
    #: Strictly higher than any earlier activation's on the subscription.
    epoch: int


def _patterns(patterns: Union[str, Iterable[str]]) -> tuple[str, ...]:
    if isinstance(patterns, str):
        return (patterns,)
    out = tuple(patterns)
    if not all(isinstance(p, str) for p in out):
        raise InvalidArgumentError("topic patterns are str")
    return out


@dataclass(frozen=True)
class SubscriptionOptions:
    """What to join: the fields of `OpenSubscription`. Build with `broadcast`, `queue` or
    `singleton`, then `with_(...)` (or `dataclasses.replace`) for the rest."""

    subscription_id: str
    mode: Mode
    consumer_group: str
    patterns: tuple[str, ...]
    #: This member's window; 0 is the broker's default (1, or 256 when ack-free).
    max_in_flight: int = 0
    #: Dead-letter (or drop) a message delivered this many times; 0 = unlimited.
    max_delivery_attempts: int = 0
    #: Where poisoned messages go; None drops and counts them.
    dead_letter_topic: Optional[str] = None
    #: Singleton only: be told when on standby, and the place in line.
    notify_standby: bool = False
    ack_mode: AckMode = AckMode.EXPLICIT
    #: None is the broker's default for the ack mode.
    overflow: Optional[Overflow] = None
    #: Singleton only: what this member tells watchers and `describe` about itself (an address,
    #: a host name), at most 1024 bytes of UTF-8; a leader can change it with `proclaim`
    #: (docs/semantics.md#member-metadata).
    metadata: str = ""
    #: Singleton only: this member's priority, an int in [0, 2^32); 0, the default, for every
    #: member keeps join order. The line is in priority order, highest first, then join order,
    #: and a member of higher priority than the active one takes over at a message boundary
    #: (docs/semantics.md#priority), across gateways too.
    priority: int = 0

    @classmethod
    def broadcast(
        cls, subscription_id: str, patterns: Union[str, Iterable[str]]
    ) -> SubscriptionOptions:
        """Every stream gets every matching message."""
        return cls(subscription_id, Mode.BROADCAST, "", _patterns(patterns))

    @classmethod
    def queue(
        cls, subscription_id: str, group: str, patterns: Union[str, Iterable[str]]
    ) -> SubscriptionOptions:
        """Competing consumers in `group`."""
        return cls(subscription_id, Mode.QUEUE, group, _patterns(patterns))

    @classmethod
    def singleton(
        cls, subscription_id: str, group: str, patterns: Union[str, Iterable[str]]
    ) -> SubscriptionOptions:
        """One active member in `group`, the others on standby."""
        return cls(subscription_id, Mode.SINGLETON, group, _patterns(patterns))

    @classmethod
    def election(cls, subscription_id: str, group: str) -> SubscriptionOptions:
        """Exactly what `elect(subscription_id, group)` joins with, as the Rust client's
        `elect` does: singleton mode on the one topic `election.<id>`, standby notices on,
        acked delivery, every other setting the broker's default (window 1, no attempt
        bound, no dead-letter topic, default overflow). Replicas in any language that join
        with these settings share one line."""
        return replace(
            cls.singleton(subscription_id, group, [f"election.{subscription_id}"]),
            notify_standby=True,
        )

    def with_(
        self,
        *,
        max_in_flight: Optional[int] = None,
        max_delivery_attempts: Optional[int] = None,
        dead_letter_topic: Optional[str] = None,
        notify_standby: Optional[bool] = None,
        ack_mode: Optional[AckMode] = None,
        overflow: Optional[Overflow] = None,
        metadata: Optional[str] = None,
        priority: Optional[int] = None,
    ) -> SubscriptionOptions:
        """A copy with the given settings changed."""
        out = self
        if metadata is not None:
            out = replace(out, metadata=metadata)
        if priority is not None:
            out = replace(out, priority=priority)
        if max_in_flight is not None:
            out = replace(out, max_in_flight=max_in_flight)
        if max_delivery_attempts is not None:
            out = replace(out, max_delivery_attempts=max_delivery_attempts)
        if dead_letter_topic is not None:
            out = replace(out, dead_letter_topic=dead_letter_topic)
        if notify_standby is not None:
            out = replace(out, notify_standby=notify_standby)
        if ack_mode is not None:
            out = replace(out, ack_mode=ack_mode)
        if overflow is not None:
            out = replace(out, overflow=overflow)
        return out

    @property
    def window(self) -> int:
        """The window the broker applies: `max_in_flight`, or its default for 0."""
        if self.max_in_flight:
            return self.max_in_flight
        return 256 if self.ack_mode is AckMode.NONE else 1

    def _to_pb(self) -> pb.OpenSubscription:
        from .v1 import broker_pb2 as pb

        for name in ("max_in_flight", "max_delivery_attempts", "priority"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < 2**32:
                raise InvalidArgumentError(f"{name} is an int in [0, 2^32), not {value!r}")
        if not isinstance(self.subscription_id, str) or not isinstance(self.consumer_group, str):
            raise InvalidArgumentError("subscription_id and consumer_group are str")
        if not isinstance(self.metadata, str):
            raise InvalidArgumentError(f"metadata is a str, not {type(self.metadata).__name__}")
        if not isinstance(self.mode, Mode) or not isinstance(self.ack_mode, AckMode):
            raise InvalidArgumentError("mode is a Mode and ack_mode an AckMode")
        if self.overflow is not None and not isinstance(self.overflow, Overflow):
            raise InvalidArgumentError("overflow is an Overflow or None")
        overflow = {
            None: pb.OVERFLOW_POLICY_UNSPECIFIED,
            Overflow.REJECT_PUBLISH: pb.OVERFLOW_POLICY_REJECT_PUBLISH,
            Overflow.DROP_OLDEST: pb.OVERFLOW_POLICY_DROP_OLDEST,
        }[self.overflow]
        return _open_subscription(
            subscription_id=self.subscription_id,
            topic_patterns=list(self.patterns),
            mode=_any(self.mode.value),
            consumer_group=self.consumer_group,
            max_in_flight=self.max_in_flight,
            max_delivery_attempts=self.max_delivery_attempts,
            dead_letter_topic=self.dead_letter_topic or "",
            notify_standby=self.notify_standby,
            ack_mode=_any(self.ack_mode.value),
            overflow=overflow,
            metadata=self.metadata,
            priority=self.priority,
        )


def _open_subscription(**fields: Any) -> pb.OpenSubscription:
    from .v1 import broker_pb2 as pb

    try:
        return pb.OpenSubscription(**fields)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"bad subscription options: {error}") from None


def _any(value: object) -> Any:
    """A value as the generated stubs' types (their enum NewTypes, the stub's call kinds)."""
    return value


# --- inspection ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberInfo:
    member_id: int
    active: bool
    #: 0 while on standby.
    epoch: int
    in_flight: int
    max_in_flight: int
    #: Place in line, 0 = first: priority order, highest first, then join order.
    position: int
    #: What it declared on joining or last proclaimed; empty if nothing (singleton only).
    metadata: str = ""
    #: Its priority (`SubscriptionOptions.priority`; singleton only).
    priority: int = 0


@dataclass(frozen=True)
class Counters:
    enqueued: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    dropped_max_attempts: int = 0
    rejected_full: int = 0
    dropped_full: int = 0
    promotions: int = 0
    stale_acks: int = 0
    dropped_overflow: int = 0
    #: Releases accepted: messages given back unworked (docs/semantics.md#releases).
    released: int = 0
    #: Active members that stepped down to a successor (a hand-over or a higher-priority
    #: takeover); each also counts in `promotions` (docs/semantics.md#hand-over).
    handovers: int = 0
    #: Of those, the ones whose hand-over timeout passed with messages in flight, which went to
    #: the successor as on a failover.
    handovers_overdue: int = 0


@dataclass(frozen=True)
class UpstreamBacklog:
    """Cluster mode: a subscription's JetStream consumer."""

    consumer: str
    pending: int
    unacked: int
    redelivered: int


@dataclass(frozen=True)
class SubscriptionInfo:
    """One subscription as the broker describes it."""

    subscription_id: str
    mode: Mode
    consumer_group: str
    patterns: tuple[str, ...]
    #: In line order (`MemberInfo.position`: priority, highest first, then join order).
    members: tuple[MemberInfo, ...]
    #: The active member in singleton mode; None otherwise or with no member.
    active_member_id: Optional[int]
    #: Highest epoch handed out on this subscription.
    epoch: int
    queued_messages: int
    queued_bytes: int
    in_flight: int
    counters: Counters
    max_delivery_attempts: int
    dead_letter_topic: Optional[str]
    ack_mode: AckMode
    overflow: Overflow
    #: Seconds until it expires, when it has no members.
    expires_in: Optional[float]
    #: Cluster mode only.
    upstream: Optional[UpstreamBacklog]
    #: The active member's metadata in singleton mode; empty with none active or none declared.
    active_metadata: str = ""
    #: Singleton: the active member while it steps down (a hand-over, or a member of higher
    #: priority joined): it is sent nothing more until it settled what it holds; None otherwise
    #: (docs/semantics.md#hand-over).
    stepping_down_member_id: Optional[int] = None


@dataclass(frozen=True)
class BrokerCounters:
    published: int = 0
    unrouted: int = 0
    rejected_publishes: int = 0
    subscriptions_expired: int = 0
    messages_expired: int = 0
    subscriptions: int = 0
    members: int = 0
    connections_open: int = 0
    connections_refused: int = 0
    handshake_timeouts: int = 0
    requests_over_budget: int = 0
    request_timeouts: int = 0
    memory_accounted_bytes: int = 0
    max_memory_bytes: int = 0
    #: Subscriptions removed by `delete_subscription` (at this gateway, in cluster mode).
    subscriptions_deleted: int = 0
    #: Messages they held, discarded with them.
    messages_deleted: int = 0
    #: Cluster mode: acks JetStream did not confirm (their messages may come again); 0 on the
    #: embedded broker.
    unconfirmed_acks: int = 0


@dataclass(frozen=True)
class Listing:
    """Every subscription (every page followed) and the broker-wide counters."""

    subscriptions: tuple[SubscriptionInfo, ...]
    broker: BrokerCounters


@dataclass(frozen=True)
class HandedOver:
    """A hand-over that happened (`Client.hand_over`; docs/semantics.md#hand-over)."""

    #: The member that stepped down.
    previous_member_id: int
    #: The epoch it held.
    previous_epoch: int
    #: The member now active.
    member_id: int
    #: Its epoch, higher than `previous_epoch`.
    epoch: int
    #: The member asked to step down left before it settled what it held: its successor took
    #: over as on any failover (what it held is redelivered).
    failed_over: bool = False


@dataclass(frozen=True)
class LeaderState:
    """A SINGLETON subscription's leadership at one moment, as the server last told it (a
    `LeadershipFrame`, from `Client.watch_leadership`)."""

    #: The active member's id; None while no member is active.
    active_member_id: Optional[int]
    #: The active member's epoch; with none active, the last one handed out (0 before any).
    epoch: int
    #: When the answering broker or gateway learned of this state, by its clock (UTC; the Unix
    #: epoch if the server sent none).
    since: datetime
    #: The active member's metadata, as it joined with or last proclaimed; empty with none
    #: active or none declared (docs/semantics.md#member-metadata).
    metadata: str = ""


_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _leader_state_from_pb(frame: pb.LeadershipFrame) -> LeaderState:
    since = _timestamp(frame.since.seconds, frame.since.nanos) if frame.HasField("since") else None
    return LeaderState(
        frame.active_member_id or None, frame.epoch, since or _UNIX_EPOCH, frame.metadata
    )


E = TypeVar("E", bound=enum.Enum)


def _enum(kind: type[E], value: int, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        # A newer broker's value: an error, not a guess (as the Rust client).
        raise InvalidArgumentError(
            f"the broker answered {what} {value}, unknown to this client"
        ) from None


def _info_from_pb(info: pb.SubscriptionInfo) -> SubscriptionInfo:
    mode = _enum(Mode, info.mode, "mode")
    ack_mode = AckMode.EXPLICIT if info.ack_mode == 0 else _enum(AckMode, info.ack_mode, "ack mode")
    overflow: Overflow
    if info.overflow == 0:
        overflow = Overflow.DROP_OLDEST if ack_mode is AckMode.NONE else Overflow.REJECT_PUBLISH
    else:
        overflow = _enum(Overflow, info.overflow, "overflow policy")
    c = info.counters
    return SubscriptionInfo(
        subscription_id=info.subscription_id,
        mode=mode,
        consumer_group=info.consumer_group,
        patterns=tuple(info.topic_patterns),
        # In line order, as the Rust client: the broker lists them in join order, which a
        # priority or a hand-over makes differ from the line's.
        members=tuple(
            sorted(
                (
                    MemberInfo(
                        m.member_id,
                        m.active,
                        m.epoch,
                        m.in_flight,
                        m.max_in_flight,
                        m.position,
                        m.metadata,
                        m.priority,
                    )
                    for m in info.members
                ),
                key=lambda m: m.position,
            )
        ),
        active_member_id=info.active_member_id or None,
        epoch=info.epoch,
        queued_messages=info.queued_messages,
        queued_bytes=info.queued_bytes,
        in_flight=info.in_flight,
        counters=Counters(
            c.enqueued,
            c.delivered,
            c.redelivered,
            c.acked,
            c.nacked,
            c.dead_lettered,
            c.dropped_max_attempts,
            c.rejected_full,
            c.dropped_full,
            c.promotions,
            c.stale_acks,
            c.dropped_overflow,
            c.released,
            c.handovers,
            c.handovers_overdue,
        ),
        max_delivery_attempts=info.max_delivery_attempts,
        dead_letter_topic=info.dead_letter_topic or None,
        ack_mode=ack_mode,
        overflow=overflow,
        expires_in=info.expires_in_ms / 1000 if info.HasField("expires_in_ms") else None,
        upstream=UpstreamBacklog(
            info.upstream.consumer,
            info.upstream.pending,
            info.upstream.unacked,
            info.upstream.redelivered,
        )
        if info.HasField("upstream")
        else None,
        active_metadata=info.active_metadata,
        stepping_down_member_id=info.stepping_down_member_id or None,
    )


def _broker_from_pb(b: pb.BrokerCounters) -> BrokerCounters:
    return BrokerCounters(
        b.published,
        b.unrouted,
        b.rejected_publishes,
        b.subscriptions_expired,
        b.messages_expired,
        b.subscriptions,
        b.members,
        b.connections_open,
        b.connections_refused,
        b.handshake_timeouts,
        b.requests_over_budget,
        b.request_timeouts,
        b.memory_accounted_bytes,
        b.max_memory_bytes,
        b.subscriptions_deleted,
        b.messages_deleted,
        b.unconfirmed_acks,
    )


def _timestamp(seconds: int, nanos: int) -> Optional[datetime]:
    if seconds <= 0 and nanos <= 0:
        return None
    try:
        return datetime.fromtimestamp(seconds + nanos / 1e9, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
