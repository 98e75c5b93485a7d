"""Module: the container for parameters and submodules, as in PyTorch.

Assigning a Tensor to a module attribute registers it as a parameter; assigning a
Module registers a submodule. braze is for inference, so a parameter is a plain Tensor
(no gradients). ``load_state_dict`` binds the given tensors without copying (weights
memory-mapped from a file stay in the file's pages) and reports every missing,
unexpected or mismatched key in one error.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, Mapping

from ..device import Device, as_device
from ..dtypes import as_dtype
from ..errors import StateDictMismatch
from ..tensor import Tensor


class Module:
    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning {name}")
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, (Tensor, Module)):
            # a plain attribute of that name (``self.bias = None`` earlier) would shadow
            # the registered one, since __getattr__ only runs when lookup fails
            self.__dict__.pop(name, None)
        if isinstance(value, Tensor):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def register_buffer(self, name: str, tensor: Tensor, persistent: bool = True) -> None:
        """A tensor that is state but not a parameter (rotary tables, masks)."""
        self._parameters.pop(name, None)
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._persistent.add(name)
        else:
            self._persistent.discard(name)

    # -- traversal -----------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def children(self) -> Iterator["Module"]:
        return iter(self._modules.values())

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Each parameter once, under its first name (a tied weight is not counted
        twice, as in PyTorch); ``state_dict`` lists every name."""
        seen: set[int] = set()
        for mod_name, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> Iterator[Tensor]:
        return (p for _, p in self.named_parameters())

    def state_dict(self) -> "OrderedDict[str, Tensor]":
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_name, m in self.named_modules():
            pre = f"{mod_name}." if mod_name else ""
            for name, p in m._parameters.items():
                out[pre + name] = p
            for name, b in m._buffers.items():
                if name in m._persistent:
                    out[pre + name] = b
        return out

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> tuple[list[str], list[str]]:
        """Bind ``state_dict``'s tensors to this module's parameters (no copy).

        Shapes and dtypes must match exactly; with ``strict`` every key must be present
        and none unexpected. All problems are reported together, and nothing is bound
        unless all checks pass, so a failed load leaves the module as it was.
        """
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        mismatched = []
        for key, new in state_dict.items():
            old = own.get(key)
            if old is None:
                continue
            if not isinstance(new, Tensor):
                mismatched.append(f"{key}: expected a braze Tensor, got {type(new).__name__}")
            elif new.shape != old.shape:
                mismatched.append(f"{key}: shape {new.shape} in the state dict, {old.shape} in the module")
            elif new.dtype is not old.dtype:
                mismatched.append(f"{key}: dtype {new.dtype.name} in the state dict, {old.dtype.name} in the module")
        if mismatched or (strict and (missing or unexpected)):
            raise StateDictMismatch(missing if strict else [], unexpected if strict else [], mismatched)
        modules = dict(self.named_modules())
        for key, new in state_dict.items():
            if key in own:
                mod_name, _, name = key.rpartition(".")
                m = modules[mod_name]
                table = m._parameters if name in m._parameters else m._buffers
                table[name] = new
        return missing, unexpected

    def to(self, dtype: Any) -> "Module":
        """Cast floating parameters and buffers to ``dtype`` (explicit, as all casts), or
        move every parameter and buffer to a device (``"cuda"``, ``"cpu"``)."""
        if isinstance(dtype, Device) or isinstance(dtype, str) and dtype.split(":")[0] in ("cpu", "cuda"):
            return self._moved(as_device(dtype, "Module.to"))
        d = as_dtype(dtype, "Module.to")
        # a tensor shared by several names (tied weights) is cast once and stays shared;
        # the original is kept alive here so its id is not reused during the walk
        done: dict[int, tuple[Tensor, Tensor]] = {}
        for m in self.modules():
            for table in (m._parameters, m._buffers):
                for name, t in table.items():
                    if t.dtype.is_floating_point and t.dtype is not d:
                        if id(t) not in done:
                            done[id(t)] = (t, t.to(d))
                        table[name] = done[id(t)][1]
        return self

    def _moved(self, dev: Device) -> "Module":
        done: dict[int, tuple[Tensor, Tensor]] = {}  # tied weights move once and stay tied
        for m in self.modules():
            for table in (m._parameters, m._buffers):
                for name, t in table.items():
                    if id(t) not in done:
                        done[id(t)] = (t, t.to(dev))
                    table[name] = done[id(t)][1]
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


class ModuleList(Module):
    def __init__(self, modules: Any = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> "ModuleList":
        setattr(self, str(len(self._modules)), m)
        return self

    def __getitem__(self, i: int) -> Any:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._modules.values())
