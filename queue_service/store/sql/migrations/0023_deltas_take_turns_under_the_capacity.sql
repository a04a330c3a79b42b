-- Delta re-checks take turns under the fleet's capacity, and a refused release gives back only
-- its own turn (docs/design.md, I6, I12, I13).
--
-- Until now a delta never waited: its run was created judging, and it took capacity without a
-- turn. A user with a finished job and no credits could keep re-checking (deltas cost nothing by
-- default), hold the capacity above its limit and keep every other user's first-pass job waiting.
-- The rules now:
--
-- * A delta still never waits for its user's slot (deltas hold none, I6), but while the fleet's
--   capacity is limited its run is created held and the job is PENDING, waiting for a turn like
--   any run (`queue_admit_job` with `p_delta_held`; the capacity trigger now covers deltas). A
--   grant releases it. With the capacity unlimited a delta is created judging and admitted
--   RUNNING, as before.
-- * Every run a user has at the core counts toward her place in the max-min order, her deltas
--   included (`queue_capacity_in_use_of_user`), and the fleet's count is one rule for both kinds
--   (`queue_capacity_in_use`): a run takes capacity while PENDING, RUNNING or ended unsettled,
--   unless it waits for a grant. I12 holds for every run at the core.
-- * Among users with equally few runs in use, a waiting delta goes ahead of first-pass work
--   (`queue_capacity_next_in_line` walks the waiting deltas first); the positions shown
--   (`analysis_jobs_capacity_order`) follow the same order.
-- * A user's deltas waiting or judging count toward her delta limit (QUEUE_MAX_ACTIVE_DELTAS_PER_USER).
-- * A refused release (`queue_capacity_refused`) gives the user's turn back only while the turn
--   it took is still her latest: one she got meanwhile through another slot is kept (it used to
--   be erased, passing her ahead of users she had already been served before).
--
-- Additive for the replicas of the previous version that overlap a deploy: every function keeps
-- its signature and result; `queue_admit_job` gains an overload with `p_delta_held`, and the one
-- the previous version calls admits deltas judging, as it always did.

CREATE INDEX analysis_jobs_deltas_taking_capacity ON analysis_jobs (user_id)
 WHERE (status IN ('pending', 'running') OR run_settle_due_at IS NOT NULL) AND delta_of_job_id IS NOT NULL
   AND (capacity_wait_since IS NULL OR capacity_token IS NOT NULL);

CREATE INDEX analysis_jobs_active_deltas ON analysis_jobs (user_id)
 WHERE status IN ('pending', 'running') AND delta_of_job_id IS NOT NULL;

CREATE INDEX analysis_jobs_deltas_waiting_turn_order ON analysis_jobs (capacity_turn_key, capacity_wait_since, queue_seq)
 WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL AND delta_of_job_id IS NOT NULL;

-- The functions, the view and the trigger these rules change live in `store/sql/functions/`, one
-- file each, applied after the migrations: queue_capacity_in_use_of_user, queue_capacity_in_use,
-- analysis_jobs_wait_for_capacity (the trigger now covers re-checks), queue_capacity_first_waiting,
-- queue_capacity_next_in_line, analysis_jobs_capacity_order, queue_grant_capacity,
-- queue_capacity_give_back_turn, queue_capacity_refused and queue_admit_job (the overload with
-- `p_delta_held`).
