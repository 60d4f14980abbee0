"""Reading a JSON-runtime node's attributes (string lists) and its tensor layouts.

TVM's serializer writes every op attribute as a list of strings (``"strides": ["1", "1"]``, ``"axis":
["-1"]``, ``"out_dtype": [""]``).  :class:`Attrs` reads them as ints, floats, bools or strings, with
defaults, or as the kind the op language's schema declares for the attribute they become
(:meth:`Attrs.as_kind`), and raises :class:`OpError` naming the attribute when one is malformed; the
runtime adds the node and op to the message.  It also holds the node's input dtypes (for the schema's
dtype rules).  The layout helpers turn a relay layout string (``NHWC``, ``OHWI``, ``IHWO``) into the
permutation to and from the channels-first form the numpy kernels use.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ...loader.jsonrt_graph import JSONNode


class OpError(ValueError):
    """A node this board cannot run as written (unknown op, bad or unsupported attribute)."""


_MISSING = object()


class Attrs:
    """Typed access to one node's attributes; ``input_dtypes``: its inputs' dtype names (None: not known)."""

    def __init__(self, node: JSONNode, input_dtypes: Optional[list[str]] = None):
        self.node = node
        self.input_dtypes = input_dtypes

    def raw(self, key: str, default: Any = _MISSING) -> Optional[list[str]]:
        value = self.node.attrs.get(key)
        if value is None or value == [""] or value == []:
            if default is _MISSING:
                raise OpError(f"attribute {key!r} is missing")
            return default
        return value

    def _converted(self, key: str, default: Any, convert: Callable[[str], Any], what: str) -> Any:
        """Attribute ``key`` as a list, each string converted (``default`` when absent)."""
        value = self.raw(key, default)
        if value is default:
            return default
        try:
            return [convert(v) for v in value]
        except ValueError:
            raise OpError(f"attribute {key!r} must be {what}, got {value}") from None

    @staticmethod
    def _one(key: str, value: Any, default: Any, what: str) -> Any:
        """The one element of ``value`` (``default`` when it is the default)."""
        if value is default:
            return default
        if len(value) != 1:
            raise OpError(f"attribute {key!r} must be {what}, got {value}")
        return value[0]

    def ints(self, key: str, default: Any = _MISSING) -> Optional[list[int]]:
        return self._converted(key, default, int, "integers")

    def int(self, key: str, default: Any = _MISSING) -> Optional[int]:
        return self._one(key, self.ints(key, default), default, "one integer")

    def float(self, key: str, default: Any = _MISSING) -> Optional[float]:
        return self._one(key, self._converted(key, default, float, "one number"), default, "one number")

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, None)
        if value is None:
            return default
        if value not in (["0"], ["1"], ["true"], ["false"], ["True"], ["False"]):
            raise OpError(f"attribute {key!r} must be 0 or 1, got {value}")
        return value[0] in ("1", "true", "True")

    def str(self, key: str, default: Any = _MISSING) -> Optional[str]:
        return self._one(key, self.raw(key, default), default, "one string")

    def floats(self, key: str, default: Any = _MISSING) -> Optional[list[float]]:
        return self._converted(key, default, float, "numbers")

    def as_kind(self, key: str, kind: str) -> Any:
        """Attribute ``key`` read as the schema's attribute kind (``int``, ``float``, ``ints``, ``floats``,
        ``str``, ...: ``rpcsrv.loader.opset.schema.KINDS``), None when absent."""
        reader = {"int": self.int, "float": self.float, "ints": self.ints, "floats": self.floats}.get(kind, self.str)
        return reader(key, None)

    def out_dtype(self) -> None:
        """Refuse an ``out_dtype`` other than the output's own (the kernels keep the input dtype)."""
        want = self.str("out_dtype", None)
        if want is not None and want != self.node.dtypes[0]:
            raise OpError(f"out_dtype {want} differs from the output dtype {self.node.dtypes[0]}")


def to_first(layout: str, what: str = "data") -> Optional[tuple[int, ...]]:
    """The permutation that takes ``layout`` (``NHWC``, ``NCW``, ...) to N, C, then its spatial
    axes in their order; None when it already is that.  Blocked layouts (``NCHW8c``) are refused."""
    if not layout.isalpha() or not layout.isupper() or len(set(layout)) != len(layout) \
            or not {"N", "C"} <= set(layout) or not set(layout) <= set("NCDHW"):
        raise OpError(f"{what} layout {layout!r} is not supported (plain N, C and D/H/W axes only)")
    order = "NC" + "".join(c for c in layout if c not in "NC")
    perm = tuple(layout.index(c) for c in order)
    return None if perm == tuple(range(len(layout))) else perm


def weight_to_first(layout: str, data_layout: str, order: str = "OI") -> Optional[tuple[int, ...]]:
    """The permutation that takes a weight layout (``OIHW``, ``OHWI``, ``IHWO``, ``HWIO``, ...) to
    ``order`` (O, I; I, O for a transposed conv), then the spatial axes in the data layout's order;
    None when it already is that."""
    spatial = "".join(c for c in data_layout if c not in "NC")
    if sorted(layout) != sorted("OI" + spatial) or not layout.isalpha() or not layout.isupper():
        raise OpError(f"kernel layout {layout!r} is not supported with data layout {data_layout!r} "
                      f"(a permutation of O, I and {spatial or 'no spatial axes'} expected)")
    perm = tuple(layout.index(c) for c in order + spatial)
    return None if perm == tuple(range(len(layout))) else perm


def inverse(perm: Optional[tuple[int, ...]]) -> Optional[tuple[int, ...]]:
    return None if perm is None else tuple(int(i) for i in np.argsort(perm))


def permute(x: np.ndarray, perm: Optional[tuple[int, ...]]) -> np.ndarray:
    """``x`` transposed by ``perm`` (contiguous), or ``x`` itself when ``perm`` is None."""
    return x if perm is None else np.ascontiguousarray(x.transpose(perm))


def spatial_pads(padding: list[int], k: int) -> list[int]:
    """Relay padding (one value, one per spatial axis, or begin then end per axis) as ONNX pads."""
    if len(padding) == 1:
        return padding * (2 * k)
    if len(padding) == k:
        return padding * 2
    if len(padding) == 2 * k:
        return list(padding)
    raise OpError(f"padding {padding} does not fit {k} spatial axes")


def spatial(attrs: Attrs, key: str, k: int, default: int) -> list[int]:
    values = attrs.ints(key, [default] * k)
    if len(values) == 1:
        values = values * k
    if len(values) != k:
        raise OpError(f"attribute {key!r} {values} does not fit {k} spatial axes")
    return values
