"""numba's disk cache for this package's kernels, keyed on all of its source files.

numba invalidates a cached function when *its own* source file changes (modification time and size). The kernels
here inline helpers from other modules (``_jit.INLINE_JIT`` has ``forceinline``), so an edited helper in
``odefilter.py`` would leave a stale Fenrir kernel from ``fenrir.py`` in the cache: old code, silently. For
functions defined in this package the source stamp is therefore that of the whole package (latest modification
time, total size of its ``.py`` files). Imported first by ``pymc_pnode/__init__.py``, before any kernel is
decorated; functions outside the package keep numba's own locators.

numba unpickles a cache index before it compares the stamp, so an index written by older package sources
that names a class those sources had (a named tuple type of a kernel's signature, say) raised an
``AttributeError`` instead of being treated as stale; for the package's caches such an index now counts as
stale (the kernel is compiled again).

numba saves an entry by reading the index, choosing the first free data-file number and writing both back. Two
processes that save overloads of one function at once (``pytest -n 2``, a study's workers, sampler processes) could
each drop the other's entry from the index, or both choose the same data file and map two signatures to one compiled
library. For the package's caches that read–choose–write runs under an exclusive lock of a file beside the index
(``fcntl.flock``; where it is not available, numba's behaviour).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from numba.core import caching

_PACKAGE_DIR = Path(__file__).resolve().parent
# Subpackages and modules with no numba code (and no constants that kernels read), whose edits cannot change a
# kernel: they do not invalidate the cache (an edit of the study runner, the demo or the generated-code builder
# would otherwise cost minutes of recompiling every kernel).
_WITHOUT_KERNELS = ("studies", "demo.py", "ode.py", "_codegen.py")


def _package_stamp() -> tuple[float, int]:
    stats = [path.stat() for path in _PACKAGE_DIR.rglob("*.py")
             if path.relative_to(_PACKAGE_DIR).parts[0] not in _WITHOUT_KERNELS]
    return max(st.st_mtime for st in stats), sum(st.st_size for st in stats)


_STAMP = _package_stamp()


class _PackageStamp:
    """Mixin for numba's source-file-backed cache locators: the package's stamp, for the package's files."""

    def get_source_stamp(self):
        return _STAMP

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(_PACKAGE_DIR):
            return None
        return super().from_function(py_func, py_file)


_LOCATORS = [
    type(f"Package{base.__name__}", (_PackageStamp, base), {})
    for base in (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
]
if not any(issubclass(cls, _PackageStamp) for cls in caching.CacheImpl._locator_classes):
    caching.CacheImpl._locator_classes[:0] = _LOCATORS


_load_index = caching.IndexDataCacheFile._load_index


def _load_index_or_stale(self):
    try:
        return _load_index(self)
    except Exception:  # noqa: BLE001 - any index that no longer unpickles is stale
        if self._source_stamp != _STAMP:
            raise  # not this package's cache: numba's own behaviour
        return {}


if getattr(caching.IndexDataCacheFile._load_index, "__name__", "") != "_load_index_or_stale":
    caching.IndexDataCacheFile._load_index = _load_index_or_stale


try:
    import fcntl
except ImportError:  # (not on Windows)
    fcntl = None

_save = getattr(caching.IndexDataCacheFile.save, "__wrapped__", caching.IndexDataCacheFile.save)  # (a reload)


@contextlib.contextmanager
def _index_lock(index_path: str):
    """An exclusive lock of ``<index>.lock`` for the duration of the block (other processes wait)."""
    with open(index_path + ".lock", "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _save_locked(self, key, data):
    if fcntl is None or self._source_stamp != _STAMP:
        return _save(self, key, data)  # not this package's cache: numba's own behaviour
    os.makedirs(self._cache_path, exist_ok=True)
    with _index_lock(self._index_path):
        return _save(self, key, data)


_save_locked.__wrapped__ = _save
if getattr(caching.IndexDataCacheFile.save, "__name__", "") != "_save_locked":
    caching.IndexDataCacheFile.save = _save_locked
