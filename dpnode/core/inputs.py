"""How a graph's inputs name stored data, the same for the node and the SDK's mock mode.

An input is ``dataset:<id>/<column>`` (or ``dataset:<id>/@subject``) or ``model:<id>/<tensor>``,
with the id written as JSON writes a whole number: ``\\d`` would take any script's digits
(``dataset:١/x`` for dataset 1) and ``01`` for 1, and the node reads ids one way only.
"""

from __future__ import annotations

import re

__all__ = ["INPUT"]

#: An input naming stored data, matched whole (``fullmatch``): the kind (``dataset`` or
#: ``model``), the id, and the part (a column or tensor name, without a line break).
INPUT = re.compile(r"(dataset|model):(0|[1-9][0-9]*)/(.+)")
