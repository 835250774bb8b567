"""TLS and mutual TLS against the broker's own TLS (`serve --tls-cert/--tls-key/--tls-client-ca`),
with certificates made for the test by openssl."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import WAIT, Broker

import tinybroker
from tinybroker import SubscriptionOptions
from tinybroker.aio import Client, ClientOptions

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def certificates(dir: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=tinybroker test CA", cwd=dir)  # fmt: skip
    for name, ext in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ]:
        (dir / f"{name}.ext").write_text(ext + "\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=dir)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                "-extfile", f"{name}.ext", cwd=dir)  # fmt: skip


def test_tls_and_mutual_tls(tmp_path: Path) -> None:
    certificates(tmp_path)
    ca = (tmp_path / "ca.pem").read_bytes()
    tls = ["--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key")]

    async def round_trip(url: str, options: ClientOptions) -> None:
        client = await Client.connect(url, options)
        sub = await client.subscribe(SubscriptionOptions.queue("tls", "g", "t.*"))
        await asyncio.wait_for(sub.active(), WAIT)
        await client.publish("t.a", "secret")
        delivery = await asyncio.wait_for(sub.next_delivery(), WAIT)
        assert delivery is not None and delivery.payload == b"secret"
        delivery.ack()
        await asyncio.wait_for(sub.close(), WAIT)
        await client.close()

    b = Broker(tls)
    try:
        url = f"https://{b.addr}"
        asyncio.run(round_trip(url, ClientOptions(ca_pem=ca)))
        # Without the CA (the system's roots do not know it) the handshake fails.
        with pytest.raises(tinybroker.TransportError):
            asyncio.run(Client.connect(url, ClientOptions(connect_timeout=2)))
    finally:
        b.close()

    b = Broker([*tls, "--tls-client-ca", str(tmp_path / "ca.pem")])
    try:
        url = f"https://{b.addr}"
        identity = ClientOptions(
            ca_pem=ca,
            client_cert_pem=(tmp_path / "client.pem").read_bytes(),
            client_key_pem=(tmp_path / "client.key").read_bytes(),
        )
        asyncio.run(round_trip(url, identity))
        with pytest.raises(tinybroker.TransportError):
            asyncio.run(Client.connect(url, ClientOptions(ca_pem=ca, connect_timeout=2)))
    finally:
        b.close()
