"""OperatorService: the overview, the job search across users, live overview, bulk cancel, the
credits' audit trail (ledger entries with their actor and reason), retry of an ended job
(`servicers/retry.py`), and the fleet settings (the core's capacity, users' limits, pauses of
releases) with their change log.

The same adapters as the other servicers: validate, read through the engine's reads (index-driven
queries of migration 0005), build responses, raise domain errors only. Bulk cancel goes
through `QueueEngine.cancel_each`, which cancels one job at a time as a single CancelJob does (each
job canceled, refunded and its user's next job promoted); the live overview is
`JobReads.watch_overview`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

import grpc

from queue_service import errors
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as pb
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as pb_grpc
from queue_service.api.servicers import page_tokens, validation
from queue_service.api.servicers.convert import (
    audit_event_to_proto,
    capacity_to_proto,
    job_to_proto,
    ledger_entry_to_proto,
    overview_to_proto,
    pause_to_proto,
    queue_minute_to_proto,
    replica_to_proto,
    set_timestamp,
    setting_change_to_proto,
    status_filter,
    user_settings_to_proto,
    user_work_to_proto,
)
from queue_service.api.servicers.retry import MAX_BULK_RETRY, RETRYABLE, choose_for_bulk_retry, retry_each, retry_job
from queue_service.engine import Admission, Credits, JobReads, QueueEngine, Recovery
from queue_service.model import LIVE, AuditQuery, JobInputsSearch, JobSearch, LedgerQuery, LiveJobFilter, RunFate

_DEFAULT_WINDOW_MINUTES = 60
_MAX_WINDOW_MINUTES = 1440
_DEFAULT_INTERVAL_MS = 1000
_MIN_INTERVAL_MS, _MAX_INTERVAL_MS = 250, 60_000
# Open WatchOverview streams: each reads the overview every interval, so they are few (the
# consoles of the on-call team): per replica, and per caller so one cannot take them all (the
# call gate's `overview` turns, besides every stream's `streams` turn).
MAX_OVERVIEW_STREAMS = 64
MAX_OVERVIEW_STREAMS_PER_CALLER = 8
# A bulk cancel counts and cancels at most this many jobs per call.
MAX_BULK_CANCEL = 1000
# The bounds of the settings an operator sets (the database's checks say the same).
MAX_CORE_CAPACITY = 1_000_000
MAX_USER_ACTIVE = 1000


class OperatorServicer(pb_grpc.OperatorServiceServicer):
    def __init__(
        self, engine: QueueEngine, admission: Admission, reads: JobReads, draining: asyncio.Event, credits: Credits, recovery: Recovery
    ) -> None:
        self._engine = engine
        # CheckJobWithCore: the sweeper's reconciliation of one job, asked for now.
        self._recovery = recovery
        self._admission = admission
        self._reads = reads
        self._draining = draining
        self._credits = credits

    async def ListReplicas(
        self, request: pb.ListReplicasRequest, context: grpc.aio.ServicerContext[pb.ListReplicasRequest, pb.ListReplicasResponse]
    ) -> pb.ListReplicasResponse:
        replicas, read_time = await self._reads.replicas()
        response = pb.ListReplicasResponse(replicas=[replica_to_proto(replica) for replica in replicas])
        if read_time is not None:
            set_timestamp(response.read_time, read_time)
        else:
            response.read_time.GetCurrentTime()
        return response

    async def GetOverview(
        self, request: pb.GetOverviewRequest, context: grpc.aio.ServicerContext[pb.GetOverviewRequest, pb.GetOverviewResponse]
    ) -> pb.GetOverviewResponse:
        window = _window(request.window_minutes)
        return pb.GetOverviewResponse(overview=await self._overview(window))

    async def _overview(self, window_minutes: int) -> pb.Overview:
        return overview_to_proto(await self._reads.overview(window_minutes))

    async def WatchOverview(
        self, request: pb.WatchOverviewRequest, context: grpc.aio.ServicerContext[pb.WatchOverviewRequest, pb.WatchOverviewResponse]
    ) -> AsyncIterator[pb.WatchOverviewResponse]:
        v = validation.Violations()
        window = _window(request.window_minutes, v)
        interval_ms = request.interval_ms or _DEFAULT_INTERVAL_MS
        if not _MIN_INTERVAL_MS <= interval_ms <= _MAX_INTERVAL_MS:
            v.add("interval_ms", f"interval_ms must be between {_MIN_INTERVAL_MS} and {_MAX_INTERVAL_MS}; 0 means {_DEFAULT_INTERVAL_MS}")
        v.raise_if_any()
        if self._draining.is_set():
            raise errors.ShuttingDown("this replica is draining; reconnect to another")
        # The replica's WatchOverview streams and each caller's share of them are the call gate's
        # (`api/road/gate.py`, MAX_OVERVIEW_STREAMS below), on both listeners.
        async for overview in self._reads.watch_overview(window, interval_ms / 1000, until=self._draining):
            yield pb.WatchOverviewResponse(overview=overview_to_proto(overview))

    async def SearchJobs(
        self, request: pb.SearchJobsRequest, context: grpc.aio.ServicerContext[pb.SearchJobsRequest, pb.SearchJobsResponse]
    ) -> pb.SearchJobsResponse:
        page_size = validation.validate_page_size(request.page_size)
        search, filter_key = _search(request.filter)
        position = page_tokens.decode_search_token(request.page_token, filter_key)
        if position is not None and (search.upper_time is None or position < (search.upper_time, search.upper_job_id or _MIN_JOB_ID)):
            search = dataclasses.replace(search, upper_time=position[0], upper_job_id=position[1])
        views = await self._reads.search(search, limit=page_size + 1)
        page, more = views[:page_size], len(views) > page_size
        token = page_tokens.encode_search_token(page[-1].create_time, page[-1].job_id, filter_key) if more else ""
        return pb.SearchJobsResponse(jobs=[job_to_proto(view) for view in page], next_page_token=token)

    async def CancelJobs(
        self, request: pb.CancelJobsRequest, context: grpc.aio.ServicerContext[pb.CancelJobsRequest, pb.CancelJobsResponse]
    ) -> pb.CancelJobsResponse:
        search, _ = _search(request.filter)
        statuses = search.statuses or tuple(sorted(LIVE))
        v = validation.Violations()
        if not LIVE.intersection(statuses):
            v.add("filter.statuses", "only QUEUED, PENDING and RUNNING jobs can be canceled; leave statuses empty for all three")
        if not request.dry_run and not 1 <= request.max_jobs <= MAX_BULK_CANCEL:
            v.add(
                "max_jobs", f"max_jobs must be between 1 and {MAX_BULK_CANCEL}: the number of jobs you confirmed (count them with dry_run)"
            )
        v.raise_if_any()
        live_filter = LiveJobFilter(
            statuses=tuple(s for s in statuses if s in LIVE),
            user_id=search.user_id,
            created_after=search.created_after,
            created_before=search.upper_time,
            has_error=search.has_error,
            inputs=search.inputs,
        )
        rows = await self._reads.live_jobs_matching(live_filter, limit=MAX_BULK_CANCEL + 1)
        matched = rows[:MAX_BULK_CANCEL]
        response = pb.CancelJobsResponse(matched=len(matched), more_than_counted=len(rows) > MAX_BULK_CANCEL)
        if request.dry_run:
            return response
        chosen = matched[: request.max_jobs]
        failures = await self._engine.cancel_each(chosen)
        response.canceled = len(chosen) - len(failures)
        response.failures.extend(
            pb.CancelFailure(job_id=str(job_id), reason=error.reason, message=error.message) for job_id, error in failures
        )
        return response

    async def ListLedgerEntries(
        self,
        request: pb.ListLedgerEntriesRequest,
        context: grpc.aio.ServicerContext[pb.ListLedgerEntriesRequest, pb.ListLedgerEntriesResponse],
    ) -> pb.ListLedgerEntriesResponse:
        v = validation.Violations()
        if request.user_id:
            v.check_id("user_id", request.user_id)
        if request.actor:
            v.check_id("actor", request.actor)
        job_id = v.check_uuid("job_id", request.job_id, required=False)
        v.raise_if_any()
        page_size = validation.validate_page_size(request.page_size)
        # A token of an unfiltered actor keeps the key it had before the actor filter existed.
        key_parts = (request.user_id, str(job_id or "")) + ((request.actor,) if request.actor else ())
        key = page_tokens.filter_key("ledger", *key_parts)
        before = page_tokens.decode_ledger_token(request.page_token, key)
        query = LedgerQuery(user_id=request.user_id, job_id=job_id, before_entry_id=before, actor=request.actor)
        entries = await self._credits.ledger_entries(query, limit=page_size + 1)
        page, more = entries[:page_size], len(entries) > page_size
        token = page_tokens.encode_ledger_token(page[-1].entry_id, key) if more else ""
        return pb.ListLedgerEntriesResponse(entries=[ledger_entry_to_proto(entry) for entry in page], next_page_token=token)

    async def SetCoreCapacity(
        self, request: pb.SetCoreCapacityRequest, context: grpc.aio.ServicerContext[pb.SetCoreCapacityRequest, pb.SetCoreCapacityResponse]
    ) -> pb.SetCoreCapacityResponse:
        v = validation.Violations()
        if request.unlimited and request.capacity != 0:
            v.add("capacity", f"capacity must be 0 with unlimited (got {request.capacity}); to set a limit, leave unlimited false")
        elif not request.unlimited and request.capacity == 0:
            v.add(
                "capacity",
                "capacity 0 would not stop anything: to stop releases use SetReleasesPaused; "
                "to remove the limit set unlimited (with capacity 0)",
            )
        elif not 0 <= request.capacity <= MAX_CORE_CAPACITY:
            v.add("capacity", f"capacity must be between 1 and {MAX_CORE_CAPACITY}, or 0 with unlimited")
        v.raise_if_any()
        # Stored as 0: the database's meaning of no limit.
        change = await self._engine.set_core_capacity(request.capacity)
        return pb.SetCoreCapacityResponse(change=setting_change_to_proto(change), overview=await self._capacity_overview())

    async def SetReleasesPaused(
        self,
        request: pb.SetReleasesPausedRequest,
        context: grpc.aio.ServicerContext[pb.SetReleasesPausedRequest, pb.SetReleasesPausedResponse],
    ) -> pb.SetReleasesPausedResponse:
        v = validation.Violations()
        if request.user_id:
            v.check_id("user_id", request.user_id)
        v.check_text("note", request.note, max_chars=validation.MAX_NOTE_CHARS)
        v.raise_if_any()
        change = await self._engine.set_releases_paused(request.user_id, paused=request.paused, note=request.note)
        response = pb.SetReleasesPausedResponse(overview=await self._capacity_overview())
        if change is not None:
            response.change.CopyFrom(setting_change_to_proto(change))
        return response

    async def GetUserSettings(
        self,
        request: pb.GetUserSettingsRequest,
        context: grpc.aio.ServicerContext[pb.GetUserSettingsRequest, pb.GetUserSettingsResponse],
    ) -> pb.GetUserSettingsResponse:
        v = validation.Violations()
        v.check_id("user_id", request.user_id)
        v.raise_if_any()
        return user_settings_to_proto(await self._reads.user_settings(request.user_id))

    async def _capacity_overview(self) -> pb.Overview:
        """The overview's capacity and pause figures, read now."""
        overview = pb.Overview()
        capacity_to_proto(await self._reads.capacity(), overview)
        return overview

    async def SetUserQueueLimit(
        self,
        request: pb.SetUserQueueLimitRequest,
        context: grpc.aio.ServicerContext[pb.SetUserQueueLimitRequest, pb.SetUserQueueLimitResponse],
    ) -> pb.SetUserQueueLimitResponse:
        v = validation.Violations()
        v.check_id("user_id", request.user_id)
        if not 0 <= request.max_active <= MAX_USER_ACTIVE:
            v.add("max_active", f"max_active must be between 0 and {MAX_USER_ACTIVE}; 0 means the service's default")
        v.raise_if_any()
        change = await self._engine.set_user_queue_limit(request.user_id, request.max_active)
        return pb.SetUserQueueLimitResponse(change=setting_change_to_proto(change))

    async def RetryJob(
        self, request: pb.RetryJobRequest, context: grpc.aio.ServicerContext[pb.RetryJobRequest, pb.RetryJobResponse]
    ) -> pb.RetryJobResponse:
        v = validation.Violations()
        job_id = v.check_uuid("job_id", request.job_id)
        if request.another_retry or request.retry_key:
            # A further retry is keyed by it; a plain retry's key is the job's alone.
            v.check_id("retry_key", request.retry_key)
        v.raise_if_any()
        assert job_id is not None
        view, admitted_now = await retry_job(
            self._admission, self._reads, job_id, another_retry=request.another_retry, retry_key=request.retry_key
        )
        return pb.RetryJobResponse(job=job_to_proto(view), admitted_now=admitted_now)

    async def RetryJobs(
        self, request: pb.RetryJobsRequest, context: grpc.aio.ServicerContext[pb.RetryJobsRequest, pb.RetryJobsResponse]
    ) -> pb.RetryJobsResponse:
        v = validation.Violations()
        by_filter = request.HasField("filter")
        if by_filter == bool(request.job_ids):
            v.add("job_ids", "give either job_ids (the jobs chosen) or filter (the jobs matching it), not both or neither")
        if len(request.job_ids) > MAX_BULK_RETRY:
            v.add("job_ids", f"at most {MAX_BULK_RETRY} job ids per call (got {len(request.job_ids)})")
        job_ids = [v.check_uuid(f"job_ids[{i}]", raw) for i, raw in enumerate(request.job_ids[:MAX_BULK_RETRY])]
        if not request.dry_run and not 1 <= request.max_jobs <= MAX_BULK_RETRY:
            v.add(
                "max_jobs", f"max_jobs must be between 1 and {MAX_BULK_RETRY}: the number of jobs you confirmed (count them with dry_run)"
            )
        v.raise_if_any()
        response = pb.RetryJobsResponse()
        if by_filter:
            search, _ = _search(request.filter)
            if not set(search.statuses) <= RETRYABLE:
                v.add("filter.statuses", "only FAILED and CANCELED jobs can be retried; leave statuses empty for both")
                v.raise_if_any()
            search = dataclasses.replace(search, statuses=search.statuses or tuple(sorted(RETRYABLE)))
            views = await self._reads.search(search, limit=MAX_BULK_RETRY + 1)
            response.more_than_counted = len(views) > MAX_BULK_RETRY
            choice = choose_for_bulk_retry(views[:MAX_BULK_RETRY])
        else:
            wanted = list(dict.fromkeys(job_id for job_id in job_ids if job_id is not None))
            views = await self._reads.by_ids(wanted)
            found = {view.job_id for view in views}
            choice = choose_for_bulk_retry(views, missing=[job_id for job_id in wanted if job_id not in found])
        response.matched = len(choice.to_retry)
        already = list(choice.already_retried)
        failures = list(choice.refused)
        if not request.dry_run:
            for job_id, outcome in await retry_each(self._admission, self._reads, choice.to_retry[: request.max_jobs]):
                if isinstance(outcome, errors.QueueError):
                    failures.append((job_id, outcome))
                elif outcome[1]:
                    response.retried += 1
                    response.jobs.append(job_to_proto(outcome[0]))
                else:
                    already.append(job_id)  # retried by someone else meanwhile: not charged again
        response.already_retried_job_ids.extend(str(job_id) for job_id in already)
        response.failures.extend(
            pb.RetryFailure(job_id=str(job_id), reason=error.reason, message=error.message) for job_id, error in failures
        )
        return response

    async def ListUsersWithWork(
        self,
        request: pb.ListUsersWithWorkRequest,
        context: grpc.aio.ServicerContext[pb.ListUsersWithWorkRequest, pb.ListUsersWithWorkResponse],
    ) -> pb.ListUsersWithWorkResponse:
        page_size = validation.validate_page_size(request.page_size)
        users, total = await self._reads.users_with_work(limit=page_size)
        return pb.ListUsersWithWorkResponse(users=[user_work_to_proto(user) for user in users], users_total=total)

    async def GetQueueHistory(
        self, request: pb.GetQueueHistoryRequest, context: grpc.aio.ServicerContext[pb.GetQueueHistoryRequest, pb.GetQueueHistoryResponse]
    ) -> pb.GetQueueHistoryResponse:
        window = _window(request.window_minutes)
        minutes = await self._reads.queue_history(window_minutes=window)
        response = pb.GetQueueHistoryResponse(minutes=[queue_minute_to_proto(minute) for minute in minutes], window_minutes=window)
        response.read_time.GetCurrentTime()
        return response

    async def ListSettingChanges(
        self,
        request: pb.ListSettingChangesRequest,
        context: grpc.aio.ServicerContext[pb.ListSettingChangesRequest, pb.ListSettingChangesResponse],
    ) -> pb.ListSettingChangesResponse:
        page_size = validation.validate_page_size(request.page_size)
        before = page_tokens.decode_setting_changes_token(request.page_token)
        changes = await self._engine.setting_changes(before_change_id=before, limit=page_size + 1)
        page, more = changes[:page_size], len(changes) > page_size
        token = page_tokens.encode_setting_changes_token(page[-1].change_id) if more else ""
        return pb.ListSettingChangesResponse(changes=[setting_change_to_proto(change) for change in page], next_page_token=token)

    async def ListReleasePauses(
        self,
        request: pb.ListReleasePausesRequest,
        context: grpc.aio.ServicerContext[pb.ListReleasePausesRequest, pb.ListReleasePausesResponse],
    ) -> pb.ListReleasePausesResponse:
        page_size = validation.validate_page_size(request.page_size or validation.MAX_PAGE_SIZE)
        pauses, paused_users = await self._reads.release_pauses(limit=page_size)
        return pb.ListReleasePausesResponse(pauses=[pause_to_proto(pause) for pause in pauses], paused_users_total=paused_users)

    async def CheckJobWithCore(
        self,
        request: pb.CheckJobWithCoreRequest,
        context: grpc.aio.ServicerContext[pb.CheckJobWithCoreRequest, pb.CheckJobWithCoreResponse],
    ) -> pb.CheckJobWithCoreResponse:
        v = validation.Violations()
        job_id = v.check_uuid("job_id", request.job_id)
        v.raise_if_any()
        assert job_id is not None
        before = await self._reads.one(job_id)
        if before is None:
            raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
        report, changed = await self._recovery.check_with_core(before)
        after = (await self._reads.one(job_id)) or before
        run_state = report.fate.value if report is not None else ""
        outcome = _check_outcome(before.status.value, after.status.value, report.fate if report is not None else None, changed)
        await self._engine.record_operator_action(
            "check_with_core", user_id=before.user_id, job_id=job_id, outcome=f"{run_state or 'not asked'}: {outcome}"
        )
        return pb.CheckJobWithCoreResponse(job=job_to_proto(after), run_state=run_state, job_changed=changed, outcome=outcome)

    async def ListAuditEvents(
        self,
        request: pb.ListAuditEventsRequest,
        context: grpc.aio.ServicerContext[pb.ListAuditEventsRequest, pb.ListAuditEventsResponse],
    ) -> pb.ListAuditEventsResponse:
        v = validation.Violations()
        if request.actor:
            v.check_id("actor", request.actor)
        if request.user_id:
            v.check_id("user_id", request.user_id)
        v.raise_if_any()
        page_size = validation.validate_page_size(request.page_size)
        key = page_tokens.filter_key("audit", request.actor, request.user_id)
        position = page_tokens.decode_audit_token(request.page_token, key)
        query = AuditQuery(
            actor=request.actor,
            user_id=request.user_id,
            before_time=position[0] if position else None,
            before_key=position[1] if position else "",
        )
        events = await self._reads.audit_events(query, limit=page_size + 1)
        page, more = events[:page_size], len(events) > page_size
        token = page_tokens.encode_audit_token(page[-1].occurred_at, page[-1].event_key, key) if more else ""
        return pb.ListAuditEventsResponse(events=[audit_event_to_proto(event) for event in page], next_page_token=token)


