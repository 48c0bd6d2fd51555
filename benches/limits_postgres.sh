#!/bin/bash
# Deliveries per second of `leasehold bench` on PostgreSQL with a target limit and
# without, in alternating rounds on a fresh database each (the ratio is what counts:
# the machine's load moves both alike).
#
#   cargo build --release --features cli
#   ROUNDS=5 MODES="off on rate binding" benches/limits_postgres.sh
#
# Modes: off (no limit), on (max_in_flight 1000, which 4 workers at batch 5 never
# reach), rate (the same and a rate of 10000/s, never reached either), binding
# (max_in_flight 10). Needs psql and the server of LEASEHOLD_TEST_POSTGRES_URL's
# host (default 127.0.0.1:5432, user postgres); drops and creates the database
# lh_bench_limits.
set -euo pipefail
BIN=${BIN:-./target/release/leasehold}
HOST=${PGHOST:-127.0.0.1}
URL=postgres://postgres@$HOST:5432/lh_bench_limits
round() {
  psql -h "$HOST" -U postgres -d postgres -qc "DROP DATABASE IF EXISTS lh_bench_limits" \
    -c "CREATE DATABASE lh_bench_limits" 2>/dev/null
  "$BIN" --db "$URL" migrate >/dev/null
  case $1 in
    on) "$BIN" --db "$URL" limits set dry-run:v1 --max-in-flight 1000 >/dev/null ;;
    rate) "$BIN" --db "$URL" limits set dry-run:v1 --max-in-flight 1000 --rate 10000/s >/dev/null ;;
    binding) "$BIN" --db "$URL" limits set dry-run:v1 --max-in-flight 10 >/dev/null ;;
  esac
  "$BIN" --db "$URL" bench --attempts 2000 --workers 4 --batch 5 2>&1 | awk -v m="$1" '/deliveries\/s/ {print m, $2}'
}
for _ in $(seq "${ROUNDS:-5}"); do
  for m in ${MODES:-off on}; do round "$m"; done
done
