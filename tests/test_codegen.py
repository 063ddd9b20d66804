"""Native code of the generated functions (``pymc_pnode._codegen``): every scalar operation it translates, against
PyTensor's own compiled evaluation of the same graph, and the calling conventions of the compiled functions."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_pnode as pn
from pymc_pnode import _codegen

# One output per operation (u in (0, 1), v < 0, w > 1 at the test points; both branches of the piecewise ones).
_OPERATIONS = {
    "exp": lambda u, v, w: pt.exp(u), "expm1": lambda u, v, w: pt.expm1(v), "log": lambda u, v, w: pt.log(w),
    "log1p": lambda u, v, w: pt.log1p(u), "log2": lambda u, v, w: pt.log2(w), "log10": lambda u, v, w: pt.log10(w),
    "sqrt": lambda u, v, w: pt.sqrt(w), "sin": lambda u, v, w: pt.sin(v), "cos": lambda u, v, w: pt.cos(v),
    "tan": lambda u, v, w: pt.tan(u), "arcsin": lambda u, v, w: pt.arcsin(u), "arccos": lambda u, v, w: pt.arccos(u),
    "arctan": lambda u, v, w: pt.arctan(v), "sinh": lambda u, v, w: pt.sinh(v), "cosh": lambda u, v, w: pt.cosh(v),
    "tanh": lambda u, v, w: pt.tanh(v), "arcsinh": lambda u, v, w: pt.arcsinh(v),
    "arccosh": lambda u, v, w: pt.arccosh(w), "arctanh": lambda u, v, w: pt.arctanh(u),
    "erf": lambda u, v, w: pt.erf(v), "erfc": lambda u, v, w: pt.erfc(v), "exp large": lambda u, v, w: pt.exp(w),
    "floor": lambda u, v, w: pt.floor(3 * v),
    "ceil": lambda u, v, w: pt.ceil(3 * v), "abs": lambda u, v, w: pt.abs(v),
    "sigmoid+": lambda u, v, w: pt.sigmoid(u), "sigmoid-": lambda u, v, w: pt.sigmoid(v),
    "softplus": lambda u, v, w: pt.softplus(v), "softplus large": lambda u, v, w: pt.softplus(40 * w),
    "sign-": lambda u, v, w: pt.sign(v), "sign+": lambda u, v, w: pt.sign(u),
    "log1mexp": lambda u, v, w: pt.log1mexp(v), "log1mexp near 0": lambda u, v, w: pt.log1mexp(-0.1 * u),
    "maximum": lambda u, v, w: pt.maximum(u, v), "minimum": lambda u, v, w: pt.minimum(u, v),
    "arctan2": lambda u, v, w: pt.arctan2(v, u), "power": lambda u, v, w: u ** w,
    "cube": lambda u, v, w: v ** 3, "inverse square": lambda u, v, w: w ** -2, "square": lambda u, v, w: pt.sqr(v),
    "reciprocal": lambda u, v, w: pt.reciprocal(v), "negation": lambda u, v, w: -u * w,
    "mod": lambda u, v, w: pt.mod(v, u), "mod by negative": lambda u, v, w: pt.mod(w, v),
    "floor division": lambda u, v, w: pt.int_div(v, u),
    "comparisons": lambda u, v, w: (pt.cast(u > v, "float64") + 2 * pt.cast(u >= w, "float64")
                                    + 4 * pt.cast(v < u, "float64") + 8 * pt.cast(w <= u, "float64")
                                    + 16 * pt.cast(pt.eq(u, u), "float64") + 32 * pt.cast(pt.neq(u, v), "float64")),
    "logic": lambda u, v, w: (pt.cast(pt.and_(u > 0, v > 0), "float64") + 2 * pt.cast(pt.or_(u > 0, v > 0), "float64")
                              + 4 * pt.cast(pt.invert(u > v), "float64")),
    "switch": lambda u, v, w: pt.switch(u > v, w * u, v), "clip": lambda u, v, w: pt.clip(v, -0.5, 0.5) + u,
}


def _field(y, t, p):
    u, v, w = y[0], y[1], y[2]
    return [p[0] * op(u, v, w) + t for op in _OPERATIONS.values()]


@pytest.fixture(scope="module")
def every_operation():
    """The field as an ODE, and PyTensor's compiled value and Jacobian of the same graph."""
    d = len(_OPERATIONS)
    ode = pn.ODE(_field, n_states=d, n_theta=1)
    y, t, p = pt.dvector("y"), pt.dscalar("t"), pt.dvector("p")
    value = pt.stack(_field([y[i] for i in range(d)], t, [p[0]]))
    reference = pytensor.function([y, t, p], [value, pytensor.gradient.jacobian(value, y)])
    return ode, reference


