-- queue_admit_job: the function (three overloads, the signatures that replicas of earlier versions
-- call, each a wrapper of queue_admit_job_v2 passing no lineage, each after the overload it calls:
-- a fresh database creates them from this file alone, and a SQL body's call is checked when it is
-- created).
-- requires: analysis_job_views, queue_admit_job_v2
--
-- Kept only while replicas of the previous version may call them: dropped, with the trigger
-- analysis_jobs_retry_lineage that fills their retries' lineage from the idempotency key, by the
-- migration after the next release. The service itself calls queue_admit_job_v2, passing the
-- lineage.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009, 0017, 0023: the admit and its earlier signatures; their history is the body's, in
--   queue_admit_job_v2.sql now.
-- * 0038 (retry lineage from its writer): The admit moved to queue_admit_job_v2, which takes the
--   lineage as a parameter. Every signature here calls it with none, so a previous version's retry
--   (its key `retry:<ended job id>...`) has its lineage filled by the trigger, as before.

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb, p_delta_held boolean)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job_v2(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                     p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                     p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                     p_document_uri, p_document_title, p_sources, p_delta_held, NULL::uuid)
$function$;

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  p_document_uri, p_document_title, p_sources, false)
$function$;

CREATE OR REPLACE FUNCTION public.queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  NULL::text, NULL::text, NULL::jsonb)
$function$;
