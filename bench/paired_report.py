#!/usr/bin/python3
"""Tessera against raw ZeroMQ, compared only where both ran with the CPUs
placed the same way (bench/run_paired.sh writes the input).

    paired_report.py WORK ROUNDS

WORK holds, for each round R in 1..ROUNDS, raw-R.json (bench/raw_zmq_bench
--json) and tessera-R/summary.json (a launcher run of
tessera-push-pull-bench); optionally raw-accumulate-R.json and
raw-copy-R.json, the baseline run with --receiver_work accumulate and copy
(the receiver does with each payload what Tessera must: a server adds a
push into its row, a worker's Pull copies the reply into the caller's
buffer). Every result in them carries, besides the MB/s of each repeat, the
CPU pair probe (bench/cpu_pair_probe.h) before each repeat and after the
last: the round trip of a cache line between the two CPUs.

How repeats are compared:
- Placements are found from the probes themselves: all probe values of the
  run, sorted, are cut wherever one is more than LINK times the one before;
  each piece is a placement, named by its median round trip. No threshold
  is tied to one machine.
- A repeat is steady when the probes before and after it fall in the same
  placement; it is then that placement's sample. Other repeats are dropped
  (counted in the table's notes): the CPUs moved while it ran.
- For each size, mode and Tessera op, and each placement, the ratio is the
  median of Tessera's steady samples (all rounds) over the median of raw
  ZeroMQ's steady samples of the same size and mode (all rounds). Rounds
  interleave the two, so a placement's samples come from the same spells.
- Where the files are there, each push, pull and view is also compared
  with the baseline that does the same work (SAME_WORK): pushes with raw +
  accumulate, pulls with raw + copy, views with plain raw (a view copies
  nothing). What Tessera loses against that baseline is its own cost; the
  rest is the work, which the plain baseline skips.

Prints one Markdown table on stdout. Exit status 0, or 2 for unusable input
(missing files, results without probes), with one line saying which.
"""
import json
import statistics
import sys
from pathlib import Path

LINK = 1.3  # consecutive sorted probes further apart than this start a new placement

SAME_WORK = {"push": "accumulate", "pull": "copy", "pullview": "none"}  # Tessera op -> raw --receiver_work
WORKS = ("none", "accumulate", "copy")
OP_LABEL = {"push": "push", "pull": "pull", "pullview": "pull, view", "pushpull": "push+pull"}
WORK_LABEL = {"none": "raw", "accumulate": "+ accumulate", "copy": "+ copy"}
MODE_LABEL = {"sequential": "sequential", "inflight8": "8 in flight",
              "stream": "stream (raw PUSH/PULL; Tessera 64 pushes in flight)"}


class Unusable(Exception):
    """Input the report cannot use; the message says which and why."""


def repeats(result):
    """(mbps, probe before, probe after) for each repeat of one result."""
    mbps, probes = result.get("mbps"), result.get("probe_ns")
    if not isinstance(mbps, list) or not isinstance(probes, list) or len(probes) != len(mbps) + 1:
        raise Unusable(f"result {result.get('size')} {result.get('op', '')} {result.get('mode')} has "
                       f"no probe_ns of one entry per repeat plus one")
    return [(mbps[i], probes[i], probes[i + 1]) for i in range(len(mbps))]


def placements(probes, link=LINK):
    """Sorted list of (low, high) probe intervals, one per placement.
    Probes of 0 or less (no probe) are ignored."""
    values = sorted(p for p in probes if p > 0)
    groups = []
    for v in values:
        if groups and v <= groups[-1][-1] * link:
            groups[-1].append(v)
        else:
            groups.append([v])
    return [(g[0], g[-1], statistics.median(g)) for g in groups]


def placement_of(groups, probe):
    """Index of the placement holding `probe`, or None."""
    for i, (low, high, _) in enumerate(groups):
        if low <= probe <= high:
            return i
    return None


def steady_samples(result, groups):
    """{placement index: [mbps, ...]} of the repeats whose probes before and
    after fall in one placement; and the number of repeats dropped."""
    out, dropped = {}, 0
    for mbps, before, after in repeats(result):
        a, b = placement_of(groups, before), placement_of(groups, after)
        if a is None or a != b:
            dropped += 1
        else:
            out.setdefault(a, []).append(mbps)
    return out, dropped


def load(work, rounds):
    """(raw results, Tessera results) of all rounds, each a list of dicts with
    a 'round' and, for raw, the receiver's 'work' added."""
    raw, tessera = [], []
    for r in range(1, rounds + 1):
        raw_path = Path(work) / f"raw-{r}.json"
        summary_path = Path(work) / f"tessera-{r}" / "summary.json"
        for path in (raw_path, summary_path):
            if not path.is_file():
                raise Unusable(f"{path} is missing")
        for receiver_work in WORKS:
            path = raw_path if receiver_work == "none" else Path(work) / f"raw-{receiver_work}-{r}.json"
            if path.is_file():
                for x in json.loads(path.read_text())["results"]:
                    raw.append(dict(x, round=r, work=receiver_work))
        summary = json.loads(summary_path.read_text())
        try:
            results = summary["worker_reports"][0]["report"]["results"]
        except (KeyError, IndexError, TypeError):
            raise Unusable(f"{summary_path} has no worker report with results") from None
        for x in results:
            tessera.append(dict(x, round=r))
    return raw, tessera


