-- What the pruners delete or empty past its retention: ended jobs, their sources, abandoned runs.

-- name: forget_abandoned_runs
-- Abandoned runs older than the retention: the core reports none of them any more.
DELETE FROM run_reservations
 WHERE run_id IN (SELECT run_id FROM run_reservations
                   WHERE settled_at < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
                   ORDER BY settled_at
                   LIMIT %(batch_size)s);

-- name: prune_ended_job_inputs
-- Empties the full sources of ended jobs (their runs settled) that ended more than the retention
-- ago, oldest first, at most `batch_size` (engine/pruner.py); the preview, the counts and the
-- document stay. `analysis_jobs_ended_holding_sources` finds exactly the jobs still holding them;
-- rows another transaction holds are left for the next batch.
UPDATE analysis_jobs j
   SET sources = NULL
  FROM (SELECT job_id FROM analysis_jobs
         WHERE end_time < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
           AND end_time IS NOT NULL AND sources IS NOT NULL
           AND status IN ('succeeded', 'failed', 'canceled') AND run_settle_due_at IS NULL
         ORDER BY end_time
         LIMIT %(batch_size)s
         FOR UPDATE SKIP LOCKED) AS due
 WHERE j.job_id = due.job_id;

-- name: prune_ended_jobs
-- Deletes ended jobs (their runs settled) that ended more than the retention ago, oldest first,
-- at most `batch_size` (engine/pruner.py), read on `analysis_jobs_recently_ended`. A job a kept
-- delta re-check names as its base stays until that delta goes (the delta's reference must hold).
-- Their ledger entries stay (`credit_ledger.job_id` references no job); their search keys go with
-- them (`analysis_job_search_keys`, migration 0029). A job admitted within the last hour stays
-- whatever the retention: the free-work limit counts the hour's jobs (`admit_state`), so a
-- retention under an hour must not delete what it counts. Each deleted job is announced to the
-- job-change feed (functions/analysis_jobs_announce_change.sql), and open WatchJobs streams say it
-- vanished. Returns how many jobs it deleted.
WITH pruned AS (
    DELETE FROM analysis_jobs j
     USING (SELECT e.job_id FROM analysis_jobs e
             WHERE e.end_time < clock_timestamp() - make_interval(secs => %(retention_seconds)s)
               AND e.end_time IS NOT NULL
               AND e.create_time < clock_timestamp() - interval '1 hour'
               AND e.status IN ('succeeded', 'failed', 'canceled') AND e.run_settle_due_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM analysis_jobs d WHERE d.delta_of_job_id = e.job_id)
             ORDER BY e.end_time
             LIMIT %(batch_size)s
             FOR UPDATE SKIP LOCKED) AS due
     WHERE j.job_id = due.job_id
    RETURNING j.job_id
), forgotten_keys AS (
    DELETE FROM analysis_job_search_keys k USING pruned WHERE k.job_id = pruned.job_id
)
SELECT count(*) AS pruned FROM pruned;
