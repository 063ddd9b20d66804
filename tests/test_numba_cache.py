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
