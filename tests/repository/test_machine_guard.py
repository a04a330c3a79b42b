"""The invariant machine stays whole: every RPC of every service in protos/ is driven by one of its
actions, and every fault the harness can inject is injected by one of them. A new RPC, a new
dev-core switch or answer-fault kind, a new fault helper in tests/faults.py or a new fault method
of the machine's world fails this test, naming what the machine does not drive, as the layer test
fails on a wrong import."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from queue_service.api.access.auth import ROLE_METHODS
from queue_service.dev.core import ANSWER_FAULT_KINDS, DevCore
from tests import faults as fault_helpers
from tests.machine import catalog
from tests.machine.world import TOKENS, World

PROTOS = Path(__file__).resolve().parents[2] / "protos"

_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)\s*;", re.MULTILINE)
_SERVICE = re.compile(r"^\s*service\s+(\w+)\s*\{(.*?)^\}", re.MULTILINE | re.DOTALL)
_RPC = re.compile(r"^\s*rpc\s+(\w+)\s*\(", re.MULTILINE)


def rpcs_in(proto_text: str) -> set[str]:
    """`package.Service/Method` for every rpc of every service in one .proto file's text."""
    package = _PACKAGE.search(proto_text)
    prefix = f"{package.group(1)}." if package else ""
    return {f"{prefix}{service}/{rpc}" for service, body in _SERVICE.findall(proto_text) for rpc in _RPC.findall(body)}


def contract_rpcs() -> set[str]:
    return set().union(*(rpcs_in(path.read_text()) for path in PROTOS.rglob("*.proto")))


def driven_rpcs() -> set[str]:
    return {rpc for action in catalog.ACTIONS.values() for rpc in action.drives}


def harness_faults() -> set[str]:
    """Every fault the harness knows: the dev core's switches and answer-fault kinds, a restart
    of the core with and without its runs, each public function and method of tests/faults.py,
    and each method of the machine's World (which wraps what crosses a process boundary)."""
    known = {f"switch:{name}" for name in DevCore.FAULT_SWITCHES if name != "answer_faults"}
    known |= {f"answer:{kind}" for kind in ANSWER_FAULT_KINDS}
    known |= {"core_restart:keep_runs", "core_restart:forget_runs"}
    for name, member in inspect.getmembers(fault_helpers):
        if name.startswith("_") or getattr(member, "__module__", "") != fault_helpers.__name__:
            continue
        if inspect.isclass(member):
            known |= {f"{name}.{method}" for method, _ in inspect.getmembers(member, inspect.isfunction) if not method.startswith("_")}
        elif inspect.isfunction(member):
            known.add(name)
    known |= {f"World.{method}" for method, _ in inspect.getmembers(World, inspect.isfunction) if not method.startswith("_")}
    return known


def injected_faults() -> set[str]:
    return {fault for action in catalog.ACTIONS.values() for fault in action.uses} | set(catalog.STANDING_FAULTS)


def test_every_rpc_of_the_contract_is_driven_by_the_machine() -> None:
    missing = contract_rpcs() - driven_rpcs()
    assert not missing, f"the invariant machine (tests/machine/catalog.py) drives no action for: {sorted(missing)}"


def test_every_fault_of_the_harness_is_injected_by_the_machine() -> None:
    missing = harness_faults() - injected_faults() - set(catalog.NOT_FAULTS)
    assert not missing, f"the invariant machine (tests/machine/catalog.py) injects no fault through: {sorted(missing)}"


# The role an action calls as: `m.call(rpc, "<role>", ...)` or `RoleStubs.metadata("<role>")`.
_ROLE_USE = re.compile(r'(?:Q|OP|CR|CB)\s*\+\s*"\w+",\s*"(\w+)",|metadata\("(\w+)"\)')


def played_roles() -> set[str]:
    text = Path(catalog.__file__).read_text()
    return {a or b for a, b in _ROLE_USE.findall(text)}


def test_every_role_of_the_auth_file_is_played_by_the_machine() -> None:
    """A new role (the viewer was one) gets a token in the machine's auth file and an action that
    calls as it, or the build is red."""
    roles = set(ROLE_METHODS)
    assert roles <= set(TOKENS), f"the machine's auth file (tests/machine/world.py TOKENS) has no token for: {sorted(roles - set(TOKENS))}"
    assert roles <= played_roles(), f"no action of the machine (tests/machine/catalog.py) calls as: {sorted(roles - played_roles())}"


def test_every_public_attribute_of_the_dev_core_is_a_switch_a_setting_or_an_observation() -> None:
    """So a new switch cannot hide from the fault list above as a plain attribute."""
    classified = set(DevCore.FAULT_SWITCHES) | set(DevCore.SETTINGS) | set(DevCore.OBSERVATIONS)
    public = {name for name in vars(DevCore()) if not name.startswith("_")}
    assert public <= classified, (
        f"classify these DevCore attributes (FAULT_SWITCHES, SETTINGS or OBSERVATIONS): {sorted(public - classified)}"
    )


def test_the_guard_names_an_rpc_added_to_a_proto_without_an_action() -> None:
    """The guard itself can fail: a service with one more rpc than the machine drives is named."""
    text = (PROTOS / "acurio/queue/v1/queue_service.proto").read_text()
    grown = re.sub(
        r"(service AnalysisQueueService \{)", r"\1\n  rpc PauseMyQueue(PauseMyQueueRequest) returns (PauseMyQueueResponse);", text
    )
    assert rpcs_in(grown) - driven_rpcs() == {"acurio.queue.v1.AnalysisQueueService/PauseMyQueue"}
