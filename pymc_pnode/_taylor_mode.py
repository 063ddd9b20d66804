"""Taylor-mode arithmetic: the exact solution's Taylor coefficients by propagating truncated power series.

The ODE filters start from the exact derivatives :math:`y^{(k)}(t_0)`, ``k = 0..q``. Written as symbolic
Lie derivatives they swell with ``q`` and ``d`` (the generated code of a 100-state field took minutes to
compile). Here the vector field's graph becomes a *tape* (a flat list of scalar operations, stored as arrays)
that one library interpreter evaluates on truncated power series (Griewank & Walther, 2008, *Evaluating
Derivatives*, ch. 13): the coefficients follow from :math:`y(s) = \\sum_k c_k s^k`, :math:`c_{k+1} =
[f(y(s), t_0 + s, \\theta)]_k / (k + 1)`. The tape grows with the field's operations. The interpreter is compiled
once per machine into C functions that take the tape as arrays; each new ODE compiles only three one-line
functions that call them with its tape.

Derivatives of the coefficients with respect to ``y0`` and ``θ`` differentiate that recursion:
:math:`\\delta c_{k+1} = (\\sum_{i \\le k} A_i \\delta c_{k-i} + B_k \\delta\\theta) / (k + 1)` with :math:`A(s),
B(s)` the Taylor series of the Jacobians :math:`\\partial f/\\partial y, \\partial f/\\partial \\theta` along
the solution, which the same tape evaluates from their (sparse) graphs.

Fields that use an operation without a Taylor rule raise :class:`UnsupportedOperation`; the ODE then uses
the symbolic coefficients.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numba as nb
import numpy as np
from llvmlite import binding as llvm
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import FunctionGraph

from pymc_pnode._codegen import UnsupportedOperation, literal
from pymc_pnode._jit import COMPILE_LOCK, JIT

# Generated modules call this module's interpreter by symbol names that carry this file's hash, and their cache
# key carries it too: a changed interpreter or tape layout never meets a stale module.
VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

# ---------------------------------------------------------------- opcodes (columns: code, out, a, b, x)
ADD, SUB, MUL, DIV, NEG, PRIMITIVE, SWITCH, PIECEWISE_CONSTANT, ABS = range(9)

# Zeroth coefficients of primitives w' = g · u' (column x of a PRIMITIVE row).
(EXP, EXPM1, LOG, LOG1P, LOG2, LOG10, SQRT, SIN, COS, TAN, ARCSIN, ARCCOS, ARCTAN, SINH, COSH, TANH,
 ARCSINH, ARCCOSH, ARCTANH, ERF, ERFC, SIGMOID, SOFTPLUS, POWER) = range(24)
# Piecewise-constant functions: only the zeroth coefficient is non-zero.
GT, GE, LT, LE, EQ, NEQ, AND, OR, NOT, FLOOR, CEIL, SIGN, INTDIV = range(13)

_COMPARISONS = {"GT": GT, "GE": GE, "LT": LT, "LE": LE, "EQ": EQ, "NEQ": NEQ, "AND": AND, "OR": OR,
                "IntDiv": INTDIV}
_STEPS = {"Invert": NOT, "Floor": FLOOR, "Ceil": CEIL, "Sign": SIGN}


class Tape(NamedTuple):
    """A vector field (and optionally its Jacobians) as scalar operations on rows of a jet array.

    Rows ``0..d-1`` hold the states, row ``d`` the time, then the parameters and the constants.
    """

    ops: np.ndarray  # (n_ops, 5) int64: code, output row, operands a, b, x (third operand or function id)
    param: np.ndarray  # (n_ops,) float64: the exponent of POWER primitives
    const_rows: np.ndarray  # (n_const,) int64
    const_values: np.ndarray  # (n_const,) float64
    n_rows: int
    field: np.ndarray  # (d,) int64: the row of each f_i
    jac_y: np.ndarray  # (n_y, 3) int64: (i, j, row of ∂f_i/∂y_j) for the entries not identically zero
    jac_p: np.ndarray  # (n_p, 3) int64: (i, k, row of ∂f_i/∂θ_k)


# ---------------------------------------------------------------- building a tape from a PyTensor graph
class _Builder:
    """Appends tape rows for graph nodes: each PyTensor scalar operation becomes one or a few Taylor rules."""

    def __init__(self, inputs: Sequence[Variable]):
        self.rows: dict[Variable, int] = {v: i for i, v in enumerate(inputs)}
        self.n_rows = len(inputs)
        self.ops: list[list[int]] = []
        self.param: list[float] = []
        self.consts: dict[float, int] = {}

    def new_row(self) -> int:
        self.n_rows += 1
        return self.n_rows - 1

    def const(self, value: float) -> int:
        value = float(value)
        if value not in self.consts:
            self.consts[value] = self.new_row()
        return self.consts[value]

    def emit(self, code: int, a: int, b: int = -1, x: int = -1, out: int | None = None, param: float = 0.0) -> int:
        out = self.new_row() if out is None else out
        self.ops.append([code, out, a, b, x])
        self.param.append(param)
        return out

    def row(self, var: Variable) -> int:
        if var in self.rows:
            return self.rows[var]
        if isinstance(var, Constant):
            return self.const(np.asarray(var.data).item())
        raise UnsupportedOperation(f"free variable {var} is not an input of the vector field")

    # arithmetic helpers that the rules below compose
    def add(self, a, b):
        return self.emit(ADD, a, b)

    def sub(self, a, b):
        return self.emit(SUB, a, b)

    def mul(self, a, b):
        return self.emit(MUL, a, b)

    def div(self, a, b):
        return self.emit(DIV, a, b)

    def primitive(self, function: int, u: int, slope, param: float = 0.0, out: int | None = None) -> int:
        """w = F(u) with w' = g · u'; ``slope(w)`` builds the row of g (it may use w: only lower coefficients
        of g enter w's next one)."""
        w = self.new_row() if out is None else out
        index = len(self.ops)
        self.emit(PRIMITIVE, u, -1, function, out=w, param=param)
        self.ops[index][3] = slope(w)
        return w

    def sin_cos(self, u: int, hyperbolic: bool) -> tuple[int, int]:
        s, c = self.new_row(), self.new_row()
        self.emit(PRIMITIVE, u, c, SINH if hyperbolic else SIN, out=s)
        if hyperbolic:
            self.emit(PRIMITIVE, u, s, COSH, out=c)
        else:
            self.primitive(COS, u, lambda w: self.emit(NEG, s), out=c)
        return s, c

    def inverse_sqrt_of(self, a: int) -> int:  # 1 / sqrt(a)
        return self.div(self.const(1.0), self.sqrt(a))

    def sqrt(self, u: int) -> int:
        return self.primitive(SQRT, u, lambda w: self.div(self.const(0.5), w))

    def integer_power(self, u: int, n: int) -> int:
        result, base, m = None, u, abs(n)
        while m:
            if m & 1:
                result = base if result is None else self.mul(result, base)
            m >>= 1
            if m:
                base = self.mul(base, base)
        if result is None:
            return self.const(1.0)
        return self.div(self.const(1.0), result) if n < 0 else result

    def power(self, u: int, exponent_var: Variable, exponent: int) -> int:
        if isinstance(exponent_var, Constant):
            e = float(np.asarray(exponent_var.data).item())
            if e == int(e) and abs(e) <= 64:
                return self.integer_power(u, int(e))
            return self.primitive(POWER, u, lambda w: self.mul(self.const(e), self.div(w, u)), param=e)
        log_u = self.primitive(LOG, u, lambda w: self.div(self.const(1.0), u))
        return self.primitive(EXP, self.mul(exponent, log_u), lambda w: w)

    def unary(self, name: str, u: int) -> int:
        one = self.const(1.0)
        if name == "Exp":
            return self.primitive(EXP, u, lambda w: w)
        if name == "Expm1":
            return self.primitive(EXPM1, u, lambda w: self.add(w, one))
        if name == "Log":
            return self.primitive(LOG, u, lambda w: self.div(one, u))
        if name == "Log1p":
            return self.primitive(LOG1P, u, lambda w: self.div(one, self.add(one, u)))
        if name == "Log2":
            return self.primitive(LOG2, u, lambda w: self.div(self.const(1.0 / math.log(2.0)), u))
        if name == "Log10":
            return self.primitive(LOG10, u, lambda w: self.div(self.const(1.0 / math.log(10.0)), u))
        if name == "Log1mexp":  # log(1 - e^u) = log(-expm1(u))
            return self.unary("Log", self.emit(NEG, self.unary("Expm1", u)))
        if name == "Sqrt":
            return self.sqrt(u)
        if name in ("Sin", "Cos", "Sinh", "Cosh"):
            s, c = self.sin_cos(u, hyperbolic=name.endswith("h"))
            return s if name.startswith("Sin") else c
        if name == "Tan":
            return self.primitive(TAN, u, lambda w: self.add(one, self.mul(w, w)))
        if name == "Tanh":
            return self.primitive(TANH, u, lambda w: self.sub(one, self.mul(w, w)))
        if name == "Sigmoid":
            return self.primitive(SIGMOID, u, lambda w: self.sub(w, self.mul(w, w)))
        if name == "Softplus":
            sigmoid = self.unary("Sigmoid", u)
            return self.primitive(SOFTPLUS, u, lambda w: sigmoid)
        if name == "ArcTan":
            return self.primitive(ARCTAN, u, lambda w: self.div(one, self.add(one, self.mul(u, u))))
        if name == "ArcTanh":
            return self.primitive(ARCTANH, u, lambda w: self.div(one, self.sub(one, self.mul(u, u))))
        if name == "ArcSin":
            return self.primitive(ARCSIN, u, lambda w: self.inverse_sqrt_of(self.sub(one, self.mul(u, u))))
        if name == "ArcCos":
            return self.primitive(ARCCOS, u, lambda w: self.emit(NEG, self.inverse_sqrt_of(
                self.sub(one, self.mul(u, u)))))
        if name == "ArcSinh":
            return self.primitive(ARCSINH, u, lambda w: self.inverse_sqrt_of(self.add(one, self.mul(u, u))))
        if name == "ArcCosh":
            return self.primitive(ARCCOSH, u, lambda w: self.inverse_sqrt_of(self.sub(self.mul(u, u), one)))
        if name in ("Erf", "Erfc"):
            scale = (2.0 if name == "Erf" else -2.0) / math.sqrt(math.pi)
            gauss = self.unary("Exp", self.emit(NEG, self.mul(u, u)))
            return self.primitive(ERF if name == "Erf" else ERFC, u, lambda w: self.mul(self.const(scale), gauss))
        if name == "Abs":
            return self.emit(ABS, u)
        if name == "Neg":
            return self.emit(NEG, u)
        if name == "Sqr":
            return self.mul(u, u)
        if name == "Reciprocal":
            return self.div(one, u)
        if name in _STEPS:
            return self.emit(PIECEWISE_CONSTANT, u, u, _STEPS[name])
        raise UnsupportedOperation(f"scalar operation {name} has no Taylor-mode rule")

    def scalar(self, op, args: list[int], arg_vars: Sequence[Variable]) -> list[int]:
        name = type(op).__name__
        if name == "Composite":
            inner = dict(zip(op.fgraph.inputs, args))
            saved = self.rows
            self.rows = {**saved, **inner}
            for node in op.fgraph.toposort():
                outs = self.scalar(node.op, [self.row(i) for i in node.inputs], node.inputs)
                self.rows.update(zip(node.outputs, outs))
            result = [self.row(o) for o in op.fgraph.outputs]
            self.rows = saved
            return result
        if name in ("Add", "Mul"):
            code = ADD if name == "Add" else MUL
            acc = args[0]
            for arg in args[1:]:
                acc = self.emit(code, acc, arg)
            return [acc]
        if name in ("Sub", "TrueDiv"):
            return [self.emit(SUB if name == "Sub" else DIV, args[0], args[1])]
        if name == "Pow":
            return [self.power(args[0], arg_vars[1], args[1])]
        if name in _COMPARISONS:
            return [self.emit(PIECEWISE_CONSTANT, args[0], args[1], _COMPARISONS[name])]
        if name == "Switch":
            return [self.emit(SWITCH, args[0], args[1], args[2])]
        if name in ("Maximum", "ScalarMaximum", "Minimum", "ScalarMinimum"):
            first = GE if "Max" in name else LE
            return [self.emit(SWITCH, self.emit(PIECEWISE_CONSTANT, args[0], args[1], first), args[0], args[1])]
        if name == "Clip":
            low = self.emit(SWITCH, self.emit(PIECEWISE_CONSTANT, args[0], args[1], GE), args[0], args[1])
            return [self.emit(SWITCH, self.emit(PIECEWISE_CONSTANT, low, args[2], LE), low, args[2])]
        if name in ("Identity", "Cast") or name.startswith("Convert"):
            return [args[0]]
        if name == "Second":
            return [args[1]]
        return [self.unary(name, args[0])]

    def graph(self, inputs: Sequence[Variable], outputs: Sequence[Variable]) -> list[int]:
        outputs = list(outputs)
        for node in FunctionGraph(list(inputs), outputs, clone=False).toposort():
            kind = type(node.op).__name__
            args = [self.row(i) for i in node.inputs]
            if kind == "Elemwise" and all(o.ndim == 0 for o in node.outputs):
                outs = self.scalar(node.op.scalar_op, args, node.inputs)
            elif kind in ("DimShuffle", "ScalarFromTensor", "TensorFromScalar") and node.outputs[0].ndim == 0:
                outs = args
            else:
                raise UnsupportedOperation(f"operation {node.op} has no Taylor-mode rule")
            self.rows.update(zip(node.outputs, outs))
        return [self.row(o) for o in outputs]


def _is_zero(var: Variable) -> bool:
    return isinstance(var, Constant) and np.all(np.asarray(var.data) == 0)


def build_tape(
    y: Sequence[Variable],
    t: Variable,
    p: Sequence[Variable],
    field: Sequence[Variable],
    jac_y: Sequence[Sequence[Variable]] | None = None,
    jac_p: Sequence[Sequence[Variable]] | None = None,
) -> Tape:
    """The tape of ``field`` (d scalar graphs in the inputs ``y``, ``t``, ``p``) and optionally its Jacobians.

    ``jac_y[i][j]``/``jac_p[i][k]`` are graphs of :math:`\\partial f_i/\\partial y_j` and
    :math:`\\partial f_i/\\partial \\theta_k`; entries that are constant zeros are left out. Raises
    :class:`UnsupportedOperation` for an operation without a Taylor rule.
    """
    builder = _Builder([*y, t, *p])
    entries_y = [(i, j, e) for i, row in enumerate(jac_y or []) for j, e in enumerate(row) if not _is_zero(e)]
    entries_p = [(i, k, e) for i, row in enumerate(jac_p or []) for k, e in enumerate(row) if not _is_zero(e)]
    rows = builder.graph([*y, t, *p], [*field, *(e for *_, e in entries_y), *(e for *_, e in entries_p)])
    d, n_y = len(field), len(entries_y)

    def entry_array(entries, offset):
        table = [(i, j, rows[offset + n]) for n, (i, j, _) in enumerate(entries)]
        return np.array(table, dtype=np.int64).reshape(len(table), 3)

    const_rows = np.array(list(builder.consts.values()), dtype=np.int64)
    return Tape(
        ops=np.array(builder.ops, dtype=np.int64).reshape(len(builder.ops), 5),
        param=np.array(builder.param, dtype=np.float64),
        const_rows=const_rows,
        const_values=np.array(list(builder.consts.keys()), dtype=np.float64),
        n_rows=builder.n_rows,
        field=np.array(rows[:d], dtype=np.int64),
        jac_y=entry_array(entries_y, d),
        jac_p=entry_array(entries_p, d + n_y),
    )


# ---------------------------------------------------------------- the interpreter
@nb.njit(**JIT)
def _primitive_value(function: int, u: float, param: float) -> float:
    if function == EXP:
        return math.exp(u)
    if function == EXPM1:
        return math.expm1(u)
    if function == LOG:
        return math.log(u) if u > 0.0 else (-math.inf if u == 0.0 else math.nan)
    if function == LOG1P:
        return math.log1p(u) if u > -1.0 else (-math.inf if u == -1.0 else math.nan)
    if function == LOG2:
        return math.log2(u) if u > 0.0 else (-math.inf if u == 0.0 else math.nan)
    if function == LOG10:
        return math.log10(u) if u > 0.0 else (-math.inf if u == 0.0 else math.nan)
    if function == SQRT:
        return math.sqrt(u) if u >= 0.0 else math.nan
    if function == SIN:
        return math.sin(u)
    if function == COS:
        return math.cos(u)
    if function == TAN:
        return math.tan(u)
    if function == ARCSIN:
        return math.asin(u) if abs(u) <= 1.0 else math.nan
    if function == ARCCOS:
        return math.acos(u) if abs(u) <= 1.0 else math.nan
    if function == ARCTAN:
        return math.atan(u)
    if function == SINH:
        return math.sinh(u)
    if function == COSH:
        return math.cosh(u)
    if function == TANH:
        return math.tanh(u)
    if function == ARCSINH:
        return math.asinh(u)
    if function == ARCCOSH:
        return math.acosh(u) if u >= 1.0 else math.nan
    if function == ARCTANH:
        return math.atanh(u) if abs(u) < 1.0 else math.nan
    if function == ERF:
        return math.erf(u)
    if function == ERFC:
        return math.erfc(u)
    if function == SIGMOID:
        if u >= 0.0:
            return 1.0 / (1.0 + math.exp(-u))
        e = math.exp(u)
        return e / (1.0 + e)
    if function == SOFTPLUS:
        return u if u > 30.0 else math.log1p(math.exp(u))
    return u**param  # POWER


@nb.njit(**JIT)
def _piecewise_value(function: int, a: float, b: float) -> float:
    if function == GT:
        return 1.0 if a > b else 0.0
    if function == GE:
        return 1.0 if a >= b else 0.0
    if function == LT:
        return 1.0 if a < b else 0.0
    if function == LE:
        return 1.0 if a <= b else 0.0
    if function == EQ:
        return 1.0 if a == b else 0.0
    if function == NEQ:
        return 1.0 if a != b else 0.0
    if function == AND:
        return 1.0 if a != 0.0 and b != 0.0 else 0.0
    if function == OR:
        return 1.0 if a != 0.0 or b != 0.0 else 0.0
    if function == NOT:
        return 1.0 if a == 0.0 else 0.0
    if function == FLOOR:
        return math.floor(a)
    if function == CEIL:
        return math.ceil(a)
    if function == SIGN:
        return 1.0 if a > 0.0 else (-1.0 if a < 0.0 else 0.0)
    return math.floor(a / b)  # INTDIV


@nb.njit(**JIT)
def _propagate(ops, param, jets, k):
    """Coefficient ``k`` of every operation's output, given every row's coefficients below ``k`` and the inputs'
    coefficient ``k``."""
    for n in range(ops.shape[0]):
        code, out, a, b, x = ops[n, 0], ops[n, 1], ops[n, 2], ops[n, 3], ops[n, 4]
        if code == ADD:
            jets[out, k] = jets[a, k] + jets[b, k]
        elif code == SUB:
            jets[out, k] = jets[a, k] - jets[b, k]
        elif code == MUL:  # Cauchy product
            acc = 0.0
            for i in range(k + 1):
                acc += jets[a, i] * jets[b, k - i]
            jets[out, k] = acc
        elif code == DIV:  # w = a / b  ⇔  w b = a
            acc = jets[a, k]
            for j in range(1, k + 1):
                acc -= jets[b, j] * jets[out, k - j]
            jets[out, k] = acc / jets[b, 0]
        elif code == NEG:
            jets[out, k] = -jets[a, k]
        elif code == PRIMITIVE:  # w' = g u': k w_k = Σ_j j u_j g_{k-j}
            if k == 0:
                jets[out, 0] = _primitive_value(x, jets[a, 0], param[n])
            else:
                acc = 0.0
                for j in range(1, k + 1):
                    acc += j * jets[a, j] * jets[b, k - j]
                jets[out, k] = acc / k
        elif code == SWITCH:  # the branch of the expansion point
            jets[out, k] = jets[b, k] if jets[a, 0] != 0.0 else jets[x, k]
        elif code == PIECEWISE_CONSTANT:
            jets[out, k] = _piecewise_value(x, jets[a, 0], jets[b, 0]) if k == 0 else 0.0
        else:  # ABS (slope 0 at a kink, as the symbolic derivative)
            u0 = jets[a, 0]
            jets[out, k] = jets[a, k] * (1.0 if u0 > 0.0 else (-1.0 if u0 < 0.0 else 0.0)) if k else abs(u0)


@nb.njit(**JIT)
def _expand(tape, y, t, p, order):
    """Jets of every row: the states' normalised Taylor coefficients c_0..c_order in rows 0..d-1, every other row
    to coefficient ``order - 1`` (all that c_order needs)."""
    d = y.shape[0]
    jets = np.zeros((tape.n_rows, order + 1))
    for i in range(d):
        jets[i, 0] = y[i]
    jets[d, 0] = t
    if order >= 1:
        jets[d, 1] = 1.0
    for j in range(p.shape[0]):
        jets[d + 1 + j, 0] = p[j]
    for n in range(tape.const_rows.shape[0]):
        jets[tape.const_rows[n], 0] = tape.const_values[n]
    for k in range(order):
        _propagate(tape.ops, tape.param, jets, k)
        for i in range(d):
            jets[i, k + 1] = jets[tape.field[i], k] / (k + 1)
    return jets


@nb.njit(**JIT)
def coefficients(tape, y, t, p, out):
    """``out[k] = y^(k)(t)``, ``k = 0..order`` (``out`` of shape ``(order + 1, d)``)."""
    order, d = out.shape[0] - 1, y.shape[0]
    jets = _expand(tape, y, t, p, order)
    factorial = 1.0
    for k in range(order + 1):
        if k:
            factorial *= k
        for i in range(d):
            out[k, i] = factorial * jets[i, k]


@nb.njit(**JIT)
def coefficients_vjp(tape, y, t, p, weights, out_y, out_p):
    """``Σ_ki weights[k, i] ∂y^(k)_i/∂y0`` into ``out_y`` and the same with respect to θ into ``out_p``: the
    coefficient recursion run backwards with the Jacobians' jets."""
    order, d = weights.shape[0] - 1, y.shape[0]
    jets = _expand(tape, y, t, p, order)
    cbar = np.empty((order + 1, d))
    factorial = 1.0
    for k in range(order + 1):
        if k:
            factorial *= k
        for i in range(d):
            cbar[k, i] = factorial * weights[k, i]
    out_p[:] = 0.0
    fbar = np.empty(d)
    for k in range(order - 1, -1, -1):  # c_{k+1} = F_k / (k + 1), F_k = Σ_{i≤k} A_i c_{k-i} + B_k θ (linearised)
        for i in range(d):
            fbar[i] = cbar[k + 1, i] / (k + 1)
        for n in range(tape.jac_y.shape[0]):
            row, col, node = tape.jac_y[n, 0], tape.jac_y[n, 1], tape.jac_y[n, 2]
            for i in range(k + 1):
                cbar[k - i, col] += jets[node, i] * fbar[row]
        for n in range(tape.jac_p.shape[0]):
            row, col, node = tape.jac_p[n, 0], tape.jac_p[n, 1], tape.jac_p[n, 2]
            out_p[col] += jets[node, k] * fbar[row]
    out_y[:] = cbar[0]


@nb.njit(**JIT)
def coefficients_jacobian(tape, y, t, p, out_y, out_p):
    """``out_y[k] = ∂y^(k)/∂y0`` (``(order + 1, d, d)``) and ``out_p[k] = ∂y^(k)/∂θ``: the recursion's tangents."""
    order, d, n_theta = out_y.shape[0] - 1, y.shape[0], p.shape[0]
    jets = _expand(tape, y, t, p, order)
    dy = np.zeros((order + 1, d, d))
    dp = np.zeros((order + 1, d, n_theta))
    for i in range(d):
        dy[0, i, i] = 1.0
    for k in range(order):
        for n in range(tape.jac_y.shape[0]):
            row, col, node = tape.jac_y[n, 0], tape.jac_y[n, 1], tape.jac_y[n, 2]
            for i in range(k + 1):
                a = jets[node, i] / (k + 1)
                for m in range(d):
                    dy[k + 1, row, m] += a * dy[k - i, col, m]
                for m in range(n_theta):
                    dp[k + 1, row, m] += a * dp[k - i, col, m]
        for n in range(tape.jac_p.shape[0]):
            row, col, node = tape.jac_p[n, 0], tape.jac_p[n, 1], tape.jac_p[n, 2]
            dp[k + 1, row, col] += jets[node, k] / (k + 1)
    factorial = 1.0
    for k in range(order + 1):
        if k:
            factorial *= k
        out_y[k] = factorial * dy[k]
        out_p[k] = factorial * dp[k]


# ---------------------------------------------------------------- the interpreter as C functions
# Each new ODE used to compile the interpreter into its own generated module (with its tape as constants) and
# again into each C callback of it: ≈ 3 s per new vector field. The interpreter is instead compiled once per
# machine into C functions that take the tape as two flat arrays (:func:`pack`) and are registered with LLVM
# under fixed symbol names; a generated function only calls them (:func:`function_ir`).
_HEADER = 7  # n_ops, n_const, n_rows, d, n_theta, n_jac_y, n_jac_p


def pack(tape: Tape, n_theta: int) -> tuple[np.ndarray, np.ndarray]:
    """``tape`` as one int64 array (a header of sizes, then ops, constants' rows, field rows, Jacobian entries)
    and one float64 array (the POWER exponents, then the constants' values): what the C interpreter reads."""
    d = tape.field.shape[0]
    header = [tape.ops.shape[0], tape.const_rows.shape[0], tape.n_rows, d, n_theta, tape.jac_y.shape[0],
              tape.jac_p.shape[0]]
    ints = np.concatenate([np.array(header, dtype=np.int64), tape.ops.ravel(), tape.const_rows, tape.field,
                           tape.jac_y.ravel(), tape.jac_p.ravel()]).astype(np.int64)
    floats = np.concatenate([tape.param, tape.const_values]).astype(np.float64)
    return ints, floats


@nb.njit(**JIT)
def _unpack(ints_ptr, floats_ptr):
    """The :data:`Tape` behind the pointers of a :func:`pack`ed tape, and its ``d`` and ``n_theta``."""
    header = nb.carray(ints_ptr, _HEADER)
    n_ops, n_const, n_rows, d, n_theta, n_y, n_p = (header[0], header[1], header[2], header[3], header[4], header[5],
                                                    header[6])
    ints = nb.carray(ints_ptr, _HEADER + 5 * n_ops + n_const + d + 3 * (n_y + n_p))
    floats = nb.carray(floats_ptr, n_ops + n_const)
    o = _HEADER
    ops = ints[o:o + 5 * n_ops].reshape((n_ops, 5))
    o += 5 * n_ops
    const_rows = ints[o:o + n_const]
    o += n_const
    field = ints[o:o + d]
    o += d
    jac_y = ints[o:o + 3 * n_y].reshape((n_y, 3))
    o += 3 * n_y
    jac_p = ints[o:o + 3 * n_p].reshape((n_p, 3))
    return Tape(ops, floats[:n_ops], const_rows, floats[n_ops:], n_rows, field, jac_y, jac_p), d, n_theta


_I64P, _F64P = nb.types.CPointer(nb.int64), nb.types.CPointer(nb.float64)


def _coefficients_c(ints, floats, y, t, p, out, order):
    tape, d, n_theta = _unpack(ints, floats)
    coefficients(tape, nb.carray(y, d), t, nb.carray(p, n_theta), nb.carray(out, (order + 1, d)))


def _coefficients_vjp_c(ints, floats, y, t, p, weights, out_y, out_p, order):
    tape, d, n_theta = _unpack(ints, floats)
    coefficients_vjp(tape, nb.carray(y, d), t, nb.carray(p, n_theta), nb.carray(weights, (order + 1, d)),
                     nb.carray(out_y, d), nb.carray(out_p, n_theta))


def _coefficients_jacobian_c(ints, floats, y, t, p, out_y, out_p, order):
    tape, d, n_theta = _unpack(ints, floats)
    coefficients_jacobian(tape, nb.carray(y, d), t, nb.carray(p, n_theta), nb.carray(out_y, (order + 1, d, d)),
                          nb.carray(out_p, (order + 1, d, n_theta)))


# The C function behind each generated Taylor-mode function, with its signature; a symbol name carries the version,
# which keeps a process from mixing interpreters.
_INTERPRETERS = {
    "taylor": (_coefficients_c, nb.types.void(_I64P, _F64P, _F64P, nb.float64, _F64P, _F64P, nb.int64)),
    "taylor_vjp": (_coefficients_vjp_c,
                   nb.types.void(_I64P, _F64P, _F64P, nb.float64, _F64P, _F64P, _F64P, _F64P, nb.int64)),
    "taylor_jac": (_coefficients_jacobian_c,
                   nb.types.void(_I64P, _F64P, _F64P, nb.float64, _F64P, _F64P, _F64P, nb.int64)),
}
_registered: dict = {}  # name → its compiled C function, kept alive while LLVM holds its address


def _symbol(name: str) -> str:
    return f"pymc_pnode_{name}_{VERSION}"


def register_interpreter(name: str) -> None:
    """Make the C interpreter of the generated function ``name`` (a key of :data:`_INTERPRETERS`) callable by
    generated functions: compiled, or loaded from numba's cache, at its first registration in a process. An ODE
    registers it before it links a function of :func:`function_ir` (an unresolved symbol would abort the process)."""
    if name not in _registered:
        with COMPILE_LOCK:
            if name not in _registered:
                func, signature = _INTERPRETERS[name]
                compiled = nb.cfunc(signature, **JIT)(func)
                llvm.add_symbol(_symbol(name), compiled.address)
                _registered[name] = compiled


def function_ir(name: str, tape: Tape, n_theta: int, order: int) -> str:
    """LLVM IR of the generated function ``name`` of one vector field (``taylor``, ``taylor_vjp`` or ``taylor_jac``,
    with the C signatures of :class:`pymc_pnode.ode.ODE`'s) for one ``order``: a call of the C interpreter with
    its ``tape`` (with the Jacobians' entries for the last two) as constant arrays. Register the interpreter
    (:func:`register_interpreter`) before the compiled function is linked: an unresolved symbol would abort the
    process."""
    ints, floats = pack(tape, n_theta)
    n_arrays = len(_INTERPRETERS[name][1].args) - 6  # (ints, floats, y, t, p, the arrays, order)
    arrays = [f"a{i}" for i in range(n_arrays)]
    int_values = ", ".join(f"i64 {int(v)}" for v in ints)
    float_values = "[" + ", ".join(f"double {literal(v)}" for v in floats) + "]" if floats.size else "zeroinitializer"
    params = ", ".join(["ptr %y", "double %t", "ptr %p", *[f"ptr %{a}" for a in arrays]])
    call = ", ".join(["ptr @tape.ints", "ptr @tape.floats", "ptr %y", "double %t", "ptr %p",
                      *[f"ptr %{a}" for a in arrays], f"i64 {order}"])
    declared = ", ".join(["ptr", "ptr", "ptr", "double", "ptr", *["ptr"] * n_arrays, "i64"])
    return "\n".join([
        f"@tape.ints = private unnamed_addr constant [{ints.size} x i64] [{int_values}], align 8",
        f"@tape.floats = private unnamed_addr constant [{floats.size} x double] {float_values}, align 8",
        f"declare void @{_symbol(name)}({declared})",
        f"define void @{name}({params}) nounwind {{",
        "entry:",
        f"  call void @{_symbol(name)}({call})",
        "  ret void",
        "}",
        "",
    ])
