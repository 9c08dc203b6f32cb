"""dpnode's server: a differential-privacy data node.

Layers (dependencies point one way): ``dpnode.node.api`` (HTTP only) ->
``dpnode.node.services`` (transactions, permission checks) -> ``dpnode.core.engine``
(prims, promotion), ``dpnode.core.dp`` (mechanisms, accounting), ``dpnode.node.db``
(tables) and ``dpnode.node.storage`` (array bytes).
"""

from dpnode import __version__

__all__ = ["API_VERSION", "__version__"]

#: Version of the HTTP API's schemas; it moves with the prim vocabulary.
API_VERSION = "1"
