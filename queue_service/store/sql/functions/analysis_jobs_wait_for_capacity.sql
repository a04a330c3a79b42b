-- analysis_jobs_wait_for_capacity: the function and its trigger analysis_jobs_wait_for_capacity.
--
-- It finishes the placement of the functions that make a job PENDING (queue_admit_job_v2,
-- queue_adopt_run_v2, queue_promote_queued_jobs; each names it at its top): while the capacity is
-- limited, a job entering PENDING from nowhere or from QUEUED waits for a grant instead of being due.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): A first-pass job entering PENDING while the capacity is limited (a
--   capacity, or a limit the core taught us) waits for the core: no release is due until the grant
--   hands it capacity.
-- * 0016 (capacity turn order): As in 0014, and the job joins the round-robin at its end (its
--   user's latest turn is older).
-- * 0023 (deltas take turns under the capacity): A PENDING job of either kind waits for a grant
--   while the capacity is limited (the function is 0016's; only the trigger's condition changes:
--   deltas too).
-- * 0028 (release pauses and ledger actor): A job of a user whose releases are paused (the fleet,
--   or the user) waits for a grant as under a capacity, with no capacity set too: the grant hands
--   it out once the pause is lifted.

CREATE OR REPLACE FUNCTION public.analysis_jobs_wait_for_capacity()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now constant timestamptz := clock_timestamp();
BEGIN
    IF (TG_OP = 'INSERT' OR OLD.status = 'queued')
       AND (EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL)
            OR queue_releases_paused(NEW.user_id)) THEN
        NEW.capacity_wait_since := v_now;
        NEW.capacity_turn_key := v_now;
        NEW.capacity_token := NULL;
        NEW.next_release_at := NULL;
        NEW.release_attempts := CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.release_attempts END;
    END IF;
    RETURN NEW;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_wait_for_capacity ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_wait_for_capacity BEFORE INSERT OR UPDATE OF status ON analysis_jobs FOR EACH ROW WHEN (new.status = 'pending'::text) EXECUTE FUNCTION analysis_jobs_wait_for_capacity();
