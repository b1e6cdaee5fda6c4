#!/usr/bin/env python3
"""The performance matrix's results and report (bench/run_matrix.sh).

Subcommands:

  add RESULTS --round K --source SRC [--kind K] [--transport T] FILE
      Reads one run's raw output and appends one JSON line per measurement
      to RESULTS:
        SRC tessera, --kind dense: a launcher run directory of
          configs/bench_push_pull.yaml (its summary.json, or, when the run
          failed part way, the TESSERA_PROGRESS lines of logs/worker-0.log);
        SRC tessera, --kind sparse: the same for configs/bench_sparse.yaml;
        SRC raw: raw_zmq_bench's --json file (--kind dense or sparse: which
          cells it is the baseline of);
        SRC memcpy: memcpy_bench's --json file.
      A missing or unreadable input appends a "failed" line instead.
  fail RESULTS --round K --source SRC [--kind K] [--transport T] REASON
      Appends a "failed" line.
  sparse-sizes RESULTS
      Prints the message sizes (bytes, comma-separated) of the sparse cells
      measured so far: what the raw ZeroMQ baseline of the sparse rows sends.
  report META RESULTS [--plot PNG]
      Prints the Markdown table (one row per cell of the matrix META lists,
      present or not) and writes the plot.

A result line: {"round": 1, "source": "tessera", "kind": "dense", "transport":
"tcp", "op": "push", "mode": "sequential", "size": 4096, "mbps": 123.4}; a
sparse cell's size is its row width (dim) and it carries "msg_bytes", the mean
payload of one request; raw and memcpy lines have no transport (raw ZeroMQ
runs over TCP loopback). MB/s are of payload, 1 MB = 10^6 bytes.
"""

import argparse
import json
import os
import statistics
import sys

SPARSE_OPS = ("push", "pull")
SPARSE_MODE = "inflight4"      # the sparse driver's requests in flight (configs/bench_sparse.yaml)
SPARSE_RAW_MODE = "inflight8"  # its raw ZeroMQ baseline, as bench/run_sparse.sh runs it
MIB = 1 << 20

# ---------------------------------------------------------------- parsing


def dense_records(report, rnd, transport):
    """Result lines of one dense Tessera run (the driver's report dict)."""
    return [{"round": rnd, "source": "tessera", "kind": "dense", "transport": transport, "op": r["op"],
             "mode": r["mode"], "size": int(r["size"]), "mbps": float(r["median_mbps"]),
             "probe_ns": r.get("probe_ns", [])}
            for r in report.get("results", [])]


def sparse_msg_bytes(unique_per_batch, dim):
    """Mean payload of one sparse request: 8-byte keys and 4-byte floats (as bench/run_sparse.sh)."""
    return int(unique_per_batch * (dim * 4 + 8)) // 4 * 4


def sparse_records(report, rnd, transport):
    return [{"round": rnd, "source": "tessera", "kind": "sparse", "transport": transport, "op": r["op"],
             "mode": SPARSE_MODE, "size": int(r["dim"]),
             "msg_bytes": sparse_msg_bytes(r["unique_per_batch"], r["dim"]),
             "mbps": float(r["payload_bytes_per_s"]) / 1e6}
            for r in report.get("results", [])]


def raw_records(data, rnd, kind):
    return [{"round": rnd, "source": "raw", "kind": kind, "mode": r["mode"], "size": int(r["size"]),
             "mbps": float(r["median_mbps"]), "probe_ns": r.get("probe_ns", [])}
            for r in data.get("results", [])]


def memcpy_records(data, rnd):
    return [{"round": rnd, "source": "memcpy", "kind": "dense", "size": int(r["size"]),
             "mbps": float(r["median_mbps"])}
            for r in data.get("results", [])]


def progress_report(log_text, kind):
    """The results a worker printed as TESSERA_PROGRESS lines (a run that failed part way)."""
    results = []
    for line in log_text.splitlines():
        at = line.find("TESSERA_PROGRESS ")
        if at < 0:
            continue
        try:
            item = json.loads(line[at + len("TESSERA_PROGRESS "):])
        except ValueError:
            continue
        if kind == "dense" and isinstance(item.get("result"), dict):
            results.append(item["result"])
        elif kind == "sparse" and "dim" in item:
            results.append(item)
    return {"results": results}


