-- analysis_jobs_announce: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0013 (every view change announced): One place builds the job-change notice, for the trigger and
--   for changes that touch no job row.
-- * 0015 (job change feed): The one place that records a job's change (migration 0013): for the
--   trigger, which holds the job's row lock from its UPDATE, and for a refund without a status
--   change.

CREATE OR REPLACE FUNCTION public.analysis_jobs_announce(p_job analysis_jobs, p_old_status text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO analysis_job_feed (job_id, user_id, status, old_status, release_claimed)
    VALUES (p_job.job_id, p_job.user_id, p_job.status, p_old_status,
            p_job.status = 'pending' AND p_job.release_attempts > 0);
END
$function$;
