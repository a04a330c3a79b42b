-- queue_adopt_run: the function, the signature replicas of earlier versions call: a wrapper of
-- queue_adopt_run_v2 passing no lineage.
-- requires: analysis_job_views, queue_adopt_run_v2
--
-- Kept only while replicas of the previous version may call it: dropped, with the trigger
-- analysis_jobs_retry_lineage that fills an adopted retry's lineage from its idempotency key, by
-- the migration after the next release. The service itself calls queue_adopt_run_v2, passing the
-- lineage.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0018, 0019, 0024: the adoption; their history is the body's, in queue_adopt_run_v2.sql now.
-- * 0038 (retry lineage from its writer): The adoption moved to queue_adopt_run_v2, which takes the
--   lineage as a parameter. This signature calls it with none, so a previous version's adoption of
--   a retry (its key `retry:<ended job id>...`) has its lineage filled by the trigger, as before.

CREATE OR REPLACE FUNCTION public.queue_adopt_run(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_run_id uuid, p_price bigint, p_judging boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_adopt_run_v2(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_run_id,
                                     p_price, p_judging, p_actor, p_reason, p_default_max_active, p_release_window_seconds,
                                     p_release_lease_seconds, p_reconcile_after_seconds, NULL::uuid)
$function$;