def run_report(run_dir, kind):
    """(report, complete): the worker's report from a launcher run directory."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        report = summary["worker_reports"][0]["report"]
        if isinstance(report, str):
            report = json.loads(report)
        return report, True
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        pass
    try:
        with open(os.path.join(run_dir, "logs", "worker-0.log"), errors="replace") as f:
            return progress_report(f.read(), kind), False
    except OSError:
        return {"results": []}, False


def fail_record(rnd, source, kind, transport, reason):
    rec = {"round": rnd, "source": source, "kind": kind, "failed": reason}
    if transport:
        rec["transport"] = transport
    return rec


def load_records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


# ---------------------------------------------------------------- the matrix


def expected_cells(meta):
    """Every cell the run was asked for, in table order: (kind, transport, op, mode, size)."""
    cells = []
    for kind in meta.get("kinds", []):
        for transport in meta.get("transports", []):
            if kind == "dense":
                for size in meta.get("sizes", []):
                    for mode in meta.get("modes", []):
                        for op in meta.get("ops", []):
                            if mode == "stream" and op != "push":
                                continue  # the driver streams pushes only
                            cells.append(("dense", transport, op, mode, int(size)))
            elif kind == "sparse":
                for dim in meta.get("dims", []):
                    for op in SPARSE_OPS:
                        cells.append(("sparse", transport, op, SPARSE_MODE, int(dim)))
    return cells


def goals_of(cell):
    """The goals (issue 30) that apply to a cell: [(baseline, minimum ratio)].

    Baselines: "raw" (raw ZeroMQ, same mode and size), "raw_seq" (raw ZeroMQ
    sending the same requests one by one), "tcp" (the same cell over TCP,
    for shared memory), "memcpy" (single-thread memcpy of the same size)."""
    kind, transport, op, mode, size = cell
    goals = []
    if transport == "shm":
        goals.append(("tcp", 1.0))
        if kind == "dense" and op == "pull" and size == 16 * MIB:
            goals.append(("memcpy", 1.0))
    elif transport == "tcp":
        if kind == "dense" and size in (MIB, 16 * MIB):
            goals.append(("raw", 0.9))
        if kind == "dense" and size == 4096 and mode == "inflight8":
            goals.append(("raw_seq", 1.5))
        if kind == "sparse" and size in (16, 64):
            goals.append(("raw", 0.6))
    return goals


class Index:
    """Lookups into the result lines, by round."""

    def __init__(self, records):
        self.tessera, self.raw, self.memcpy, self.failed = {}, {}, {}, []
        for r in records:
            if "failed" in r:
                self.failed.append(r)
                continue
            rnd = r["round"]
            if r["source"] == "tessera":
                key = (r["kind"], r["transport"], r["op"], r["mode"], int(r["size"]))
                self.tessera[(key, rnd)] = r
            elif r["source"] == "raw":
                self.raw[(r.get("kind", "dense"), r["mode"], int(r["size"]), rnd)] = r["mbps"]
            elif r["source"] == "memcpy":
                self.memcpy[(int(r["size"]), rnd)] = r["mbps"]

    def value(self, cell, rnd):
        r = self.tessera.get((cell, rnd))
        return None if r is None else r["mbps"]

    def baseline(self, name, cell, rnd):
        kind, transport, op, mode, size = cell
        if name == "raw":
            if kind == "sparse":
                r = self.tessera.get((cell, rnd))
                return None if r is None else self.raw.get(("sparse", SPARSE_RAW_MODE, r["msg_bytes"], rnd))
            return self.raw.get(("dense", mode, size, rnd))
        if name == "raw_seq":
            return self.raw.get((kind, "sequential", size, rnd))
        if name == "tcp":
            return None if transport == "tcp" else self.value((kind, "tcp", op, mode, size), rnd)
        if name == "memcpy":
            return self.memcpy.get((size, rnd)) if kind == "dense" and transport == "shm" else None
        raise ValueError(name)

    def msg_bytes(self, cell):
        for (c, _), r in self.tessera.items():
            if c == cell and "msg_bytes" in r:
                return r["msg_bytes"]
        return None


def spread(values):
    """(median, min, max) of a list of numbers; None if empty."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def cell_row(cell, index, rounds):
    """Everything the table says about one cell."""
    tessera = [v for v in (index.value(cell, r) for r in rounds) if v is not None]
    row = {"cell": cell, "rounds_run": len(tessera), "rounds": len(rounds), "mbps": spread(tessera),
           "msg_bytes": index.msg_bytes(cell) if cell[0] == "sparse" else None}
    names = ["raw", "tcp", "memcpy"] + [g for g, _ in goals_of(cell) if g not in ("raw", "tcp", "memcpy")]
    row["baseline_mbps"] = {}
    row["ratio"] = {}
    for name in names:
        base_values, ratios = [], []
        for r in rounds:
            b = index.baseline(name, cell, r)
            if b is not None:
                base_values.append(b)
            t = index.value(cell, r)
            if b and t is not None:  # a ratio only from the same round
                ratios.append(t / b)
        row["baseline_mbps"][name] = spread(base_values)
        row["ratio"][name] = spread(ratios)
    marks = []
    if not tessera:
        marks.append("**failed: did not run**")
    elif len(tessera) < len(rounds):
        marks.append(f"ran in {len(tessera)} of {len(rounds)} rounds")
    row["goals"] = []
    for name, minimum in goals_of(cell):
        ratio = row["ratio"].get(name)
        status = "missing" if ratio is None else ("below" if ratio[0] < minimum else "met")
        row["goals"].append((name, minimum, status))
        if status == "below":
            marks.append(f"**below goal** ({BASELINE_NAMES[name]} {ratio[0]:.2f} < {minimum:g})")
        elif status == "missing" and tessera:
            marks.append(f"**goal not measured** ({BASELINE_NAMES[name]} missing)")
    if not marks and row["goals"]:
        marks.append("goal met")
    row["marks"] = marks
    return row


