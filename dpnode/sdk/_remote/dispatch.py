"""From an ATen call on remote tensors to recorded prims.

Every op is classified once (cached per overload), in this order:

1. *private*: needs values (``item``, ``nonzero``, ``unique``...): PrivateValueError.
2. *view*: recorded as view steps sharing the input's storage (see ``views.py``).
3. *in-place* (``add_``, ``copy_``...): the functional op, then a write into
   ``self`` that updates every alias.
4. *rule*: our own ATen -> prim recipe (``rules.py``, ``rules_nn.py``).
5. *decomposition*: torch's table (``torch._decomp``), run under
   :class:`FactoryCapture` so that factories it calls on the meta device
   become prims; the ops it emits come back here.
6. *composite*: ``func.decompose()`` for CompositeImplicitAutograd ops.
7. otherwise UnsupportedOperationError naming the op.

Output shapes, strides and dtypes always come from running the op on meta
tensors, i.e. from torch itself; tests check that the node's inference agrees.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode

from sdk._exceptions import PrivateValueError, UnsupportedOperationError
from sdk._remote import views
from sdk._remote.graph import Node, constant
from sdk._remote.tensor import RemoteTensor, Storage

__all__ = ["FactoryCapture", "dispatch", "node_of", "private_error"]

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

#: aten overload -> rule(out_meta, *args, **kwargs) -> Node | sequence of Nodes
RULES: dict[Any, Callable[..., Any]] = {}
#: aten overload -> (what it is, advice) for the PrivateValueError
PRIVATE: dict[Any, tuple[str, str]] = {}
#: factories that a decomposition may call with no tensor argument
FACTORIES: set[Any] = set()
#: aten overload -> handler(args, kwargs) for ops that need more than a rule
SPECIAL: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {}

DOCS = "docs/prims.md and docs/remote-tensors.md"


_LOCAL_WRITE_ADVICE = (
    "Local tensors hold public values only. An optimizer steps once gradients are published "
    "(sdk.publish_grads, or MockSession.materialize_grads in mock mode); BatchNorm's running "
    "statistics cannot absorb remote batches: use track_running_stats=False, eval() mode, or "
    "GroupNorm/LayerNorm."
)


def private_error(what: str, advice: str = "") -> PrivateValueError:
    """The error for code that needs a remote tensor's values locally."""
    return PrivateValueError(
        f"{what} needs the values of a remote tensor, and those stay on the node. "
        + (advice + " " if advice else "")
        + "To see a result, publish it: tensor.publish(epsilon=...) returns a noised copy; "
        "to dry-run on fake data, use sdk.mock(dataset)."
    )


# -- arguments ---------------------------------------------------------------------------

_CONSTANTS: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, int], Node]] = {}


def _forget(key: int) -> Callable[[Any], None]:
    def drop(_ref: Any) -> None:
        _CONSTANTS.pop(key, None)

    return drop


def node_of(t: torch.Tensor) -> Node:
    """The node of a tensor argument: a remote tensor's value, or a local tensor as a constant.

    A local tensor becomes one constant per (tensor, version): a parameter used
    by the forward and the backward pass travels once.
    """
    if isinstance(t, RemoteTensor):
        return t.node
    if t.device.type == "meta":
        raise UnsupportedOperationError(
            "a meta tensor without values met a remote computation; this is a gap in the SDK's "
            f"decompositions (please report it), see {DOCS}"
        )
    key = id(t)
    hit = _CONSTANTS.get(key)
    # in-place updates bump the version; `p.data = ...` swaps the buffer (and its pointer)
    version = (t._version, t.data_ptr())
    if hit is not None and hit[0]() is t and hit[1] == version:
        return hit[2]
    node = constant(t)
    _CONSTANTS[key] = (weakref.ref(t, _forget(key)), version, node)
    return node


