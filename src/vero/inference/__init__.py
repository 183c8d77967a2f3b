"""The inference gateway: candidate agents' only way to a model (per-evaluation tokens, allow-list,
metered tokens and cost, budgets). `pricing` imports only the standard library and `vero.spec`;
`gateway` (FastAPI, httpx) loads only where a gateway is served."""
