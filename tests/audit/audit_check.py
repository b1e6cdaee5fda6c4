#!/usr/bin/env python3
"""Audit checker for fault experiments.

Reads the push logs of tessera-audit-workload (RECORDS/worker-*.log: "I NODE
INC SEQ KEY..." when a push is issued, "A NODE INC SEQ" when it is
acknowledged) and the audit dumps the servers wrote at the end of the job
(AUDIT/server-*.audit: "row TABLE KEY ROLE VALUES PUSH..."; a deposed server
writes only its header), and proves, for every row of the table:

  acknowledged <= applied   every acknowledged push is in the row, on every
                            server that holds a copy of it;
  applied <= issued         every push in a row was issued, to that key;
  no duplicates             no copy lists a push twice;
  values agree              a row's value (its first column) is the number
                            of pushes it lists (each adds +1; a push of a
                            piece of the row counts if the piece holds
                            that column);
  replicas equal            every copy of a row lists the same pushes.

Prints a summary and the first violations; exits 0 when everything holds,
1 when something does not, 2 when the input is unusable.

Usage: audit_check.py --records DIR --audit DIR [--json OUT]
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def read_pushes(records: Path):
    issued = {}  # (node, inc, seq) -> list of keys
    acked = set()
    for path in sorted(records.glob("worker-*.log")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                if parts[0] == "I" and len(parts) >= 5:
                    issued[(int(parts[1]), int(parts[2]), int(parts[3]))] = [int(k) for k in parts[4:]]
                    continue
                if parts[0] == "A" and len(parts) == 4:
                    acked.add((int(parts[1]), int(parts[2]), int(parts[3])))
                    continue
            except ValueError:
                pass
            if number == len(lines):
                continue  # a last line cut short by a kill: that push was not issued yet
            raise ValueError(f"{path}:{number}: cannot read {line!r}")
    return issued, acked


def read_audits(audit: Path):
    """rows[(table, key)] -> list of (server file, role, value, [pushes])"""
    rows = defaultdict(list)
    servers = []
    for path in sorted(audit.glob("server-*.audit")):
        lines = path.read_text().splitlines()
        if not lines or not lines[0].startswith("# tessera audit"):
            raise ValueError(f"{path}: not an audit dump")
        if "deposed" in lines[0]:
            continue
        servers.append(path.name)
        for number, line in enumerate(lines[1:], 2):
            parts = line.split()
            if len(parts) < 5 or parts[0] != "row":
                raise ValueError(f"{path}:{number}: cannot read {line!r}")
            table, key, role = int(parts[1]), int(parts[2]), parts[3]
            value = float(parts[4].split(",")[0])
            # NODE:INC:SEQ, or NODE:INC:SEQ:FIRST:COUNT for a push of a piece
            # of the row (columns FIRST .. FIRST+COUNT-1).
            entries = [tuple(int(x) for x in p.split(":")) for p in parts[5:]]
            if any(len(e) not in (3, 5) for e in entries):
                raise ValueError(f"{path}:{number}: cannot read {line!r}")
            pushes = [e[:3] for e in entries]
            # The pushes that added to column 0, the value checked.
            adds = sum(1 for e in entries if len(e) == 3 or e[3] == 0)
            rows[(table, key)].append((path.name, role, value, pushes, adds))
    return rows, servers


def check(issued, acked, rows):
    violations = defaultdict(list)
    applied = set()
    issued_to_key = defaultdict(set)
    for push, keys in issued.items():
        for k in keys:
            issued_to_key[k].add(push)
    occurrences = defaultdict(int)  # (push, key) -> times issued to that key (a push may list a key twice)
    for push, keys in issued.items():
        for k in keys:
            occurrences[(push, k)] += 1
    for (table, key), copies in sorted(rows.items()):
        lists = []
        for server, role, value, pushes, adds in copies:
            counted = defaultdict(int)
            for p in pushes:
                counted[p] += 1
            for p, n in counted.items():
                if n > occurrences.get((p, key), 0):
                    kind = "duplicates" if (p, key) in occurrences else "phantoms"
                    violations[kind].append(f"{server}: row {table}/{key} lists push {p} {n} times, "
                                            f"issued to it {occurrences.get((p, key), 0)} times")
            if value != adds:
                violations["values"].append(f"{server}: row {table}/{key} ({role}) has value {value:g} "
                                            f"but lists {adds} pushes to its first column")
            lists.append((server, sorted(pushes)))
            applied.update(pushes)
        first = lists[0]
        for other in lists[1:]:
            if other[1] != first[1]:
                violations["replicas"].append(
                    f"row {table}/{key}: {first[0]} lists {len(first[1])} pushes, {other[0]} {len(other[1])}")
    keys_held = {key for (_, key) in rows}
    for push in sorted(acked):
        if push not in issued:
            violations["phantoms"].append(f"push {push} acknowledged but never issued")
            continue
        for k in set(issued[push]):
            copies = [c for (t, key), cs in rows.items() if key == k for c in cs]
            if k not in keys_held or not copies:
                violations["lost"].append(f"acknowledged push {push} to key {k}: no server holds the row")
                continue
            for server, role, value, pushes, _ in copies:
                if push not in pushes:
                    violations["lost"].append(f"acknowledged push {push} missing from key {k} on {server} ({role})")
    return applied, violations


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="the workers' push logs")
    parser.add_argument("--audit", type=Path, required=True, help="the servers' audit dumps")
    parser.add_argument("--json", type=Path, help="write the verdict here as JSON")
    args = parser.parse_args(argv)
    try:
        issued, acked = read_pushes(args.records)
        rows, servers = read_audits(args.audit)
    except (OSError, ValueError) as e:
        print(f"audit_check: {e}", file=sys.stderr)
        return 2
    if not issued or not servers:
        print(f"audit_check: nothing to check ({len(issued)} pushes issued, {len(servers)} server dumps)",
              file=sys.stderr)
        return 2
    applied, violations = check(issued, acked, rows)
    counts = {kind: len(violations.get(kind, [])) for kind in ("lost", "duplicates", "phantoms", "values", "replicas")}
    ok = not any(counts.values())
    verdict = {"issued": len(issued), "acknowledged": len(acked), "applied": len(applied & set(issued)),
               "rows": len(rows), "servers": servers, **counts, "ok": ok}
    print(f"audit: {len(issued)} pushes issued, {len(acked)} acknowledged, {verdict['applied']} applied, "
          f"{len(rows)} rows on {len(servers)} servers; lost {counts['lost']}, duplicates {counts['duplicates']}, "
          f"phantoms {counts['phantoms']}, value mismatches {counts['values']}, "
          f"replica mismatches {counts['replicas']}: {'PASS' if ok else 'FAIL'}")
    for kind, items in violations.items():
        for item in items[:5]:
            print(f"  {kind}: {item}")
    if args.json:
        args.json.write_text(json.dumps(verdict, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
