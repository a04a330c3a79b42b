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
-- * 0041: with the DOIs' buckets (queue_doi_search_buckets), which the search by DOI's index reads.
--   In one statement, each DOI's key computed once (the `OFFSET 0` keeps the planner from
--   repeating the key's expression in the filter): written as two, with the key in the filter and
--   the list, it cost an admit 0.03 ms more of PostgreSQL's time than the insert of 0036 alone.

CREATE OR REPLACE FUNCTION public.analysis_jobs_keep_search_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO analysis_job_search_keys (job_id, document_uri, source_dois, source_doi_buckets, title_words)
    SELECT NEW.job_id, NEW.document_uri, k.dois, queue_doi_search_buckets(k.dois),
           to_tsvector('simple'::regconfig, COALESCE(NEW.document_title, ''))
      FROM (SELECT ARRAY(SELECT DISTINCT d.doi
                           FROM (SELECT queue_doi_search_key(s.e->>'doi') AS doi
                                   FROM jsonb_array_elements(COALESCE(NEW.sources, '[]'::jsonb)) AS s(e)
                                 OFFSET 0) AS d
                          WHERE d.doi <> '') AS dois) AS k;
    RETURN NULL;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_keep_search_keys ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_keep_search_keys AFTER INSERT ON analysis_jobs FOR EACH ROW WHEN (new.sources IS NOT NULL OR new.document_title IS NOT NULL OR new.document_uri IS NOT NULL) EXECUTE FUNCTION analysis_jobs_keep_search_keys();
