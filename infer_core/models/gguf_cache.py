"""A GGUF's dequantized checkpoint, kept on disk so that later starts do not read the GGUF.

Starting from a GGUF parses its metadata and dequantizes every tensor in transformers' Python
reader, and builds the tokenizer from the vocabulary stored in the metadata. The result of that
work is an ordinary checkpoint folder, ``<root>/<the GGUF's sha256>/``, which later starts load
like any other: the tensors as dequantized (float32 for quantized blocks, which bfloat16 could not
hold exactly) in ``model.safetensors``, the config the GGUF's metadata gives in ``config.json``,
and the tokenizer saved with ``save_pretrained``. A GGUF carries no generation config, so the
entry has none either: both paths then start from the same defaults.

An entry is written into a temporary folder beside it and renamed into place, so a reader sees
a whole entry or none. Writers take a lock file first (where the platform has ``fcntl``), so two
processes starting at once write the entry once; without the lock, the second rename fails and
that process uses the first one's entry. An entry is used only when its manifest names this
format, the GGUF's hash and the installed transformers (whose reader wrote it), and every file it
lists has the recorded size and parses; anything else is written again, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from infer_core.models.source import ModelSource, resolve_model_source

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # raise when what an entry holds, or how it is laid out, changes
MANIFEST = "infer-cache.json"  # written last: a folder without it is not an entry
WEIGHTS = "model.safetensors"
_HASH_CHUNK = 1 << 22
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256, for repeated starts in a process


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/infer``, else ``~/.cache/infer``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "infer"


def locate_model(model: str | None, load_format: str = "auto", cache_dir: str | None = None) -> ModelSource:
    """The ``model`` setting's files, the embedded default model's from its dequantized cache.

    The default model is read from ``cache_dir`` (default: ``default_cache_root()``),
    written there on its first start, unless ``load_format`` is ``gguf`` (read the GGUF itself).
    A cache that cannot be written is a warning, and the GGUF is read. Logs where the model comes from.
    """
    source = resolve_model_source(model)
    if not source.is_default or load_format == "gguf":
        logger.info("model %s: from %s", source.name, source.describe())
        return source
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    try:
        cached, written = cached_checkpoint(source, root)
    except OSError as e:
        logger.warning("model %s: from %s; its dequantized copy cannot be cached in %s (%s): set "
                       "INFER_CACHE_DIR to a writable folder", source.name, source.describe(), root, e)
        return source
    logger.info("model %s: from %s%s", source.name, cached.describe(), ", written now" if written else "")
    return cached


def gguf_sha256(path: Path) -> str:
    """The file's sha256 (hex), the key of its cache entry."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def cached_checkpoint(source: ModelSource, root: Path) -> tuple[ModelSource, bool]:
    """The checkpoint folder holding ``source``'s GGUF dequantized, and whether it was written now.

    An entry that is missing, partial, corrupt or stale is (re)written first. Raises ``OSError``
    when ``root`` cannot be written; the caller then reads the GGUF itself.
    """
    assert source.gguf_path is not None, "only a GGUF source has a dequantized checkpoint"
    key = gguf_sha256(source.gguf_path)
    entry = root / key
    cached = replace(source, path=entry, gguf_file=None, dequantized_from=source.gguf_path)
    if entry_problem(entry, key) is None:  # the common case: no lock, no write
        return cached, False
    root.mkdir(parents=True, exist_ok=True)
    with _writer_lock(root, key):
        if entry_problem(entry, key) is None:  # another process wrote it while this one waited
            return cached, False
        _write_entry_atomically(source, root, entry, key)
    return cached, True


def entry_problem(entry: Path, key: str) -> str | None:
    """Why the folder ``entry`` is not a usable cache entry for the GGUF of hash ``key`` (None: it is)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except FileNotFoundError:
        return f"{entry} has no {MANIFEST}"
    except (OSError, ValueError) as e:
        return f"its {MANIFEST} does not parse ({e})"
    expected = {"format": CACHE_FORMAT, "gguf_sha256": key, "transformers": _transformers_version()}
    stale = [f"{k} {manifest.get(k)!r} (now {v!r})" for k, v in expected.items() if manifest.get(k) != v]
    if stale:
        return f"it was written for {', '.join(stale)}"
    files = manifest.get("files")
    if not isinstance(files, dict) or WEIGHTS not in files or "config.json" not in files:
        return f"its {MANIFEST} lists no {WEIGHTS} and config.json"
    for name, size in files.items():
        path = entry / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not the {size} written"
        problem = _parse_problem(path)
        if problem:
            return f"{name} does not parse ({problem})"
    return None


def _parse_problem(path: Path) -> str | None:
    """What is wrong with a JSON file or a safetensors file's header and extent (None: nothing)."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".safetensors":
            with open(path, "rb") as f:
                header_size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(header_size))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            if 8 + header_size + end != path.stat().st_size:
                return f"its header describes {8 + header_size + end} bytes"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return str(e) or type(e).__name__
    return None


def _write_entry_atomically(source: ModelSource, root: Path, entry: Path, key: str) -> None:
    """Write the entry into a temporary folder under ``root``, then rename it to ``entry``."""
    staging = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=root))
    try:
        _write_entry(source, staging, key)
        if entry.exists():  # a broken or stale entry: moved aside first, since rename keeps a full folder
            discard = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-old-", dir=root))
            entry.rename(discard / "entry")
            shutil.rmtree(discard, ignore_errors=True)
        try:
            staging.rename(entry)
        except OSError:
            if entry_problem(entry, key) is not None:  # not another writer's whole entry
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_entry(source: ModelSource, folder: Path, key: str) -> None:
    from safetensors.torch import save_file

    from infer_core.models.source import read_model_config
    from infer_core.models.tokenizer import load_tokenizer
    from infer_core.models.weights import iterate_gguf

    config = read_model_config(source)
    save_file(dict(iterate_gguf(source, config)), str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config.raw, indent=2, sort_keys=True, default=str))
    tokenizer = load_tokenizer(source)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"format": CACHE_FORMAT, "gguf_sha256": key, "transformers": _transformers_version(),
                "gguf": str(source.gguf_path), "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


@contextlib.contextmanager
def _writer_lock(root: Path, key: str) -> Iterator[None]:
    """One writer of an entry at a time, across processes (released when the process dies)."""
    try:
        import fcntl
    except ImportError:  # no fcntl: writers may race, and the rename decides
        yield
        return
    with open(root / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")