def _to_nodes(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return node_of(a)
    if isinstance(a, (list, tuple)) and a and any(isinstance(x, torch.Tensor) for x in a):
        return [None if x is None else _to_nodes(x) for x in a]
    return a


def _meta(a: Any) -> Any:
    if isinstance(a, RemoteTensor):
        return a._meta
    if isinstance(a, torch.Tensor):
        if a.device.type == "meta":
            return a
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)) and a and any(isinstance(x, torch.Tensor) for x in a):
        return [_meta(x) for x in a]
    if isinstance(a, torch.device):
        return torch.device("meta")
    return a


def _meta_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    if not kwargs:
        return kwargs
    out = {k: _meta(v) for k, v in kwargs.items()}
    if "device" in out:
        out["device"] = torch.device("meta")
    return out


#: (op, the arguments' metadata) -> the outputs' (shape, stride, dtype): torch's meta kernels
#: read metadata only, so the same metadata gives the same outputs; bounded, cleared when full
_OUTPUT_METAS: dict[tuple[Any, ...], Any] = {}
_MAX_OUTPUT_METAS = 8192
_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.memory_format, torch.layout)


def _signature(a: Any) -> Any:
    """What torch's meta kernel reads of one argument, hashable; ``...`` when unsure."""
    if isinstance(a, torch.Tensor):
        m = a._meta if isinstance(a, RemoteTensor) else a
        return (tuple(m.shape), m.stride(), m.dtype, m.device.type == "meta", m.requires_grad)
    if isinstance(a, _SCALARS):
        return (type(a), a)  # 1, 1.0 and True hash alike but promote differently
    if isinstance(a, (list, tuple)):
        parts = tuple(_signature(x) for x in a)
        return ... if ... in parts else (type(a), parts)
    return ...


