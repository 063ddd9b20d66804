"""The small dense kernels under the square-root filters, against NumPy."""

import numba as nb
import numpy as np
import pytest

from pymc_pnode._jit import slp_vectorization
from pymc_pnode.filtering.linalg import (
    copy_transposed,
    matmul,
    matmul_nt,
    matmul_tn,
    solve_gram_inplace,
    tria_cols_inplace,
)


@pytest.mark.parametrize("rows, cols", [(24, 8), (16, 8), (9, 9), (8, 10), (7, 3), (3, 5), (1, 4), (5, 1)])
def test_tria_cols_gives_an_upper_triangular_root_of_the_same_gram_matrix(rows, cols):
    rng = np.random.default_rng(rows * 100 + cols)
    m = rng.standard_normal((rows, cols))
    m[:, cols // 2] = 0.0  # a zero column: its reflection is skipped
    sentinel = 7.0
    mt = np.full((cols + 2, rows + 3), sentinel)  # larger than the stack: the rest must stay untouched
    mt[:cols, :rows] = m.T
    tria_cols_inplace(mt, rows, cols, np.empty(rows))
    r = mt[:cols, :rows].T  # rows × cols, upper trapezoidal
    np.testing.assert_allclose(r.T @ r, m.T @ m, atol=1e-12 * (1 + np.abs(m).max() ** 2))
    assert np.all(np.tril(r, -1) == 0.0)
    assert np.all(mt[:, rows:] == sentinel) and np.all(mt[cols:] == sentinel)


def test_tria_cols_of_a_rank_deficient_stack_keeps_the_gram_matrix():
    rng = np.random.default_rng(3)
    b = rng.standard_normal((12, 2))
    m = b @ rng.standard_normal((2, 6))  # rank 2
    mt = np.ascontiguousarray(m.T)
    tria_cols_inplace(mt, 12, 6, np.empty(12))
    r = mt[:, :12].T
    np.testing.assert_allclose(r.T @ r, m.T @ m, atol=1e-12 * np.abs(m.T @ m).max())
    assert np.all(np.isfinite(r))


@pytest.mark.parametrize("n, k, m", [(8, 8, 8), (6, 7, 9), (12, 12, 12), (3, 5, 2), (10, 4, 13)])
def test_matmul_and_its_transposed_variants_match_numpy(n, k, m):
    rng = np.random.default_rng(n + 10 * k + 100 * m)
    a = rng.standard_normal((n, k))
    b = rng.standard_normal((k, m))
    out = np.empty((n, m))
    matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-13, atol=1e-13)
    at = np.ascontiguousarray(a.T)
    out[:] = 0.0
    matmul_tn(at, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-13, atol=1e-13)
    out[:] = 0.0
    matmul_nt(a, np.ascontiguousarray(b.T), out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-13, atol=1e-13)


def test_solve_gram_inplace_applies_the_inverse_gram_matrix():
    rng = np.random.default_rng(5)
    r = np.triu(rng.standard_normal((8, 8))) + 4.0 * np.eye(8)
    x = rng.standard_normal((8, 5))
    y = x.copy()
    solve_gram_inplace(r, 8, y)
    np.testing.assert_allclose(y, np.linalg.solve(r.T @ r, x), rtol=1e-10)


def test_copy_transposed_writes_the_transpose_at_the_column_offset():
    src = np.arange(9.0).reshape(3, 3)
    dst = np.zeros((3, 7))
    copy_transposed(src, 3, dst, 2)
    np.testing.assert_array_equal(dst[:, 2:5], src.T)
    assert np.all(dst[:, :2] == 0.0) and np.all(dst[:, 5:] == 0.0)


def test_slp_vectorization_is_scoped_and_restored_after_an_error():
    before = nb.config.SLP_VECTORIZE
    with slp_vectorization():
        assert nb.config.SLP_VECTORIZE == 1
    assert nb.config.SLP_VECTORIZE == before
    with pytest.raises(RuntimeError):
        with slp_vectorization():
            raise RuntimeError("compile failed")
    assert nb.config.SLP_VECTORIZE == before


def test_kernels_that_inline_filter_helpers_compile_with_the_slp_vectoriser(monkeypatch):
    # numba caches a helper's optimised code at its first compile and inlines it into later kernels, so every
    # INLINE_JIT kernel must compile with the same LLVM settings as the Fenrir kernels.
    from pymc_pnode import _jit

    seen, njit = [], nb.njit

    def recording_njit(*args, **kwargs):
        seen.append(nb.config.SLP_VECTORIZE)
        return njit(*args, **kwargs)

    def add_one(x):
        return x + 1.0

    monkeypatch.setattr(nb, "njit", recording_njit)
    before = nb.config.SLP_VECTORIZE
    inline_kernel = _jit.compile_on_first_use((nb.float64,), **dict(_jit.INLINE_JIT, cache=False))(add_one)
    plain_kernel = _jit.compile_on_first_use((nb.float64,), **dict(_jit.JIT, cache=False))(add_one)
    assert inline_kernel(1.0) == 2.0 and plain_kernel(1.0) == 2.0
    assert seen == [1, before] and nb.config.SLP_VECTORIZE == before


def _add_one(x):
    return x + 1.0


def test_python_entry_points_compile_with_the_slp_vectoriser(monkeypatch):
    """``smooth``, ``sample_backward`` and ``interpolate`` compile per argument types when first called from
    Python; each compile runs with the SLP vectoriser, a known call compiles nothing, bad types still fail."""
    from numba.core.errors import TypingError

    from pymc_pnode import _jit
    from pymc_pnode.filtering import smoother

    assert all(isinstance(f, _jit.VectorisedEntryPoint)
               for f in (smoother.smooth, smoother.sample_backward, smoother.interpolate))
    entry = _jit.VectorisedEntryPoint(_add_one)
    seen, compile_types = [], entry.dispatcher.compile

    def recording_compile(types):
        seen.append(nb.config.SLP_VECTORIZE)
        return compile_types(types)

    monkeypatch.setattr(entry.dispatcher, "compile", recording_compile)
    before = nb.config.SLP_VECTORIZE
    with pytest.raises(TypingError):
        entry("x")
    assert entry(1.0) == 2.0 and entry(2.0) == 3.0
    assert entry(np.arange(2.0)).tolist() == [1.0, 2.0]  # new types: compiled again
    assert seen == [1, 1, 1] and nb.config.SLP_VECTORIZE == before
    assert len(entry.dispatcher.overloads) == 2
