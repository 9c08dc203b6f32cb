"""Progress bars (tqdm) for long uploads and publishes, off where nobody would see them."""

from __future__ import annotations

import sys
from typing import Any


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


#: a publish's bar: how long it has run and its state on the node (no total: a publish
#: reports no progress of its own, which could depend on the data)
_PUBLISH_BAR = "{desc}: {elapsed} {postfix}"


def _wants_progress(progress: bool | None) -> bool:
    """``progress``, or by default: in a terminal or a notebook (a Jupyter kernel)."""
    if progress is None:
        return sys.stderr.isatty() or "ipykernel" in sys.modules
    return progress


def _progress_bar(total: int | None, progress: bool | None, **options: Any) -> Any:
    """A tqdm bar (in bytes unless ``options`` say otherwise), or a stand-in when it is off
    (or tqdm is not installed)."""
    if not _wants_progress(progress):
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    options = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "desc": "upload"} | options
    return tqdm(total=total, **options)
