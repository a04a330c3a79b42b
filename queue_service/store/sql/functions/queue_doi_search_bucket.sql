-- queue_doi_search_bucket: one DOI search key's bucket.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0041 (DOI search in bounded buckets): the key's md5's first 16 bits modulo 16 384
--   (queue_doi_search_buckets says why). One expression, so PostgreSQL inlines it where it is
--   called: the insert trigger (analysis_jobs_keep_search_keys) computes a job's keys and their
--   buckets in its one statement without a function call per job. The migration's backfill
--   writes the same formula out.

CREATE OR REPLACE FUNCTION public.queue_doi_search_bucket(p_key text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT ('x' || substr(md5(p_key), 1, 4))::bit(16)::integer % 16384
$function$;
