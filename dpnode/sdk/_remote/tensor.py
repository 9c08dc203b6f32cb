"""RemoteTensor: a torch.Tensor whose values live on the node.

A wrapper subclass (``_make_wrapper_subclass``) around a ``meta`` tensor: it
has a shape, dtype and strides, no storage, and takes part in autograd like
any tensor (autograd runs above Python dispatch, so ``backward`` just calls
more ATen ops on it). Shapes, strides and dtypes are propagated by running
each op on the meta tensors (``_meta``); the wrapper itself reports the
``cpu`` device, see :data:`OUTER_DEVICE` for why. Every ATen op
that reaches :meth:`RemoteTensor.__torch_dispatch__` is handed to
:func:`dpnode.sdk._remote.dispatch.dispatch`, which records prims.

Aliasing is kept for real rather than functionalized away: tensors that share
memory in torch share a :class:`Storage` here, whose ``node`` is the current
value of the base. A view remembers the chain of view ops from its base, and
its value is re-derived whenever the base has been written since. Writing into
a view scatters the new value back into the base through the inverse of each
view op. So ``x[0].mul_(2)`` changes ``x`` exactly as in torch, and the node
only ever sees functional prims.
"""

from __future__ import annotations

from typing import Any

import torch

from dpnode.sdk._remote.graph import Node, count_ops
from dpnode.sdk._remote.losses import OVERRIDES
from dpnode.sdk._remote.privacy import CALLS
from dpnode.sdk._remote.views import forward, inverse

__all__ = ["RemoteTensor", "Storage", "ViewStep"]


#: The device remote tensors report. Their shapes and dtypes come from meta tensors (``_meta``),
#: but the wrapper claims "cpu": the helper tensors that torch and its decompositions create
#: "on the same device" (``torch.tensor(0, device=x.device)``, scalars wrapped by ``torch.where``,
#: list indices) are then real local tensors whose public values travel as constants, instead
#: of value-less meta tensors.
OUTER_DEVICE = torch.device("cpu")


class Storage:
    """The shared memory of a family of aliasing remote tensors: the base's current value."""

    __slots__ = ("meta", "node", "version")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.version = 0
        #: the base's meta tensor: its strides say how the values lie in memory (as_strided)
        self.meta: torch.Tensor | None = None


#: one elementary view step, e.g. ("slice", dim, start, end, step); see views.py
ViewStep = tuple[Any, ...]


_WHERE = "Choose between values remotely with torch.where(condition, a, b)."

_torch_function = torch._C._disabled_torch_function_impl


#: the node's integers: int64
_INT64 = range(-(2**63), 2**63)


