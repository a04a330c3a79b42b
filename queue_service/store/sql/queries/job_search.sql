-- The operator's job search, one query shape per index that fits its filter (store
-- `job_search_statement` picks it), and the jobs a bulk cancel matches.

-- name: search_job_views_of_user
-- One page of the operator's job search within one user, newest admitted first. The upper
-- bound is the page token's keyset position or `created_before`, whichever is lower, so the
-- walk over the user index (`analysis_jobs_user_newest_admitted`) starts right there; one query shape per index keeps
-- the plan index-driven when the statement is prepared.
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s
   AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: search_job_views_in_status
-- One page of the job search within one status across users (an ended status:
-- `analysis_jobs_ended_status_newest_admitted`; an active one: that status's partial index).
SELECT * FROM analysis_job_views
 WHERE status = %(status)s
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: search_job_views
-- One page of the job search across users and statuses (the admit-time index, `analysis_jobs_newest_admitted`).
SELECT * FROM analysis_job_views
 WHERE (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
   AND (create_time, job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR last_error <> '')
 ORDER BY create_time DESC, job_id DESC
 LIMIT %(limit)s;

-- name: job_search_narrowing
-- The filters of the searches in what jobs judge (below), after the condition whose index each
-- walks: a fragment they include, never run alone. The user, the statuses, the keyset position,
-- the admit time, errors, and the other search fields (`also_*`; empty: every job, and the store
-- empties the one the shape walks, so a custom plan counts its selectivity once); newest admitted
-- first, one page. The uri is matched exactly by `starts_with` (the shapes' range is its bound).
   AND (%(user_id)s::text = '' OR j.user_id = %(user_id)s::text)
   AND (cardinality(%(statuses)s::text[]) = 0 OR j.status = ANY(%(statuses)s::text[]))
   AND (j.create_time, j.job_id) < (COALESCE(%(upper_time)s::timestamptz, 'infinity'),
                                    COALESCE(%(upper_job_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
   AND j.create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND (NOT %(has_error)s OR j.last_error <> '')
   AND (%(also_document_uri_prefix)s::text = '' OR starts_with(k.document_uri, %(also_document_uri_prefix)s::text))
   AND (%(also_title_words)s::text = '' OR k.title_words @@ plainto_tsquery('simple', %(also_title_words)s::text))
   AND (%(also_source_doi)s::text = '' OR k.source_dois @> ARRAY[%(also_source_doi)s::text])
 ORDER BY j.create_time DESC, j.job_id DESC
 LIMIT %(limit)s

-- name: search_job_views_by_source_doi
-- One page of the job search among the jobs citing a DOI: those in the DOI's bucket
-- (`analysis_job_search_keys_by_source_doi_bucket`, migration 0041, functions/queue_doi_search_buckets.sql),
-- of which those holding the DOI: few jobs cite one DOI, so all are read, narrowed and sorted;
-- then the page's views.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.source_doi_buckets @> queue_doi_search_buckets(ARRAY[%(source_doi)s::text])
                       AND k.source_dois @> ARRAY[%(source_doi)s::text]
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: search_job_views_by_document_uri
-- One page of the job search among the jobs whose document uri starts with a prefix: the range of
-- `analysis_job_search_keys_by_document_uri` (migration 0029; "C" collation, so a prefix is a range)
-- from the prefix to the prefix followed by the highest code point (`starts_with` decides), then the
-- page's views.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.document_uri COLLATE "C" >= %(document_uri_prefix)s::text
                       AND k.document_uri COLLATE "C" < %(document_uri_prefix)s::text || chr(1114111)
                       AND starts_with(k.document_uri, %(document_uri_prefix)s::text)
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: search_job_views_by_title_words
-- One page of the job search among the jobs whose title holds every word (`title_words` and its
-- index `analysis_job_search_keys_by_title_words`, migration 0029, 'simple' configuration), then the
-- page's views. For words in many titles the planner walks the newest jobs instead, testing the stored words.
SELECT v.* FROM analysis_job_views v
 WHERE v.job_id IN (SELECT j.job_id FROM analysis_job_search_keys k JOIN analysis_jobs j ON j.job_id = k.job_id
                     WHERE k.title_words @@ plainto_tsquery('simple', %(title_words)s::text)
-- include: job_search_narrowing
                   )
 ORDER BY v.create_time DESC, v.job_id DESC;

-- name: active_jobs_matching
-- The QUEUED, PENDING and RUNNING jobs a bulk cancel would touch, oldest admitted first (the
-- partial indexes over the rows in flight: only those are read).
SELECT job_id, user_id
  FROM analysis_jobs
 WHERE status IN ('queued', 'pending', 'running')  -- lets a prepared (generic) plan see how few rows that is
   AND status = ANY(%(statuses)s::text[])
   AND (%(user_id)s::text = '' OR user_id = %(user_id)s::text)
   AND create_time >= COALESCE(%(created_after)s::timestamptz, '-infinity')
   AND create_time < COALESCE(%(created_before)s::timestamptz, 'infinity')
   AND (NOT %(has_error)s OR last_error <> '')
   AND (%(document_uri_prefix)s::text = '' OR starts_with(document_uri, %(document_uri_prefix)s::text))
   AND (%(title_words)s::text = '' AND %(source_doi)s::text = ''
        OR EXISTS (SELECT 1 FROM analysis_job_search_keys k
                    WHERE k.job_id = analysis_jobs.job_id
                      AND (%(title_words)s::text = '' OR k.title_words @@ plainto_tsquery('simple', %(title_words)s::text))
                      AND (%(source_doi)s::text = '' OR k.source_dois @> ARRAY[%(source_doi)s::text])))
 ORDER BY create_time, job_id
 LIMIT %(limit)s;
