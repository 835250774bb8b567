"""What a subscription stream carries: deliveries, activation, standby and step-down notices,
refusals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Optional, Union

from .errors import InvalidArgumentError, TinybrokerError

__all__ = ["Active", "Delivery", "Event", "Refused", "Standby", "SteppedDown"]

#: Queues one settlement (nack?, system_id) for the member's stream; raises when it has ended.
SettleFn = Callable[[bool, int], None]


@dataclass(eq=False)
class Delivery:
    """One delivered message. Settle it with `ack()` or `nack()`; one left unsettled stays in
    flight until the subscription ends, when it is redelivered with `attempt` + 1."""

    #: Broker-wide id, increasing in publish order.
    system_id: int
    topic: str
    payload: bytes
    #: Application headers (plus `tinybroker-dead-letter-*` on a dead letter).
    headers: dict[str, str]
    #: 1 on first delivery, +1 on every redelivery.
    attempt: int
    #: The member's epoch: the fencing token for side effects.
    epoch: int
    #: When the broker accepted the publish.
    published_at: Optional[datetime]
    subscription_id: str
    #: The member it was delivered to.
    member_id: int
    _settle: Optional[SettleFn] = field(default=None, repr=False)
    _settled: bool = field(default=False, repr=False)

    def ack(self) -> None:
        """Releases the message for good. Queued for the member's own stream without waiting
        (`Subscription.close()` returns once the broker applied it). A refusal comes back as a
        `Refused` event. Does nothing on an ack-free subscription.

        Raises `UnavailableError` when the stream has ended (the broker redelivers the
        message), `InvalidArgumentError` when this delivery was already settled."""
        self._do(False)

    def nack(self) -> None:
        """Gives the message back for redelivery at the head of the queue, `attempt` + 1."""
        self._do(True)

    def _do(self, nack: bool) -> None:
        if self._settle is None:
            return
        if self._settled:
            raise InvalidArgumentError(f"message {self.system_id} was already settled")
        self._settle(nack, self.system_id)
        self._settled = True


@dataclass(frozen=True)
class Active:
    """The confirmation frame: this member is now active."""

    member_id: int
    epoch: int


@dataclass(frozen=True)
class Standby:
    """Singleton with `notify_standby`: this member waits in line (1 = next)."""

    member_id: int
    position: int


@dataclass(frozen=True)
class SteppedDown:
    """Singleton: this member was active and stepped down at a message boundary (a
    `Client.hand_over`, or a member of higher priority took over; docs/semantics.md#hand-over):
    `epoch` has ended, and the member waits in line on standby at `position` (1 = next), confirmed
    again with a new epoch (an `Active` event) if it is promoted. Sent whether or not the member
    asked for standby notices; not a `Standby`."""

    member_id: int
    #: The epoch that ended.
    epoch: int
    #: 1 = next to be promoted.
    position: int


@dataclass(frozen=True)
class Refused:
    """Acks or nacks sent on this stream were refused and changed nothing. `error` is the
    exception a unary call would have raised (`NotFoundError`, `FailedPreconditionError`...).
    `system_ids` is empty when a whole settle was refused (more ids than the window, which this
    client never sends)."""

    system_ids: tuple[int, ...]
    #: True for a nack (and for a release, a nack that keeps its attempt).
    nack: bool
    error: TinybrokerError
    #: True for a release: what `close()` gives back unworked (docs/semantics.md#releases).
    release: bool = False


Event = Union[Active, Standby, SteppedDown, Delivery, Refused]
