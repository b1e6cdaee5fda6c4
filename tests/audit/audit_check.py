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

A shard restored from a checkpoint inside the running job (both copies
lost, on_shard_loss: restore) loses the pushes acknowledged after that
checkpoint, by design. The restoring server's dump then lists, per
restored shard, the pushes the checkpoint held by writer and sequence
number ("restored VSHARD of NUM_VSHARDS WORKER:INC:FLOOR[:SEQ/SEQ..]");
an acknowledged push missing from a row of such a shard, and not held by
its checkpoint, is lost to the restore: reported exactly (every push and
key, in the JSON verdict) and not a violation. A missing push the
checkpoint did hold, or one in a shard that was never restored, stays a
violation.

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


MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """common/keys.h's Mix64 (splitmix64's finalizer)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def vshard_of(table_id: int, key: int, num_vshards: int) -> int:
    """common/keys.h's VirtualShardOf: the virtual shard of a key."""
    h = mix64(key ^ ((table_id * 0x9E3779B97F4A7C15) & MASK64))
    return (h * num_vshards) >> 64


def read_restore(server: str, line: str):
    """One "restored VSHARD of N WORKER:INC:FLOOR[:SEQ/..] ..." line ->
    (server, vshard, n, {(worker, inc): (floor, {seqs})})."""
    parts = line.split()
    if len(parts) < 4 or parts[2] != "of":
        raise ValueError(line)
    windows = {}
    for w in parts[4:]:
        fields = w.split(":")
        if len(fields) not in (3, 4):
            raise ValueError(line)
        seqs = {int(x) for x in fields[3].split("/")} if len(fields) == 4 else set()
        windows[(int(fields[0]), int(fields[1]))] = (int(fields[2]), seqs)
    return server, int(parts[1]), int(parts[3]), windows


def read_audits(audit: Path, restores=None):
    """rows[(table, key)] -> list of (server file, role, value, [pushes]);
    the dumps' "restored" lines appended to `restores` (read_restore's tuples)."""
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
            if parts and parts[0] == "restored":
                try:
                    restored = read_restore(path.name, line)
                except ValueError:
                    raise ValueError(f"{path}:{number}: cannot read {line!r}") from None
                if restores is not None:
                    restores.append(restored)
                continue
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


def lost_to_a_restore(push, key, tables, restores) -> bool:
    """Whether some checkpoint restore of the key's shard did not hold the
    push (its writer's window there has it neither below the floor nor
    listed): a push acknowledged after that checkpoint, lost by design."""
    node, inc, seq = push
    for _, vshard, n, windows in restores:
        if not any(vshard_of(t, key, n) == vshard for t in tables):
            continue
        floor, seqs = windows.get((node, inc), (0, set()))
        if seq >= floor and seq not in seqs:
            return True
    return False


def check(issued, acked, rows, restores=()):
    violations = defaultdict(list)
    restored_losses = set()  # (push, key) lost to a checkpoint restore
    tables = {table for (table, _) in rows}
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
            missing = [f"no server holds the row"] if k not in keys_held or not copies else [
                f"missing on {server} ({role})" for server, role, value, pushes, _ in copies if push not in pushes]
            if not missing:
                continue
            if lost_to_a_restore(push, k, tables, restores):
                restored_losses.add((push, k))
                continue
            for where in missing:
                violations["lost"].append(f"acknowledged push {push} to key {k}: {where}")
    return applied, violations, sorted(restored_losses)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, required=True, help="the workers' push logs")
    parser.add_argument("--audit", type=Path, required=True, help="the servers' audit dumps")
    parser.add_argument("--json", type=Path, help="write the verdict here as JSON")
    args = parser.parse_args(argv)
    try:
        issued, acked = read_pushes(args.records)
        restores = []
        rows, servers = read_audits(args.audit, restores)
    except (OSError, ValueError) as e:
        print(f"audit_check: {e}", file=sys.stderr)
        return 2
    if not issued or not servers:
        print(f"audit_check: nothing to check ({len(issued)} pushes issued, {len(servers)} server dumps)",
              file=sys.stderr)
        return 2
    applied, violations, restored_losses = check(issued, acked, rows, restores)
    counts = {kind: len(violations.get(kind, [])) for kind in ("lost", "duplicates", "phantoms", "values", "replicas")}
    ok = not any(counts.values())
    lost_pushes = sorted({push for push, _ in restored_losses})
    verdict = {"issued": len(issued), "acknowledged": len(acked), "applied": len(applied & set(issued)),
               "rows": len(rows), "servers": servers, **counts, "ok": ok,
               "restored_shards": sorted({(server, v) for server, v, _, _ in restores}),
               "lost_to_restore": len(lost_pushes),
               "lost_to_restore_pushes": [[*push, key] for push, key in restored_losses]}
    print(f"audit: {len(issued)} pushes issued, {len(acked)} acknowledged, {verdict['applied']} applied, "
          f"{len(rows)} rows on {len(servers)} servers; lost {counts['lost']}, duplicates {counts['duplicates']}, "
          f"phantoms {counts['phantoms']}, value mismatches {counts['values']}, "
          f"replica mismatches {counts['replicas']}: {'PASS' if ok else 'FAIL'}")
    if restores:
        shards = sorted({v for _, v, _, _ in restores})
        print(f"  {len(shards)} shards restored from checkpoints inside the job ({','.join(map(str, shards))}): "
              f"{len(lost_pushes)} acknowledged pushes lost to the restore, by design "
              f"({len(restored_losses)} push-key pairs; every one in the JSON verdict)")
        for push, key in restored_losses[:20]:
            print(f"  lost to the restore: push {push[0]}:{push[1]}:{push[2]} to key {key}")
        if len(restored_losses) > 20:
            print(f"  ... and {len(restored_losses) - 20} more")
    for kind, items in violations.items():
        for item in items[:5]:
            print(f"  {kind}: {item}")
    if args.json:
        args.json.write_text(json.dumps(verdict, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
