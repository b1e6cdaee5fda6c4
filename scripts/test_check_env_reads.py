"""Tests of scripts/check_env_reads.py: it finds what it must and nothing else."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_env_reads  # noqa: E402


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_library_reading_the_environment_is_found(tmp_path):
    f = write(tmp_path, "server/x.cc", 'int a = 1;\nconst char* v = std::getenv("X");\n')
    g = write(tmp_path, "transport/y.h", "extern char** environ;\n")
    found = check_env_reads.violations(tmp_path, [f, g])
    assert [(rel, line) for rel, line, _ in found] == [("server/x.cc", 2), ("transport/y.h", 1)]


def test_mains_comments_and_strings_are_not_reads(tmp_path):
    main = write(tmp_path, "server/server_main.cc", 'auto v = getenv("X");\n')
    quiet = write(tmp_path, "server/z.cc", '// getenv("X") is not called\nconst char* s = "getenv(";\n'
                                          "int my_getenvironment_count = 0;\n")
    assert check_env_reads.violations(tmp_path, [main, quiet]) == []


def test_the_allowed_files_exist_and_the_tree_passes():
    for rel in check_env_reads.ALLOWED:
        assert (check_env_reads.ROOT / rel).exists(), rel
    assert check_env_reads.violations() == []
