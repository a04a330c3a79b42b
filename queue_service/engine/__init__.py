"""The engine: the queue's rules, between the edge (`api`, `server`) and the store.

The lifecycle core (`engine.QueueEngine`: ending, promotion, cancel, settlement) and the rooms
around it: `admission` (admit), `completions` (the core's report of a run's end), `releases`
(release a PENDING job; the dispatcher's work), `recovery` (what the sweeper asks),
`core_reconciliation` (the core's live runs against the jobs after a database failover), the
reads (`job_reads`, `credits`) and the watch hub. What the rooms ask of the loops and of the
failover checks are ports (`ports`: `ReleaseStarter`, `FailoverGuard`), given to each room by its
constructor. The collaborators several rooms share (the store, the core client, the background
tasks, the fleet's capacity, the release starter, the owed releases, the dispatcher's wake-up)
come as one bundle (`parts.SharedParts`), and each room reads its own settings value
(`AdmissionSettings`, ...), never the whole `Config`.
"""

from queue_service.engine.admission import Admission, AdmissionSettings, request_digest
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.completions import Completions
from queue_service.engine.core_reconciliation import CoreReconciler, CoreReconcilerSettings
from queue_service.engine.credits import Credits
from queue_service.engine.dispatcher import ReleaseDispatcher
from queue_service.engine.engine import QueueEngine, QueueEngineSettings
from queue_service.engine.job_reads import JobReads
from queue_service.engine.owed_releases import OwedReleases
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import FailoverGuard, NoFailoverGuard, ReleaseHandoff, ReleaseStarter
from queue_service.engine.recovery import Recovery
from queue_service.engine.releases import Releases, ReleasesSettings
from queue_service.engine.replica_heartbeat import ReplicaHeartbeat, new_replica_id
from queue_service.engine.sweeper import Sweeper, SweeperSettings
from queue_service.engine.tasks import BackgroundTasks, each_at_most
from queue_service.engine.watch import NotificationHub
from queue_service.engine.watch_stream import VanishedJob, WatchItem, WatchPage, WatchStream

__all__ = [
    "Admission",
    "AdmissionSettings",
    "BackgroundTasks",
    "Completions",
    "CoreReconciler",
    "CoreReconcilerSettings",
    "Credits",
    "FailoverGuard",
    "FleetCapacity",
    "JobReads",
    "NoFailoverGuard",
    "NotificationHub",
    "OwedReleases",
    "QueueEngine",
    "QueueEngineSettings",
    "Recovery",
    "ReleaseDispatcher",
    "ReleaseHandoff",
    "ReleaseStarter",
    "Releases",
    "ReleasesSettings",
    "ReplicaHeartbeat",
    "SharedParts",
    "Sweeper",
    "SweeperSettings",
    "VanishedJob",
    "WatchItem",
    "WatchPage",
    "WatchStream",
    "each_at_most",
    "new_replica_id",
    "request_digest",
]
