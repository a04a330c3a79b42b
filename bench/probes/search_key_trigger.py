"""What the search keys' insert trigger costs a job, in the forms it has had (docs/scaling.md §15.2).

Each form is a trigger function of its own on a scratch table, writing into a copy of
`analysis_job_search_keys` (its indexes included) on a fresh, migrated, non-durable PostgreSQL.
A round inserts `--jobs` rows of `--dois` DOIs each into every form's table in one statement, so
the figure is the trigger's work per job (its statements, the keys' index entries), not a call's
round trip; the forms take turns within a round, and the median of `--rounds` rounds is printed.

- `round_start`: the DOIs lowercased in the insert itself (no search key cleaning, no buckets).
- `two_statements`: the keys into a variable (each DOI's key computed in the filter and the list),
  then the insert calling `queue_doi_search_buckets` (migration 0041's form).
- `insert_select`: one INSERT ... SELECT over the keys computed once, still calling
  `queue_doi_search_buckets` (commit 2de1e0d, which measured dearer).
- `one_insert_aggregated`: the keys and their buckets aggregated in the insert's one statement,
  the bucket's expression (`queue_doi_search_bucket`) inlined: the trigger's text now.

    .venv/bin/python -m bench.probes.search_key_trigger [--jobs 10000] [--dois 1] [--rounds 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import psycopg

from bench.probes.rounds import new_report, print_and_write_forms, scratch_database

_KEY = "queue_doi_search_key(s.e->>'doi')"
_SOURCES = "jsonb_array_elements(COALESCE(NEW.sources, '[]'::jsonb)) AS s(e)"
_TITLE = "to_tsvector('simple'::regconfig, COALESCE(NEW.document_title, ''))"
_KEYS_ONCE = f"(SELECT {_KEY} AS doi FROM {_SOURCES} OFFSET 0) AS d"

FORMS = {
    "round_start": f"""
        INSERT INTO {{keys}} (job_id, document_uri, source_dois, title_words)
        VALUES (NEW.job_id, NEW.document_uri,
                ARRAY(SELECT DISTINCT lower(s.e->>'doi') FROM {_SOURCES} WHERE COALESCE(s.e->>'doi', '') <> ''), {_TITLE});""",
    "two_statements": f"""
        v_dois := ARRAY(SELECT DISTINCT {_KEY} FROM {_SOURCES} WHERE COALESCE({_KEY}, '') <> '');
        INSERT INTO {{keys}} (job_id, document_uri, source_dois, source_doi_buckets, title_words)
        VALUES (NEW.job_id, NEW.document_uri, v_dois, queue_doi_search_buckets(v_dois), {_TITLE});""",
    "insert_select": f"""
        INSERT INTO {{keys}} (job_id, document_uri, source_dois, source_doi_buckets, title_words)
        SELECT NEW.job_id, NEW.document_uri, k.dois, queue_doi_search_buckets(k.dois), {_TITLE}
          FROM (SELECT ARRAY(SELECT DISTINCT d.doi FROM {_KEYS_ONCE} WHERE d.doi <> '') AS dois) AS k;""",
    "one_insert_aggregated": f"""
        INSERT INTO {{keys}} (job_id, document_uri, source_dois, source_doi_buckets, title_words)
        SELECT NEW.job_id, NEW.document_uri, COALESCE(array_agg(DISTINCT d.doi), '{{{{}}}}'),
               COALESCE(array_agg(DISTINCT queue_doi_search_bucket(d.doi)), '{{{{}}}}'), {_TITLE}
          FROM {_KEYS_ONCE} WHERE d.doi <> '';""",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.search_key_trigger", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000, help="rows a form inserts per round")
    parser.add_argument("--dois", type=int, default=1, help="DOIs per job (the admit benchmark's jobs have 1)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    report = new_report(what="search keys' trigger forms", jobs=args.jobs, dois=args.dois, rounds=args.rounds)
    with scratch_database("search-key-trigger-", durable=False) as (db, _), psycopg.connect(db.dsn, autocommit=True) as conn:
        for form, body in FORMS.items():
            conn.execute(f"CREATE TABLE keys_{form} (LIKE analysis_job_search_keys INCLUDING DEFAULTS INCLUDING INDEXES)")
            conn.execute(f"CREATE TABLE jobs_{form} (job_id uuid, document_uri text, document_title text, sources jsonb)")
            conn.execute(
                f"CREATE FUNCTION keep_{form}() RETURNS trigger LANGUAGE plpgsql AS $f$ DECLARE v_dois text[]; "
                f"BEGIN {body.format(keys=f'keys_{form}')} RETURN NULL; END $f$"
            )
            conn.execute(f"CREATE TRIGGER keep AFTER INSERT ON jobs_{form} FOR EACH ROW EXECUTE FUNCTION keep_{form}()")
        sources = json.dumps([{"doi": f"10.1234/Bench.{i}", "citation": "Bench et al. 2024"} for i in range(args.dois)])
        per_job: dict[str, list[float]] = {form: [] for form in FORMS}
        for _ in range(args.rounds):
            for form in FORMS:
                conn.execute(f"TRUNCATE jobs_{form}, keys_{form}")
                started = time.perf_counter()
                conn.execute(
                    f"INSERT INTO jobs_{form} SELECT gen_random_uuid(), 'doc://x', 'A title of words', %s::jsonb "
                    "FROM generate_series(1, %s)",
                    (sources, args.jobs),
                )
                per_job[form].append((time.perf_counter() - started) * 1e6 / args.jobs)
    print_and_write_forms(
        per_job,
        report,
        args.out,
        heading=f"{args.jobs} jobs of {args.dois} DOI(s) a round, {args.rounds} rounds: microseconds a job, median (every round)",
        key="us_per_job",
        digits=1,
    )


if __name__ == "__main__":
    main()
