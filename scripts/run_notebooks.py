"""Runs notebooks top to bottom with their parameters overridden, and keeps the executed copies.

    python3 scripts/run_notebooks.py --set FULL=True --set 'PRESET="ant-mlp"' --out OUT notebooks/*.ipynb

Each `--set NAME=EXPR` becomes a cell inserted after the notebook's first code cell (its parameters), so
the stored notebooks stay as they are. Each notebook runs in its own folder `OUT/<name>/` (its `runs/`
land there); the executed notebook, outputs included, is written to `OUT/<name>.ipynb` even when a cell
fails, and the exit status says whether every notebook ran. On the GPU machine this needs the Jupyter
wheels (`scripts/gpu_session.sh notebooks` says how to carry them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def parameter_cell(assignments: list[str]):
    import nbformat

    for assignment in assignments:
        name, sep, _ = assignment.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SystemExit(f"--set {assignment!r}: expected NAME=EXPR, e.g. --set FULL=True")
    cell = nbformat.v4.new_code_cell("\n".join(assignments))
    cell.metadata["tags"] = ["injected-parameters"]
    return cell


def run(path: pathlib.Path, assignments: list[str], out: pathlib.Path, timeout: int) -> dict:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    if assignments:
        first = next(i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code")
        notebook.cells.insert(first + 1, parameter_cell(assignments))
    workdir = out / path.stem
    workdir.mkdir(parents=True, exist_ok=True)
    start, error = time.perf_counter(), None
    try:
        NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(workdir)}}).execute()
    except Exception as e:  # a failing cell or a timeout: the executed part is still written below
        error = (str(e).strip().splitlines() or [type(e).__name__])[-1]
    finally:
        nbformat.write(notebook, out / path.name)
    return {"notebook": path.name, "ok": error is None, "error": error, "seconds": time.perf_counter() - start,
            "parameters": assignments}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path)
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="NAME=EXPR",
                        help="a parameter override, as Python source (repeatable)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/notebooks"))
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    options = parser.parse_args(argv)
    missing = [str(path) for path in options.notebooks if not path.is_file()]
    if missing:
        raise SystemExit(f"no such notebook: {', '.join(missing)} (give paths to .ipynb files, e.g. notebooks/*.ipynb)")
    options.out.mkdir(parents=True, exist_ok=True)
    results = [run(path.resolve(), options.assignments, options.out, options.timeout) for path in options.notebooks]
    (options.out / "notebooks.json").write_text(json.dumps(results, indent=1))
    for result in results:
        status = "ok" if result["ok"] else f"FAILED: {result['error']}"
        print(f"[notebook] {result['notebook']}: {status} ({result['seconds']:.0f} s)", flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
