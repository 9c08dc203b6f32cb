"""The prim registry: one :class:`PrimDef` per prim, registered with :func:`prim`.

A prim bundles everything the node knows about one operation: its argument and
attribute schema, a rule giving the output's shape and dtype from the inputs'
(no data needed), a NumPy kernel, a compute-cost estimate, whether it may touch
private data (``privacy``: the privacy layer has a rule for it, or it is public-only),
and an empty slot (``rules``) where later layers such as privacy tracking hang their
own per-prim rule. The evaluator is the only interpreter; it looks prims up here.
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
    "PRIVACY_KINDS",
    "REGISTRY",
    "ArgMeta",
    "AttrSpec",
    "Call",
    "Kernel",
    "PrimDef",
    "Privacy",
    "Scalar",
    "TensorMeta",
    "prim",
]

Array: TypeAlias = npt.NDArray[Any]
Shape: TypeAlias = tuple[int, ...]
AttrValue: TypeAlias = bool | int | float | str | tuple[int, ...] | None
AttrKind = Literal["int", "ints", "bool", "float", "dtype", "str", "shape"]
#: Whether a prim may touch private data. ``"rule"``: the privacy layer has a rule for it
#: (``node.privacy.rules.RULES``), so it may take private arguments; ``"public_only"``: no
#: rule, so it runs on public arguments only and a graph applying it to private data is
#: refused (the SDK refuses it as it records the op). Every prim declares one of the two;
#: a test checks the declarations against the rules, both ways.
Privacy = Literal["rule", "public_only"]
PRIVACY_KINDS: tuple[Privacy, ...] = ("rule", "public_only")


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

    __slots__ = ("accurate", "args", "attrs", "index", "meta", "op", "rng", "total")

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
        #: never fail on a value: out-of-range indices are clamped, integer division by
        #: zero gives 0 (evaluations on private data, where a value-dependent error would
        #: tell the caller something about the data; see docs/privacy.md, the threat model)
        self.total = False

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
        """An EvaluationError naming this node (for value-dependent failures).

        Kernels raise it only when ``total`` is false: public values, or a user's mock data.
        """
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
    #: may it touch private data (it has a privacy rule), or is it public-only; see Privacy
    privacy: Privacy
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
    privacy: Privacy,
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
    """Register the decorated function as the NumPy kernel of prim ``name``.

    ``privacy`` is required: ``"rule"`` for a prim the privacy layer has a rule for,
    ``"public_only"`` for one that may only ever see public data (see :data:`Privacy`).
    """
    lo, hi = (args, args) if isinstance(args, int) else args
    if privacy not in PRIVACY_KINDS:
        raise AssertionError(f"prim {name!r}: privacy must be one of {PRIVACY_KINDS}")

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
            privacy=privacy,
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
