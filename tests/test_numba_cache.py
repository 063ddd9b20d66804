"""numba's disk cache of this package's kernels is keyed on all of the package's sources."""

import inspect

import pytest
from numba.core import caching

from pymc_pnode import _numba_cache
from pymc_pnode.filtering.stepping import propose_step


def _locator(func):
    py_file = inspect.getfile(func)
    for cls in caching.CacheImpl._locator_classes:
        locator = cls.from_function(func, py_file)
        if locator is not None:
            return locator
    return None


def test_package_kernels_are_stamped_with_every_package_source():
    # an inlined helper edited in another module (e.g. propose_step into the Fenrir kernel) must invalidate the kernel
    locator = _locator(propose_step.py_func)
    assert isinstance(locator, _numba_cache._PackageStamp)
    newest, total = locator.get_source_stamp()
    package = _numba_cache._PACKAGE_DIR
    files = [f for f in package.rglob("*.py") if f.relative_to(package).parts[0] not in _numba_cache._WITHOUT_KERNELS]
    assert len(files) > 20 and total == sum(f.stat().st_size for f in files)
    assert newest == max(f.stat().st_mtime for f in files)


def test_modules_left_out_of_the_stamp_have_no_numba_code():
    # Their edits do not invalidate the kernels; that is only right while no kernel can inline their code.
    for name in _numba_cache._WITHOUT_KERNELS:
        entry = _numba_cache._PACKAGE_DIR / name
        paths = [entry] if entry.is_file() else list(entry.rglob("*.py"))
        assert paths, entry
        for path in paths:
            source = path.read_text()
            assert "import numba" not in source and "from numba" not in source and "njit" not in source, path


def test_functions_outside_the_package_keep_numbas_own_stamp():
    def outside(x):
        return x + 1

    locator = _locator(outside)
    assert locator is not None and not isinstance(locator, _numba_cache._PackageStamp)


def test_an_index_naming_a_class_that_no_longer_exists_is_stale(tmp_path):
    # An index written by older package sources may name a class they had (e.g. a named tuple of a kernel
    # signature); numba unpickles before it compares the stamp, so that must count as stale, not raise.
    import collections
    import pickle

    import numba

    gone = collections.namedtuple("GoneBundle", "a")
    gone.__module__ = _numba_cache.__name__
    _numba_cache.GoneBundle = gone
    data = pickle.dumps((("old stamp", 1), {gone(1): "overload"}))
    del _numba_cache.GoneBundle
    for stamp in (_numba_cache._STAMP, ("other sources", 1)):
        with open(tmp_path / "kernel-1.py311.nbi", "wb") as f:
            pickle.dump(numba.__version__, f)
            f.write(data)
        index = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", stamp)
        if stamp == _numba_cache._STAMP:
            assert index._load_index() == {}
        else:  # outside the package's caches numba's behaviour is unchanged
            with pytest.raises(AttributeError):
                index._load_index()


def _save_two_at_once(cache_dir, monkeypatch):
    # Each save reads the index, waits, then writes: without a lock both read the empty index.
    import threading
    import time

    load = caching.IndexDataCacheFile._load_index

    def slow_load(self):
        overloads = load(self)
        time.sleep(0.2)
        return overloads

    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", slow_load)
    cache_dir.mkdir()

    def save(key):
        caching.IndexDataCacheFile(str(cache_dir), "kernel-1.py311", _numba_cache._STAMP).save(key, f"data {key}")

    threads = [threading.Thread(target=save, args=(key,)) for key in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", load)
    return caching.IndexDataCacheFile(str(cache_dir), "kernel-1.py311", _numba_cache._STAMP)


@pytest.mark.skipif(_numba_cache.fcntl is None, reason="file locks need fcntl")
def test_saves_at_once_keep_every_entry(tmp_path, monkeypatch):
    # Two processes (here threads, which flock separates the same way) saving overloads of one kernel at once.
    index = _save_two_at_once(tmp_path / "locked", monkeypatch)
    overloads = index._load_index()
    assert set(overloads) == {"a", "b"} and len(set(overloads.values())) == 2
    assert index.load("a") == "data a" and index.load("b") == "data b"
    # numba's own save loses one of them (what the lock is for)
    monkeypatch.setattr(caching.IndexDataCacheFile, "save", _numba_cache._save)
    assert len(_save_two_at_once(tmp_path / "unlocked", monkeypatch)._load_index()) == 1
