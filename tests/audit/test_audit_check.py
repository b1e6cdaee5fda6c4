"""The audit checker catches each kind of violation (synthetic logs and dumps)."""
import importlib.util
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("audit_check", Path(__file__).resolve().parent / "audit_check.py")
audit_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit_check)

PUSHES = "I 7 0 1 10 11\nA 7 0 1\nI 7 0 2 10\nA 7 0 2\nI 8 0 1 11\n"  # push 8:0:1 issued, never acknowledged
GOOD = {
    "server-0-node-1.audit": "# tessera audit server 0 epoch 2\nrow 5 10 primary 2 7:0:1 7:0:2\nrow 5 11 backup 1 7:0:1\n",
    "server-1-node-2.audit": "# tessera audit server 1 epoch 2\nrow 5 10 backup 2 7:0:1 7:0:2\nrow 5 11 primary 1 7:0:1\n",
}


def run(tmp_path, dumps, pushes=PUSHES):
    records, audit = tmp_path / "records", tmp_path / "audit"
    records.mkdir()
    audit.mkdir()
    (records / "worker-0-node-7-inc-0.log").write_text(pushes)
    for name, text in dumps.items():
        (audit / name).write_text(text)
    out = tmp_path / "verdict.json"
    code = audit_check.main(["--records", str(records), "--audit", str(audit), "--json", str(out)])
    import json
    return code, json.loads(out.read_text()) if out.exists() else None


def test_a_consistent_run_passes(tmp_path):
    code, verdict = run(tmp_path, GOOD)
    assert code == 0 and verdict["ok"]
    assert (verdict["issued"], verdict["acknowledged"], verdict["applied"]) == (3, 2, 2)


@pytest.mark.parametrize("kind,server,old,new", [
    ("lost", "server-1-node-2.audit", "row 5 10 backup 2 7:0:1 7:0:2", "row 5 10 backup 1 7:0:1"),
    ("duplicates", "server-0-node-1.audit", "row 5 11 backup 1 7:0:1", "row 5 11 backup 2 7:0:1 7:0:1"),
    ("phantoms", "server-0-node-1.audit", "row 5 11 backup 1 7:0:1", "row 5 11 backup 2 7:0:1 9:0:1"),
    ("values", "server-0-node-1.audit", "row 5 10 primary 2 7:0:1 7:0:2", "row 5 10 primary 3 7:0:1 7:0:2"),
    ("replicas", "server-0-node-1.audit", "row 5 11 backup 1 7:0:1", "row 5 11 backup 2 7:0:1 8:0:1"),
])
def test_each_violation_is_caught(tmp_path, kind, server, old, new):
    dumps = dict(GOOD)
    assert old in dumps[server]
    dumps[server] = dumps[server].replace(old, new)
    code, verdict = run(tmp_path, dumps)
    assert code == 1
    assert verdict[kind] >= 1, verdict
    assert not verdict["ok"]


def test_pieces_of_rows_count_for_the_columns_they_carried(tmp_path):
    # Push 7:0:2 went to key 10 in two pieces (seqs 2 and 3): columns 0-1, then 2-3.
    pushes = "I 7 0 1 10 11\nA 7 0 1\nI 7 0 2 10\nA 7 0 2\nI 7 0 3 10\nA 7 0 3\n"
    dumps = {
        "server-0-node-1.audit": "# tessera audit server 0 epoch 2\n"
                                 "row 5 10 primary 2,2,1,1 7:0:1 7:0:2:0:2 7:0:3:2:2\nrow 5 11 primary 1 7:0:1\n",
    }
    code, verdict = run(tmp_path, dumps, pushes)
    assert code == 0 and verdict["ok"], verdict
    # Column 0 holds 2: counting the piece without it would make 3.
    bad = dict(dumps)
    bad["server-0-node-1.audit"] = bad["server-0-node-1.audit"].replace("7:0:3:2:2", "7:0:3:0:2")
    (tmp_path / "bad").mkdir()
    code, verdict = run(tmp_path / "bad", bad, pushes)
    assert code == 1 and verdict["values"] == 1
    # An entry of 4 fields is not an audit dump.
    odd = {"server-0-node-1.audit": dumps["server-0-node-1.audit"].replace("7:0:3:2:2", "7:0:3:2")}
    (tmp_path / "odd").mkdir()
    code, _ = run(tmp_path / "odd", odd, pushes)
    assert code == 2


