"""Tests of scripts/check_sizes.py's measuring (the size rules' check itself
runs as the ctest `size_rules`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_sizes  # noqa: E402


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


def test_functions_at_namespace_and_class_level_are_measured_from_their_name_to_their_brace():
    text = ("namespace a {\n"
            "int Free(int x) {\n" + body(3) + "  return x;\n}\n"
            "struct S {\n"
            " public:\n"
            "  void Inline() {\n    if (true) { y = 1; }\n  }\n"
            "  int y;\n"
            "};\n"
            "void S::Long(\n    int z) const {\n" + body(5) + "}\n"
            "}  // namespace a\n")
    found = {name: (first, length) for name, first, length in check_sizes.cxx_functions(text)}
    assert found == {"Free": (2, 6), "Inline": (10, 3), "S::Long": (15, 8)}


def test_braces_in_comments_strings_and_characters_do_not_count():
    text = ('void F() {\n'
            '  const char* s = "{{{";  // }}}\n'
            "  char c = '}';\n"
            "  /* { */\n"
            '  auto r = R"(})";\n'
            "}\n"
            "void G() {\n}\n")
    found = {name: length for name, _, length in check_sizes.cxx_functions(text)}
    assert found == {"F": 6, "G": 2}


def test_initializer_braces_and_lambdas_inside_a_function_belong_to_it():
    text = ("std::vector<int> v = {1, 2};\n"
            "void F() {\n  auto f = [&](int a) {\n    return a;\n  };\n  int b{3};\n}\n")
    found = {name: length for name, _, length in check_sizes.cxx_functions(text)}
    assert found == {"F": 6}


def test_python_functions_count_their_decorators():
    text = "import functools\n\n@functools.cache\ndef f():\n    a = 1\n    return a\n"
    assert check_sizes.py_functions(text) == [("f", 3, 4)]


def test_the_check_fails_on_new_growing_and_stale_entries(monkeypatch, capsys):
    def run(over, listed):
        monkeypatch.setattr(check_sizes, "measure", lambda: dict(over))
        monkeypatch.setattr(check_sizes, "read_exceptions", lambda: dict(listed))
        return check_sizes.main([])

    assert run({}, {}) == 0
    assert run({"file a.cc": 900}, {"file a.cc": 900}) == 0
    assert run({"file a.cc": 801}, {}) == 1, "code over the limit and not listed"
    assert run({"file a.cc": 901}, {"file a.cc": 900}) == 1, "a listed entry grew"
    assert run({"file a.cc": 850}, {"file a.cc": 900}) == 1, "a listed entry shrank: record it"
    assert run({}, {"function a.cc:F": 130}) == 1, "a listed entry keeps the rule now"
    assert "keeps the rule now" in capsys.readouterr().out
