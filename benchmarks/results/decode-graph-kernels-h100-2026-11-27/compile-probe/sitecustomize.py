"""Diagnostic for call D7 (not engine code): every Triton kernel variant a process compiles or loads, one stderr line
each with the wall-clock time, so the variants made after a server's 'ready' line can be named."""
import sys
import time

try:
    import triton.knobs as _knobs

    def _log_variant(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        stamp = time.strftime("%H:%M:%S", time.localtime()) + f",{int(time.time() * 1000) % 1000:03d}"
        try:
            name = repr.split("[", 1)[0]
            line = f"{stamp} TRITON-VARIANT {name} key={key!r} constants={compile.get('constants')!r}"
        except Exception as exc:  # never break a launch
            line = f"{stamp} TRITON-VARIANT (unprintable: {exc!r})"
        line = line.replace("\n", " ")
        print(line[:3000], file=sys.stderr, flush=True)
        return None

    _knobs.runtime.jit_post_compile_hook = _log_variant
except Exception as exc:  # no triton here: nothing to watch
    print(f"compile probe off: {exc}", file=sys.stderr)
