-- A pause holds releases, never the count (docs/design.md, "The core's capacity", rule 1; I12).
--
-- `release_turn_attempt` is the attempt that opened the job's current turn to be released: the
-- grant's claim (queue_grant_capacity), or 1, the first claim of all. A claim at that attempt
-- follows no ReleaseRun since the job last waited, so a pause may send it back to waiting, its
-- capacity given back (`hold_release_if_paused`); a later attempt follows one that may have been
-- applied, and the job keeps its place in what is in use while the pause holds its retry
-- (`next_release_at` NULL outside the wait for capacity), the core possibly judging it. An attempt
-- held back before the core was asked (`schedule_release_retry` with nothing sent) passes the turn
-- on to the next attempt. An adopted judging run takes back only such jobs
-- (functions/queue_take_back_unreleased_jobs.sql), never one whose run may judge.
--
-- Additive for running replicas: the previous version never reads it; rows it grants keep the
-- default 1, so a claim of theirs past the first attempt counts as possibly applied.
-- Carries the texts of functions/queue_grant_capacity.sql, queue_capacity_next_in_line.sql,
-- analysis_jobs_capacity_order.sql, queue_set_releases_paused.sql and
-- queue_take_back_unreleased_jobs.sql.

ALTER TABLE analysis_jobs ADD COLUMN release_turn_attempt integer NOT NULL DEFAULT 1;
