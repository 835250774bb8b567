"""The asyncio API: the primary one, where every behaviour of the client is implemented.

    from tinybroker.aio import Client

    client = await Client.connect("http://127.0.0.1:50051")
    leader = await client.elect("nightly-report", "reporters")

The blocking API (`tinybroker.Client`) runs this same code on a private event loop thread.
"""

from ._client import Client, ClientOptions, channel_options
from ._election import MAX_BUFFERED_MESSAGES, Leadership, Lost, LostCause
from ._publisher import MAX_PENDING_PUBLISHES, Publisher
from ._subscription import MAX_SETTLE_BATCH, Subscription
from ._watch import LeadershipWatch

__all__ = [
    "MAX_BUFFERED_MESSAGES",
    "MAX_PENDING_PUBLISHES",
    "MAX_SETTLE_BATCH",
    "Client",
    "ClientOptions",
    "Leadership",
    "LeadershipWatch",
    "Lost",
    "LostCause",
    "Publisher",
    "Subscription",
    "channel_options",
]
