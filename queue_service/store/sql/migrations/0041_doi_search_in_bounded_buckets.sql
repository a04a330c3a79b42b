-- The search by DOI in bounded buckets (functions/queue_doi_search_buckets.sql says why): a GIN
-- index never removes a key from its entry tree, so `analysis_job_search_keys_by_source_doi`,
-- over the DOIs themselves, grew with every DOI ever admitted however many jobs the retention
-- kept (the soak's database was not bounded by the retention). Each job's DOIs are now also kept
-- as their buckets, at most 16 384 keys for the index, written with the DOIs by
-- analysis_jobs_keep_search_keys and analysis_jobs_trim_search_keys (new texts, applied right after
-- this migration in the same transaction); the jobs kept now get theirs here. The old index goes
-- now: a replica of the previous version searching by DOI during the deploy reads the keys'
-- table without it (the same answer, slower), and keeping it would keep it growing. Admits wait
-- while it runs: 26.9 s at a million kept jobs of 3 DOIs each (docs/operations.md, "Migrations").
-- The backfill writes queue_doi_search_buckets' formula out: the function files apply after the
-- migrations, so the function does not exist yet on a database this upgrades.
ALTER TABLE analysis_job_search_keys ADD COLUMN source_doi_buckets integer[] NOT NULL DEFAULT '{}';
UPDATE analysis_job_search_keys
   SET source_doi_buckets = ARRAY(SELECT DISTINCT ('x' || substr(md5(k), 1, 4))::bit(16)::integer % 16384
                                    FROM unnest(source_dois) AS k ORDER BY 1)
 WHERE cardinality(source_dois) > 0;
CREATE INDEX analysis_job_search_keys_by_source_doi_bucket ON analysis_job_search_keys USING gin (source_doi_buckets);
DROP INDEX analysis_job_search_keys_by_source_doi;
