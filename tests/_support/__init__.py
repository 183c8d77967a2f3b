"""The tests' one set of setup helpers, importable from every test package as `_support.*`
(`tests/` is on `sys.path`: pytest's rootdir insertion; a child process started as
`python -m tests....` from the repository root imports `tests._support.*`).

- `_support.git`: git with a clean identity and configuration, and commits of test repositories;
- `_support.cases`: real Harbor task dirs (a case);
- `_support.specs`: the standard spec tree (`build.yaml`, target, reference, cases) and its edits;
- `_support.cli`: the real `vero` console script, and the files of a compiled tree.
"""
