-- The capacity seat's one owner: a job's place at the core's capacity (`capacity_wait_since`,
-- `capacity_token`, `capacity_turn_key`, `capacity_turn_before`, `release_turn_attempt`) is
-- written by the new functions/queue_seat_*.sql alone (functions/README.md, "The capacity seat").
-- The placement of a job entering PENDING, which the BEFORE trigger analysis_jobs_wait_for_capacity
-- finished behind its writer since 0014, is now taken by the writer itself from
-- queue_seat_on_entry, in the statement that creates the PENDING row: the admit
-- (queue_admit_job_v2), the adoption (queue_adopt_run_v2) and the promotion
-- (queue_promote_queued_jobs), whose new texts apply right after this migration, in the same
-- transaction. Every older signature calls these, so no caller of the previous version relies on
-- the trigger, which goes now with its function. No table changes.
DROP TRIGGER IF EXISTS analysis_jobs_wait_for_capacity ON analysis_jobs;
DROP FUNCTION IF EXISTS analysis_jobs_wait_for_capacity();
