"""Regenerates the Python code (messages, gRPC stubs, .pyi stubs) from the protos.

The .pyi stubs (messages and gRPC services, sync and grpc.aio) come from mypy-protobuf's protoc
plugins, pinned in the `dev` extra: mypy reads them instead of the untyped generated modules.

Run `python protos/generate.py` after changing a .proto; CI runs it and fails on any
difference. The output lands in `queue_service/_gen/` and is never edited by hand.

protoc emits absolute imports (`from acurio.queue.v1 import job_pb2`); they are rewritten to
`queue_service._gen.acurio...` so the generated modules live inside our package instead of
claiming a top-level `acurio` package.

It also writes `descriptor_set.binpb`: the contract as a FileDescriptorSet with its source info
(the comments of every message, field and RPC) and its imports. The service's reflection serves
it (`queue_service/api/servicers/reflection.py`), since the `_pb2` modules carry no comments.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
OUT = REPO / "queue_service" / "_gen"
IMPORT_PREFIX = "queue_service._gen."
DESCRIPTOR_SET = OUT / "descriptor_set.binpb"
_ABSOLUTE_IMPORT = re.compile(r"^(from|import) acurio\.", re.MULTILINE)


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(protoc.__file__).parent / "_proto"
    plugins = [f"--plugin=protoc-gen-{name}={_plugin(name)}" for name in ("mypy", "mypy_grpc")]
    status = protoc.main(
        [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={OUT}",
            f"--grpc_python_out={OUT}",
            *plugins,
            f"--mypy_out=quiet:{OUT}",
            f"--mypy_grpc_out=quiet:{OUT}",
            "--include_source_info",
            "--include_imports",
            f"--descriptor_set_out={DESCRIPTOR_SET}",
            *protos,
        ]
    )
    if status != 0:
        return status
    _without_json_names(DESCRIPTOR_SET)
    for generated in OUT.rglob("*.py*"):
        text = generated.read_text()
        rewritten = _ABSOLUTE_IMPORT.sub(lambda m: f"{m.group(1)} {IMPORT_PREFIX}acurio.", text)
        generated.write_text(rewritten)
    for folder in [OUT, *[p for p in OUT.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").write_text("")
    return 0


def _without_json_names(path: Path) -> None:
    """Drops the `json_name` protoc writes on every field of a descriptor set, as the `_pb2`
    modules' descriptors have none: given one, grpcurl prints camelCase (`jobId`) instead of
    the proto names (`job_id`) the docs and scripts read."""
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())

    def clear(message: descriptor_pb2.DescriptorProto) -> None:
        for field in [*message.field, *message.extension]:
            field.ClearField("json_name")
        for nested in message.nested_type:
            clear(nested)

    for file in files.file:
        for message in file.message_type:
            clear(message)
        for extension in file.extension:
            extension.ClearField("json_name")
    path.write_bytes(files.SerializeToString(deterministic=True))


def _plugin(name: str) -> str:
    """The path of a protoc plugin installed beside this Python (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / f"protoc-gen-{name}"
    found = str(beside) if beside.exists() else shutil.which(f"protoc-gen-{name}")
    if found is None:
        raise SystemExit(f"protoc-gen-{name} not found: pip install -e '.[dev]' (it comes with mypy-protobuf)")
    return found


if __name__ == "__main__":
    sys.exit(main())
