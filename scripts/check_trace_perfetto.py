#!/usr/bin/env python3
"""Loads a `wgtrain profile --trace` file into Perfetto's trace processor (the engine
behind ui.perfetto.dev, whose JSON importer reads Chrome trace files) and checks it
against the profile's `--json` summary:

- the import reports no errors or data losses (Perfetto's `stats` table);
- the GPU track holds one slice per launch: steps x launches_per_step;
- the host tracks hold one slice per step, and the phases;
- per step, the kernels' time adds up to no more than the GPU busy time, which is no
  more than the wall time.

Prints one JSON object; exits 1 when a check fails, 2 when the trace processor cannot
load the trace.

    python3 scripts/check_trace_perfetto.py TRACE.json PROFILE.json --bin trace_processor_shell

`--bin` is Perfetto's trace_processor_shell (its `query` command): the one that
get.perfetto.dev/trace_processor downloads, or one built from Perfetto's sources by
scripts/build_trace_processor.sh where that site cannot be reached.
"""

import argparse
import csv
import io
import json
import subprocess
import sys


class LoadError(Exception):
    pass


def query(binary, trace, sql):
    """The rows of `sql` on `trace`, as dicts (numbers as int where they are)."""
    run = subprocess.run([binary, "query", trace, sql], capture_output=True, text=True)
    if run.returncode != 0:
        raise LoadError(run.stderr.strip()[-2000:])
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    number = lambda v: int(v) if v.lstrip("-").isdigit() else v
    return [{k: number(v) for k, v in r.items()} for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("profile")
    ap.add_argument("--bin", default="trace_processor_shell", help="trace_processor_shell binary")
    args = ap.parse_args()
    profile = json.load(open(args.profile))
    try:
        return check(args, profile, lambda sql: query(args.bin, args.trace, sql))
    except (LoadError, OSError) as e:
        print(f"the trace processor could not load {args.trace}: {e}", file=sys.stderr)
        return 2


def check(args, profile, rows):
    problems = rows(
        "select name, idx, severity, source, value from stats "
        "where severity in ('error', 'data_loss') and value > 0"
    )
    tracks = {
        r["track"]: r
        for r in rows(
            "select thread.name as track, count(*) as slices, sum(slice.dur) as dur_ns "
            "from slice join thread_track on slice.track_id = thread_track.id "
            "join thread using (utid) group by thread.name"
        )
    }
    steps = rows(
        "select slice.name as name, slice.ts as ts, slice.dur as dur from slice "
        "join thread_track on slice.track_id = thread_track.id join thread using (utid) "
        "where thread.name = 'host: steps' order by slice.ts"
    )
    # The kernels inside each step's span.
    per_step = []
    for s in steps:
        k = rows(
            "select count(*) as n, coalesce(sum(slice.dur), 0) as dur from slice "
            "join thread_track on slice.track_id = thread_track.id join thread using (utid) "
            f"where thread.name = 'GPU: kernels' and slice.ts >= {s['ts']} and slice.ts < {s['ts'] + s['dur']}"
        )[0]
        per_step.append({"step": s["name"], "wall_ns": s["dur"], "kernels": k["n"], "kernel_ns": k["dur"]})

    n_steps, launches = profile["steps"], profile["launches_per_step"]
    gpu = tracks.get("GPU: kernels", {"slices": 0})
    checks = {
        "no import errors": not problems,
        "one GPU slice per launch": gpu["slices"] == n_steps * launches,
        "one host slice per step": tracks.get("host: steps", {"slices": 0})["slices"] == n_steps,
        "host phases present": tracks.get("host: phases", {"slices": 0})["slices"] > 0,
        "kernels per step = launches per step": all(p["kernels"] == launches for p in per_step),
        # Timestamps are whole nanoseconds in Perfetto and microseconds with three
        # decimals in the file: allow 1 us of rounding per launch.
        "kernel time <= GPU busy <= wall, per step": all(
            p["kernel_ns"] <= s["gpu_ms"] * 1e6 + launches * 1e3 and s["gpu_ms"] <= s["wall_ms"]
            for p, s in zip(per_step, profile["per_step"])
        ),
    }
    print(
        json.dumps(
            {
                "trace": args.trace,
                "tracks": tracks,
                "per_step": per_step,
                "import_problems": problems,
                "checks": checks,
                "ok": all(checks.values()),
            },
            indent=1,
        )
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
