#!/usr/bin/env python3
"""No library reads the environment (docs/design.md, "Settings").

    scripts/check_env_reads.py

A remote shell, srun or mpirun may drop environment variables, so every
setting reaches a process as a flag or in the job's files and is handed to
the libraries as an options struct filled in `main`. This check fails when
a product C++ file other than a binary's main (`*_main.cc`) calls getenv,
secure_getenv, setenv, putenv or reads `environ`. The files allowed anyway
are listed below with the reason.
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_sizes import ROOT, product_files, strip_cxx  # noqa: E402

# path -> why it may read the environment
ALLOWED = {
    "etcd/local_etcd.cc": "TESSERA_ETCD, where tests find an etcd binary; linked only into tests",
    "transport/transport_flags.h": "WarnAboutOldTransportVariables, called by mains only: it reads the environment "
                                   "to warn that the old TESSERA_* transport variables are not read any more",
}
CALL = re.compile(r"\b(secure_getenv|getenv|setenv|unsetenv|putenv|clearenv)\s*\(|\benviron\b")


def violations(root: Path = ROOT, files=None):
    """(path relative to root, line number, text) for every environment read."""
    found = []
    for path in files if files is not None else product_files():
        if path.suffix not in (".cc", ".h", ".cu", ".cuh") or path.name.endswith("_main.cc"):
            continue
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        code = strip_cxx(text).split("\n")
        for number, line in enumerate(code, 1):
            if CALL.search(line):
                found.append((rel, number, text.split("\n")[number - 1].strip()))
    return found


def main() -> int:
    found = violations()
    for rel, number, text in found:
        print(f"{rel}:{number}: reads the environment in a library: {text}\n"
              "  pass the setting as a flag of the binary and hand it to the library in an options struct "
              "(scripts/check_env_reads.py says why)", file=sys.stderr)
    if found:
        return 1
    missing = [rel for rel in ALLOWED if not (ROOT / rel).exists()]
    if missing:
        print(f"scripts/check_env_reads.py allows files that are gone: {', '.join(missing)}; take them off ALLOWED",
              file=sys.stderr)
        return 1
    print("no library reads the environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
