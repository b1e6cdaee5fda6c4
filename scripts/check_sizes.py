#!/usr/bin/env python3
"""Size rules of the product code: no file over 800 lines, no function over
120 lines (docs/design.md, "Sizes").

    scripts/check_sizes.py [--list] [--write-exceptions]

Product code is the C++ under common/ compress/ coordinator/ etcd/ node/ rdma/
server/ transport/ worker/ python/ and the launcher's package
(launcher/tessera_launch); tests, benchmarks, examples and test helpers are
not. What still breaks a rule is listed, with its size, in
scripts/size_exceptions.txt: the check fails when code not listed breaks a
rule, when a listed entry grew past its recorded size (it may only shrink),
and when a listed entry keeps the rule now (take it off the list). So the
list only gets shorter. --list prints every file and function over the
limits; --write-exceptions rewrites the list from the code as it is (for a
change that shrinks entries).

C++ functions are found by their braces: a brace opened at namespace or
class level after a parenthesis opens a function (comments, strings and
character literals skipped); its length runs from the line of its name to
its closing brace. Python functions are measured with the ast module.
"""
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CXX_DIRS = ["common", "compress", "coordinator", "etcd", "node", "rdma", "server", "transport", "worker", "python"]
PY_DIRS = ["launcher/tessera_launch"]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
EXCEPTIONS = ROOT / "scripts" / "size_exceptions.txt"


def is_product(path: Path) -> bool:
    name = path.name
    return not (name.endswith("_test.cc") or name.endswith("_test.h") or name.startswith("test_")
                or "_test_" in name or name.startswith("fake_") or "testing" in name)


def product_files():
    for d in CXX_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.suffix in (".cc", ".h", ".cu", ".cuh") and is_product(p):
                yield p
    for d in PY_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            if is_product(p):
                yield p


def strip_cxx(text: str) -> str:
    """`text` with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()) and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator (1'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cxx_functions(text: str):
    """(name, first line, lines) of each function body at namespace or class level."""
    code = strip_cxx(text)
    stack = []  # kinds of open braces: ns, type, fn, block
    head_start = 0  # offset where the current statement's head begins
    found = []
    line_of = [0] * (len(code) + 1)
    line = 1
    for i, ch in enumerate(code):
        line_of[i] = line
        if ch == "\n":
            line += 1
    for i, ch in enumerate(code):
        if ch == "{":
            head = code[head_start:i]
            outer = stack[-1][0] if stack else "ns"
            if re.search(r"\bnamespace\b", head) or re.search(r'\bextern\s*$', head):
                kind = "ns"
            elif outer in ("ns", "type") and "(" in head and not re.search(r"=\s*$", head):
                kind = "fn"
            elif re.search(r"\b(class|struct|union|enum)\b", head) and "(" not in head:
                kind = "type"
            else:
                kind = "block"
            start = head_start + len(head) - len(head.lstrip())
            name = ""
            if kind == "fn":
                m = re.search(r"([~\w:]+(?:<[^()]*>)?|operator\s*\S+)\s*\(", head)
                name = m.group(1) if m else head.strip()[:40]
            stack.append((kind, line_of[start], name))
            head_start = i + 1
        elif ch == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "fn":
                    found.append((name, first, line_of[i] - first + 1))
            head_start = i + 1
        elif ch == ";":
            head_start = i + 1
        elif ch == ":" and stack and stack[-1][0] == "type":
            # access specifiers (public:) end a head in a class body
            if re.search(r"\b(public|private|protected)\s*$", code[head_start:i]):
                head_start = i + 1
    return found


def py_functions(text: str):
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, first, node.end_lineno - first + 1))
    return out


def measure():
    """{entry: size} for every file and function over its limit."""
    over = {}
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        text = p.read_text(errors="replace")
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_FILE_LINES:
            over[f"file {rel}"] = lines
        fns = py_functions(text) if p.suffix == ".py" else cxx_functions(text)
        for name, first, length in fns:
            if length > MAX_FUNCTION_LINES:
                key = f"function {rel}:{name}"
                over[key] = max(over.get(key, 0), length)
    return over


def read_exceptions():
    listed = {}
    if EXCEPTIONS.exists():
        for raw in EXCEPTIONS.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                entry, _, size = line.rpartition(" ")
                if not entry or not size.isdigit():
                    sys.exit(f"check_sizes: {EXCEPTIONS.name}: bad line {raw!r} (want `file PATH LINES` or "
                             "`function PATH:NAME LINES`)")
                listed[entry] = int(size)
    return listed


def main(argv):
    over = measure()
    if "--list" in argv:
        for entry, size in sorted(over.items(), key=lambda kv: -kv[1]):
            print(f"{size:6d}  {entry}")
        return 0
    if "--write-exceptions" in argv:
        body = "".join(f"{entry} {size}\n" for entry, size in sorted(over.items()))
        EXCEPTIONS.write_text("# Product code that still breaks the size rules (scripts/check_sizes.py):\n"
                              "# `file PATH LINES` over 800 lines, `function PATH:NAME LINES` over 120.\n"
                              "# Entries may only shrink and go; the check fails otherwise.\n" + body)
        print(f"wrote {len(over)} entries to {EXCEPTIONS.relative_to(ROOT)}")
        return 0
    listed = read_exceptions()
    problems = []
    for entry, size in sorted(over.items()):
        limit = MAX_FILE_LINES if entry.startswith("file ") else MAX_FUNCTION_LINES
        if entry not in listed:
            problems.append(f"{entry}: {size} lines (limit {limit}); split it")
        elif size > listed[entry]:
            problems.append(f"{entry}: grew to {size} lines from {listed[entry]} (listed entries may only shrink)")
    for entry, size in sorted(listed.items()):
        if entry not in over:
            problems.append(f"{entry}: keeps the rule now; remove it from {EXCEPTIONS.name}")
        elif over[entry] < size:
            problems.append(f"{entry}: shrank to {over[entry]} lines from {size}; "
                            f"record it (scripts/check_sizes.py --write-exceptions)")
    for p in problems:
        print(f"check_sizes: {p}")
    print(f"check_sizes: {len(over)} entries over the limits, {len(listed)} listed, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
