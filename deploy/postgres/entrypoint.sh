#!/bin/sh
# First start: initdb with POSTGRES_USER (default postgres) as superuser and POSTGRES_PASSWORD,
# password (scram) authentication over TCP, and POSTGRES_DB created. Then PostgreSQL in the
# foreground, listening on every address; extra arguments go to `postgres`.
set -eu
user=${POSTGRES_USER:-postgres}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
  database=${POSTGRES_DB:-$user}
  if [ "$database" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start >/dev/null
    psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$user" -d postgres -qc "CREATE DATABASE \"$database\""
    pg_ctl -D "$PGDATA" -w stop >/dev/null
  fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -k /var/run/postgresql "$@"
