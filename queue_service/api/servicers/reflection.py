"""Server reflection that carries the contract's comments.

grpcio-reflection answers from a descriptor pool, by default the one the `_pb2` modules fill,
which holds no source info: `grpcurl describe` then shows no comment, and a field such as
SetUserQueueLimitRequest.max_active reads as whatever its name suggests. The pool served here is
the default one, but each file of the contract goes out as `_gen/descriptor_set.binpb` holds it
(written by `protos/generate.py` with the comments from the same protos as the `_pb2` modules),
since the pool's own `CopyToProto` drops the source info. Other files (health, reflection,
google.rpc's error details, which grpcurl resolves to print an error) are served as the pool has them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

_DESCRIPTOR_SET = "descriptor_set.binpb"


@cache
def contract_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The contract's files (and the well-known types they import) with their comments, by name."""
    raw = resources.files("queue_service._gen").joinpath(_DESCRIPTOR_SET).read_bytes()
    return {file.name: file for file in descriptor_pb2.FileDescriptorSet.FromString(raw).file}


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
    """The lookups grpc_reflection makes of a pool, answered by the default pool (every file the
    service imports: the contract, health, reflection, google.rpc's error details), each file
    sent with its comments where the contract's set has them."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def FindFileByName(self, name: str) -> _FileWithComments:  # noqa: N802 (the pool's API)
        return _with_comments(self._pool.FindFileByName(name))

    def FindFileContainingSymbol(self, symbol: str) -> _FileWithComments:  # noqa: N802
        return _with_comments(self._pool.FindFileContainingSymbol(symbol))

    def __getattr__(self, name: str) -> Any:
        # FindMessageTypeByName, FindExtensionByNumber, FindAllExtensions: as the pool answers.
        return getattr(self._pool, name)


class _ServedOnce(reflection_aio.ReflectionServicer):
    """grpc_reflection's servicer, each file's answer (it and its dependencies, serialized) made
    once and kept: a 50-byte request answers some 60 KB, which grpc_reflection copies and
    serializes again for every request. Kept per file of the pool, which holds only the files the
    service imports (a name it does not know is NOT_FOUND, never kept)."""

    def __init__(self, service_names: tuple[str, ...], pool: CommentedPool) -> None:
        super().__init__(service_names, pool=pool)
        self._commented = pool
        self._files: dict[str, list[bytes]] = {}

    def _file_by_filename(self, request: reflection_pb2.ServerReflectionRequest, filename: str) -> reflection_pb2.ServerReflectionResponse:
        return self._answer(request, self._commented.FindFileByName, filename)

    def _file_containing_symbol(
        self, request: reflection_pb2.ServerReflectionRequest, symbol: str
    ) -> reflection_pb2.ServerReflectionResponse:
        return self._answer(request, self._commented.FindFileContainingSymbol, symbol)

    def _answer(
        self, request: reflection_pb2.ServerReflectionRequest, find: Callable[[str], _FileWithComments], name: str
    ) -> reflection_pb2.ServerReflectionResponse:
        try:
            file = find(name)
        except KeyError:
            return reflection_pb2.ServerReflectionResponse(
                error_response=reflection_pb2.ErrorResponse(error_code=grpc.StatusCode.NOT_FOUND.value[0], error_message="not found"),
                original_request=request,
            )
        files = self._files.get(file.name)
        if files is None:
            files = self._files[file.name] = _serialized_with_dependencies(file)
        return reflection_pb2.ServerReflectionResponse(
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(file_descriptor_proto=files), original_request=request
        )


def _serialized_with_dependencies(file: _FileWithComments) -> list[bytes]:
    """The file and every file it depends on, transitively, each serialized (what grpc_reflection
    answers for a file)."""
    files: dict[str, _FileWithComments] = {}
    unseen = [file]
    while unseen:
        next_file = unseen.pop()
        if next_file.name not in files:
            files[next_file.name] = next_file
            unseen.extend(next_file.dependencies)
    serialized = []
    for each in files.values():
        proto = descriptor_pb2.FileDescriptorProto()
        each.CopyToProto(proto)
        serialized.append(proto.SerializeToString())
    return serialized


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serves reflection for `service_names` on `server`, the contract's files with their comments,
    each file's answer serialized once. Each request is worked on in a unary turn of its caller's
    share (the call gate's, `api/road/gate.py`)."""
    contract_files()  # read once now: a missing or broken set fails the start, not a client's call
    pool = CommentedPool(descriptor_pool.Default())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(_ServedOnce(tuple(service_names), pool), server)  # type: ignore[no-untyped-call]