def compare(raw, tessera, link=LINK):
    """Rows of the table: dicts with size, mode, op, placement (median probe
    ns), n_tessera, n_raw, tessera and raw medians, ratio, and the same for
    the baseline doing the op's work (SAME_WORK; None where there is none):
    work, n_work, work_raw, work_ratio; and the counts of repeats (all,
    dropped). Raw results without a 'work' are plain raw."""
    for x in raw + tessera:
        repeats(x)  # every result must carry its probes
    probes = [p for x in raw + tessera for p in x["probe_ns"]]
    groups = placements(probes, link)
    if not groups:
        raise Unusable("no probe ran (every probe_ns is -1): the placement of the CPUs is unknown")
    pooled = {}  # (side, size, mode, op) -> {placement: [mbps]}
    total = dropped = 0
    for side, results in (("raw", raw), ("tessera", tessera)):
        for x in results:
            samples, d = steady_samples(x, groups)
            total += len(x["mbps"])
            dropped += d
            key = (side, x["size"], x["mode"], x.get("op", "") if side == "tessera" else x.get("work", "none"))
            for g, values in samples.items():
                pooled.setdefault(key, {}).setdefault(g, []).extend(values)
    rows = []
    cells = sorted({(k[1], k[2], k[3]) for k in pooled if k[0] == "tessera"},
                   key=lambda c: (c[0], list(MODE_LABEL).index(c[1]) if c[1] in MODE_LABEL else 9,
                                  list(OP_LABEL).index(c[2]) if c[2] in OP_LABEL else 9))
    for size, mode, op in cells:
        mine = pooled[("tessera", size, mode, op)]
        base = pooled.get(("raw", size, mode, "none"), {})
        work = SAME_WORK.get(op)
        same = pooled.get(("raw", size, mode, work), {}) if work else {}
        for g in sorted(set(mine) | set(base)):
            t, r, w = mine.get(g, []), base.get(g, []), same.get(g, [])
            tm = statistics.median(t) if t else None
            rm = statistics.median(r) if r else None
            wm = statistics.median(w) if w else None
            rows.append({"size": size, "mode": mode, "op": op, "placement_ns": groups[g][2],
                         "n_tessera": len(t), "n_raw": len(r), "tessera": tm, "raw": rm,
                         "ratio": tm / rm if tm and rm else None,
                         "work": work, "n_work": len(w), "work_raw": wm,
                         "work_ratio": tm / wm if tm and wm else None})
    return rows, total, dropped, groups


def size_label(size):
    if size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size % (1 << 10) == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


def markdown(rows, total, dropped, groups):
    def num(v, fmt):
        return "–" if v is None else format(v, fmt)

    with_work = any(row.get("n_work") for row in rows)
    head = ("| size | mode | Tessera op | CPUs placed (round trip) | repeats Tessera / raw | Tessera MB/s "
            "| raw ZMQ MB/s | Tessera/raw |")
    rule = "|---:|---|---|---:|---:|---:|---:|---:|"
    if with_work:
        head += " raw + same work | repeats | MB/s | (raw + work)/raw | Tessera/(raw + work) |"
        rule += "---|---:|---:|---:|---:|"
    lines = [head, rule]
    for row in rows:
        line = (f"| {size_label(row['size'])} | {MODE_LABEL.get(row['mode'], row['mode'])} "
                f"| {OP_LABEL.get(row['op'], row['op'])} | {row['placement_ns']:.0f} ns "
                f"| {row['n_tessera']} / {row['n_raw']} | {num(row['tessera'], ',.0f')} "
                f"| {num(row['raw'], ',.0f')} | {num(row['ratio'], '.2f')} |")
        if with_work:
            work = WORK_LABEL.get(row.get("work"), "–")
            cost = row["work_raw"] / row["raw"] if row.get("work_raw") and row.get("raw") else None
            line += (f" {work} | {row.get('n_work', 0)} | {num(row.get('work_raw'), ',.0f')} "
                     f"| {num(cost, '.2f')} | {num(row.get('work_ratio'), '.2f')} |")
        lines.append(line)
    spans = ", ".join(f"{lo:.0f}-{hi:.0f} ns" for lo, hi, _ in groups)
    lines += ["",
              "MB/s of payload (1 MB = 10^6 bytes): medians of the steady repeats of all rounds with the CPUs",
              f"placed that way. Placements seen (cache-line round trip between the two CPUs): {spans}.",
              f"{dropped} of {total} repeats were dropped because the CPUs moved while they ran."]
    if with_work:
        lines += ["'raw + same work': the baseline's receiver adds each payload into a row (for pushes) or copies",
                  "it into the next of 8 buffers (for pulls); views copy nothing and are compared with plain raw.",
                  "(raw + work)/raw is what that work costs raw ZeroMQ itself on this machine when done after each",
                  "message arrives; Tessera can beat it where it overlaps the work with the transfer (wide rows in",
                  "pieces)."]
    return "\n".join(lines)


def main(argv):
    if len(argv) != 3:
        print("usage: paired_report.py WORK ROUNDS", file=sys.stderr)
        return 2
    try:
        raw, tessera = load(argv[1], int(argv[2]))
        print(markdown(*compare(raw, tessera)))
    except (Unusable, ValueError, json.JSONDecodeError) as e:
        print(f"paired_report.py: unusable input: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
