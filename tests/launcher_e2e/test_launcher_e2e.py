"""End-to-end jobs through launcher/tessera-launch: real processes on TCP
loopback. Each test names the scenario it checks; see conftest.py for how
the build tree is found."""

from __future__ import annotations

import json
import re

#: How far the trained model's test AUC may be from the ground truth's.
AUC_TOLERANCE = 0.02
#: Seconds a failed assembly may take beyond timeouts.assemble_seconds:
#: process start-up, the launcher's 1 s cascade wait and 3 s stop grace.
FAIL_FAST_SLACK_SECONDS = 10

MISSING_SERVER = re.compile(r"server[- ]?1\b")


def read_summary(result):
    path = result.run_dir / "summary.json"
    assert path.is_file(), f"no summary.json in {result.run_dir}; {result.describe()}"
    return json.loads(path.read_text())


def test_local_job_reaches_truth_auc(launcher, binaries, source_dir):
    """configs/local.yaml (2 servers, 2 workers) trains logistic regression
    to within AUC_TOLERANCE of the ground-truth model's test AUC."""
    result = launcher.local("--config", str(source_dir / "configs" / "local.yaml"), "--quiet", "--timeout", "150")
    assert result.returncode == 0, result.describe()
    summary = read_summary(result)
    assert summary["status"] == "ok", summary["reason"]
    reports = summary["worker_reports"]
    assert [r["rank"] for r in reports] == [0, 1], reports
    for r in reports:
        report = r["report"]
        test_auc, truth_auc = report.get("test_auc"), report.get("truth_auc")
        assert isinstance(test_auc, float) and isinstance(truth_auc, float), f"worker {r['rank']}: {report}"
        assert 0.7 < truth_auc < 0.9, f"worker {r['rank']}: implausible truth AUC {truth_auc}"
        assert abs(test_auc - truth_auc) <= AUC_TOLERANCE, (
            f"worker {r['rank']}: test AUC {test_auc:.4f} is more than {AUC_TOLERANCE} from the truth AUC "
            f"{truth_auc:.4f}")
        assert r["steps"] > 0 and r["bytes_pushed"] > 0 and r["bytes_pulled"] > 0, r
    assert abs(summary["test_auc"] - reports[0]["report"]["truth_auc"]) <= AUC_TOLERANCE
    progress = (result.run_dir / "progress.jsonl").read_text().splitlines()
    assert any("test_auc" in json.loads(line) for line in progress), "no per-epoch test_auc in progress.jsonl"


def test_missing_server_fails_fast(launcher, binaries, source_dir):
    """A job whose server 1 never starts fails within the assemble timeout
    plus a few seconds, naming server 1 in the output and the summary."""
    assemble = 3
    result = launcher.local("--config", str(source_dir / "configs" / "local.yaml"), "--skip", "server-1",
                            "--set", f"timeouts.assemble_seconds={assemble}", "--timeout", "60")
    assert result.returncode == 1, result.describe()
    assert result.seconds <= assemble + FAIL_FAST_SLACK_SECONDS, (
        f"took {result.seconds:.1f} s to fail; {result.describe()}")
    summary = read_summary(result)
    assert summary["status"] == "failed"
    assert summary["skipped"] == ["server-1"]
    assert MISSING_SERVER.search(summary["reason"]), f"reason does not name server 1: {summary['reason']}"
    # The launcher's own report (the final block) names it too.
    reason_lines = [line for line in result.output.splitlines() if line.startswith("reason")]
    assert reason_lines and MISSING_SERVER.search(reason_lines[-1]), result.describe()


def test_malformed_config_is_rejected(launcher, tmp_path):
    """A config with a bad value or an unknown key is refused before anything
    starts: exit status 2 and a message naming the key."""
    bad_value = tmp_path / "bad_value.yaml"
    bad_value.write_text("job:\n  name: broken\ncluster:\n  servers: two\nworker:\n  program: tessera-logreg\n")
    result = launcher.local("--config", str(bad_value))
    assert result.returncode == 2, result.describe()
    assert "cluster.servers" in result.stderr, result.describe()
    assert not result.run_dir.exists(), "a rejected config must not create the run directory"

    unknown_key = tmp_path / "unknown_key.yaml"
    unknown_key.write_text("cluster:\n  severs: 2\nworker:\n  program: tessera-logreg\n")
    result = launcher.local("--config", str(unknown_key))
    assert result.returncode == 2, result.describe()
    assert "cluster.severs" in result.stderr, result.describe()


def test_unknown_worker_flag_is_named(launcher, binaries, source_dir):
    """A worker.args key tessera-logreg does not know fails the job, and the
    worker's error names the flag."""
    result = launcher.local("--config", str(source_dir / "configs" / "local.yaml"), "--set",
                            "worker.args.featurs=10", "--set", "timeouts.assemble_seconds=5", "--timeout", "60")
    assert result.returncode == 1, result.describe()
    log = (result.run_dir / "logs" / "worker-0.log").read_text()
    assert "--featurs" in log, log
    summary = read_summary(result)
    assert summary["status"] == "failed"
    assert "worker-" in summary["reason"], summary["reason"]
