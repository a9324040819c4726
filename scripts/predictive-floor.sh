#!/bin/sh
# Does the scaler's predictive floor earn its keep? A periodic trace
# (a burst every PERIOD seconds, idle between) is replayed through
# `stoke bench load --trace` against `stoke serve` with sim engines, once
# with the deployment's forecast.predictive on and once off. For each run
# it prints the replica acquisitions by tier and cause (demand: requests
# waited for it; predicted: the floor started it ahead of them), the
# replica-seconds held, and the client's TTFT percentiles.
#
#   scripts/predictive-floor.sh [PERIODS] [PERIOD] [BURST] [RATE]
#
# defaults: 6 periods of 60 s, bursts of 10 s at 6 req/s (about 13 minutes
# for both runs). Needs bin/stoke (make build); leaves everything under a
# temporary directory it prints.
set -eu
PERIODS=${1:-6}
PERIOD=${2:-60}
BURST=${3:-10}
RATE=${4:-6}
STOKE=${STOKE:-bin/stoke}
WORK=$(mktemp -d /tmp/stoke-predictive.XXXXXX)
echo "predictive-floor: working in $WORK" >&2

# The trace: bursts start half a period in, on a forecast bucket's edge.
awk -v periods="$PERIODS" -v period="$PERIOD" -v burst="$BURST" -v rate="$RATE" 'BEGIN {
	for (k = 0; k < periods; k++)
		for (i = 0; i < burst * rate; i++)
			printf "{\"time\": %.3f, \"input_tokens\": 128, \"output_tokens\": 64}\n", k * period + period / 2 + i / rate
}' >"$WORK/trace.jsonl"

"$STOKE" model synth --preset tiny --out "$WORK/model" --seed 1 >/dev/null 2>&1

run() { # run NAME PREDICTIVE
	name=$1
	dir=$WORK/$name
	mkdir -p "$dir/bucket"
	cp -r "$WORK/model" "$dir/src"
	cat >"$dir/src/stoke.yaml" <<EOF
replicas: {min: 0, max: 2, sleeping: 0}
target_concurrency: 2
window: 10s
idle_delay: 5s
buffer: {timeout: 60s}
forecast: {predictive: $2, period: ${PERIOD}s, bucket: 5s}
EOF
	"$STOKE" push "$dir/src" "file://$dir/bucket/chat" >/dev/null 2>&1
	port=$(( 20000 + $$ % 10000 ))
	[ "$name" = on ] && port=$(( port + 1 ))
	"$STOKE" serve --listen "127.0.0.1:$port" --data "$dir/data" --bucket "file://$dir/bucket" --warm 0 --slots 3 \
		--watch-interval 200ms --sim-profile llama-3.1-8b-fp8-h100 >"$dir/serve.log" 2>&1 &
	pid=$!
	until curl -sf "127.0.0.1:$port/admin/deployments/chat" >/dev/null 2>&1; do sleep 0.2; done
	"$STOKE" bench load --url "http://127.0.0.1:$port" --model chat --trace "$WORK/trace.jsonl" --json >"$dir/report.json"
	curl -s "127.0.0.1:$port/metrics" >"$dir/metrics.txt"
	kill -TERM "$pid"; wait "$pid" || true
	echo "== forecast.predictive: $2"
	grep '^stoke_cold_starts_total' "$dir/metrics.txt" || echo "(no acquisitions)"
	grep '^stoke_replica_seconds_total' "$dir/metrics.txt"
	grep -A 9 '"ttft_ms"' "$dir/report.json" | tr -d ' \n'; echo
}
run off false
run on true
