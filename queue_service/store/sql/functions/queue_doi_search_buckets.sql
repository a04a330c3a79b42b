-- queue_doi_search_buckets: the function.
-- requires: queue_doi_search_bucket
--
-- Why, migration by migration (its text below is the last one's):
-- * 0041 (DOI search in bounded buckets): the buckets of a job's DOI search keys, as
--   `analysis_job_search_keys.source_doi_buckets` holds them and its GIN index serves a search by
--   DOI: each key's bucket is its md5's first 16 bits modulo 16 384 (md5 is the same on every
--   server and major, where `hashtext` may change), once each. A GIN index never removes a key
--   from its entry tree, even when no row holds it any more, so over the DOIs themselves, nearly
--   all distinct, the index grew with every DOI ever admitted (8 turnovers of 20 000 jobs: 29.5 MB
--   to 200 MB, at a constant 20 000 rows); over at most 16 384 buckets its entries are bounded
--   (about 0.4 MB once every bucket was used) and vacuum reclaims the posting lists (at 65 536
--   buckets: 8.7 MB throughout). A search reads the jobs in the DOI's bucket (about 50 per bucket at
--   40 000 kept jobs of 20 DOIs) and keeps those whose `source_dois` holds the DOI. '{}' for no DOI.
--   A key's bucket is `queue_doi_search_bucket`'s.

CREATE OR REPLACE FUNCTION public.queue_doi_search_buckets(p_keys text[])
 RETURNS integer[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT ARRAY(SELECT DISTINCT queue_doi_search_bucket(k) FROM unnest(p_keys) AS k ORDER BY 1)
$function$;
