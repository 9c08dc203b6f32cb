"""Privacy tracking: the sensitivity of every graph output, from public metadata only.

The public face:

- :class:`InputSpec`: an input's bounds and subject structure (or "public").
- :class:`Subjects`: a subject index with its structure, computed once and shareable
  by the columns of a dataset.
- :func:`track`: sensitivities of a graph's outputs without any data (free to ask).
- :func:`evaluate_tracked`: evaluate and track in one engine pass.
- :class:`PrivacyReport` / :class:`OutputSensitivity`: L1 and L2 sensitivity per output.
- :class:`PrivacyTracker`: the engine tracker itself; :data:`RULES`: one rule per prim.
- :class:`PrivacyTrackingError`: a graph whose sensitivity cannot be bounded (refused).

The neighbouring relation, the state each tensor carries and the soundness argument
are in ``docs/sensitivity.md``.
"""

from node.privacy.rules import RULES
from node.privacy.spec import InputSpec
from node.privacy.state import MIXED, PUBLIC, PrivacyTrackingError, State
from node.privacy.subjects import Subjects
from node.privacy.tracker import (
    OutputSensitivity,
    PrivacyReport,
    PrivacyTracker,
    evaluate_tracked,
    track,
)

__all__ = [
    "MIXED",
    "PUBLIC",
    "RULES",
    "InputSpec",
    "OutputSensitivity",
    "PrivacyReport",
    "PrivacyTracker",
    "PrivacyTrackingError",
    "State",
    "Subjects",
    "evaluate_tracked",
    "track",
]
