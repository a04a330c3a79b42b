"""The parts the engine's rooms share, built once by `server` and handed to each room whole.

Before, four constructors repeated the same collaborators one by one. Each room now takes this
bundle, unpacks the parts it uses, and is given beside it only what is its own: a settings value
declared beside the room (`AdmissionSettings`, `ReleasesSettings`, ...: the few settings it
reads, never the whole `Config`) and its room-specific ports (the failover guard, the lifecycle
core, the recovery). It knows no room: every part is below the rooms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from queue_service.core_client import CoreClient
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.owed_releases import OwedReleases
from queue_service.engine.ports import ReleaseStarter
from queue_service.engine.tasks import BackgroundTasks
from queue_service.store import Store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SharedParts:
    """One replica's collaborators of more than one room."""

    # The database, through the store (the only code that runs SQL).
    store: Store
    # Calls to the core's RunService.
    core: CoreClient
    # Clean-ups and changes that outlive their caller; stopping the replica waits for them.
    tasks: BackgroundTasks
    # What this replica knows of the fleet's capacity at the core; asking for a grant starts one.
    capacity: FleetCapacity
    # Starts the releases a room claimed and asks for grants (the `ReleaseHandoff` to the
    # dispatcher, which is built after the rooms).
    starter: ReleaseStarter
    # The releases a locked change whose outcome is unknown may have claimed, handed over at once.
    owed_releases: OwedReleases
    # Wakes this replica's dispatcher to claim the releases that became due.
    wake_dispatcher: Callable[[], None]
