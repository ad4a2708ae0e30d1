#!/usr/bin/env python3
"""Tables of perf/device/profile.sh from Nsight Compute CSV (ncu --csv --print-units base).

usage: ncu_tables.py kernels <csv>   per-kernel time, DRAM bytes, SM / memory %, grid, registers
                                     (and, when the stall metrics are present, issue / warps /
                                     HMMA pipe and the four largest stall reasons)
       ncu_tables.py memory <csv>    L1 / shared, L2, DRAM %, shared wavefronts per SM cycle,
                                     bank-conflict share
Both read the CSV into {ID: {metric: value}} in launch order (read_rows) and print markdown.
"""
import csv
import sys


def read_rows(path):
    """({ID: {"name": kernel, metric: float or text}}, [IDs in launch order]); None if no rows."""
    text = open(path).read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        return None
    rows, order = {}, []
    for r in csv.DictReader(text[start:]):
        key = r["ID"]
        if key not in rows:
            rows[key] = {"name": r.get("Kernel Name", "?")}
            order.append(key)
        try:
            rows[key][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            rows[key][r["Metric Name"]] = r["Metric Value"]
    return rows, order


def short(name, n):
    return name if len(name) < n else name[:n - 3] + "..."


def kernels(rows, order):
    print("| # | kernel | us | DRAM MB | read MB | written MB | SM % | mem % | grid | regs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    total = 0.0
    for k in order:
        d = rows[k]
        t = d.get("gpu__time_duration.sum", 0.0) / 1e3
        total += t
        mb = (d.get("dram__bytes_read.sum", 0.0) + d.get("dram__bytes_write.sum", 0.0)) / 1e6
        name = short(d["name"], 70)
        print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.0f | %.0f | %s | %s |" % (
            k, name, t, mb, d.get("dram__bytes_read.sum", 0.0) / 1e6, d.get("dram__bytes_write.sum", 0.0) / 1e6,
            d.get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
            d.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", 0.0),
            int(d.get("launch__grid_size", 0) or 0), int(d.get("launch__registers_per_thread", 0) or 0)))
    print("\nsum of recorded kernel durations: %.1f us (%d kernels)" % (total, len(order)))
    stall = "smsp__average_warps_issue_stalled_"
    if any(m.startswith(stall) for d in rows.values() for m in d):
        print("\n| # | kernel | issue % | warps active % | HMMA pipe % | largest stalls (warp cycles per issued instruction) |")
        print("|---|---|---|---|---|---|")
        for k in order:
            d = rows[k]
            st = sorted(((v, m[len(stall):].replace("_per_issue_active.ratio", "")) for m, v in d.items()
                         if m.startswith(stall) and isinstance(v, float)), reverse=True)[:4]
            name = short(d["name"], 50)
            def pct(m):  # a metric ncu reports as text (n/a) prints as it is
                v = d.get(m, "-")
                return "%.0f" % v if isinstance(v, float) else str(v)
            print("| %s | %s | %s | %s | %s | %s |" % (
                k, name, pct("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                pct("sm__warps_active.avg.pct_of_peak_sustained_active"),
                pct("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
                ", ".join("%s %.1f" % (n, v) for v, n in st)))


def memory(rows, order):
    print("\n| # | kernel | L1/shared % | L2 % | DRAM % | shared wavefronts per SM cycle | bank-conflict wavefronts % |")
    print("|---|---|---|---|---|---|---|")
    for k in order:
        d = rows[k]
        f = lambda m: d.get(m) if isinstance(d.get(m), float) else None
        name = short(d["name"], 50)
        wf, bc, cyc = f("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"), f("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"), f("sm__cycles_elapsed.sum")
        pct = lambda m: "%.0f" % f(m) if f(m) is not None else "-"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (k, name, pct("l1tex__throughput.avg.pct_of_peak_sustained_active"),
            pct("lts__throughput.avg.pct_of_peak_sustained_elapsed"), pct("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            "%.2f" % (wf / cyc) if wf is not None and cyc else "-",
            "%.0f" % (100.0 * bc / wf) if bc is not None and wf else "-"))


def main(argv):
    if len(argv) != 3 or argv[1] not in ("kernels", "memory"):
        sys.stderr.write(__doc__)
        return 2
    got = read_rows(argv[2])
    if got is None:
        print("no ncu rows" if argv[1] == "kernels" else "\nno ncu memory rows")
        return 0
    (kernels if argv[1] == "kernels" else memory)(*got)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
