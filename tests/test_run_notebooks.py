"""scripts/run_notebooks.py: parameters injected after the first code cell, the executed copy kept even
when a cell fails, and the exit status saying whether every notebook ran."""

import importlib.util
import json
import pathlib

import nbformat
import pytest

SCRIPT = pathlib.Path(__file__).parent.parent / "scripts" / "run_notebooks.py"


def _script():
    spec = importlib.util.spec_from_file_location("run_notebooks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parameters_are_injected_and_a_failure_is_reported(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a study"),
        nbformat.v4.new_code_cell("FULL = False\nSCALE = 1"),
        nbformat.v4.new_code_cell("open('ran.txt', 'w').write(str(FULL))\nassert SCALE == 3, SCALE\nprint(SCALE * 2)"),
    ])
    path = tmp_path / "study.ipynb"
    nbformat.write(notebook, path)
    out = tmp_path / "out"
    main = _script().main

    assert main([str(path), "--set", "FULL=True", "--set", "SCALE=3", "--out", str(out)]) == 0
    executed = nbformat.read(out / "study.ipynb", as_version=4)
    assert executed.cells[2].source == "FULL=True\nSCALE=3"  # right after the parameters cell
    assert executed.cells[3].outputs[0]["text"] == "6\n"
    assert (out / "study" / "ran.txt").read_text() == "True"  # each notebook runs in its own folder
    assert nbformat.read(path, as_version=4).cells[1].source == "FULL = False\nSCALE = 1"  # stored one untouched

    assert main([str(path), "--set", "SCALE=2", "--out", str(out)]) == 1
    [result] = json.loads((out / "notebooks.json").read_text())
    assert not result["ok"] and "AssertionError" in result["error"] and result["parameters"] == ["SCALE=2"]
    executed = nbformat.read(out / "study.ipynb", as_version=4)
    assert any(o.get("ename") == "AssertionError" for o in executed.cells[3].outputs)  # the partial run is kept


def test_a_missing_notebook_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no such notebook: .*nope.ipynb"):
        _script().main([str(tmp_path / "nope.ipynb"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # nothing started


def test_a_malformed_override_names_the_form(tmp_path):
    path = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("A = 1")]), path)
    with pytest.raises(SystemExit, match="expected NAME=EXPR"):
        _script().main([str(path), "--set", "not an assignment", "--out", str(tmp_path / "out")])
