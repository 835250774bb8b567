"""Building the package, and what the tests themselves tell: a build from a checkout leaves the
checkout as it was, and the tests say out loud when they build the broker (and refuse a
`TINYBROKER_BIN` that is not there instead of building another one)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO, WAIT, binary

CLIENT = Path(__file__).resolve().parents[1]
#: What a checkout may hold that is not the package's source (caches of the tools run on it).
NOT_SOURCE = shutil.ignore_patterns(
    "build", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"
)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_building_the_package_leaves_the_checkout_as_it_was(tmp_path: Path) -> None:
    """`pip install ./clients/python` builds in place: the build must not write into the
    source tree (no build/, no egg-info). Built here from a copy laid out as the checkout."""
    checkout = tmp_path / "checkout"
    shutil.copytree(CLIENT, checkout / "clients" / "python", ignore=NOT_SOURCE)
    shutil.copytree(REPO / "proto", checkout / "proto")
    before = files_under(checkout)
    wheels = tmp_path / "wheels"
    # No build isolation: the test's venv has the build requirements (grpcio-tools brings
    # setuptools), and the build then needs no index.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            str(checkout / "clients" / "python"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = wheels.glob("tinybroker-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {"tinybroker/v1/broker_pb2.py", "tinybroker/v1/broker_pb2.pyi"} <= names, names
    left = sorted(files_under(checkout) - before)
    assert left == [], f"the build wrote {len(left)} paths into the checkout: {left[:4]}"


def fake_cargo(bin_dir: Path, real: Path) -> None:
    """A `cargo` that says it compiles and puts the real binary where `cargo build` would
    (under $CARGO_TARGET_DIR), so the tests' build step can be watched in seconds."""
    bin_dir.mkdir()
    cargo = bin_dir / "cargo"
    cargo.write_text(
        "#!/bin/sh\n"
        'echo "fake cargo: Compiling tinybroker ($*)" >&2\n'
        'mkdir -p "$CARGO_TARGET_DIR/release"\n'
        f'ln -sf "{real}" "$CARGO_TARGET_DIR/release/tinybroker"\n'
    )
    cargo.chmod(cargo.stat().st_mode | stat.S_IXUSR)


def run_one_test(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One test that starts a broker, run by pytest as a user runs the suite."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(CLIENT / "tests" / "test_client.py"),
            "-k",
            "test_a_refused_settle_is_an_event_with_an_exception_and_close_raises_it",
        ],
        cwd=CLIENT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT * 4,
        stdin=subprocess.DEVNULL,
    )


def test_the_tests_say_when_they_build_the_broker(tmp_path: Path) -> None:
    real = binary().resolve()
    fake_cargo(tmp_path / "bin", real)
    env = {k: v for k, v in os.environ.items() if k != "TINYBROKER_BIN"}
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["CARGO_TARGET_DIR"] = str(tmp_path / "target")
    done = run_one_test(env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # Said on the terminal, not in the captured output of a test that passed.
    assert "building the release binary" in done.stdout and "TINYBROKER_BIN" in done.stdout, out
    assert "fake cargo: Compiling tinybroker (build --release --locked" in out, out

    # A TINYBROKER_BIN that is not there is an error that names it, and nothing is built.
    env["TINYBROKER_BIN"] = str(tmp_path / "nowhere" / "tinybroker")
    env["CARGO_TARGET_DIR"] = str(tmp_path / "target2")
    done = run_one_test(env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert f"TINYBROKER_BIN={tmp_path / 'nowhere' / 'tinybroker'}" in out, out
    assert "fake cargo" not in out and not (tmp_path / "target2").exists(), out
