"""What the node and the SDK share, pure: no HTTP, no database, no torch.

* :mod:`dpnode.core.engine` — prims, dtype promotion, graphs and their wire format;
* :mod:`dpnode.core.privacy` — the sensitivity tracker and the release plan;
* :mod:`dpnode.core.dp` — mechanisms, samplers and accounting;
* :mod:`dpnode.core.structures` — graph structures sent once, then referenced;
* :mod:`dpnode.core.inputs` — how a graph's inputs name stored data;
* :mod:`dpnode.core.errors` — the errors both sides raise, each with its wire code.

Import boundaries are checked by import-linter (``scripts/check``).
"""
