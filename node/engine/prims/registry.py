"""The prim registry: one :class:`PrimDef` per prim, registered with :func:`prim`.

A prim bundles everything the node knows about one operation: its argument and
attribute schema, a rule giving the output's shape and dtype from the inputs'
(no data needed), a NumPy kernel, a compute-cost estimate, and an empty slot
(``rules``) where later layers such as privacy tracking hang their own
per-prim rule. The evaluator is the only interpreter; it looks prims up here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from node.engine.dtypes import DType
from node.errors import EvaluationError, GraphError

__all__ = [
    "REGISTRY",
    "ArgMeta",
    "AttrSpec",
    "Call",
    "Kernel",
    "PrimDef",
    "Scalar",
    "TensorMeta",
    "prim",
]

Array: TypeAlias = npt.NDArray[Any]
Shape: TypeAlias = tuple[int, ...]
AttrValue: TypeAlias = bool | int | float | str | tuple[int, ...] | None
AttrKind = Literal["int", "ints", "bool", "float", "dtype", "str", "shape"]


@dataclass(frozen=True)
class TensorMeta:
    """What is known about a value without its data: shape and dtype."""

    shape: Shape
    dtype: DType

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Scalar:
    """An inline Python scalar argument; promotes like a torch wrapped number."""

    value: bool | int | float


#: What a shape/dtype rule sees for each argument.
ArgMeta: TypeAlias = TensorMeta | Scalar | None


@dataclass(frozen=True)
class AttrSpec:
    """Schema of one attribute.

    ``optional`` attributes may be absent or null and then take ``default``.
    ``nonfinite`` allows inf/nan for float attributes (e.g. a fill value).
    """

    kind: AttrKind
    optional: bool = False
    default: AttrValue = None
    nonfinite: bool = False


class Call:
    """One application of a prim: the node, its arguments' metadata and attributes.

    Shape rules, kernels and error messages all go through a ``Call`` so that
    every error names the node index, the prim and the argument.
    """

    __slots__ = ("accurate", "args", "attrs", "index", "meta", "op", "rng")

    def __init__(
        self, index: int, op: str, args: Sequence[ArgMeta], attrs: Mapping[str, AttrValue]
    ) -> None:
        self.index = index
        self.op = op
        self.args = tuple(args)
        # validated against the prim's schema already, so rules may read them as Any
        self.attrs: Mapping[str, Any] = attrs
        self.meta: TensorMeta | None = None  # set once the shape rule has run
        #: the node's generator, set by the evaluator for random prims
        self.rng: np.random.Generator | None = None
        #: accumulate float sums and contractions in float64 (tracked evaluations: the
        #: privacy tracker bounds the rounding of exactly this computation)
        self.accurate = False

    def where(self, arg: int | str | None = None) -> str:
        loc = f"node {self.index} ({self.op})"
        if isinstance(arg, int):
            loc += f", argument {arg}"
        elif isinstance(arg, str):
            loc += f", attribute {arg!r}"
        return loc

    def fail(self, msg: str, arg: int | str | None = None) -> GraphError:
        """A GraphError naming this node, its prim and the offending argument."""
        return GraphError(f"{self.where(arg)}: {msg}")

    def eval_error(self, msg: str, arg: int | str | None = None) -> EvaluationError:
        """An EvaluationError naming this node (for value-dependent failures)."""
        return EvaluationError(f"{self.where(arg)}: {msg}")

    def tensor(self, i: int) -> TensorMeta:
        """Argument ``i``, which must be a tensor."""
        a = self.args[i] if i < len(self.args) else None
        if not isinstance(a, TensorMeta):
            raise self.fail("expected a tensor", i)
        return a

    def attr(self, name: str) -> Any:
        return self.attrs[name]

    def dim(self, d: int, ndim: int, name: str = "dim") -> int:
        """Normalise a possibly negative dim like torch (0-dim tensors take -1/0)."""
        n = max(ndim, 1)
        if not -n <= d < n:
            raise self.fail(f"dim {d} out of range for a {ndim}-d tensor", name)
        return d % n

    def out(self) -> TensorMeta:
        assert self.meta is not None
        return self.meta


InferFn: TypeAlias = Callable[[Call], TensorMeta]
#: A kernel takes the call, the argument values (arrays, Python scalars or
#: None) and an optional preallocated output it may write into.
Kernel: TypeAlias = Callable[[Call, list[Any], "Array | None"], Array]
FlopsFn: TypeAlias = Callable[[Call], int]


def _default_flops(c: Call) -> int:
    return max(c.out().numel, 1)


def _default_workspace(c: Call) -> int:
    """Temporaries a kernel allocates beyond its output.

    By default only float16/bfloat16 cost extra: they are computed in float32 copies.
    """
    tensors = [a for a in c.args if isinstance(a, TensorMeta)]
    if not any(t.dtype.is_low_precision for t in [*tensors, c.out()]):
        return 0
    return 4 * (sum(t.numel for t in tensors) + c.out().numel)


@dataclass
class PrimDef:
    """Everything the node knows about one prim."""

    name: str
    min_args: int
    max_args: int | None  # None: variadic
    attrs: dict[str, AttrSpec]
    infer: InferFn
    kernel: Kernel
    flops: FlopsFn = _default_flops
    #: bytes of temporaries the kernel allocates beyond its output (counted in the peak)
    workspace: FlopsFn = _default_workspace
    #: kernel honours ``out`` (elementwise ops); the evaluator offers a dying input
    inplace: bool = False
    #: output may be a view of argument 0 (reshape, permute, expand, slice...)
    view: bool = False
    #: kernel draws from ``Call.rng`` (the evaluator hands it a private Call)
    random: bool = False
    #: arguments that may be inline scalars (others must be tensor refs)
    scalar_args: frozenset[int] | Literal["all"] = frozenset()
    #: arguments that may be null (absent optional tensors)
    optional_args: frozenset[int] = frozenset()
    #: rules of later layers, keyed by layer name (e.g. "privacy"); empty here
    rules: dict[str, Any] = field(default_factory=dict)
    doc: str = ""


REGISTRY: dict[str, PrimDef] = {}


def prim(
    name: str,
    *,
    args: int | tuple[int, int | None],
    attrs: Mapping[str, AttrSpec] | None = None,
    infer: InferFn,
    flops: FlopsFn | None = None,
    workspace: FlopsFn | None = None,
    inplace: bool = False,
    view: bool = False,
    scalar_args: frozenset[int] | Literal["all"] = frozenset(),
    optional_args: frozenset[int] = frozenset(),
    random: bool = False,
    doc: str = "",
) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the NumPy kernel of prim ``name``."""
    lo, hi = (args, args) if isinstance(args, int) else args

    def deco(kernel: Kernel) -> Kernel:
        if name in REGISTRY:
            raise AssertionError(f"prim {name!r} registered twice")
        REGISTRY[name] = PrimDef(
            name=name,
            min_args=lo,
            max_args=hi,
            attrs=dict(attrs or {}),
            infer=infer,
            kernel=kernel,
            flops=flops or _default_flops,
            workspace=workspace or _default_workspace,
            inplace=inplace,
            view=view,
            scalar_args=scalar_args,
            optional_args=optional_args,
            random=random,
            doc=doc or (kernel.__doc__ or "").strip(),
        )
        return kernel

    return deco


def broadcast(c: Call, shapes: Sequence[Shape]) -> Shape:
    """torch/NumPy broadcasting of ``shapes``, without allocating."""
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*shapes))
    except ValueError:
        raise c.fail(
            "shapes " + ", ".join(str(list(s)) for s in shapes) + " cannot be broadcast"
        ) from None
