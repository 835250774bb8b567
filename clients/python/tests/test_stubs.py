"""The generated stubs: built from the repository's proto/ at install time, never committed, and
checked against the proto so an install that fell behind it fails here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc_tools
from conftest import REPO
from google.protobuf import descriptor_pb2
from grpc_tools import protoc
from tinybroker.v1 import broker_pb2, broker_pb2_grpc

PROTO = Path("tinybroker") / "v1" / "broker.proto"


def compiled(root: Path, tmp: Path) -> descriptor_pb2.FileDescriptorProto:
    """broker.proto under `root`, compiled now."""
    out = tmp / "set.pb"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main(
        ["protoc", f"-I{root}", f"-I{well_known}", f"--descriptor_set_out={out}", str(root / PROTO)]
    )
    assert code == 0, f"protoc failed on {root / PROTO}"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    [file] = [f for f in files if f.name == str(PROTO)]
    return file


def installed() -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(broker_pb2.DESCRIPTOR.serialized_pb)


def normalized(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Without `json_name`, which protoc's Python output leaves out of the embedded copy."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(file)

    def strip(messages: object) -> None:
        for message in messages:  # type: ignore[attr-defined]
            for field in message.field:
                field.ClearField("json_name")
            strip(message.nested_type)

    strip(out.message_type)
    return out


def test_the_installed_stubs_match_the_proto(tmp_path: Path) -> None:
    assert normalized(compiled(REPO / "proto", tmp_path)) == normalized(installed()), (
        "the installed tinybroker stubs were generated from another proto/: "
        "reinstall with `pip install ./clients/python`"
    )
    # The service stub has every RPC of the proto.
    [service] = installed().service
    stub = broker_pb2_grpc.BrokerStub(__import__("grpc").insecure_channel("127.0.0.1:1"))
    for method in service.method:
        assert hasattr(stub, method.name), method.name


def test_the_check_fails_when_the_proto_moves_on(tmp_path: Path) -> None:
    changed = tmp_path / "proto"
    shutil.copytree(REPO / "proto", changed)
    path = changed / PROTO
    path.write_text(
        path.read_text().replace(
            "message AckResponse {}", "message AckResponse { bool applied = 1; }"
        )
    )
    assert normalized(compiled(changed, tmp_path)) != normalized(installed())


def test_no_generated_code_is_committed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "clients/python"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "clients/python is not in git"
    assert not [f for f in tracked if "_pb2" in f], "generated stubs are committed"
