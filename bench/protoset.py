"""A protoset (FileDescriptorSet) for ghz, built from the generated Python descriptors.

ghz resolves a method through reflection by its symbol `pkg.Service.Method`, which Python's
reflection service does not answer ("Symbol not found"); a protoset sidesteps that and is exactly
what the servers were generated from.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health_pb2

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2,
    credits_service_pb2,
    operator_service_pb2,
    queue_service_pb2,
)


def _with_dependencies(roots: list[FileDescriptor]) -> list[FileDescriptor]:
    ordered: list[FileDescriptor] = []
    seen: set[str] = set()

    def visit(fd: FileDescriptor) -> None:
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            visit(dep)
        ordered.append(fd)  # dependencies first, as protoc writes them

    for root in roots:
        visit(root)
    return ordered


def write_protoset(path: Path) -> Path:
    roots = [
        queue_service_pb2.DESCRIPTOR,
        credits_service_pb2.DESCRIPTOR,
        core_callback_service_pb2.DESCRIPTOR,
        operator_service_pb2.DESCRIPTOR,
        health_pb2.DESCRIPTOR,
    ]
    descriptor_set = descriptor_pb2.FileDescriptorSet()
    for fd in _with_dependencies(roots):
        fd.CopyToProto(descriptor_set.file.add())
    path.write_bytes(descriptor_set.SerializeToString())
    return path
