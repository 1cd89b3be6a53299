"""Reading the checkpoint layouts of ``cerebras.pytorch`` 2.0 and earlier (``__version__`` 0.1-0.4).

What differs from layout 0.5 (:mod:`cstream.checkpoint.h5`), as the real package's legacy reader
(``cerebras.pytorch.storage._legacy``) reads it:

* the root attribute ``__spec__`` is the hex text of a ``dill`` pickle of the
  ``torch.utils._pytree`` tree spec: read by :func:`cstream.checkpoint.safe_pickle.loads_spec`, which admits
  the spec's classes and container types only, so a spec that would run code is refused, naming
  what it calls;
* every leaf is a dataset named by its dotted key path, percent-encoded
  (``urllib.parse.quote(key, safe="")``), whose ``__H5_TYPE__`` attribute says what it holds:
  ``TorchTensorH5Type`` (the values; ``is_bfloat16`` marks int16 bits of bfloat16),
  ``NumpyArrayH5Type`` (a tensor in layouts up to 0.3, a numpy array after), ``ScalarH5Type``
  (a 0-d dataset), ``StringH5Type`` (``string_value``), ``NoneH5Type``, ``ObjectH5Type``
  (``object_value``: the hex text of a ``dill`` pickle, read like layout 0.5's pickled values);
* there is no ``__SUCCESS__`` attribute.

Deferred tensors of releases 1.8 and earlier (``DeferredH5Tensor``, ``StoredTensorH5Type``, files
that point to other files) are refused with the type they name.
"""

from __future__ import annotations

import pickle
import urllib.parse

import numpy as np
import torch

from cstream.checkpoint import safe_pickle
from cstream.checkpoint.lazy import CheckpointError, Lazy
from cstream.checkpoint.h5 import _H5_ERRORS, H5Checkpoint, _Node, one, where_of

_KINDS = {dict: "builtins.dict", list: "builtins.list", tuple: "builtins.tuple"}


class LegacyH5Checkpoint(H5Checkpoint):
    """An open checkpoint in a layout of ``cerebras.pytorch`` 2.0 and earlier."""

    def _check_root(self) -> None:
        pass  # these layouts have no __SUCCESS__ attribute

    @property
    def writer(self) -> str:
        return str(self.attrs.get("__cstorch_version__", f"a release of layout {self.version}"))

    def _read_tree(self) -> _Node:
        text = self.attrs.get("__spec__")
        try:
            data = bytes.fromhex(text)
        except (TypeError, ValueError) as e:
            raise self.error("its __spec__ is not the hex text of a pickled tree spec") from e
        try:
            spec = safe_pickle.loads_spec(data)
        except safe_pickle.UnsafePickleError as e:
            raise CheckpointError(
                f"{self.path}: its tree spec (__spec__) is a pickle that names {e.name}, which "
                "cstream refuses to load: a spec holds only torch.utils._pytree.TreeSpec, LeafSpec "
                "and container types, and loading a file never runs code from it.") from e
        except pickle.UnpicklingError as e:  # any damage (see safe_pickle._load)
            raise self.error(f"its tree spec cannot be unpickled ({type(e).__name__}: {e})") from e
        return self._node(spec, "/")

    def _node(self, spec, where: str) -> _Node:
        if getattr(spec, "leaf", False):
            return _Node(None, None, [])
        kind, context = getattr(spec, "type", None), getattr(spec, "context", None)
        children = getattr(spec, "children_specs", None)
        if not isinstance(children, list) or not all(isinstance(
                c, safe_pickle.SpecNode) for c in children):
            raise self.error(f"its tree spec is malformed at {where}")
        if kind is dict or getattr(kind, "__name__", None) == "OrderedDict":
            if not (isinstance(context, list) and len(context) == len(children)
                    and all(type(k) in (str, int) for k in context)):
                raise self.error(f"the keys of the dict at {where} are malformed")
            return _Node("builtins.dict", list(context), [
                self._node(c, where_of("" if where == "/" else where, k))
                for k, c in zip(context, children)])
        if kind in (list, tuple):
            return _Node(_KINDS[kind], None, [self._node(c, f"{'' if where == '/' else where}[{i}]")
                                              for i, c in enumerate(children)])
        raise self.error(f"its tree spec holds a {getattr(kind, '__name__', kind)} at {where}; "
                         "cstream reads dict, OrderedDict, list and tuple")

    def leaf_value(self, key: str, where: str, device, links: dict):
        name = urllib.parse.quote(key, safe="")
        ds = self.open_dataset(name, where)
        try:
            kind = one(ds.attrs.get("__H5_TYPE__"))
            attrs = dict(ds.attrs)
            stored_dtype, shape = ds.dtype, ds.shape
        except _H5_ERRORS as e:
            raise self.error(f"the entry {where} (dataset {name!r}) cannot be read") from e
        kind = kind if isinstance(kind, str) else None
        tensor_kinds = ["TorchTensorH5Type"] + (["NumpyArrayH5Type"] if self.version <= 0.3 else [])
        if kind in tensor_kinds:
            dtype = torch.bfloat16 if one(attrs.get("is_bfloat16")) else _torch_dtype(stored_dtype)
            if dtype is None:
                raise self.error(f"the tensor {where} has the dtype {stored_dtype}, which torch lacks")
            return Lazy(lambda: self.read_tensor(name, dtype, shape, where, device), dtype, shape)
        if kind in ("NumpyArrayH5Type", "ScalarH5Type"):
            self.check_storage(ds, where)
            try:
                value = np.array(ds[...])
            except _H5_ERRORS as e:
                raise self.error(f"the values of the entry {where} cannot be read") from e
            if kind == "NumpyArrayH5Type":
                return value
            if value.size != 1:
                raise self.error(f"the number {where} holds {value.size} values")
            return value.item()
        if kind == "StringH5Type" and isinstance(attrs.get("string_value"), str):
            return attrs["string_value"]
        if kind == "NoneH5Type":
            return None
        if kind == "ObjectH5Type" and isinstance(attrs.get("object_value"), str):
            try:
                data = bytes.fromhex(attrs["object_value"])
            except ValueError as e:
                raise self.error(f"the pickled entry {where} is not hex text ({e})") from e
            return self.unpickle(data, where)
        raise self.error(f"the entry {where} is a {kind or 'dataset without __H5_TYPE__'}, which "
                         "cstream does not read (it reads TorchTensorH5Type, NumpyArrayH5Type, "
                         "ScalarH5Type, StringH5Type, NoneH5Type and ObjectH5Type)")


def _torch_dtype(np_dtype: np.dtype):
    try:
        # the values are read in this machine's byte order (h5.H5Checkpoint._values)
        return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype
    except TypeError:
        return None
