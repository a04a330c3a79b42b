-- analysis_jobs_keep_search_keys: the function and its trigger of the same name.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0029 (job search by document and DOI): What the job search reads is written once, at insert,
--   whichever code inserts the job (as the migration's backfill does for the jobs before it):
--   each distinct DOI of its sources, lowercased (DOIs are case-insensitive), kept for as long as
--   the row is, after its sources are pruned; and its title's words ('simple': no stemming, no
--   stop words), stored so a search that walks the newest jobs tests each row cheaply. In a row
--   of `analysis_job_search_keys` beside the job's, written once: the job's own row is rewritten
--   at every step of its life, and its indexes with it (the migration says why).
-- * 0032: "kept for as long as the row is" no longer holds for the DOIs: once the job's sources
--   are pruned, `analysis_jobs_trim_search_keys` cuts them to its preview's (first 10 sources).
-- * 0036: each DOI as `queue_doi_search_key` writes it (lowercased, without the characters that
--   show as nothing), so a DOI stored before the service refused those is found as it reads.
-- * 0041: with the DOIs' buckets (queue_doi_search_bucket), which the search by DOI's index reads.
--   In one statement: each DOI's key computed once (`OFFSET 0` keeps the planner from repeating
--   its expression in the filter), the keys and their buckets aggregated together, the bucket's
--   expression inlined. As two statements, the key computed twice and the buckets by a function
--   call, the trigger took 27 us a job of one DOI and 64 us of twenty, against 22 and 50 so
--   (the round's start, without the search key's cleaning nor buckets: 19 and 32).

CREATE OR REPLACE FUNCTION public.analysis_jobs_keep_search_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO analysis_job_search_keys (job_id, document_uri, source_dois, source_doi_buckets, title_words)
    SELECT NEW.job_id, NEW.document_uri, COALESCE(array_agg(DISTINCT d.doi), '{}'),
           COALESCE(array_agg(DISTINCT queue_doi_search_bucket(d.doi)), '{}'),
           to_tsvector('simple'::regconfig, COALESCE(NEW.document_title, ''))
      FROM (SELECT queue_doi_search_key(s.e->>'doi') AS doi
              FROM jsonb_array_elements(COALESCE(NEW.sources, '[]'::jsonb)) AS s(e)
            OFFSET 0) AS d
     WHERE d.doi <> '';
    RETURN NULL;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_keep_search_keys ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_keep_search_keys AFTER INSERT ON analysis_jobs FOR EACH ROW WHEN (new.sources IS NOT NULL OR new.document_title IS NOT NULL OR new.document_uri IS NOT NULL) EXECUTE FUNCTION analysis_jobs_keep_search_keys();
