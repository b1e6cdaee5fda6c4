"""tessera-sim as a user meets it: a seed replays exactly in a fresh process
(the same digest as when it ran inside a batch), a trace is written, and bad
arguments are refused with a clear message."""
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
SIM = BUILD / "tests" / "sim" / "tessera-sim"


def run(*args, check=True):
    p = subprocess.run([str(SIM), *args], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def digests(out):
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^seed (\d+):.* digest (\d+)$", out, re.M)}


def test_a_seed_replays_exactly_alone_and_in_a_batch(tmp_path):
    batch = digests(run("--first-seed", "40", "--seeds", "12", "--digests").stdout)
    assert sorted(batch) == list(range(40, 52))
    assert len(set(batch.values())) == 12, "different seeds gave the same run"
    for seed in (41, 47, 51):
        trace = tmp_path / f"{seed}.trace"
        alone = run("--seed", str(seed), "--digests", "--trace", str(trace)).stdout
        assert digests(alone) == {seed: batch[seed]}, alone
        lines = trace.read_text().splitlines()
        assert lines[0].startswith(f"# tessera-sim seed {seed}:")
        assert any(" -> sim://coordinator register_request" in line for line in lines)
        assert any("push req" in line for line in lines)


def test_bad_arguments_are_refused():
    p = run("--break", "nonsense", check=False)
    assert p.returncode == 2 and "unknown --break 'nonsense'" in p.stderr
    p = run("--trace", "/tmp/x", check=False)
    assert p.returncode == 2 and "--trace needs --seed" in p.stderr
    p = run("--seed", "3", "--trace", "/nonexistent-dir/t.trace", check=False)
    assert p.returncode == 2 and "cannot write the trace to /nonexistent-dir/t.trace" in p.stderr
    p = run("--help")
    assert "--seeds" in p.stdout and "--minutes" in p.stdout and "--break" in p.stdout
