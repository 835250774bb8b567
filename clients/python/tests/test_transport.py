"""What grpcio really does with connections (the ack fence depends on it), the client's channel
settings, and the settle batching, checked without trusting the documentation."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from conftest import WAIT, Broker
from tinybroker.v1 import broker_pb2 as pb
from tinybroker.v1 import broker_pb2_grpc as pb_grpc

import tinybroker
from tinybroker.aio import ClientOptions, Subscription, channel_options


def connections(client: tinybroker.Client) -> int:
    return client.list().broker.connections_open


def held_by_a_stream_on(channel: grpc.Channel, sid: str, publisher: tinybroker.Client) -> Any:
    """Joins `sid` over `channel` (the seed's Subscribe) and returns the stream and the id of a
    message it holds."""
    stream = pb_grpc.BrokerStub(channel).Subscribe(
        pb.OpenSubscription(
            subscription_id=sid,
            topic_patterns=[f"{sid}.*"],
            mode=pb.DELIVERY_MODE_QUEUE,
            consumer_group="g",
        ),
        timeout=WAIT,
    )
    assert next(stream).WhichOneof("frame") == "confirmation"
    sent = publisher.publish(f"{sid}.a", "x")
    frame = next(stream)
    assert frame.message.system_id == sent.system_id
    return stream, sent.system_id


@pytest.mark.parametrize("local_pool", [False, True])
def test_grpcio_shares_one_connection_between_channels_unless_told_not_to(
    broker: Broker, local_pool: bool
) -> None:
    target = broker.addr
    options = [("grpc.use_local_subchannel_pool", 1)] if local_pool else []
    with tinybroker.Client(broker.url) as observer:
        before = connections(observer)
        a = grpc.insecure_channel(target, options=options)
        b = grpc.insecure_channel(target, options=options)
        for channel in (a, b):
            grpc.channel_ready_future(channel).result(timeout=WAIT)
        opened = connections(observer) - before
        sid = f"share{int(local_pool)}"
        stream, system_id = held_by_a_stream_on(a, sid, observer)
        # The two-field ack (no member_id) over the *other* channel object: fenced by the
        # connection, so it is accepted exactly when both channels share one.
        two_field = pb.Ack(subscription_id=sid, system_id=system_id)
        if local_pool:
            assert opened == 2
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.BrokerStub(b).Ack(two_field, timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        else:
            assert opened == 1, "grpcio opened one TCP connection per channel object"
            pb_grpc.BrokerStub(b).Ack(two_field, timeout=WAIT)
        stream.cancel()
        a.close()
        b.close()


def test_each_tinybroker_client_has_a_connection_of_its_own(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as observer:
        before = connections(observer)
        with tinybroker.Client(broker.url), tinybroker.Client(broker.url):
            assert connections(observer) - before == 2


def test_keepalive_is_on_by_default_with_the_rust_clients_intervals() -> None:
    args = dict(channel_options(ClientOptions()))
    assert args["grpc.keepalive_time_ms"] == 10_000
    assert args["grpc.keepalive_timeout_ms"] == 10_000
    assert args["grpc.http2.ping_timeout_ms"] == 10_000
    assert args["grpc.keepalive_permit_without_calls"] == 1
    assert args["grpc.http2.max_pings_without_data"] == 0
    assert args["grpc.use_local_subchannel_pool"] == 1
    off = dict(channel_options(ClientOptions(keepalive_interval=None)))
    assert "grpc.keepalive_time_ms" not in off


def test_a_client_notices_a_silent_broker_through_keepalive(broker: Broker) -> None:
    # SIGSTOP: the broker keeps its socket open and answers nothing, as a partitioned host.
    import os
    import signal

    options = ClientOptions(keepalive_interval=0.5, keepalive_timeout=0.5)

    async def body() -> None:
        client = await tinybroker.aio.Client.connect(broker.url, options)
        leader = await asyncio.wait_for(client.elect("ka", "g"), WAIT)
        assert broker.process is not None
        os.kill(broker.process.pid, signal.SIGSTOP)
        try:
            lost = await asyncio.wait_for(leader.lost(), WAIT)
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
        assert lost.cause is tinybroker.LostCause.ENDED
        assert isinstance(lost.error, tinybroker.UnavailableError)
        await client.close()

    asyncio.run(body())


class FakeCall:
    """Records what a Subscription writes."""

    def __init__(self) -> None:
        self.written: list[pb.ConsumeRequest] = []
        self.half_closed = False

    async def write(self, request: pb.ConsumeRequest) -> None:
        self.written.append(request)

    async def done_writing(self) -> None:
        self.half_closed = True

    def cancel(self) -> bool:
        return True


def test_settles_never_name_more_ids_than_the_window_and_flush_before_the_half_close() -> None:
    async def body() -> None:
        call = FakeCall()
        opts = tinybroker.SubscriptionOptions.queue("s", "g", "a.*").with_(max_in_flight=2)
        sub = Subscription(call, opts)  # type: ignore[arg-type]
        sub._writer = asyncio.ensure_future(sub._write_loop())
        for n in range(5):
            sub._queue_settle(n == 3, n)
        sub._begin_close()
        await asyncio.wait_for(sub._writer, WAIT)
        batches = [(list(r.settle.ack), list(r.settle.nack)) for r in call.written]
        assert batches == [([0, 1], []), ([2], [3]), ([4], [])]
        assert call.half_closed
        with pytest.raises(tinybroker.UnavailableError):
            sub._queue_settle(False, 9)  # after the close began

    asyncio.run(body())


def test_status_codes_map_to_the_exception_hierarchy() -> None:
    from tinybroker.errors import error_from_code

    cases = {
        3: tinybroker.InvalidArgumentError,
        5: tinybroker.NotFoundError,
        6: tinybroker.AlreadyExistsError,
        9: tinybroker.FailedPreconditionError,
        8: tinybroker.ResourceExhaustedError,
        11: tinybroker.ResourceExhaustedError,
        16: tinybroker.UnauthenticatedError,
        14: tinybroker.UnavailableError,
        1: tinybroker.TransientError,
        4: tinybroker.TransientError,
        13: tinybroker.RefusedError,
        999: tinybroker.TransientError,
    }
    for code, cls in cases.items():
        error = error_from_code(code, "m")
        assert type(error) is cls, (code, error)
        assert error.message == "m"
        assert error.transient == issubclass(cls, tinybroker.TransientError)
    assert str(error_from_code(9, "stale")) == "failed precondition: stale"
