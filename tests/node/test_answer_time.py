"""A charged publish's answer time, padded to a public deadline (``publish_time_quantum_seconds``).

The evaluation on private values is the one part of a publish whose time may depend on them.
The engine's kernels are made to take the same time on every value where a channel was
found; padding covers the ones nobody found. Here a kernel that does leak is simulated: the
evaluation is made to take 0.3 s longer when the first row's private value is high, and two
neighbouring datasets (that value replaced) are published from. Unpadded, the clock tells
them apart; padded to a quantum of 1 s, both answers go out in the same doubling of it. An
evaluation longer than the quantum goes out at the next doubling, 2 s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.services import publish as service
from dpnode.node.settings import Settings
from tests.conftest import login
from tests.node.conftest import publish, upload_ok

QUANTUM = 1.0
#: How much longer the simulated leaky evaluation takes on a high first row.
LEAK = 0.3


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"publish_time_quantum_seconds": QUANTUM})


def _leaky_evaluation(monkeypatch: pytest.MonkeyPatch, extra: float) -> None:
    """Every evaluation takes ``extra`` more seconds when the first private value is above 0.5:
    a kernel whose time shows a row, as the engine's own are tested not to."""
    real = service.run_release

    def leaky(rp: Any, inputs: Callable[[], Mapping[str, Any]], **kw: Any) -> Any:
        values = inputs()
        if float(np.asarray(next(iter(values.values())))[0]) > 0.5:
            time.sleep(extra)
        return real(rp, values, **kw)

    monkeypatch.setattr(service, "run_release", leaky)


def _neighbours(http: TestClient, owner_h: dict[str, str]) -> list[int]:
    ids = []
    for k, first in enumerate((0.0, 1.0)):
        x = np.full(50, 0.25)
        x[0] = first
        ids.append(upload_ok(http, owner_h, f"pair-{k}", {"x": x}, bounds={"x": (0, 1)})["id"])
    return ids


def _timed_mean(http: TestClient, ds_h: dict[str, str], ident: int) -> float:
    b = GraphBuilder()
    x = b.input(f"dataset:{ident}/x", "float64", (50,))
    frame = encode(b.build([b.op("mean", x)]))
    start = time.monotonic()
    response = publish(http, ds_h, frame, 0.1)
    elapsed = time.monotonic() - start
    assert response.status_code == 200, response.text
    return elapsed


def _doubling(elapsed: float) -> int:
    """Which doubling of the quantum an answer went out in."""
    return math.floor(math.log2(elapsed / QUANTUM))


def test_answer_time_shows_no_row_within_the_quantum(
    http: TestClient,
    context: NodeContext,
    owner: Any,
    scientist: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner_h, ds_h = login(http, owner.email), login(http, scientist.email)
    ids = _neighbours(http, owner_h)
    _leaky_evaluation(monkeypatch, LEAK)

    padded = [_timed_mean(http, ds_h, i) for i in ids]
    assert all(t >= QUANTUM for t in padded), padded
    assert [_doubling(t) for t in padded] == [0, 0], padded

    # the same two publishes unpadded: the clock reads the replaced row. A loaded machine only
    # adds time, in spells longer than a publish: the fastest of three interleaved pairs, and
    # half the leak (a padding still applied, or no leak to hide, leaves ~0 of it)
    monkeypatch.setattr(context.settings, "publish_time_quantum_seconds", 0.0)
    pairs = [[_timed_mean(http, ds_h, i) for i in ids] for _ in range(3)]
    low, high = (min(times) for times in zip(*pairs, strict=True))
    assert high - low >= LEAK * 0.5, pairs


def test_an_evaluation_past_the_quantum_goes_out_at_its_doubling(
    http: TestClient, owner: Any, scientist: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner_h, ds_h = login(http, owner.email), login(http, scientist.email)
    _, high = _neighbours(http, owner_h)
    _leaky_evaluation(monkeypatch, QUANTUM * 1.2)
    elapsed = _timed_mean(http, ds_h, high)
    assert elapsed >= 2 * QUANTUM and _doubling(elapsed) == 1, elapsed


@pytest.mark.parametrize(
    ("quantum", "elapsed", "delay"),
    [
        (0.0, 0.3, 0.0),
        (1.0, 0.0, 1.0),
        (1.0, 0.25, 0.75),
        (1.0, 1.0, 0.0),
        (1.0, 1.5, 0.5),
        (0.25, 5.0, 3.0),
    ],  # 0.25 * 2^5 = 8 is the first doubling not before 5
)
def test_answer_delay(quantum: float, elapsed: float, delay: float) -> None:
    assert service.answer_delay(quantum, elapsed) == pytest.approx(delay)
