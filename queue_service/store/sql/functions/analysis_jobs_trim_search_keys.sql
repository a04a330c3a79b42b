-- analysis_jobs_trim_search_keys: the function and its trigger of the same name.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0032 (search keys pruned with the sources): a job's DOIs in `analysis_job_search_keys` are
--   what the job still holds. Kept whole after the pruner emptied its sources, every DOI of up to
--   1 000 sources stayed for the job's 30 days with its GIN entries (about 1 MB a job with
--   4-byte characters, where the stated bound after pruning was 36 KB): the search keys counted
--   against no bound. So when a job's sources are emptied, whichever code empties them (the
--   pruner of this version or of the previous one), its DOIs become those of its preview (its
--   first 10 sources, which its detail still shows), as migration 0029's backfill wrote them for
--   jobs pruned before it. Fires only on an UPDATE that sets `sources` (the pruner's): the job's
--   other updates, at every step of its life, never name it.
-- * 0036: each DOI as `queue_doi_search_key` writes it, as `analysis_jobs_keep_search_keys` does.
-- * 0041: the DOIs' buckets (queue_doi_search_buckets) cut with them.
--   The kept keys and their buckets are computed as analysis_jobs_keep_search_keys computes them
--   (sorted, each key once), so a job whose preview keeps every DOI compares equal and is not
--   written again.

CREATE OR REPLACE FUNCTION public.analysis_jobs_trim_search_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    kept_dois text[];
    kept_buckets integer[];
BEGIN
    SELECT COALESCE(array_agg(DISTINCT d.doi), '{}'), COALESCE(array_agg(DISTINCT queue_doi_search_bucket(d.doi)), '{}')
      INTO kept_dois, kept_buckets
      FROM (SELECT queue_doi_search_key(s.e->>'doi') AS doi
              FROM jsonb_array_elements(COALESCE(NEW.sources_preview, '[]'::jsonb)) AS s(e)
            OFFSET 0) AS d
     WHERE d.doi <> '';
    UPDATE analysis_job_search_keys
       SET source_dois = kept_dois,
           source_doi_buckets = kept_buckets
     WHERE job_id = NEW.job_id AND source_dois IS DISTINCT FROM kept_dois;
    RETURN NULL;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_trim_search_keys ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_trim_search_keys AFTER UPDATE OF sources ON analysis_jobs FOR EACH ROW WHEN (old.sources IS NOT NULL AND new.sources IS NULL) EXECUTE FUNCTION analysis_jobs_trim_search_keys();
