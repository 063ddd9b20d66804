"""ODE definition: symbolic derivatives compiled to numba, exact Taylor coefficients, validation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from pymc_pnode._callbacks import CompiledFunction
from tests.conftest import lotka_volterra


def test_vector_field_and_jacobians_lotka_volterra(lv_ode):
    y, p = np.array([1.3, 0.7]), np.array([0.5, 1.1, 0.9, 0.4])
    f = lv_ode.f(y, 0.0, p)
    assert np.allclose(f, [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]], rtol=1e-14)
    jy = lv_ode.jacobian(y, 0.0, p)
    expected = [[p[0] - p[1] * y[1], -p[1] * y[0]], [p[2] * y[1], p[2] * y[0] - p[3]]]
    assert np.allclose(jy, expected, rtol=1e-14)
    jp = np.empty((2, 4))
    lv_ode.jac_p(y, 0.0, p, jp)
    assert np.allclose(jp, [[y[0], -y[0] * y[1], 0, 0], [0, 0, y[0] * y[1], -y[1]]], rtol=1e-14)


def test_second_derivatives_match_central_differences(fhn_ode, rng):
    y, p = rng.normal(size=2), np.array([0.2, 0.3, 2.5])
    hyy = np.empty((2, 2, 2))
    hyp = np.empty((2, 2, 3))
    fhn_ode.hess_yy(y, 0.0, p, hyy)
    fhn_ode.hess_yp(y, 0.0, p, hyp)
    eps = 1e-6
    for k in range(2):
        dy = np.zeros(2)
        dy[k] = eps
        fd = (fhn_ode.jacobian(y + dy, 0.0, p) - fhn_ode.jacobian(y - dy, 0.0, p)) / (2 * eps)
        assert np.allclose(hyy[:, :, k], fd, atol=1e-7)
    for k in range(3):
        dp = np.zeros(3)
        dp[k] = eps
        fd = (fhn_ode.jacobian(y, 0.0, p + dp) - fhn_ode.jacobian(y, 0.0, p - dp)) / (2 * eps)
        assert np.allclose(hyp[:, :, k], fd, atol=1e-7)


def test_hessian_rows_of_lotka_volterra(lv_ode):
    """``∂f_0/∂y_0 = θ_0 − θ_1 y_1`` and ``∂f_1/∂y_1 = θ_2 y_0 − θ_3``: rows with entries off the diagonal and in θ."""
    y, p = np.array([1.3, 0.7]), np.array([0.5, 1.1, 0.9, 0.4])
    rows_y, rows_p = np.full((2, 2), np.nan), np.full((2, 4), np.nan)
    lv_ode.hess_rows_y(y, 0.0, p, rows_y)
    lv_ode.hess_rows_p(y, 0.0, p, rows_p)
    np.testing.assert_array_equal(rows_y, [[0.0, -p[1]], [p[2], 0.0]])
    np.testing.assert_array_equal(rows_p, [[1.0, -y[1], 0.0, 0.0], [0.0, 0.0, y[0], -1.0]])


def _ring(y, t, p):
    """A sparse field of ``len(y)`` states with time- and parameter-dependent second derivatives."""
    d = len(y)
    return [(y[(i + 1) % d] - y[i - 2]) * y[i - 1] - y[i] + p[0] * pt.sin(t) * y[i] ** 2 for i in range(d)]


def test_contracted_derivatives_equal_the_full_tensors_and_grow_with_the_nonzeros(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("PYMC_PNODE_CACHE_DIR", str(tmp_path))
    small = pn.ODE(_ring, n_states=5, n_theta=1)
    y, p, w = rng.normal(size=5), np.array([1.3]), rng.normal(size=(5, 5))
    hyy, hyp = np.empty((5, 5, 5)), np.empty((5, 5, 1))
    small.hess_yy(y, 0.4, p, hyy)
    small.hess_yp(y, 0.4, p, hyp)
    out_y, out_p = np.empty(5), np.empty(1)
    small.hess_contract(y, 0.4, p, w, out_y, out_p)
    assert np.allclose(out_y, np.einsum("rc,rce->e", w, hyy), rtol=1e-13, atol=1e-13)
    assert np.allclose(out_p, np.einsum("rc,rce->e", w, hyp), rtol=1e-13, atol=1e-13)
    rows_y, rows_p = np.empty((5, 5)), np.empty((5, 1))  # the block-diagonal EK1's rows ∂²f_i/∂y_i∂(y, θ)
    small.hess_rows_y(y, 0.4, p, rows_y)
    small.hess_rows_p(y, 0.4, p, rows_p)
    np.testing.assert_array_equal(rows_y, np.einsum("iie->ie", hyy))
    np.testing.assert_array_equal(rows_p, np.einsum("iie->ie", hyp))
    assert np.count_nonzero(rows_y) == 5 and np.count_nonzero(rows_p) == 5  # ∂f_i/∂y_i = 2 θ sin(t) y_i − 1
    small_sizes = {path.name: path.stat().st_size for path in tmp_path.glob("pnode_*.o")}
    w = rng.normal(size=(4, 5))
    ty, tp = np.empty((4, 5, 5)), np.empty((4, 5, 1))
    small.taylor_functions(3)[1](y, 0.4, p, ty, tp)
    small.taylor_vjp(3)(y, 0.4, p, w, out_y, out_p)
    assert np.allclose(out_y, np.einsum("ic,ice->e", w, ty), rtol=1e-12, atol=1e-12)
    assert np.allclose(out_p, np.einsum("ic,ice->e", w, tp), rtol=1e-12, atol=1e-12)
    taylor_modules = {path.name for path in tmp_path.glob("pnode_*.o")} - set(small_sizes)

    # 20 states: the contraction against central differences of the Jacobian (the full tensors are what the
    # contraction avoids generating), and the size of the field's, Jacobians' and contraction's modules.
    d = 20
    large = pn.ODE(_ring, n_states=d, n_theta=1)
    y, w = rng.normal(size=d), rng.normal(size=(d, d))
    out_y, out_p = np.empty(d), np.empty(1)
    large.hess_contract(y, 0.4, p, w, out_y, out_p)
    eps = 1e-6
    for k in range(d):
        step = np.zeros(d)
        step[k] = eps
        fd = (large.jacobian(y + step, 0.4, p) - large.jacobian(y - step, 0.4, p)) / (2 * eps)
        assert np.sum(w * fd) == pytest.approx(out_y[k], rel=1e-7, abs=1e-7)
    fd = (large.jacobian(y, 0.4, p + eps) - large.jacobian(y, 0.4, p - eps)) / (2 * eps)
    assert np.sum(w * fd) == pytest.approx(out_p[0], rel=1e-7, abs=1e-7)
    large_sizes = [path.stat().st_size for path in tmp_path.glob("pnode_*.o")
                   if path.name not in small_sizes and path.name not in taylor_modules]
    # The field, its Jacobians and second derivatives: compiled code grows with the non-zero derivatives (4d of
    # d² Jacobian entries, 5d of d³ second derivatives), not with their d² and d³ entries: 4× the states, well
    # under 16× the object code.
    assert len(large_sizes) == 2
    assert max(large_sizes) < 6 * max(small_sizes.values())


def test_taylor_coefficients_lotka_volterra_by_hand(lv_ode):
    a, b, c, d = 0.5, 1.1, 0.9, 0.4
    y = np.array([1.3, 0.7])
    taylor, _ = lv_ode.taylor_functions(3)
    out = np.empty((4, 2))
    taylor(y, 0.0, np.array([a, b, c, d]), out)
    y1, y2 = y
    d1 = np.array([a * y1 - b * y1 * y2, c * y1 * y2 - d * y2])
    jac = np.array([[a - b * y2, -b * y1], [c * y2, c * y1 - d]])
    d2 = jac @ d1
    # y''' = J y'' + (dJ/dt) y' with dJ/dt = [[-b y2', -b y1'], [c y2', c y1']]
    djac = np.array([[-b * d1[1], -b * d1[0]], [c * d1[1], c * d1[0]]])
    d3 = jac @ d2 + djac @ d1
    assert np.allclose(out, [y, d1, d2, d3], rtol=1e-13)


def test_taylor_coefficients_logistic_closed_form(logistic_ode):
    r, k, y0 = 3.0, 2.0, 0.3
    taylor, taylor_jac = logistic_ode.taylor_functions(4)
    out = np.empty((5, 1))
    taylor(np.array([y0]), 0.0, np.array([r, k]), out)
    # Derivatives of y(t) = K / (1 + c e^{-rt}) at t = 0 by polynomial recursion in y:
    # y' = r y - r y^2 / K, and d/dt of a polynomial P(y) is P'(y) y'.
    poly = np.polynomial.Polynomial([0.0, r, -r / k])
    p = np.polynomial.Polynomial([0.0, 1.0])
    expected = []
    for _ in range(5):
        expected.append(p(y0))
        p = p.deriv() * poly
    assert np.allclose(out[:, 0], expected, rtol=1e-12)
    # Exact Jacobians of the coefficients against central differences of the coefficients.
    jy, jp = np.empty((5, 1, 1)), np.empty((5, 1, 2))
    taylor_jac(np.array([y0]), 0.0, np.array([r, k]), jy, jp)
    eps = 1e-6
    plus, minus = np.empty((5, 1)), np.empty((5, 1))
    taylor(np.array([y0 + eps]), 0.0, np.array([r, k]), plus)
    taylor(np.array([y0 - eps]), 0.0, np.array([r, k]), minus)
    assert np.allclose(jy[:, :, 0], (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)
    taylor(np.array([y0]), 0.0, np.array([r + eps, k]), plus)
    taylor(np.array([y0]), 0.0, np.array([r - eps, k]), minus)
    assert np.allclose(jp[:, :, 0], (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_vector_valued_field_is_accepted(stack_ode):
    f = stack_ode.f([0.3, 0.2], 0.0, [2.0])
    assert np.allclose(f, [0.4, -2.0 * np.sin(0.3) - 0.02])


_BUILD_IN_FRESH_PROCESS = """
import json
import pymc_pnode._codegen as codegen

