#!/usr/bin/env python3
"""Checks a wgtrain memory_viz export with PyTorch's own memory_viz code.

    python3 scripts/check_memory_viz.py RUN.stepN.pickle RUN.jsonl N

Run it where PyTorch is installed. It loads the pickle the dashboard exports
(/api/runs/RUN/snapshot.pickle?step=N), runs torch.cuda._memory_viz's processing on it
(segsum, with its assertion that the blocks tile each segment; trace; segment_plot and
trace_plot, which embed it for memory_viz's page), then replays the trace as
memory_viz's allocator-state view does, backwards from the segments: every traced block
must lie inside a segment, an allocation must find its block live and a free its block
not live and not overlapping a live one. The live bytes replayed forward must peak at
the log's `mem.peak` of step N. Prints a JSON summary; exits 1 on any failure.
"""

import json
import pickle
import sys

from torch.cuda import _memory_viz as mv


def main():
    path, log, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(path, "rb") as f:
        data = pickle.load(f)
    failures = []

    # PyTorch's processing.
    summary = mv.segsum(data)
    text = mv.trace(data)
    html = mv.segment_plot(data) + mv.trace_plot(data)

    segments = data["segments"]
    trace = data["device_traces"][0]
    # Blocks tile each segment, from its address to its end.
    live = {}
    for s in segments:
        at = s["address"]
        for b in s["blocks"]:
            if b["address"] != at:
                failures.append(f"segment {s['address']}: block at {b['address']}, expected {at}")
            at += b["size"]
            if b["state"] == "active_allocated":
                live[b["address"]] = b["size"]
        if at != s["address"] + s["total_size"]:
            failures.append(f"segment {s['address']}: blocks end at {at}, not at its end")
        if sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated") != s["allocated_size"]:
            failures.append(f"segment {s['address']}: allocated_size disagrees with its blocks")

    def segment_of(addr, size):
        for s in segments:
            if s["address"] <= addr and addr + size <= s["address"] + s["total_size"]:
                return s
        return None

    outside = [e for e in trace if segment_of(e["addr"], e["size"]) is None]
    if outside:
        failures.append(f"{len(outside)} traced blocks lie in no segment, e.g. {outside[0]}")

    # Back from the end state, as memory_viz's allocator-state history replays it.
    for e in reversed(trace):
        addr, size = e["addr"], e["size"]
        if e["action"] == "alloc":
            if live.get(addr) != size:
                failures.append(f"undoing alloc of {size} at {addr}: not live with that size")
            live.pop(addr, None)
        elif e["action"] == "free_completed":
            if addr in live:
                failures.append(f"undoing free at {addr}: already live")
            for a, sz in live.items():
                if a < addr + size and addr < a + sz:
                    failures.append(f"undoing free at {addr}+{size}: overlaps live {a}+{sz}")
                    break
            live[addr] = size
    at_start = sum(live.values())
    # Forward: the live bytes over the step.
    now, peak = at_start, at_start
    for e in trace:
        now += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, now)
    logged = None
    with open(log) as f:
        for line in f:
            v = json.loads(line)
            if v.get("step") == step and "mem" in v:
                logged = v["mem"]["peak"]
    if logged is None:
        failures.append(f"step {step} is not in {log}")
    elif peak != logged:
        failures.append(f"replayed peak {peak} != the log's {logged}")

    frames = {f["name"] for e in trace for f in e["frames"]}
    print(json.dumps({
        "pickle": path,
        "step": step,
        "segments": len(segments),
        "trace_entries": len(trace),
        "replayed_peak": peak,
        "log_peak": logged,
        "bytes_at_step_start": at_start,
        "distinct_frames": len(frames),
        "segsum_lines": summary.count("\n"),
        "trace_lines": text.count("\n"),
        "trace_entries_memory_viz_text_puts_outside_allocated_size": text.count("= MEM["),
        "html_bytes": len(html),
        "failures": failures[:20],
        "ok": not failures,
    }, indent=1))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
