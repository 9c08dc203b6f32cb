"""dpnode's server: a differential-privacy data node.

Layers (dependencies point one way): ``node.api`` (HTTP only) ->
``node.services`` (transactions, permission checks) -> ``node.engine``
(prims, promotion), ``node.dp`` (mechanisms, accounting), ``node.db``
(tables) and ``node.storage`` (array bytes).
"""

__version__ = "0.1.0"

#: Version of the HTTP API's schemas; it moves with the prim vocabulary.
API_VERSION = "1"
