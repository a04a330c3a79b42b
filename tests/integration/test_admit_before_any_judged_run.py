"""An admit's answer on a database where no first-pass job has succeeded yet: no mean judging time
for the estimates. Its own module, so its database has no judged run from another test."""

from __future__ import annotations

from queue_service.engine import job_reads
from tests.harness import CheckoutsWithinCalls, S, new_user


async def test_queued_admits_answer_without_a_read_per_admit_while_no_run_was_judged_and_estimate_after_the_first(
    service, monkeypatch
) -> None:
    """While no run was ever judged, a queued admit's answer does not read the missing mean judging
    time again on a connection of its own (once a second at most: another replica's first
    completion); a run judged on this replica makes the next answer read it at once."""
    monkeypatch.setattr(job_reads, "_CAPACITY_CACHE_SECONDS", 60.0)  # fresh throughout, however slow the machine
    monkeypatch.setattr(job_reads, "_UNKNOWN_MEAN_RETRY_SECONDS", 60.0)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 12)
    first = await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)  # its read found no mean
    checkouts = CheckoutsWithinCalls(service, monkeypatch)
    admits = 8
    for _ in range(admits):
        queued = await stubs.admit(user)
        assert queued.status == S.JOB_STATUS_QUEUED and not queued.HasField("estimated_start_time")
    # Two connections an admit (the pre-check, the locked admit), and one read of the capacity's
    # state for the first answer; not one more per admit for a mean that is not there.
    assert checkouts.count <= 2 * admits + 1, checkouts.count

    await service.core.finish(first.run_id)  # a run judged here: the mean exists now
    await stubs.wait_for(first.job_id, S.JOB_STATUS_SUCCEEDED)
    after = await stubs.admit(user)
    assert after.status == S.JOB_STATUS_QUEUED and after.HasField("estimated_start_time")