def _check_outcome(before: str, after: str, fate: RunFate | None, changed: bool) -> str:
    """What CheckJobWithCore found and did, for a person."""
    if fate is None:
        return f"the job had ended ({after}); the core was not asked"
    if fate is RunFate.UNKNOWN_TO_CORE:
        return f"the core does not know the job's run: the job {'failed, refunded' if changed else 'had moved on meanwhile'} ({after})"
    if changed and after != before:
        return f"the core reports the run {fate.value}: the job ended {after}"
    if changed:
        return "the core still held the run: released again"
    if fate is RunFate.JUDGING:
        return "the core confirms it is judging the run"
    return f"the core reports the run {fate.value}; nothing to change ({after})"


def _window(window_minutes: int, v: validation.Violations | None = None) -> int:
    window = window_minutes or _DEFAULT_WINDOW_MINUTES
    if not 1 <= window <= _MAX_WINDOW_MINUTES:
        violations = v or validation.Violations()
        violations.add("window_minutes", f"window_minutes must be between 1 and {_MAX_WINDOW_MINUTES}; 0 means {_DEFAULT_WINDOW_MINUTES}")
        if v is None:
            violations.raise_if_any()
    return window


# The smallest job id: `(t, _MIN_JOB_ID)` is the keyset position just below every job admitted at t.
_MIN_JOB_ID = uuid.UUID(int=0)