def test_a_deposed_servers_dump_is_not_a_copy(tmp_path):
    dumps = dict(GOOD, **{"server-2-node-3.audit": "# tessera audit server 2 epoch 3 deposed\n"})
    code, verdict = run(tmp_path, dumps)
    assert code == 0 and len(verdict["servers"]) == 2


def test_unusable_input_is_reported(tmp_path):
    code, _ = run(tmp_path, {"server-0-node-1.audit": "garbage\n"})
    assert code == 2


def test_shard_map_problems_finds_two_maps_under_one_epoch_and_epochs_going_back():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from jobprocs import shard_map_problems

    def at(node, epoch, digest):
        return f"[{node}] 2026-12-03 11:46:28.765 {node} info shard map epoch {epoch} (map {digest}): lost server 1"

    fine = [at("server-0", 1, "aaaaaaaa"), at("server-0", 2, "bbbbbbbb"), at("worker-0", 1, "aaaaaaaa"),
            at("worker-0", 2, "bbbbbbbb"), "[worker-0] unrelated line"]
    assert shard_map_problems(fine) == []
    split = fine + [at("worker-1", 2, "cccccccc")]
    assert shard_map_problems(split) == ["epoch 2 has 2 maps: bbbbbbbb (first at server-0), cccccccc (first at worker-1)"]
    back = fine + [at("server-0", 2, "bbbbbbbb")]
    assert shard_map_problems(back) == ["server-0 adopted epoch 2 after epoch 2"]


def test_vshard_of_matches_the_servers():
    # The same fixed values as common/keys_test.cc's VirtualShardOfKeepsItsKnownValues.
    assert [audit_check.vshard_of(5, k, 64) for k in (0, 1, 10, 11, 12345)] == [6, 45, 31, 36, 54]
    assert audit_check.vshard_of(3, (1 << 63) + 7, 1000) == 370


# Key 10 of table 5 is in shard 31 of 64, key 11 in shard 36. Push 7:0:2
# (to key 10) was acknowledged after the checkpoint that shard 31 was
# restored from: that checkpoint held writer 7's pushes below 2 only.
RESTORE_PUSHES = "I 7 0 1 10 11\nA 7 0 1\nI 7 0 2 10\nA 7 0 2\nI 7 0 3 11\nA 7 0 3\n"
RESTORED = ("# tessera audit server 0 epoch 3\nrestored 31 of 64 7:0:2\n"
            "row 5 10 primary 1 7:0:1\nrow 5 11 primary 2 7:0:1 7:0:3\n")


def test_a_push_lost_to_a_checkpoint_restore_is_reported_exactly_and_allowed(tmp_path):
    code, verdict = run(tmp_path, {"server-0-node-1.audit": RESTORED}, RESTORE_PUSHES)
    assert code == 0 and verdict["ok"], verdict
    assert verdict["lost"] == 0
    assert verdict["lost_to_restore"] == 1 and verdict["lost_to_restore_pushes"] == [[7, 0, 2, 10]]
    assert verdict["restored_shards"] == [["server-0-node-1.audit", 31]]
    # A window of another incarnation of the writer holds none of this one's pushes.
    (tmp_path / "inc").mkdir()
    code, verdict = run(tmp_path / "inc", {"server-0-node-1.audit": RESTORED.replace("7:0:2", "7:0:1 7:1:9")},
                        RESTORE_PUSHES)
    assert code == 0 and verdict["lost_to_restore_pushes"] == [[7, 0, 2, 10]], verdict


@pytest.mark.parametrize("restored", [
    "restored 31 of 64 7:0:3",      # the checkpoint held push 2 (below its floor): losing it is a bug
    "restored 31 of 64 7:0:1:2/5",  # ... held it by number
    "restored 36 of 64 7:0:1",      # another shard was restored: key 10's was not
    "restored 31 of 32 7:0:1",      # shard 31 of 32 is not key 10's
])
def test_a_loss_that_no_restore_explains_stays_a_violation(tmp_path, restored):
    dump = RESTORED.replace("restored 31 of 64 7:0:2", restored)
    code, verdict = run(tmp_path, {"server-0-node-1.audit": dump}, RESTORE_PUSHES)
    assert code == 1 and verdict["lost"] == 1 and verdict["lost_to_restore"] == 0, verdict


def test_an_unreadable_restore_line_is_unusable_input(tmp_path):
    code, _ = run(tmp_path, {"server-0-node-1.audit": RESTORED.replace("7:0:2", "7:0")}, RESTORE_PUSHES)
    assert code == 2