@pytest.mark.parametrize("point", [(0.3, -0.7, 2.5), (0.85, -2.4, 1.2), (0.05, -0.2, 7.5)])
def test_every_operation_agrees_with_pytensors_evaluation(every_operation, point):
    ode, reference = every_operation
    y = np.zeros(ode.n_states)
    y[:3] = point
    p = np.array([1.3])
    value, jacobian = reference(y, 0.4, p)
    native = ode.f(y, 0.4, p)
    for name, got, expected in zip(_OPERATIONS, native, value):
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15, err_msg=name)
    native_jacobian = ode.jacobian(y, 0.4, p)
    for name, got, expected in zip(_OPERATIONS, native_jacobian, jacobian):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14, err_msg=name)


def test_operations_keep_nan_and_infinity(every_operation):
    """Special values follow the operations' definitions: NaN propagates (also through maximum and minimum, as in
    NumPy), an overflowing exp is inf, not an error."""
    ode, reference = every_operation
    y = np.zeros(ode.n_states)
    y[:3] = (np.nan, -0.7, 800.0)
    native = np.empty(ode.n_states)
    ode.rhs(y, 0.0, np.array([1.0]), native)  # (ode.f refuses a NaN)
    expected = reference(y, 0.0, np.array([1.0]))[0]
    for name, got, value in zip(_OPERATIONS, native, expected):
        np.testing.assert_allclose(got, value, rtol=1e-13, equal_nan=True, err_msg=name)
    names = list(_OPERATIONS)
    assert np.isnan(native[names.index("maximum")]) and np.isinf(native[names.index("exp large")])


def test_native_functions_refuse_arrays_they_would_read_out_of_bounds(lv_ode):
    y, p = np.array([1.0, 2.0]), np.array([0.5, 1.1, 0.9, 0.4])
    out = np.empty(2)
    lv_ode.rhs(y, 0.0, p, out)
    with pytest.raises(TypeError, match=r"argument 2 of rhs must be a C-contiguous float64 array of shape \(2,\)"):
        lv_ode.rhs(y, 0.0, p, np.empty(1))
    with pytest.raises(TypeError, match="argument 0 of rhs"):
        lv_ode.rhs(y.astype(np.float32), 0.0, p, out)
    with pytest.raises(TypeError, match="argument 1 of jac_y"):
        lv_ode.jac_y(y, 0.0, np.ones((4, 2))[:, 0], np.empty((2, 2)))  # a strided view
    with pytest.raises(TypeError, match="takes y, t, p and 1 arrays"):
        lv_ode.rhs(y, 0.0, p)


def test_an_object_file_of_another_machine_is_not_loaded(tmp_path, monkeypatch):
    """Native code is specific to the CPU and LLVM that compiled it: the cache file's name carries both, so a cache
    directory shared between machines holds one file per machine."""
    monkeypatch.setenv("PYMC_PNODE_CACHE_DIR", str(tmp_path))
    key = _codegen.source_key("test", "machine")
    assert _codegen.load_native(key) is None
    module = _codegen.load_native(key, [_codegen.function_ir("f", [], pt.dscalar("t"), [], {"out": []},
                                                              {"out": (0,)})])
    (path,) = tmp_path.glob("pnode_*.o")
    suffix = _codegen._host()[0]
    assert path.name == f"pnode_{key}_{suffix}.o" and module.address("f") > 0
