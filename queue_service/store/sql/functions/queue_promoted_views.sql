-- queue_promoted_views: the function.
-- requires: analysis_job_views
--
-- Why, migration by migration (its text below is the last one's):
-- * 0009 (locked sections in one statement): The views of jobs a section just promoted, as
--   'promoted' rows in the given order. Each read is a statement of its own (it sees the
--   promotions) and goes by primary key: a join of the array with the view, planned generically,
--   cost twenty times more.

CREATE OR REPLACE FUNCTION public.queue_promoted_views(p_job_ids uuid[])
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_job_id uuid;
BEGIN
    FOREACH v_job_id IN ARRAY p_job_ids LOOP
        RETURN QUERY SELECT 'promoted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_job_id;
    END LOOP;
END
$function$;