generated = []
original = codegen.function_ir


def counting(fname, *args, **kwargs):
    generated.append(fname)
    return original(fname, *args, **kwargs)


codegen.function_ir = counting
import pymc_pnode as pn
from tests.conftest import lotka_volterra

ode = pn.ODE(lotka_volterra, n_states=2, n_theta=4)
# the Taylor-mode functions call the interpreter by its registered symbol, also when loaded from the cache
import numpy as np
taylor, vjp = ode.taylor_coefficients(3), ode.taylor_vjp(3)
addresses = [ode.rhs.address, taylor.address, vjp.address]  # their C functions, as the kernels take them
coefficients, gy, gp = np.empty((4, 2)), np.empty(2), np.empty(4)
taylor(np.array([1.3, 0.7]), 0.0, np.array([0.5, 1.1, 0.9, 0.4]), coefficients)
vjp(np.array([1.3, 0.7]), 0.0, np.array([0.5, 1.1, 0.9, 0.4]), np.ones((4, 2)), gy, gp)
print(json.dumps({
    "generated": generated,
    "f": list(ode.f([1.3, 0.7], 0.0, [0.5, 1.1, 0.9, 0.4])),
    "taylor": [*coefficients.ravel(), *gy, *gp],
}))
"""


def _build_in_fresh_process(cache_dir):
    env = dict(os.environ, PYMC_PNODE_CACHE_DIR=str(cache_dir))
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", _BUILD_IN_FRESH_PROCESS], cwd=root, env=env, capture_output=True, text=True,
        timeout=600, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_generated_code_is_reused_from_disk(tmp_path):
    # Two fresh interpreters share an empty code cache: the first generates and compiles the field's module and
    # its Taylor-mode functions, the second must neither generate code nor rewrite the object files.
    first = _build_in_fresh_process(tmp_path)
    assert first["generated"] == ["rhs", "jac_y", "jac_p"]
    files = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("pnode_*")}
    assert len(files) == 3 and all(name.endswith(".o") for name in files)  # field, coefficients, their VJP
    second = _build_in_fresh_process(tmp_path)
    assert second["generated"] == []
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("pnode_*")} == files
    assert second["f"] == first["f"]
    assert second["taylor"] == first["taylor"] and np.isfinite(first["taylor"]).all()


def test_a_numpy_array_of_expressions_is_accepted():
    # np.array([...]) of traced expressions is an object array (pm.ode rejects it); its entries are the field
    ode = pn.ODE(lambda y, t, p: np.array([y[1], -p[0] * y[0]]), n_states=2, n_theta=1)
    assert np.allclose(ode.f([0.3, 0.2], 0.0, [2.0]), [0.2, -0.6])


def test_wrong_output_length_names_func():
    with pytest.raises(ValueError, match="func returned 1 values but n_states=2"):
        pn.ODE(lambda y, t, p: [y[0]], n_states=2, n_theta=0)


@pytest.mark.parametrize("field, match", [
    (lambda y, t, p: [p[2] * y[0], -y[1]], r"y or p beyond their lengths"),
    (lambda y, t, p: [y[2], -y[1]], r"y or p beyond their lengths"),
    (lambda y, t, p: [y.sum() * p[2], -y[1]], r"p\[2\] beyond its length"),  # y.sum(): traced on vectors
    (lambda y, t, p: [y.sum() * y[-3], -y[1]], r"y\[-3\] beyond its length"),
])
def test_an_index_beyond_n_states_or_n_theta_is_named(field, match):
    with pytest.raises(ValueError, match=match + r".*\(n_states=2, n_theta=2\)"):
        pn.ODE(field, n_states=2, n_theta=2)
    pn.ODE(lambda y, t, p: [y.sum() * p[1], -y[-2]], n_states=2, n_theta=2)  # in range, also from the end


@pytest.mark.parametrize("kwargs", [dict(n_states=0, n_theta=1), dict(n_states=2, n_theta=-1)])
def test_bad_dimensions(kwargs):
    with pytest.raises(ValueError, match="n_states|n_theta"):
        pn.ODE(lotka_volterra, **kwargs)


def test_validation_of_y0_and_theta(lv_ode):
    with pytest.raises(ValueError, match="y0 must have shape"):
        lv_ode.validate_y0([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="theta must have shape"):
        lv_ode.validate_theta([1.0])


def test_scalar_y0_for_one_state_ode_and_tensor_inputs():
    decay = pn.ODE(lambda y, t, p: [-p[0] * y[0]], n_states=1, n_theta=1)
    assert decay.validate_y0(2.0).shape == (1,)
    sol = pn.solve(decay, 2.0, 0.5, (0.0, 1.0), step=0.01, diffusion=1.0, save_at=[1.0])
    assert sol.mean[-1, 0] == pytest.approx(2.0 * np.exp(-0.5), rel=1e-8)
    assert decay.y0_tensor(2.0).eval().shape == (1,)
    with pytest.raises(ValueError, match="y0 must have shape"):
        decay.y0_tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="theta is required"):
        decay.theta_tensor(None)


def test_threads_loading_one_generated_module_link_it_once(tmp_path, monkeypatch):
    # nutpie's chains are threads: their first gradients load the same generated module at once. (A thread that
    # found a half-imported numba module read a missing function: with a cold cache the sampler failed.)
    import threading

    import pymc_pnode._codegen as codegen

    monkeypatch.setenv("PYMC_PNODE_CACHE_DIR", str(tmp_path))
    key = codegen.source_key("threads", str(tmp_path))
    y = [pt.dscalar("y0")]
    source = codegen.function_ir("f", y, pt.dscalar("t"), [], {"out": [pt.exp(y[0])]}, {"out": (1,)})
    results, errors = [], []

    def load():
        try:
            module = codegen.load_native(key, [source])
            out = np.empty(1)
            CompiledFunction(module, "f", [(1,), (0,), (1,)])(np.array([1.0]), 0.0, np.empty(0), out)
            results.append((id(module), out[0]))
        except Exception as err:  # noqa: BLE001 - recorded for the assertion
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(results)) == 1 and results[0][1] == np.exp(1.0)
    assert len(list(tmp_path.glob("pnode_*.o"))) == 1