BASELINE_NAMES = {"raw": "× raw", "raw_seq": "× raw sequential", "tcp": "× TCP", "memcpy": "× memcpy"}


def build_rows(meta, records):
    rounds = list(range(1, int(meta.get("rounds", 1)) + 1))
    index = Index(records)
    return [cell_row(cell, index, rounds) for cell in expected_cells(meta)]


# ---------------------------------------------------------------- output


def size_name(n):
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024} KiB"
    return f"{n} B"


def fmt_mbps(s):
    return "–" if s is None else f"{s[0]:,.0f}"


def fmt_number(x):
    return f"{x:.2f}" if x >= 0.095 else f"{x:.2g}"


def fmt_ratio(s):
    """'median (min–max)', or the median alone when the rounds agree (or there was one)."""
    if s is None:
        return "–"
    if s[1] == s[2]:
        return fmt_number(s[0])
    return f"{fmt_number(s[0])} ({fmt_number(s[1])}–{fmt_number(s[2])})"


MODE_NAMES = {"sequential": "sequential", "inflight8": "8 in flight", "stream": "stream",
              SPARSE_MODE: "4 in flight"}


def markdown_table(rows):
    lines = ["| kind | transport | op | mode | size | Tessera MB/s | raw ZMQ MB/s | × raw ZMQ | × TCP | × memcpy "
             "| goal | mark |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        kind, transport, op, mode, size = row["cell"]
        if kind == "sparse":
            size_text = f"dim {size}"
            if row["msg_bytes"]:
                size_text += f" ({row['msg_bytes'] / 1024:,.0f} KiB/request)"
        else:
            size_text = size_name(size)
        goal_texts = []
        for name, minimum, _ in row["goals"]:
            text = f"{BASELINE_NAMES[name]} ≥ {minimum:g}"
            if name == "raw_seq":  # no column of its own
                text += f": {fmt_ratio(row['ratio'].get(name))}"
            goal_texts.append(text)
        lines.append(
            f"| {kind} | {transport} | {op} | {MODE_NAMES.get(mode, mode)} | {size_text} | {fmt_mbps(row['mbps'])} "
            f"| {fmt_mbps(row['baseline_mbps'].get('raw'))} | {fmt_ratio(row['ratio'].get('raw'))} "
            f"| {fmt_ratio(row['ratio'].get('tcp'))} | {fmt_ratio(row['ratio'].get('memcpy'))} "
            f"| {'; '.join(goal_texts)} | {'; '.join(row['marks'])} |")
    return "\n".join(lines)


def below_goal(rows):
    """The cells marked: below a goal, failed, or with a goal not measured."""
    return [row for row in rows if any(m.startswith("**") for m in row["marks"])]


def plot_series(rows):
    """{(panel, op, mode, transport): [(size, median, min, max)]}: dense ratios by size."""
    series = {}
    for row in rows:
        kind, transport, op, mode, size = row["cell"]
        if kind != "dense":
            continue
        for panel, name in (("raw", "raw"), ("tcp", "tcp")):
            ratio = row["ratio"].get(name)
            if ratio is None:
                continue
            series.setdefault((panel, op, mode, transport), []).append((size, *ratio))
    for points in series.values():
        points.sort()
    return series


def write_plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    series = plot_series(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 7.5))
    titles = {"raw": "Tessera / raw ZeroMQ (same mode), dense rows", "tcp": "shared memory / TCP, dense rows"}
    goal_lines = {"raw": 0.9, "tcp": 1.0}
    styles = {"tcp": "-", "shm": "--"}
    markers = {"push": "o", "pull": "s", "pullview": "^"}
    colors = {"sequential": "tab:blue", "inflight8": "tab:orange", "stream": "tab:green"}
    for ax, panel in zip(axes, ("raw", "tcp")):
        for (p, op, mode, transport), points in sorted(series.items()):
            if p != panel:
                continue
            xs = [x for x, *_ in points]
            med = [m for _, m, _, _ in points]
            lo = [m - a for _, m, a, _ in points]
            hi = [b - m for _, m, _, b in points]
            ax.errorbar(xs, med, yerr=[lo, hi], linestyle=styles.get(transport, ":"), marker=markers.get(op, "x"),
                        color=colors.get(mode, "gray"), capsize=3, label=f"{op}, {MODE_NAMES.get(mode, mode)}, "
                        f"{transport}")
        ax.axhline(goal_lines[panel], color="red", linewidth=0.8, linestyle=":")
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        sizes = sorted({x for (p, *_), points in series.items() if p == panel for x, *_ in points})
        if sizes:
            ax.set_xticks(sizes)
            ax.set_xticklabels([size_name(x) for x in sizes])
            ax.minorticks_off()
        ax.set_yscale("log", base=2)  # ratios far from 1 either way stay readable
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_xlabel("row size")
        ax.set_ylabel("ratio (median over rounds; bars: min–max; log scale)")
        ax.set_title(titles[panel])
        ax.grid(True, which="major", alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- commands


def cmd_add(args):
    recs = []
    if args.source == "tessera":
        if not os.path.isdir(args.file):
            recs = [fail_record(args.round, "tessera", args.kind, args.transport, f"no run directory {args.file} (launcher output: "
                                    f"{args.file}.launch.log)")]
        else:
            report, complete = run_report(args.file, args.kind)
            parse = dense_records if args.kind == "dense" else sparse_records
            recs = parse(report, args.round, args.transport)
            if not complete:
                recs.append(fail_record(args.round, "tessera", args.kind, args.transport,
                                        f"the run did not finish ({len(recs)} results from its log); logs in "
                                        f"{args.file}/logs"))
    else:
        try:
            with open(args.file) as f:
                data = json.load(f)
            recs = raw_records(data, args.round, args.kind) if args.source == "raw" else memcpy_records(data, args.round)
        except (OSError, ValueError) as e:
            recs = [fail_record(args.round, args.source, args.kind, args.transport, f"cannot read {args.file}: {e}")]
    with open(args.results, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    for r in recs:
        if "failed" in r:
            what = " ".join(x for x in (args.source, args.kind, args.transport) if x)
            print(f"matrix_report.py: round {args.round}, {what}: {r['failed']}", file=sys.stderr)
    return 0


def cmd_fail(args):
    with open(args.results, "a") as f:
        f.write(json.dumps(fail_record(args.round, args.source, args.kind, args.transport, args.reason)) + "\n")
    return 0


def cmd_sparse_sizes(args):
    sizes = sorted({r["msg_bytes"] for r in load_records(args.results)
                    if r.get("source") == "tessera" and r.get("kind") == "sparse" and "msg_bytes" in r})
    print(",".join(str(s) for s in sizes))
    return 0


def cmd_report(args):
    with open(args.meta) as f:
        meta = json.load(f)
    records = load_records(args.results)
    rows = build_rows(meta, records)
    print(markdown_table(rows))
    failed = [r for r in records if "failed" in r]
    if failed:
        print()
        print("Runs that failed:")
        for r in failed:
            what = " ".join(x for x in (r["source"], r.get("kind"), r.get("transport")) if x)
            print(f"- round {r['round']}, {what}: {r['failed']}")
    marked = below_goal(rows)
    print()
    print(f"{len(rows)} cells, {len(marked)} marked.")
    if meta.get("commit"):
        changed = meta.get("changed") or []
        print(f"Source tree: commit {meta['commit']}" +
              (f", with uncommitted changes to {', '.join(changed)}." if changed else ", no uncommitted changes."))
    if args.plot:
        write_plot(rows, args.plot)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("add", "fail"):
        s = sub.add_parser(name)
        s.add_argument("results")
        s.add_argument("--round", type=int, required=True)
        s.add_argument("--source", choices=("tessera", "raw", "memcpy"), required=True)
        s.add_argument("--kind", choices=("dense", "sparse"), default="dense")
        s.add_argument("--transport", choices=("tcp", "shm"))
        s.add_argument("file" if name == "add" else "reason")
    s = sub.add_parser("sparse-sizes")
    s.add_argument("results")
    s = sub.add_parser("report")
    s.add_argument("meta")
    s.add_argument("results")
    s.add_argument("--plot")
    args = p.parse_args(argv)
    return {"add": cmd_add, "fail": cmd_fail, "sparse-sizes": cmd_sparse_sizes, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
