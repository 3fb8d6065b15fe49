"""How an adapter hands a block's self/joint attention to an attention implementation: the scope protocol and
the forward hooks that open it around the attention modules' calls."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from torch import nn


class AttentionScope(Protocol):
    """What an adapter needs from an attention implementation (see parallel_runtime/attention/usp.py's CONTRACT)."""

    def intercept(self) -> contextlib.AbstractContextManager: ...


@contextlib.contextmanager
def intercepted(modules: Sequence[nn.Module], attention: AttentionScope) -> Iterator[None]:
    """While active, every call of ``modules`` made by this thread runs inside ``attention.intercept()``.

    Implemented with forward hooks removed on exit (the modules are not edited). Hooks belong to the
    module, so they act only for the thread that installed them; the exit hook is ``always_call``
    so an exception inside a module still closes its scope."""
    owner = threading.get_ident()
    handles = []
    open_scopes: list[contextlib.AbstractContextManager] = []

    def enter(module: nn.Module, args: Any) -> None:
        if threading.get_ident() == owner:
            scope = attention.intercept()
            scope.__enter__()
            open_scopes.append(scope)

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() == owner and open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    try:
        for m in modules:
            handles.append(m.register_forward_pre_hook(enter))
            handles.append(m.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()
        while open_scopes:
            open_scopes.pop().__exit__(None, None, None)
