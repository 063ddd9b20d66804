"""The ODE definition: a user vector field written in PyTensor, compiled once to native functions."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import applys_between
from pytensor.printing import debugprint
from pytensor.tensor.subtensor import Subtensor, get_constant_idx

from pymc_pnode import _codegen, _rounding_bound, _taylor_mode
from pymc_pnode._callbacks import CompiledFunction

__all__ = ["ODE"]


_ZERO = pt.constant(0.0, dtype="float64")


# PyTensor records a stack trace for every variable it creates, for its error messages: a fifth of the time of
# building a large field's derivatives, for graphs that PyTensor never compiles.
def _without_traces():
    return pytensor.config.change_flags(traceback__limit=0)


def _gradient(expr: Variable, wrt: Sequence[Variable]) -> list[Variable]:
    """[d expr / d w for w in wrt] for 0-d variables (zero where ``expr`` does not depend on w).

    One reverse pass per expression: differentiating entry by entry costs a graph traversal per
    partial derivative, which dominated the set-up time of larger systems.
    """
    if not wrt:
        return []
    # Disconnected partials as constants: PyTensor's "zero" would be a ``zeros_like`` graph per entry, d² of
    # them to rewrite for a Jacobian.
    grads = pytensor.grad(expr, list(wrt), disconnected_inputs="ignore", return_disconnected="None")
    return [_ZERO if g is None else g for g in grads]


def _sum(terms: Sequence[Variable]) -> Variable:
    """The sum of ``terms`` as one graph node (a float64 zero when there are none)."""
    if not terms:
        return _ZERO
    return pt.add(*terms) if len(terms) > 1 else terms[0]


class ODE:
    r"""An ordinary differential equation :math:`\dot y = f(y, t, \theta)`.

    The vector field is written once with PyTensor operations, with the signature of
    :class:`pymc.ode.DifferentialEquation`. On construction it is differentiated symbolically and
    compiled to straight-line native functions (:mod:`pymc_pnode._codegen`): the vector field, its Jacobians with
    respect to the state and the parameters, second derivatives (for exact gradients of EK1 filters) and
    Taylor coefficients of the solution (for exact initialisation; in Taylor mode from a tape of the
    field, see :mod:`pymc_pnode._taylor_mode`). Generated code is cached on disk (see
    ``PYMC_PNODE_CACHE_DIR``), so a second Python process pays almost nothing.

    Parameters
    ----------
    func : callable
        ``func(y, t, p)`` returning a list (or a 1-d tensor) of ``n_states`` expressions. ``y`` and
        ``p`` support integer indexing (``y[0]``, ``p[2]``); ``t`` is a scalar.
    n_states : int
        Dimension of the state.
    n_theta : int
        Number of parameters (may be 0).
    t0 : float, default 0.0
        Initial time of the problem.

    Attributes
    ----------
    rhs, jac_y, jac_p : CompiledFunction
        ``rhs(y, t, p, out)`` writes :math:`f` into ``out`` (shape ``(d,)``);
        ``jac_y(y, t, p, out)`` writes :math:`\partial f_i/\partial y_j` (shape ``(d, d)``);
        ``jac_p(y, t, p, out)`` writes :math:`\partial f_i/\partial p_k` (shape ``(d, n_theta)``).
        All arrays are C-contiguous float64 of these shapes. Callable from Python; compiled code calls them by
        ``address`` as C functions (:mod:`pymc_pnode._callbacks`).

    Raises
    ------
    ValueError
        If ``n_states``/``n_theta`` are invalid, or ``func`` does not return ``n_states`` values.

    Examples
    --------
    >>> def lotka_volterra(y, t, p):
    ...     return [p[0] * y[0] - p[1] * y[0] * y[1], p[2] * y[0] * y[1] - p[3] * y[1]]
    >>> ode = ODE(lotka_volterra, n_states=2, n_theta=4)
    >>> ode.f([1.0, 1.0], 0.0, [1.0, 1.0, 1.0, 1.0])
    array([0., 0.])
    """

    def __init__(self, func: Callable, n_states: int, n_theta: int, t0: float = 0.0):
        if not callable(func):
            raise ValueError("func must be callable as func(y, t, p)")
        if int(n_states) != n_states or n_states < 1:
            raise ValueError(f"n_states must be a positive integer, got {n_states!r}")
        if int(n_theta) != n_theta or n_theta < 0:
            raise ValueError(f"n_theta must be a non-negative integer, got {n_theta!r}")
        t0 = float(t0)
        if not np.isfinite(t0):
            raise ValueError(f"t0 must be finite, got {t0!r}")
        self.func = func
        self.n_states = int(n_states)
        self.n_theta = int(n_theta)
        self.t0 = t0
        self._y = [pt.scalar(f"y{i}", dtype="float64") for i in range(self.n_states)]
        self._t = pt.scalar("t", dtype="float64")
        self._p = [pt.scalar(f"p{i}", dtype="float64") for i in range(self.n_theta)]
        self._inputs = [*self._y, self._t, *self._p]
        with _without_traces():
            self._f = _codegen.canonicalize(self._trace(func), self._inputs)
        text = io.StringIO()
        debugprint(self._f, file=text, print_type=True)
        self._key = _codegen.source_key(text.getvalue(), str(self.n_states), str(self.n_theta))
        self._taylor: dict[int, object] = {}
        self._taylor_jac: dict[int, object] = {}
        self._taylor_vjp: dict[int, object] = {}
        self._lie: dict[int, list] = {}
        self._hess = None
        self._hess_rows = None
        self._contract = None
        self._term_scale = None
        self._first_derivatives: tuple[list[list[Variable]], list[list[Variable]]] | None = None
        self._canonical_first_derivatives: tuple[list[list[Variable]], list[list[Variable]]] | None = None
        self._taylor_mode: dict[str, bool] = {}  # name → whether the field has its Taylor-mode function
        base = self._native("base", self._base_functions)
        d, k = self.n_states, self.n_theta
        self.rhs = self._compiled(base, "rhs", (d,))
        self.jac_y = self._compiled(base, "jac_y", (d, d))
        self.jac_p = self._compiled(base, "jac_p", (d, k))

    # ------------------------------------------------------------------ tracing and codegen
    def _trace(self, func: Callable) -> list[Variable]:
        try:
            out = func(list(self._y), self._t, list(self._p))
        except IndexError as err:
            if "out of range" in str(err):  # a vector of PyTensor scalars would take the index silently
                raise ValueError(f"func indexes y or p beyond their lengths (n_states={self.n_states}, "
                                 f"n_theta={self.n_theta}): {err}") from err
            out = self._trace_vectors(func)
        except (TypeError, ValueError, AttributeError):
            out = self._trace_vectors(func)
        return self._outputs(out)

    def _trace_vectors(self, func: Callable):
        """``func`` on stacked vectors (a field written with vector operations); rewrites usually reduce the result
        back to scalar operations."""
        yv = pt.stack(self._y)
        pv = pt.stack(self._p) if self._p else pt.zeros((0,), dtype="float64")
        out = func(yv, self._t, pv)
        outs = [pt.as_tensor_variable(o) for o in (out if isinstance(out, (list, tuple)) else [out])]
        sizes = {id(yv): ("y", self.n_states), id(pv): ("p", self.n_theta)}
        for node in applys_between([yv, pv], outs):  # a vector takes any constant index; numba fails much later
            if isinstance(node.op, Subtensor) and id(node.inputs[0]) in sizes:
                name, size = sizes[id(node.inputs[0])]
                for index in get_constant_idx(node.op.idx_list, node.inputs, allow_partial=True):
                    if isinstance(index, (int, np.integer)) and not -size <= index < size:
                        raise ValueError(f"func indexes {name}[{index}] beyond its length (n_states={self.n_states}, "
                                         f"n_theta={self.n_theta})")
        return out

    def _outputs(self, out) -> list[Variable]:
        """The traced field's value as ``n_states`` scalar expressions."""
        if isinstance(out, np.ndarray) and out.dtype == object and out.ndim == 1:  # np.array([...]) of expressions
            out = list(out)
        if isinstance(out, (list, tuple)):
            outs = [pt.as_tensor_variable(o) for o in out]
        else:
            out = pt.as_tensor_variable(out)
            if out.ndim == 0:
                outs = [out]
            elif out.ndim == 1:
                length = out.type.shape[0]
                if length is None and out.owner is not None and type(out.owner.op).__name__ == "MakeVector":
                    length = len(out.owner.inputs)
                if length is None:
                    length = self.n_states
                outs = [out[i] for i in range(length)]
            else:
                raise ValueError(
                    f"func must return a list or a 1-d tensor of {self.n_states} values; "
                    f"got a {out.ndim}-d tensor"
                )
        if len(outs) != self.n_states:
            raise ValueError(
                f"func returned {len(outs)} values but n_states={self.n_states}"
            )
        for i, o in enumerate(outs):
            if o.ndim != 0:
                raise ValueError(f"func output {i} is not a scalar (ndim={o.ndim})")
        return [pt.cast(o, "float64") if o.dtype != "float64" else o for o in outs]

    def _native(self, kind: str, make_functions: Callable[[], list[str] | None],
                before_link: Callable[[], None] | None = None):
        """The native module ``kind`` of the IR functions that ``make_functions`` returns, compiled unless cached
        (None if it is not cached and ``make_functions`` returns None); ``before_link`` runs just before it is
        linked (:func:`~pymc_pnode._codegen.load_native`)."""
        key = _codegen.source_key(self._key, kind)
        module = _codegen.load_native(key, before_link=before_link)
        if module is None:
            try:
                with _without_traces():
                    functions = make_functions()
            except _codegen.UnsupportedOperation as err:
                raise ValueError(
                    f"func uses an operation that cannot be compiled to scalar native code: {err}. "
                    "Write the vector field with scalar PyTensor operations (indexing, +, *, "
                    "exp, sin, ...)."
                ) from err
            module = _codegen.load_native(key, functions, before_link)
        return module

    @property
    def field_addresses(self) -> tuple[int, int, int]:
        """Addresses of the C callbacks of :attr:`rhs`, :attr:`jac_y` and :attr:`jac_p`, the arguments by which compiled
        kernels take them (:mod:`pymc_pnode._callbacks`; valid in this process only)."""
        return self.rhs.address, self.jac_y.address, self.jac_p.address

    def _compiled(self, module, name: str, *shapes: tuple[int, ...]) -> CompiledFunction:
        """The generated ``name(y, t, p, *arrays)`` of the native ``module`` with ``arrays`` of these ``shapes``,
        callable by kernels."""
        return CompiledFunction(module, name, [(self.n_states,), (self.n_theta,), *shapes])

    def _gen(self, fname, outputs, shapes):
        return _codegen.function_ir(fname, self._y, self._t, self._p, outputs, shapes)

    def _jacobian_graphs(self) -> tuple[list[list[Variable]], list[list[Variable]]]:
        """Graphs of ``∂f_i/∂y_j`` and ``∂f_i/∂θ_k`` (rows ``i``), built once."""
        if self._first_derivatives is None:
            d = self.n_states
            grads = [_gradient(fi, [*self._y, *self._p]) for fi in self._f]
            self._first_derivatives = ([row[:d] for row in grads], [row[d:] for row in grads])
        return self._first_derivatives

    def _canonical_jacobians(self) -> tuple[list[list[Variable]], list[list[Variable]]]:
        """:meth:`_jacobian_graphs` with the entries that are not constants (most are zeros) canonicalised, built
        once: the generated Jacobians, the Taylor tape and the Hessian contraction start from them (a rewrite of
        ``d²`` entries each otherwise)."""
        if self._canonical_first_derivatives is None:
            jac_y, jac_p = self._jacobian_graphs()
            rows = [list(row) for row in [*jac_y, *jac_p]]
            where = [(i, j) for i, row in enumerate(rows) for j, g in enumerate(row) if not isinstance(g, Constant)]
            for (i, j), g in zip(where, _codegen.canonicalize([rows[i][j] for i, j in where], self._inputs)):
                rows[i][j] = g
            self._canonical_first_derivatives = (rows[:self.n_states], rows[self.n_states:])
        return self._canonical_first_derivatives

    def _base_functions(self) -> list[str]:
        d, k = self.n_states, self.n_theta
        jac_y, jac_p = self._canonical_jacobians()
        return [
            self._gen("rhs", {"out": self._f}, {"out": (d,)}),
            self._gen("jac_y", {"out": [g for row in jac_y for g in row]}, {"out": (d, d)}),
            self._gen("jac_p", {"out": [g for row in jac_p for g in row]}, {"out": (d, k)}),
        ]

    def _taylor_tape(self, name: str) -> _taylor_mode.Tape | None:
        """The tape of the Taylor-mode function ``name`` (``taylor``, ``taylor_vjp`` or ``taylor_jac``), or None when
        the field has an operation without a Taylor rule (the symbolic Lie derivatives serve it then)."""
        jac_y = jac_p = None
        if name != "taylor":  # the derivatives of the coefficients need the Jacobians' jets
            jac_y, jac_p = self._canonical_jacobians()
        try:
            return _taylor_mode.build_tape(self._y, self._t, self._p, self._f, jac_y, jac_p)
        except _codegen.UnsupportedOperation:
            return None

    def _taylor_part(self, name: str, order: int, cache: dict, shapes, make_source) -> CompiledFunction:
        """The generated function ``name`` for Taylor coefficients up to ``order``: in Taylor mode (a call of the
        library's interpreter with the field's tape) when the field allows, else from symbolic Lie derivatives
        (``make_source``)."""
        if order not in cache:
            module = None
            if self._taylor_mode.get(name, True):

                def make_functions():
                    tape = self._taylor_tape(name)
                    return None if tape is None else [_taylor_mode.function_ir(name, tape, self.n_theta, order)]

                # The interpreter is registered only for a module that calls it (a cached one, or a field with a
                # tape), just before linking it: a field without Taylor rules does not compile it.
                module = self._native(f"{name.replace('_', '')}mode-{_taylor_mode.VERSION}-{order}", make_functions,
                                      before_link=lambda: _taylor_mode.register_interpreter(name))
                self._taylor_mode[name] = module is not None
            if module is None:
                module = self._native(f"{name.replace('_', '')}{order}", lambda: [make_source()])
            cache[order] = self._compiled(module, name, *shapes)
        return cache[order]

    def _hess_functions(self) -> list[str]:
        d, k = self.n_states, self.n_theta
        jy, _ = self._jacobian_graphs()
        second = [_gradient(jy[i][j], [*self._y, *self._p]) for i in range(d) for j in range(d)]
        hyy = [g for row in second for g in row[:d]]
        hyp = [g for row in second for g in row[d:]]
        return [self._gen("hess_yy", {"out": hyy}, {"out": (d, d, d)}),
                self._gen("hess_yp", {"out": hyp}, {"out": (d, d, k)})]

    def _hess_rows_functions(self) -> list[str]:
        d = self.n_states
        jac_y, _ = self._jacobian_graphs()
        second = [_gradient(jac_y[i][i], [*self._y, *self._p]) for i in range(d)]
        return [self._gen("hess_rows_y", {"out": [g for row in second for g in row[:d]]}, {"out": (d, d)}),
                self._gen("hess_rows_p", {"out": [g for row in second for g in row[d:]]}, {"out": (d, self.n_theta)})]

    def _vjp_source(self, fname: str, exprs: Sequence[Variable], shape: tuple[int, ...]) -> str:
        """Source of ``fname(y, t, p, weights, out_y, out_p)``: the gradient of ``Σ weights[i] exprs[i]`` (``exprs``
        flattened from ``shape``, the shape of ``weights``, and canonicalised: constant entries have no derivatives)
        with respect to ``y`` and ``p``.

        One reverse pass through the weighted sum, where a Jacobian has ``len(exprs) × (d + n_theta)`` entries:
        code and cost grow with the expressions, not with the number of outputs times inputs.
        """
        d = self.n_states
        weights, terms = {}, []
        for flat, expr in enumerate(exprs):
            if isinstance(expr, Constant):  # no derivatives
                continue
            weight = pt.scalar(f"w{flat}", dtype="float64")
            weights[weight] = tuple(int(i) for i in np.unravel_index(flat, shape))
            terms.append(weight * expr)
        if terms:
            grads = _gradient(_sum(terms), [*self._y, *self._p])
        else:
            grads = [_sum([])] * (d + self.n_theta)
        return _codegen.function_ir(
            fname, self._y, self._t, self._p, {"out_y": grads[:d], "out_p": grads[d:]},
            {"out_y": (d,), "out_p": (self.n_theta,), "weights": shape}, entries={"weights": weights},
        )

    def _hess_contract_source(self) -> str:
        jac_y, _ = self._canonical_jacobians()
        return self._vjp_source("hess_contract", [g for row in jac_y for g in row], (self.n_states, self.n_states))

    def _taylor_vjp_source(self, order: int) -> str:
        flat = [gi for level in self._lie_derivatives(order) for gi in level]
        return self._vjp_source("taylor_vjp", flat, (order + 1, self.n_states))

    def _lie_derivatives(self, order: int) -> list[list[Variable]]:
        """Time derivatives y^(k) = g_k(y, t, p), k = 0..order, of the exact solution."""
        if order in self._lie:
            return self._lie[order]
        g = [list(self._y)]
        for _ in range(order):
            nxt = []
            for gi in g[-1]:
                # Only the connected partials: with all d of them the graph (and its rewriting) grows with d²
                # per level even for sparse fields.
                dt, *dy = pytensor.grad(gi, [self._t, *self._y], disconnected_inputs="ignore",
                                        return_disconnected="None") if not isinstance(gi, Constant) else [None]
                terms = [dt] if dt is not None else []
                terms += [dyj * fj for dyj, fj in zip(dy, self._f) if dyj is not None]
                nxt.append(_sum(terms))
            g.append(_codegen.canonicalize(nxt, self._inputs))
        self._lie[order] = g
        return g

    def _taylor_source(self, order: int) -> str:
        flat = [gi for level in self._lie_derivatives(order) for gi in level]
        return self._gen("taylor", {"out": flat}, {"out": (order + 1, self.n_states)})

    def _taylor_jac_source(self, order: int) -> str:
        d, k = self.n_states, self.n_theta
        flat = [gi for level in self._lie_derivatives(order) for gi in level]
        grads = [_gradient(gi, [*self._y, *self._p]) for gi in flat]
        dy = [g for row in grads for g in row[:d]]
        dp = [g for row in grads for g in row[d:]]
        return self._gen("taylor_jac", {"out_y": dy, "out_p": dp},
                         {"out_y": (order + 1, d, d), "out_p": (order + 1, d, k)})

    # ------------------------------------------------------------------ lazily compiled parts
    @property
    def hess_yy(self):
        r"""``hess_yy(y, t, p, out)``: :math:`\partial^2 f_i / \partial y_j \partial y_k` into ``(d, d, d)``."""
        return self._hessians()[0]

    @property
    def hess_yp(self):
        r"""``hess_yp(y, t, p, out)``: :math:`\partial^2 f_i / \partial y_j \partial p_k` into ``(d, d, n_theta)``."""
        return self._hessians()[1]

    @property
    def hess_rows_y(self):
        r"""``hess_rows_y(y, t, p, out)``: :math:`\partial^2 f_i / \partial y_i \partial y_k` into ``(d, d)``.

        The rows of :attr:`hess_yy` that the block-diagonal EK1 needs (its linearisation keeps
        :math:`L_{ii} = \partial f_i / \partial y_i`): ``d²`` entries instead of ``d³``.
        """
        return self._diagonal_hessian_rows()[0]

    @property
    def hess_rows_p(self):
        r"""``hess_rows_p(y, t, p, out)``: :math:`\partial^2 f_i / \partial y_i \partial p_k` into
        ``(d, n_theta)`` (the rows of :attr:`hess_yp` of the block-diagonal EK1)."""
        return self._diagonal_hessian_rows()[1]

    @property
    def hess_contract(self):
        r"""``hess_contract(y, t, p, w, out_y, out_p)``: second derivatives contracted with weights ``w`` (d, d),
        :math:`\sum_{ij} w_{ij} \partial^2 f_i / \partial y_j \partial y_k` into ``out_y[k]`` and
        :math:`\sum_{ij} w_{ij} \partial^2 f_i / \partial y_j \partial p_k` into ``out_p[k]``.

        The vector–Jacobian product of the Jacobian :math:`\partial f / \partial y` that reverse sweeps of EK1
        filters need: generated from the non-constant Jacobian entries only, its code and cost grow with the
        non-zero second derivatives, where the full tensors :attr:`hess_yy` have ``d³`` entries.
        """
        if self._contract is None:
            d, k = self.n_states, self.n_theta
            self._contract = self._compiled(self._native("contract", lambda: [self._hess_contract_source()]),
                                            "hess_contract", (d, d), (d,), (k,))
        return self._contract

    @property
    def term_scale(self) -> tuple[CompiledFunction, CompiledFunction]:
        r"""``(term_scale, term_scale_vjp)``: a running bound of the rounding error of :math:`f` and its derivatives.

        ``term_scale(y, t, p, out)`` writes :math:`T(f_i)` into ``out`` (shape ``(d,)``), so that the computed
        :math:`f_i` is within :math:`\varepsilon\, T(f_i)` of the exact value to first order, counting the rounding
        of ``y`` itself (:mod:`pymc_pnode._rounding_bound`; Higham, 2002, §3.3): the scale of :math:`f`'s terms,
        which cancel near an equilibrium. ``term_scale_vjp(y, t, p, w, out_y, out_p)`` writes the gradients of
        :math:`\sum_i w_i T(f_i)` with respect to ``y`` and ``p``. The EK0's rounding floor of the local
        diffusion calls them (:func:`~pymc_pnode.filtering.calibration.rounding_kappa`); compiled on first use.
        """
        if self._term_scale is None:
            d, k = self.n_states, self.n_theta

            def functions():
                bounds = _rounding_bound.term_magnitudes(self._y, [self._t, *self._p], self._f)
                return [self._gen("term_scale", {"out": bounds}, {"out": (d,)}),
                        self._vjp_source("term_scale_vjp", bounds, (d,))]

            module = self._native(f"terms-{_rounding_bound.VERSION}", functions)
            self._term_scale = (self._compiled(module, "term_scale", (d,)),
                                self._compiled(module, "term_scale_vjp", (d,), (d,), (k,)))
        return self._term_scale

    def term_scale_addresses(self, needed: bool) -> tuple[int, int]:
        """Addresses of :attr:`term_scale`'s two functions, as kernels take them, or ``(0, 0)`` when not ``needed``
        (only an EK0 that calibrates local diffusions reads them; nothing is compiled then)."""
        if not needed:
            return 0, 0
        value, vjp = self.term_scale
        return value.address, vjp.address

    def _hessians(self):
        if self._hess is None:
            d, k = self.n_states, self.n_theta
            mod = self._native("hess", self._hess_functions)
            self._hess = (self._compiled(mod, "hess_yy", (d, d, d)), self._compiled(mod, "hess_yp", (d, d, k)))
        return self._hess

    def _diagonal_hessian_rows(self):
        if self._hess_rows is None:
            d, k = self.n_states, self.n_theta
            mod = self._native("hessrows", self._hess_rows_functions)
            self._hess_rows = (self._compiled(mod, "hess_rows_y", (d, d)), self._compiled(mod, "hess_rows_p", (d, k)))
        return self._hess_rows

    def taylor_coefficients(self, order: int):
        r"""Compiled exact Taylor coefficients of the solution up to ``order``.

        Returns ``taylor(y0, t0, p, out)``, which writes the derivatives :math:`y^{(k)}(t_0)`,
        ``k = 0..order``, into ``out`` of shape ``(order + 1, d)``; exact, by Taylor-mode arithmetic on a
        tape of the vector field (Griewank & Walther, 2008, ch. 13), or by symbolic Lie derivatives for a
        field with an operation that has no Taylor rule; not finite differences. Compiled on first use
        (solvers need only this; likelihood gradients also need :meth:`taylor_vjp`, forward-mode tangents
        :meth:`taylor_functions`).
        """
        order = self._check_order(order)
        return self._taylor_part("taylor", order, self._taylor, [(order + 1, self.n_states)],
                                 lambda: self._taylor_source(order))

    def taylor_functions(self, order: int):
        r"""``(taylor, taylor_jac)``: the Taylor coefficients and their Jacobians.

        ``taylor`` is :meth:`taylor_coefficients`; ``taylor_jac(y0, t0, p, out_y, out_p)`` writes the
        derivatives of the coefficients with respect to ``y0`` (shape ``(order + 1, d, d)``) and
        ``p`` (shape ``(order + 1, d, n_theta)``), from the coefficient recursion linearised with the Taylor
        series of the field's Jacobians along the solution.
        """
        order = self._check_order(order)
        d, k = self.n_states, self.n_theta
        taylor_jac = self._taylor_part("taylor_jac", order, self._taylor_jac, [(order + 1, d, d), (order + 1, d, k)],
                                       lambda: self._taylor_jac_source(order))
        return self.taylor_coefficients(order), taylor_jac

    def taylor_vjp(self, order: int):
        r"""``taylor_vjp(y0, t0, p, w, out_y, out_p)``: the Taylor coefficients' Jacobians contracted with weights
        ``w`` of shape ``(order + 1, d)``, :math:`\sum_{ij} w_{ij} \partial y^{(i)}_j / \partial y_0` into ``out_y``
        and the same with respect to ``p`` into ``out_p``.

        What reverse-mode gradients of the exact initialisation need (a vector–Jacobian product of
        :meth:`taylor_functions`' ``taylor_jac``): the linearised coefficient recursion run backwards, at a cost
        that grows with the non-zero Jacobian entries, not with ``(order + 1) d (d + n_theta)``.
        """
        order = self._check_order(order)
        d, k = self.n_states, self.n_theta
        return self._taylor_part("taylor_vjp", order, self._taylor_vjp, [(order + 1, d), (d,), (k,)],
                                 lambda: self._taylor_vjp_source(order))

    @staticmethod
    def _check_order(order) -> int:
        order = int(order)
        if order < 0:
            raise ValueError(f"order must be >= 0, got {order}")
        return order

    # ------------------------------------------------------------------ validation and helpers
    def validate_y0(self, y0, name: str = "y0") -> np.ndarray:
        """``y0`` as a float64 array of shape ``(n_states,)``; ``ValueError`` otherwise."""
        arr = np.asarray(y0, dtype=np.float64)
        if arr.ndim == 0 and self.n_states == 1:
            arr = arr.reshape(1)
        if arr.shape != (self.n_states,):
            raise ValueError(f"{name} must have shape ({self.n_states},), got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got {arr}")
        return np.ascontiguousarray(arr)

    def validate_theta(self, theta, name: str = "theta") -> np.ndarray:
        """``theta`` as a float64 array of shape ``(n_theta,)``; ``ValueError`` otherwise."""
        arr = np.asarray(theta if theta is not None else [], dtype=np.float64).reshape(-1)
        if arr.shape != (self.n_theta,):
            raise ValueError(f"{name} must have shape ({self.n_theta},), got {np.shape(theta)}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got {arr}")
        return np.ascontiguousarray(arr)

    def y0_tensor(self, y0, name: str = "y0") -> pt.TensorVariable:
        """``y0`` as a float64 PyTensor vector of shape ``(n_states,)`` for a model graph.

        Numbers are validated now (:meth:`validate_y0`); a symbolic value (e.g. a random variable)
        must be a vector whose static length, if known, is ``n_states``; its length is pinned with
        ``specify_shape``, so a wrong run-time length fails instead of being misread. A scalar is
        accepted for a one-state ODE.
        """
        return vector_tensor(y0, name, self.n_states, self.validate_y0)

    def theta_tensor(self, theta, name: str = "theta") -> pt.TensorVariable:
        """``theta`` as a float64 PyTensor vector of shape ``(n_theta,)``; see :meth:`y0_tensor`.

        ``None`` stands for "no parameters" and is accepted only when ``n_theta == 0``.
        """
        if theta is None and self.n_theta:
            raise ValueError(f"{name} is required: the ODE has n_theta={self.n_theta}")
        return vector_tensor(theta, name, self.n_theta, self.validate_theta)

    def f(self, y: Sequence[float], t: float, theta: Sequence[float]) -> np.ndarray:
        """Evaluate the vector field at one point (convenience; kernels call ``rhs`` directly)."""
        out = np.empty(self.n_states)
        self.rhs(self.validate_y0(y, "y"), float(t), self.validate_theta(theta), out)
        return out

    def jacobian(self, y: Sequence[float], t: float, theta: Sequence[float]) -> np.ndarray:
        """The Jacobian :math:`\\partial f/\\partial y` at one point, shape ``(d, d)``."""
        out = np.empty((self.n_states, self.n_states))
        self.jac_y(self.validate_y0(y, "y"), float(t), self.validate_theta(theta), out)
        return out

    def __repr__(self) -> str:
        name = getattr(self.func, "__name__", "func")
        return f"ODE({name}, n_states={self.n_states}, n_theta={self.n_theta}, t0={self.t0})"

    def __reduce__(self):
        # Compiled functions do not pickle; rebuild from the user function (cheap: disk cache).
        return (ODE, (self.func, self.n_states, self.n_theta, self.t0))


def vector_tensor(value, name: str, size: int, validate: Callable) -> pt.TensorVariable:
    """A float64 PyTensor vector of length ``size`` from numbers (checked by ``validate``) or a symbolic
    value (static length checked, run-time length pinned by ``specify_shape``); see :meth:`ODE.y0_tensor`."""
    if isinstance(value, Constant):
        value = value.data
    if isinstance(value, (list, tuple)) and any(isinstance(v, Variable) for v in value):
        value = pt.stack([pt.as_tensor_variable(v) for v in value])
    if not isinstance(value, Variable):
        return pt.as_tensor_variable(validate(value, name))
    var = value if value.dtype == "float64" else pt.cast(value, "float64")
    if var.ndim == 0 and size == 1:
        var = var[None]
    if var.ndim != 1:
        raise ValueError(f"{name} must be a vector of length {size}, got a tensor with ndim={var.ndim}")
    if var.type.shape[0] is not None and var.type.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), got ({var.type.shape[0]},)")
    return pt.specify_shape(var, (size,))