def _search(job_filter: pb.JobFilter) -> tuple[JobSearch, str]:
    """Validates a filter; returns the search (its upper bound from `created_before`) and a key
    that ties page tokens to the filter."""
    v = validation.Violations()
    if job_filter.user_id:
        v.check_id("filter.user_id", job_filter.user_id)
    inputs = JobInputsSearch(
        document_uri_prefix=v.check_trimmed(
            "filter.document_uri_prefix", job_filter.document_uri_prefix, max_chars=validation.MAX_URI_CHARS
        ),
        title_words=validation.search_words(v, "filter.title_words", job_filter.title_words),
        source_doi=validation.search_doi(v, "filter.source_doi", job_filter.source_doi),
    )
    after = v.check_timestamp("filter.created_after", job_filter.created_after) if job_filter.HasField("created_after") else None
    before = v.check_timestamp("filter.created_before", job_filter.created_before) if job_filter.HasField("created_before") else None
    if after is not None and before is not None and after >= before:
        v.add("filter.created_before", "created_before must be later than created_after")
    v.raise_if_any()
    statuses = status_filter(job_filter.statuses, field="filter.statuses")
    search = JobSearch(
        user_id=job_filter.user_id,
        statuses=statuses,
        created_after=after,
        upper_time=before,
        upper_job_id=_MIN_JOB_ID if before is not None else None,
        has_error=job_filter.has_error,
        inputs=inputs,
    )
    # The search in inputs joins the key only when set, so a token of a replica without it (during
    # a deploy) keeps its meaning here.
    searched = [inputs.document_uri_prefix, inputs.title_words, inputs.source_doi] if inputs else []
    key = page_tokens.filter_key(search.user_id, [str(s) for s in statuses], str(after), str(before), search.has_error, *searched)
    return search, key
