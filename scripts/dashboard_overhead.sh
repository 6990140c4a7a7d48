#!/usr/bin/env bash
# The dashboard's cost to training: runs the same training twice, once with no
# recording (--no-record) and once with --dashboard and a client reading the live
# stream and fetching the latest step's timeline every 0.2 s (as the app does), and
# prints one JSON line with the median step times (steps 3 on) and the overhead.
#   scripts/dashboard_overhead.sh WGTRAIN_BINARY OUT_DIR PORT [train arguments...]
set -euo pipefail
bin=$1; out=$2; port=$3; shift 3
mkdir -p "$out"; rm -f "$out"/plain.jsonl "$out"/dash.jsonl "$out"/dash.memory.json
"$bin" train --quiet --no-record --log "$out/plain.jsonl" "$@" > "$out/plain.txt" 2>&1
"$bin" train --quiet --log "$out/dash.jsonl" --dashboard "127.0.0.1:$port" "$@" > "$out/dash.txt" 2>&1 &
pid=$!
until curl -s "http://127.0.0.1:$port/api/health" > /dev/null; do sleep 0.05; done
curl -s -N "http://127.0.0.1:$port/api/runs/dash/stream" > "$out/stream.txt" &
spid=$!
fetches=0
while kill -0 $pid 2> /dev/null; do
    step=$(tail -n 1 "$out/dash.jsonl" 2> /dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.read() or "{}").get("step", 0))' 2> /dev/null || echo 0)
    curl -s -o /dev/null "http://127.0.0.1:$port/api/runs/dash/timeline?step=$step" && fetches=$((fetches + 1)) || true
    sleep 0.2
done
wait $pid || true
kill $spid 2> /dev/null || true
python3 - "$out" "$fetches" <<'PY'
import json, sys
out, fetches = sys.argv[1], int(sys.argv[2])
def med(name):
    xs = sorted(json.loads(l)["step_ms"] for l in open(f"{out}/{name}.jsonl") if '"mem"' in l)[2:]
    return xs[len(xs) // 2], len(xs) + 2
p, n = med("plain"); d, _ = med("dash")
frames = sum(1 for l in open(f"{out}/stream.txt") if l.startswith("data:"))
print(json.dumps({"steps": n, "median_step_ms_plain": round(p, 2), "median_step_ms_dashboard": round(d, 2),
                  "overhead": round(d / p - 1, 4), "stream_frames": frames, "timeline_fetches": fetches}))
PY
