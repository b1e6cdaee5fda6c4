"""tessera-launch report: plots and a Markdown page from a run directory."""

import json

import pytest

from tessera_launch import cli, report


def make_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({
        "job": "demo", "status": "ok", "reason": "all workers finished", "wall_seconds": 4.0, "steps": 40,
        "final_loss": 0.5, "test_auc": 0.8, "bytes_pushed": 10, "bytes_pulled": 20,
        "worker_reports": [
            {"rank": 0, "steps": 20, "final_loss": 0.5, "lost": None,
             "report": {"test_loss": 0.55, "test_auc": 0.8, "worker_stats": {"wire_bytes_pushed": 123}}},
            {"rank": 1, "steps": 20, "final_loss": 0.6, "lost": "worker 1 (x): no heartbeat for 5 s"}]}))
    records = []
    for w in (0, 1):
        for i, t in enumerate((0.5, 1.5, 2.5, 3.5)):
            records.append({"worker": w, "step": 5 * (i + 1), "loss": 0.7 - 0.05 * i, "elapsed": t})
    records.append({"worker": 0, "step": 20, "test_loss": 0.55, "elapsed": 3.6})
    (run / "progress.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (run / "events.jsonl").write_text(json.dumps({"elapsed": 2.0, "what": "kill server-1"}) + "\n")
    return run


def test_throughput_bins_every_workers_steps():
    progress = [{"worker": 0, "step": 5, "elapsed": 0.2}, {"worker": 1, "step": 5, "elapsed": 0.4},
                {"worker": 0, "step": 15, "elapsed": 1.2}, {"worker": 1, "step": 10, "elapsed": 1.7},
                {"worker": 0, "step": 15, "elapsed": 2.5}]
    xs, ys = report.throughput(progress)
    assert xs == [1.5] and ys == [15.0]  # the first record of a worker is its base


def test_report_writes_plots_and_markdown(tmp_path, capsys):
    run = make_run(tmp_path)
    assert cli.main(["report", str(run)]) == 0
    for name in ("loss.png", "throughput.png"):
        data = (run / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (run / "report.md").read_text()
    assert "| 0 | 20 | 0.5000 | 0.5500 | 0.8000 | 123 | - |" in md
    assert "- kill server-1 at 2.0 s" in md
    assert "- worker 1 lost: worker 1 (x): no heartbeat for 5 s" in md
    assert "wrote" in capsys.readouterr().out


def test_report_of_a_directory_without_a_summary_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "has no summary.json" in capsys.readouterr().err
    bad = make_run(tmp_path)
    (bad / "progress.jsonl").write_text("{not json\n")
    with pytest.raises(report.ReportError, match="progress.jsonl:1: not JSON"):
        report.load(bad)
