"""Client for the tinybroker gRPC message broker.

Two APIs over one implementation:

- `tinybroker.aio`: the asyncio API, the primary one. Every behaviour (the ack stream, the
  close that waits for the broker, the election's rejoin loop, the lost signal) lives there.
- `tinybroker` (this module): the blocking API, a thin wrapper that runs the asyncio client on
  a private event loop thread, for plain scripts and scheduled jobs::

      import tinybroker

      with tinybroker.Client("http://127.0.0.1:50051") as client:
          for leader in client.leaderships("nightly-report", "reporters"):
              while not leader.wait_lost(timeout=60):
                  run_report(epoch=leader.epoch)

The gRPC stubs (`tinybroker.v1.broker_pb2`, `broker_pb2_grpc`) are generated from the
repository's proto/ when the package is built.
"""

from ._sync import Client, Leadership, LeadershipWatch, Publisher, Subscription
from .aio import MAX_BUFFERED_MESSAGES, MAX_PENDING_PUBLISHES, ClientOptions, Lost, LostCause
from .errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RefusedError,
    ResourceExhaustedError,
    TinybrokerError,
    TransientError,
    TransportError,
    UnauthenticatedError,
    UnavailableError,
)
from .events import Active, Delivery, Event, Refused, Standby, SteppedDown
from .types import (
    AckMode,
    Activation,
    BrokerCounters,
    Counters,
    HandedOver,
    LeaderState,
    Listing,
    MemberInfo,
    Message,
    Mode,
    Overflow,
    Published,
    SubscriptionInfo,
    SubscriptionOptions,
    UpstreamBacklog,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_BUFFERED_MESSAGES",
    "MAX_PENDING_PUBLISHES",
    "AckMode",
    "Activation",
    "Active",
    "AlreadyExistsError",
    "BrokerCounters",
    "Client",
    "ClientOptions",
    "Counters",
    "Delivery",
    "Event",
    "FailedPreconditionError",
    "HandedOver",
    "InvalidArgumentError",
    "LeaderState",
    "Leadership",
    "LeadershipWatch",
    "Listing",
    "Lost",
    "LostCause",
    "MemberInfo",
    "Message",
    "Mode",
    "NotFoundError",
    "Overflow",
    "Published",
    "Publisher",
    "RefusedError",
    "Refused",
    "ResourceExhaustedError",
    "Standby",
    "SteppedDown",
    "SubscriptionInfo",
    "SubscriptionOptions",
    "Subscription",
    "TinybrokerError",
    "TransientError",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
    "UpstreamBacklog",
]