def _output_meta(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` on the arguments' metadata (torch's meta kernel), from a cache when the same
    op met the same metadata before: fresh meta tensors of the remembered layout."""
    key_parts = (id(func), _signature(args), _signature(tuple(sorted(kwargs.items()))))
    if ... in key_parts:
        return func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))
    hit = _OUTPUT_METAS.get(key_parts)
    if hit is not None:
        return _fresh(hit)
    out = func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))
    layout = _layout(out)
    if layout is not None:
        if len(_OUTPUT_METAS) >= _MAX_OUTPUT_METAS:
            _OUTPUT_METAS.clear()
        _OUTPUT_METAS[key_parts] = layout
    return out


def _layout(out: Any) -> Any:
    if isinstance(out, torch.Tensor) and out.device.type == "meta" and not out.requires_grad:
        return (tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, tuple) and out and all(isinstance(o, torch.Tensor) for o in out):
        parts = tuple(_layout(o) for o in out)
        return None if None in parts else (type(out), parts)
    return None


def _fresh(layout: Any) -> Any:
    if isinstance(layout[0], type):  # a tuple of outputs (a plain tuple or a named one)
        kind, parts = layout
        items = [_fresh(p) for p in parts]
        return kind(items) if kind is not tuple else tuple(items)
    shape, stride, dtype = layout
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _source(args: tuple[Any, ...]) -> str:
    for a in args:
        if isinstance(a, RemoteTensor):
            return a._source
        if isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, RemoteTensor):
                    return x._source
    return ""


def _wrap(meta: Any, nodes: Any, source: str) -> Any:
    if isinstance(meta, torch.Tensor):
        if not isinstance(nodes, Node):
            raise AssertionError(f"rule returned {type(nodes).__name__} for one output")
        return RemoteTensor(meta, Storage(nodes), source=source)
    if isinstance(meta, (tuple, list)):
        return type(meta)(_wrap(m, n, source) for m, n in zip(meta, nodes, strict=True))
    return meta


# -- classification --------------------------------------------------------------------


def _has_remote(args: Any) -> bool:
    for a in args:
        if isinstance(a, RemoteTensor):
            return True
        if isinstance(a, (list, tuple)) and _has_remote(a):
            return True
    return False


def _functional_of(func: OpOverload) -> OpOverload | None:
    schema = func._schema
    if not schema.arguments or schema.arguments[0].alias_info is None:
        return None
    if not schema.arguments[0].alias_info.is_write:
        return None
    name = schema.name.split("::")[1]
    if not name.endswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    if packet is None:
        return None
    same = getattr(packet, func._overloadname, None)
    if same is not None:
        return same  # type: ignore[no-any-return]
    # overloads are not always named alike (bernoulli_.float is bernoulli.p): match arguments
    names = [a.name for a in schema.arguments]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if [a.name for a in candidate._schema.arguments] == names:
            return candidate  # type: ignore[no-any-return]
    return getattr(packet, "default", None)


_KIND: dict[int, tuple[str, Any]] = {}


def _classify(func: OpOverload) -> tuple[str, Any]:
    if func in PRIVATE:
        return "private", PRIVATE[func]
    if func in SPECIAL:
        return "special", SPECIAL[func]
    if func in views.VIEW_SPECS:
        return "view", views.VIEW_SPECS[func]
    if func in views.MULTI_VIEWS:
        return "multiview", None
    if func in RULES:
        return "rule", RULES[func]
    if func._schema.is_mutable:
        functional = _functional_of(func)
        if functional is not None and (
            functional in views.VIEW_SPECS or functional is aten.as_strided.default
        ):
            return "inplace_view", functional
        if func is aten.copy_.default:
            return "copy", None
        if functional is not None:
            return "inplace", functional
        return "unsupported", None
    if func in decomposition_table:
        return "decomp", decomposition_table[func]
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):  # type: ignore[no-untyped-call]
        return "composite", None
    return "unsupported", None


# -- the dispatcher ----------------------------------------------------------------------


def dispatch(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Record ``func(*args, **kwargs)`` on remote tensors and return remote results."""
    kind = _KIND.get(id(func))  # OpOverloads are long-lived singletons; id() hashes fastest
    if kind is None:
        kind = _KIND[id(func)] = _classify(func)
    how, what = kind
    if how == "rule":
        out = _output_meta(func, args, kwargs)
        nodes = what(
            out, *[_to_nodes(a) for a in args], **{k: _to_nodes(v) for k, v in kwargs.items()}
        )
        if nodes is not NotImplemented:
            return _wrap(out, nodes, _source(args))
        # the rule declines this call form: torch's decomposition, if there is one
        how = "decomp" if func in decomposition_table else "unsupported"
        what = decomposition_table.get(func)
    if how == "view":
        return _view(func, what, args, kwargs)
    if how == "special":
        return what(args, kwargs)
    if how == "inplace":
        return _inplace(func, what, args, kwargs)
    if how == "copy":
        return _copy(args[0], args[1])
    if how == "decomp":
        with FactoryCapture():  # type: ignore[no-untyped-call]
            r = what(*args, **kwargs)
        if r is not NotImplemented:  # some decompositions decline some call forms
            return r
        how = "unsupported"
    if how == "composite":
        with FactoryCapture():  # type: ignore[no-untyped-call]
            r = func.decompose(*args, **kwargs)
        if r is not NotImplemented:
            return r
        how = "unsupported"
    if how == "inplace_view":
        return _inplace_view(what, args, kwargs)
    if how == "multiview":
        return _multiview(func, args, kwargs)
    if how == "private":
        raise private_error(*what)
    raise UnsupportedOperationError(
        f"{func} has no decomposition into dpnode's prims, so it cannot run on remote tensors; "
        f"the supported vocabulary is in {DOCS}"
    )


def _view(func: OpOverload, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    out = func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))
    if not isinstance(x, RemoteTensor):  # a view of a local tensor: a local view
        return func(*args, **kwargs)
    steps = spec(x._meta, out, *args[1:], **kwargs)
    return _view_result(x, out, steps)


def _view_result(x: RemoteTensor, out: torch.Tensor, steps: list[Any]) -> RemoteTensor:
    if steps == [("identity",)]:
        r = RemoteTensor(out, x._storage, x._steps, x._source)
        r._cached, r._seen_version = x.node, x._seen_version
        return r
    st = tuple(steps)
    r = RemoteTensor(out, x._storage, x._steps + st, x._source)
    node = x.node
    for s in st:
        node = views.forward(s, node)
    node.shape, node.dtype = tuple(out.shape), out.dtype
    r._cached, r._seen_version = node, x._seen_version
    return r


def _multiview(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    outs = func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))
    all_steps = views.multi_view_steps(func, x._meta, outs, args[1:])
    return [_view_result(x, o, s) for o, s in zip(outs, all_steps, strict=True)]


def _defaults(
    func: OpOverload, functional: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """``kwargs`` with the in-place op's defaults for what the call left out, where the
    functional op takes them without one (``bernoulli_(p=0.5)`` is ``bernoulli.p(p)``)."""
    takes = {a.name for a in functional._schema.arguments}
    out = dict(kwargs)
    for i, a in enumerate(func._schema.arguments):
        if i >= len(args) and a.name not in out and a.name in takes and a.has_default_value():
            out[a.name] = a.default_value
    return out


def _inplace(
    func: OpOverload, functional: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    self = args[0]
    if not isinstance(self, RemoteTensor):
        raise private_error(
            f"{func} writes a remote value into a local tensor, which",
            _LOCAL_WRITE_ADVICE,
        )
    func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))  # torch's own checks (casting, shapes)
    result = dispatch(functional, args, _defaults(func, functional, args, kwargs))
    _assign(self, result)
    return self


def _inplace_view(functional: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``squeeze_``, ``t_``, ``as_strided_``...: self becomes the view, in place."""
    from torch.utils._mode_utils import no_dispatch

    self = args[0]
    view = dispatch(functional, args, kwargs)
    with no_dispatch():  # change the wrapper's own sizes and strides; it has no data to touch
        self.as_strided_(view.shape, view.stride(), view.storage_offset())
    self._meta, self._steps = view._meta, view._steps
    self._cached, self._seen_version = view._cached, view._seen_version
    return self


def _assign(self: RemoteTensor, src: Any) -> None:
    from sdk._remote.graph import prim

    if isinstance(src, torch.Tensor):
        value = node_of(src)
        sd, shape = src.dtype, tuple(src.shape)
    else:
        value, sd, shape = src, None, ()
    if not isinstance(value, Node):
        value = prim("full", shape=tuple(self.shape), value=float(value), dtype=_name(self.dtype))
    else:
        if sd != self.dtype:
            value = prim("convert_element_type", value, dtype=_name(self.dtype))
        if shape != tuple(self.shape):
            value = prim("expand", value, shape=tuple(self.shape))
    self._write(value)


def _copy(self: Any, src: Any) -> Any:
    if not isinstance(self, RemoteTensor):
        raise private_error(
            "copying a remote tensor into a local one",
            _LOCAL_WRITE_ADVICE,
        )
    aten.copy_.default(self._meta, _meta(src))  # broadcast and dtype checks
    _assign(self, src)
    return self


def _name(d: torch.dtype) -> str:
    from sdk._remote.graph import TORCH_NAMES

    try:
        return TORCH_NAMES[d]
    except KeyError:
        raise UnsupportedOperationError(f"dtype {d} is not supported by dpnode's prims") from None


# -- factories inside decompositions ------------------------------------------------------


class FactoryCapture(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Active while a torch decomposition runs: meta-device factories become prims.

    Decompositions create helper tensors with ``torch.zeros(..., device=x.device)``
    and the like. Recorded as prims (``full``, ``arange``, ``rand``) they cost a
    few bytes of graph instead of a constant as large as the data; anything with
    remote arguments goes on to the subclass.
    """

    def __torch_dispatch__(
        self, func: OpOverload, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if _has_remote(args) or _has_remote(kwargs.values()):
            return func(*args, **kwargs)
        if func in FACTORIES:
            out = func(*[_meta(a) for a in args], **_meta_kwargs(kwargs))
            return _wrap(out, RULES[func](out, *args, **kwargs), "")
        return func(*args, **kwargs)