def _check_constants(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a Python integer constant that does not fit int64 before torch sees it: torch
    would raise an ``OverflowError`` for some and wrap others around as unsigned (``x > 2**63``
    true for every ``x``), and the node computes with int64.

    Raises:
        GraphError: names the call and the constant, and what to write instead.
    """
    for arg in (*args, *kwargs.values()):
        for v in arg if type(arg) in (list, tuple) else (arg,):
            if type(v) is int and v not in _INT64:
                from dpnode.sdk._exceptions import GraphError

                name = torch.overrides.resolve_name(func) or getattr(func, "__name__", "an op")
                raise GraphError(
                    f"{name}: the integer constant {v} does not fit int64, the node's integers "
                    f"(-2**63 to 2**63 - 1): write it as a float ({_as_float(v)}) or within "
                    "that range"
                )


def _as_float(v: int) -> str:
    """``v`` as a float literal, infinite beyond the floats.

    >>> _as_float(2**63), _as_float(-(10**400))
    ('9.223372036854776e+18', "-float('inf')")
    """
    try:
        return repr(float(v))
    except OverflowError:
        return "float('inf')" if v > 0 else "-float('inf')"


def _private(what: str, advice: str = "") -> Exception:
    from dpnode.sdk._remote.dispatch import private_error

    return private_error(what, advice)


class RemoteTensor(torch.Tensor):
    """A tensor whose values stay on the node: shape and dtype here, values never.

    Obtain one from a dataset (``ds["age"]``, ``ds.tensors(...)``) or a model
    (``model.state_dict()``), then use ordinary PyTorch: every op is recorded
    as prims into a lazy graph. Data-dependent operations (``item``, ``bool``,
    ``tolist``, boolean masks...) raise :class:`sdk.PrivateValueError`, except
    inside :func:`sdk.mock`, where they run on mock data.
    """

    _storage: Storage
    _steps: tuple[ViewStep, ...]
    _seen_version: int
    _cached: Node
    _source: str
    _meta: torch.Tensor

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``func`` as a plain tensor would, remembering it as the call being recorded.

        torch disables subclass torch functions while ``func`` runs, so only the outermost
        call comes here: ``torch.median``, not the ops its decomposition calls. A refusal
        raised while it records names it (``privacy.not_publishable``).
        """
        calls = CALLS
        outer = calls.func
        calls.func = func
        kwargs = kwargs if kwargs is not None else {}
        try:
            _check_constants(func, args, kwargs)
            override = OVERRIDES.get(func)
            if override is not None:
                done = override(*args, **kwargs)
                if done is not NotImplemented:
                    return done
            return _torch_function(func, types, args, kwargs)
        finally:
            calls.func = outer

    @staticmethod
    def __new__(
        cls,
        meta: torch.Tensor,
        storage: Storage,
        steps: tuple[ViewStep, ...] = (),
        source: str = "",
        requires_grad: bool = False,
    ) -> RemoteTensor:
        r: RemoteTensor = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.shape,
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            device=OUTER_DEVICE,
            requires_grad=requires_grad,
        )
        r._meta = meta
        r._storage = storage
        r._steps = steps
        r._seen_version = storage.version
        r._cached = storage.node
        r._source = source
        if not steps:
            storage.meta = meta
            node = storage.node
            if node.shape is None:
                node.shape, node.dtype = tuple(meta.shape), meta.dtype
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    @property
    def node(self) -> Node:
        """The recorded node holding this tensor's current value."""
        st = self._storage
        if self._seen_version == st.version:
            return self._cached
        node = st.node
        for step in self._steps:
            node = forward(step, node)
        node.shape, node.dtype = tuple(self.shape), self.dtype
        self._cached = node
        self._seen_version = st.version
        return node

    def _write(self, value: Node) -> None:
        """Replace this tensor's value (same shape and dtype) and update every alias."""
        st = self._storage
        old = st.node
        if self._steps:
            bases = [old]
            for step in self._steps[:-1]:
                bases.append(forward(step, bases[-1]))
            for step, base in zip(reversed(self._steps), reversed(bases), strict=True):
                value = inverse(step, base, value)
        value.shape, value.dtype = old.shape, old.dtype
        st.node = value
        st.version += 1

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from dpnode.sdk._remote.dispatch import dispatch

        return dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        shape = str(tuple(self.shape))
        src = f", source={self._source}" if self._source else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (
            f"RemoteTensor(shape={shape}, dtype={self.dtype}{src}, "
            f"ops={count_ops([self.node])}{grad})"
        )

    __str__ = __repr__

    def _repr_html_(self) -> str:
        from dpnode.sdk._display import fields_table

        return fields_table(
            "remote tensor (its values stay on the node)",
            [
                ("shape", str(tuple(self.shape))),
                ("dtype", str(self.dtype)),
                ("source", self._source),
                ("ops", count_ops([self.node])),
                ("requires_grad", self.requires_grad),
            ],
        )

    def graph(self) -> Any:
        """The engine graph computing this tensor (output 0), with its inputs and constants."""
        from dpnode.sdk._remote.graph import build

        return build([self.node])

    def publish(
        self,
        *,
        epsilon: float,
        delta: float | None = None,
        client: Any = None,
        description: str = "",
    ) -> Any:
        """Compute this tensor on the node and release it with noise (see ``sdk.publish``;
        ``description``: what it is for, shown to an admin who approves it)."""
        from dpnode.sdk._publish import publish

        return publish(self, epsilon=epsilon, delta=delta, client=client, description=description)

    def sensitivity(self, *, client: Any = None) -> Any:
        """How far this tensor can move when one subject changes (free; ``sdk.sensitivity``)."""
        from dpnode.sdk._publish import sensitivity

        return sensitivity(self, client=client)

    def noise_scale(
        self, *, epsilon: float, delta: float | None = None, client: Any = None
    ) -> float:
        """The noise scale a publish at ``epsilon`` would use (free; ``sdk.noise_scale``)."""
        from dpnode.sdk._publish import noise_scale

        return noise_scale(self, epsilon=epsilon, delta=delta, client=client)

    # data-dependent Python protocols: the values are on the node
    def __bool__(self) -> bool:
        raise _private("bool(tensor) (an `if` or `while` on a remote value)", _WHERE)

    def __int__(self) -> int:
        raise _private("int(tensor)")

    def __float__(self) -> float:
        raise _private("float(tensor)")

    def __index__(self) -> int:
        raise _private("using a remote tensor as a Python index")

    def tolist(self) -> Any:
        raise _private("tensor.tolist()")

    def numpy(self, *, force: bool = False) -> Any:
        raise _private("tensor.numpy()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise _private("converting a remote tensor to a NumPy array")

    def __reduce_ex__(self, proto: Any) -> Any:
        raise TypeError("a RemoteTensor cannot be pickled: its values live on the node")
