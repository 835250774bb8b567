"""Build step: generate the gRPC stubs from the repository's proto/ with grpcio-tools.

Nothing generated is committed. `pip install ./clients/python` runs `build_py`, which compiles
`tinybroker/v1/broker.proto` into the wheel as `tinybroker/v1/broker_pb2.py`,
`broker_pb2_grpc.py` and their typed stubs (`.pyi`, from mypy-protobuf). The proto is looked
for in `$TINYBROKER_PROTO_DIR`, then in `proto/` beside this file (where an sdist carries its
copy), then in the repository's `proto/` two levels up.

pip builds a local directory in place, so setuptools' work files (`build/`, the egg-info) go
to a temporary directory removed when the build ends: installing from a checkout leaves the
checkout as it was.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO = Path("tinybroker") / "v1" / "broker.proto"


def proto_root() -> Path:
    candidates = []
    if os.environ.get("TINYBROKER_PROTO_DIR"):
        candidates.append(Path(os.environ["TINYBROKER_PROTO_DIR"]))
    candidates += [HERE / "proto", HERE.parent.parent / "proto"]
    for root in candidates:
        if (root / PROTO).is_file():
            return root
    tried = ", ".join(str(c / PROTO) for c in candidates)
    raise SystemExit(
        f"tinybroker: cannot find the proto to generate the stubs from (tried {tried})"
    )


def generate(out: Path) -> None:
    """Compile the proto into `out` (a package root): `out/tinybroker/v1/broker_pb2*.py{,i}`."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as error:  # pragma: no cover - the build requirements install it
        raise SystemExit(f"tinybroker: grpcio-tools is needed to build: {error}") from error
    root = proto_root()
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    target = out / "tinybroker" / "v1"
    target.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        str(root / PROTO),
    ]
    if shutil.which("protoc-gen-mypy") is None:
        # Installed as a build requirement, but in an isolated build its scripts may not be
        # on PATH: point protoc at the one beside this interpreter.
        import sys

        scripts = Path(sys.executable).parent
        for name in ("mypy", "mypy_grpc"):
            plugin = scripts / f"protoc-gen-{name}"
            if plugin.exists():
                args.insert(1, f"--plugin=protoc-gen-{name}={plugin}")
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"tinybroker: protoc failed ({code}) on {root / PROTO}")
    init = target / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated from proto/tinybroker/v1/broker.proto at build time."""\n')


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        generate(Path(self.build_lib))


class SdistWithProto(sdist):
    """Carries the proto inside the sdist, so a wheel built from it finds it."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "proto" / PROTO
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, dest)


#: Where setuptools writes its work files instead of the source tree (one per build step: pip
#: runs each in a process of its own).
SCRATCH = Path(tempfile.mkdtemp(prefix="tinybroker-build-"))
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)

setup(
    cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProto},
    options={
        "build": {"build_base": str(SCRATCH / "build")},
        "egg_info": {"egg_base": str(SCRATCH)},
    },
)
