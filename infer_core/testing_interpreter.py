"""Triton's interpreter (``TRITON_INTERPRET=1``) made quicker for test processes, computing what it computed."""

from __future__ import annotations

import threading
from typing import Any


def quicken_triton_interpreter() -> None:
    """Make ``TRITON_INTERPRET=1`` runs skip the interpreter's repeated patching of ``triton.language``.

    The interpreter patches the language's builtins when a kernel launches and restores them when it ends, but
    also again at every call of a ``@triton.jit`` helper inside the kernel (``inspect.getmembers`` over
    ``tl``, ``tl.tensor`` and ``tl.math``), though the launch has already patched the same modules: in a kernel
    that calls helpers in its loops, that repetition is most of the interpreter's time. Here a helper's call skips
    it when the language modules it sees were patched by the launch in progress; anything else is patched as
    before. The kernels run the same code either way. Idempotent; a no-op without Triton's interpreter.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    if getattr(interpreter, "_infer_quickened", False):
        return
    import inspect

    import triton.language as tl

    original_patch, original_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    # per thread: a test may run a kernel in a second thread (a rank that waits) while this one launches another,
    # and one thread's launch must not take the other's patching for its own (its scope would be dropped)
    launch = threading.local()

    seen_languages: dict[int, frozenset[int]] = {}  # a function's globals dict -> the language modules in it

    def languages(fn) -> frozenset[int]:
        found = seen_languages.get(id(fn.__globals__))
        if found is None:
            found = frozenset(id(v) for v in fn.__globals__.values()
                              if inspect.ismodule(v) and (v is tl or v is tl.core))
            seen_languages[id(fn.__globals__)] = found
        return found

    def patch_lang(fn):
        patched = getattr(launch, "patched", None)  # None: no launch in progress on this thread
        if patched is not None and languages(fn) <= patched:
            return None  # a helper's call: its language is the launch's, patched already (its scope is dropped)
        scope = original_patch(fn)
        if patched is not None:
            patched |= languages(fn)
        return scope

    def launch_kernel(self, *args, **kwargs):
        launch.patched = set()
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            launch.patched = None

    np_dtypes: dict[Any, Any] = {}  # Triton dtype -> numpy dtype (the original builds its table at every call)
    original_np_dtype = interpreter._get_np_dtype

    def get_np_dtype(tt_dtype):
        try:
            return np_dtypes[tt_dtype]
        except KeyError:
            np_dtypes[tt_dtype] = found = original_np_dtype(tt_dtype)
            return found
        except TypeError:  # not hashable: asked as it is
            return original_np_dtype(tt_dtype)

    interpreter._patch_lang = patch_lang
    interpreter._get_np_dtype = get_np_dtype
    interpreter.GridExecutor.__call__ = launch_kernel
    interpreter._infer_quickened = True
