"""dpnode: a differential-privacy data node and the SDK that talks to it.

* :mod:`dpnode.node` — the server (HTTP API, services, database, blob storage);
* :mod:`dpnode.sdk` — the data scientist's client: remote tensors with ordinary PyTorch code;
* :mod:`dpnode.policies` — the admin policy language and its evaluation;
* :mod:`dpnode.core` — what both sides share: the engine's prims and wire format, the
  privacy tracker and the DP mechanisms. Pure: no HTTP, no database, no torch.

Importing ``dpnode`` imports nothing else, so the node's install needs no torch.
"""

__version__ = "0.1.0"
