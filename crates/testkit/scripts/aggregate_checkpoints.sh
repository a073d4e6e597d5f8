#!/bin/bash
# The checkpoint of a GROUP BY view after a small change (docs/benchmarks.md, "Sessions on
# arrangements, aggregates' incremental checkpoints"): a keyed table of 1 M rows, a view over
# 200 K groups, a whole CHECKPOINT, then three 10 000-row UPDATEs each followed by a CHECKPOINT;
# prints each checkpoint's duration, pause (seconds) and bytes from eddy_checkpoints, then the
# view's and the table's sums (equal when the view is right).
# Usage: aggregate_checkpoints.sh <eddy binary> <free port>
set -euo pipefail
EDDY=$1
PORT=$2
DIR=$(mktemp -d)
"$EDDY" --data-dir "$DIR/data" --listen "127.0.0.1:$PORT" --http-listen "127.0.0.1:$((PORT + 1))" >"$DIR/log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do
  psql -h 127.0.0.1 -p "$PORT" -U eddy -d eddy -Atc "SELECT 1" >/dev/null 2>&1 && break
  sleep 0.2
done
q() { psql -h 127.0.0.1 -p "$PORT" -U eddy -d eddy -q -At "$@" 2>&1 | { grep -v NOTICE || true; }; }
report="SELECT round(extract(epoch from duration)::numeric, 3), round(extract(epoch from pause)::numeric, 3), bytes FROM eddy_checkpoints"
q -c "CREATE TABLE t (k BIGINT PRIMARY KEY, g BIGINT, v BIGINT, s TEXT)" \
  -c "INSERT INTO t SELECT i, i % 200000, i, 'row ' || i FROM generate_series(1, 1000000) AS s(i)" \
  -c "CREATE MATERIALIZED VIEW a AS SELECT g, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi, string_agg(s, ',') AS names FROM t GROUP BY g" \
  -c "FLUSH"
echo "whole: $(q -c CHECKPOINT -c "$report")"
for r in 1 2 3; do
  echo "after a 10000-row UPDATE: $(q -c "UPDATE t SET v = v + 1 WHERE k BETWEEN $((r * 10000)) AND $((r * 10000 + 9999))" -c FLUSH -c CHECKPOINT -c "$report")"
done
echo "view: $(q -c "SELECT sum(n), sum(total) FROM a")  table: $(q -c "SELECT count(*), sum(v) FROM t")"
