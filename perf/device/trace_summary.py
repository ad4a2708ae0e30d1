#!/usr/bin/env python3
"""Prints an hk_forward --trace file as text: one block per thread, spans in time order
(start and duration in ms from the start of main, nesting by indentation, chunk index)."""
import json
import sys


def main(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    for tid in sorted({e["tid"] for e in spans}):
        print(f"-- {names.get(tid, 'thread %d' % tid)}")
        mine = sorted((e for e in spans if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in mine:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            chunk = e.get("args", {}).get("chunk")
            print(f"  {e['ts'] / 1000:9.2f} {e['dur'] / 1000:8.2f}  {'  ' * len(open_ends)}{e['name']}"
                  + (f" [{chunk}]" if chunk is not None else ""))
            open_ends.append(e["ts"] + e["dur"])


if __name__ == "__main__":
    main(sys.argv[1])
