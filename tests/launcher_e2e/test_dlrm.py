"""The DLRM example (examples/dlrm.py, configs/dlrm.yaml) end to end: two
PyTorch worker processes train a recommender whose embeddings live on two
servers, through tessera-launch; the test AUC must end close to the
ground-truth model's."""

from __future__ import annotations

import json

import pytest

#: How far the trained model's test AUC may be from the ground truth's.
AUC_TOLERANCE = 0.03


def test_dlrm_reaches_the_truth_auc(launcher, binaries, source_dir):
    pytest.importorskip("torch", reason="no torch for /usr/bin/python3 (apt install python3-torch)")
    if not (launcher.build_dir / "python" / "tessera" / "__init__.py").is_file():
        pytest.skip(f"the tessera Python module is not built in {launcher.build_dir} (needs pybind11-dev)")
    result = launcher.local("--config", str(source_dir / "configs" / "dlrm.yaml"), "--quiet", "--timeout", "200",
                            timeout=220)
    assert result.returncode == 0, result.describe()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["reason"]
    reports = summary["worker_reports"]
    assert sorted(r["rank"] for r in reports) == [0, 1], reports
    for r in reports:
        report = r["report"]
        test_auc, truth_auc = report["test_auc"], report["truth_auc"]
        assert 0.7 < truth_auc < 0.9, f"worker {r['rank']}: implausible truth AUC {truth_auc}"
        assert truth_auc - test_auc <= AUC_TOLERANCE, (
            f"worker {r['rank']}: test AUC {test_auc:.4f} is more than {AUC_TOLERANCE} below the truth AUC "
            f"{truth_auc:.4f}")
        # The embeddings went through the servers: rows pulled and gradients pushed.
        assert report["worker"]["pushes"] > 0 and report["worker"]["pulls"] > 0, report["worker"]
    progress = [json.loads(line) for line in (result.run_dir / "progress.jsonl").read_text().splitlines()]
    assert any("loss" in p for p in progress), "no loss in progress.jsonl"
    assert any("test_auc" in p for p in progress), "no test_auc in progress.jsonl"
