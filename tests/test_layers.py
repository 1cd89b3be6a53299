"""The layers, read from every module's imports (tools/import_graph.py): ``cstream`` (the API)
imports ``executor`` and ``workers``, ``executor`` imports ``workers``, ``workers`` neither;
``cstream_tools`` stands on all three and none of them imports it; no package has an import
circle; the benchmarks, the tools and the examples import nothing of the tests."""

import pytest

from tools import import_graph


@pytest.fixture(scope="module")
def graph():
    return import_graph.imports()


def test_every_import_points_down_the_layers(graph):
    assert import_graph.layer_breaks(graph) == []


def test_the_graph_reads_lazy_relative_and_from_imports(graph):
    assert "cstream_tools.cli_errors" in graph["cstream_tools.cli"]
    assert "executor.report" in graph["cstream_tools.cli_run"]  # inside a function
    assert "cstream.optim.registry" in graph["cstream.optim.configure"]


@pytest.mark.parametrize("package", import_graph.PACKAGES)
def test_no_import_circle(graph, package):
    assert import_graph.circles_per_package(graph)[package] == []


def test_the_checks_find_a_circle_and_an_import_against_the_layers(tmp_path):
    for package, files in {
        "workers": {"a.py": "from . import b\n", "b.py": "def f():\n    import workers.a\n"},
        "executor": {"__init__.py": "", "run.py": "import workers.a\n"},
        "cstream_tools": {"__init__.py": ""},
    }.items():
        (tmp_path / package).mkdir()
        for name, text in files.items():
            (tmp_path / package / name).write_text(text)
    (tmp_path / "workers" / "c.py").write_text("from cstream_tools import x\nimport executor.run\n")
    graph = import_graph.imports(tmp_path, ("workers", "executor", "cstream_tools"))
    assert import_graph.circles(graph) == [["workers.a", "workers.b"]]
    assert import_graph.layer_breaks(graph, tmp_path) == [
        "workers/c.py:1 workers.c imports cstream_tools",
        "workers/c.py:2 workers.c imports executor.run"]


def test_the_benchmarks_tools_and_examples_import_nothing_of_the_tests():
    assert import_graph.imports_of_tests() == []


def test_the_check_finds_a_script_that_imports_the_tests(tmp_path):
    (tmp_path / "tests" / "helpers").mkdir(parents=True)
    (tmp_path / "tests" / "helpers" / "models.py").write_text("")
    (tmp_path / "tests" / "test_x.py").write_text("")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "run.py").write_text(
        "import torch\nfrom helpers.models import TinyLM\nimport test_x\nfrom cstream_tools import models\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "data.py").write_text("")
    (tmp_path / "examples" / "train.py").write_text("from data import MLP\n")
    assert import_graph.imports_of_tests(tmp_path, ("benchmarks", "examples")) == [
        "benchmarks/run.py:2 benchmarks.run imports helpers.models",
        "benchmarks/run.py:3 benchmarks.run imports test_x"]
