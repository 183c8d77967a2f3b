"""Command modules of the `vero` CLI: plain functions that `vero.cli` registers on `app`/`harbor_app`.

| module | commands |
|---|---|
| `build` | `vero harbor build` |
| `run` | `vero harbor run` |
| `sidecar` | `vero harbor serve`, `vero harbor seal` (trusted side) |
| `agent` | `vero harbor status`, `eval`, `result`, `submit` (the agent's client) |
| `verify` | `vero harbor verify`, `vero report` |
"""
