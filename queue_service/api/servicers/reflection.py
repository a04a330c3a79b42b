"""Server reflection that carries the contract's comments.

grpcio-reflection answers from a descriptor pool, by default the one the `_pb2` modules fill,
which holds no source info: `grpcurl describe` then shows no comment, and a field such as
SetUserQueueLimitRequest.max_active reads as whatever its name suggests. The pool served here is
built from `_gen/descriptor_set.binpb` (written by `protos/generate.py` with the comments), and
files go out as they were generated, since the pool's own `CopyToProto` drops the source info.
Files outside the contract (the health and reflection services) are served from the default pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol, cast

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

_DESCRIPTOR_SET = "descriptor_set.binpb"


@cache
def contract_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The contract's files (and the well-known types they import) with their comments, by name."""
    raw = resources.files("queue_service._gen").joinpath(_DESCRIPTOR_SET).read_bytes()
    return {file.name: file for file in descriptor_pb2.FileDescriptorSet.FromString(raw).file}


class GeneratedFile(Protocol):
    """A `_pb2` module's DESCRIPTOR, as far as it is read here."""

    @property
    def name(self) -> str: ...
    @property
    def serialized_pb(self) -> bytes: ...


class _FileWithComments:
    """A file descriptor as reflection reads it (its name, its dependencies, `CopyToProto`),
    copied from the generated file so the comments go along."""

    def __init__(self, file: descriptor.FileDescriptor, generated: descriptor_pb2.FileDescriptorProto | None) -> None:
        self._file = file
        self._generated = generated
        self.name = file.name

    @property
    def dependencies(self) -> list[_FileWithComments]:
        return [_with_comments(dependency) for dependency in self._file.dependencies]

    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:  # noqa: N802 (the descriptor API's name)
        if self._generated is not None:
            proto.CopyFrom(self._generated)
        else:
            self._file.CopyToProto(proto)


def _with_comments(file: descriptor.FileDescriptor) -> _FileWithComments:
    return _FileWithComments(file, contract_files().get(file.name))


class CommentedPool:
    """The lookups grpc_reflection makes of a pool, answering files with their comments."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def FindFileByName(self, name: str) -> _FileWithComments:  # noqa: N802
        return _with_comments(self._pool.FindFileByName(name))

    def FindFileContainingSymbol(self, symbol: str) -> _FileWithComments:  # noqa: N802
        return _with_comments(self._pool.FindFileContainingSymbol(symbol))

    def __getattr__(self, name: str) -> Any:
        # FindMessageTypeByName, FindExtensionByNumber, FindAllExtensions: as the pool answers.
        return getattr(self._pool, name)


def enable(service_names: Iterable[str], server: grpc.aio.Server, *, extra_files: Sequence[GeneratedFile] = ()) -> None:
    """Serves reflection for `service_names` on `server`; `extra_files` are the files outside the
    contract whose services are listed (health), loaded into the pool from their modules."""
    pool = descriptor_pool.DescriptorPool()
    for file in contract_files().values():  # in dependency order, as protoc writes a set
        pool.Add(file)
    for extra in (*extra_files, cast(GeneratedFile, reflection_pb2.DESCRIPTOR)):
        if extra.name not in contract_files():
            pool.AddSerializedFile(extra.serialized_pb)
    reflection.enable_server_reflection(tuple(service_names), server, pool=CommentedPool(pool))  # type: ignore[arg-type]
