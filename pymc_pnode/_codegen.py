"""Translate graphs of PyTensor scalar operations into straight-line native code.

A vector field written with PyTensor and called on lists of 0-d variables yields a graph of scalar
``Elemwise`` operations only. Each graph (the field, its Jacobians, second derivatives and vector–Jacobian
products) is written as LLVM IR, one instruction or libm call per node, and compiled by llvmlite to a C
function ``void f(double* y, double t, double* p, double* a1, ...)``: nanoseconds per call, where a
``numba_funcify`` of the vector graph costs microseconds (small-array allocations; see DESIGN.md). Written
directly, the IR skips numba's front end, whose typing and lowering of long straight-line functions took most
of a large model's build (Lorenz-96 with 100 states: 4.0 s for the field and its Jacobians, 2.3 s for the
Hessian contraction; docs/benchmarks.md). Compiled functions are cached on disk as object files keyed by the
graph and the host CPU, so a second process only links them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from llvmlite import binding as llvm
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.utils import rewrite_graph

from pymc_pnode._jit import COMPILE_LOCK

CODEGEN_VERSION = "7"

class UnsupportedOperation(TypeError):
    """Raised when a graph holds an operation that has no scalar translation."""


# Every value is a double; a comparison's i1 is widened to 0.0 / 1.0, and a condition is "not 0.0" (NaN counts as
# true, as in Python).
_BINARY = {"Add": "fadd", "Mul": "fmul", "Sub": "fsub", "TrueDiv": "fdiv"}  # Add and Mul take any number
_COMPARE = {"GT": "ogt", "GE": "oge", "LT": "olt", "LE": "ole", "EQ": "oeq", "NEQ": "une"}
# Unary operations by the function they call: libm's, LLVM's intrinsics, or the helpers of _PRELUDE.
_CALL_UNARY = {
    "Exp": "exp", "Expm1": "expm1", "Log": "log", "Log1p": "log1p", "Log2": "log2", "Log10": "log10",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "ArcSin": "asin", "ArcCos": "acos", "ArcTan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Tanh": "tanh", "ArcSinh": "asinh", "ArcCosh": "acosh", "ArcTanh": "atanh",
    "Erf": "erf", "Erfc": "erfc", "Gamma": "tgamma", "GammaLn": "lgamma",
    "Sqrt": "llvm.sqrt.f64", "Floor": "llvm.floor.f64", "Ceil": "llvm.ceil.f64", "Abs": "llvm.fabs.f64",
    "Sigmoid": "pn.sigmoid", "Softplus": "pn.softplus", "Sign": "pn.sign", "Log1mexp": "pn.log1mexp",
}
# Binary ones; maximum and minimum (helpers: NaN propagates, as in NumPy and PyTensor; LLVM's llvm.maximum has no
# x86 lowering in older LLVM versions).
_CALL_BINARY = {"Maximum": "pn.maximum", "ScalarMaximum": "pn.maximum", "Minimum": "pn.minimum",
                "ScalarMinimum": "pn.minimum", "ArcTan2": "atan2", "Pow": "pow", "Mod": "pn.mod"}
LIBM_FUNCTIONS = sorted({name for name in [*_CALL_UNARY.values(), *_CALL_BINARY.values()]
                         if "." not in name})

# The helpers, with Python's semantics where PyTensor's scalar ops follow them (a float modulo takes the sign of
# the divisor), and the numerically stable branches of the logistic functions.
_PRELUDE = """
define internal double @pn.sigmoid(double %x) alwaysinline {
  %pos = fcmp oge double %x, 0.0
  br i1 %pos, label %a, label %b
a:
  %m = fneg double %x
  %e1 = call double @exp(double %m)
  %d1 = fadd double 1.0, %e1
  %r1 = fdiv double 1.0, %d1
  ret double %r1
b:
  %e2 = call double @exp(double %x)
  %d2 = fadd double 1.0, %e2
  %r2 = fdiv double %e2, %d2
  ret double %r2
}

define internal double @pn.softplus(double %x) alwaysinline {
  %big = fcmp ogt double %x, 30.0
  br i1 %big, label %a, label %b
a:
  ret double %x
b:
  %e = call double @exp(double %x)
  %r = call double @log1p(double %e)
  ret double %r
}

define internal double @pn.sign(double %x) alwaysinline {
  %pos = fcmp ogt double %x, 0.0
  %neg = fcmp olt double %x, 0.0
  %zero = fmul double 0.0, %x
  %s = select i1 %neg, double -1.0, double %zero
  %r = select i1 %pos, double 1.0, double %s
  ret double %r
}

define internal double @pn.log1mexp(double %x) alwaysinline {
  %small = fcmp olt double %x, 0xBFE62E42FEFA39EF
  br i1 %small, label %a, label %b
a:
  %e = call double @exp(double %x)
  %m = fneg double %e
  %r1 = call double @log1p(double %m)
  ret double %r1
b:
  %e2 = call double @expm1(double %x)
  %m2 = fneg double %e2
  %r2 = call double @log(double %m2)
  ret double %r2
}

define internal double @pn.mod(double %a, double %b) alwaysinline {
  %r = frem double %a, %b
  %nonzero = fcmp une double %r, 0.0
  %rneg = fcmp olt double %r, 0.0
  %bneg = fcmp olt double %b, 0.0
  %differ = xor i1 %rneg, %bneg
  %shift = and i1 %nonzero, %differ
  %shifted = fadd double %r, %b
  %zero = call double @llvm.copysign.f64(double 0.0, double %b)
  %kept = select i1 %nonzero, double %r, double %zero
  %out = select i1 %shift, double %shifted, double %kept
  ret double %out
}
""" + "".join(f"""
define internal double @pn.{name}(double %a, double %b) alwaysinline {{
  %kept = fcmp {keeps_a} double %a, %b
  %m = select i1 %kept, double %a, double %b
  %nan = fcmp uno double %a, %a
  %r = select i1 %nan, double %a, double %m
  ret double %r
}}
""" for name, keeps_a in (("maximum", "ogt"), ("minimum", "olt")))  # NaN in either argument propagates
# Every function the tables call: libm's and LLVM's by their arity, and the intrinsics the helpers and stores use.
_DECLARATIONS = "\n".join(
    [f"declare double @{name}(double)" for name in sorted(set(_CALL_UNARY.values())) if not name.startswith("pn.")]
    + [f"declare double @{name}(double, double)" for name in sorted(set(_CALL_BINARY.values()))
       if not name.startswith("pn.")]
    + ["declare double @llvm.copysign.f64(double, double)", "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"]
)


def literal(value) -> str:
    """LLVM's notation of a double constant: its bit pattern, exact for every value (also inf and NaN)."""
    return "0x" + np.float64(value).view(np.uint64).item().to_bytes(8, "big").hex().upper()


_ZERO = literal(0.0)


class _Emitter:
    """Writes one instruction per graph node into the body of an LLVM function; shared subexpressions are
    computed once. ``names`` maps a graph variable to its operand (``%y_0``, ``%v12`` or a constant)."""

    def __init__(self, names: dict[Variable, str]):
        self.names = dict(names)
        self.lines: list[str] = []
        self.counter = 0

    def instruction(self, text: str) -> str:
        self.counter += 1
        name = f"%v{self.counter}"
        self.lines.append(f"  {name} = {text}")
        return name

    def ref(self, var: Variable) -> str:
        if var in self.names:
            return self.names[var]
        if isinstance(var, Constant):
            return literal(var.data)
        raise UnsupportedOperation(f"free variable {var} is not an input of the vector field")

    def call(self, function: str, *args: str) -> str:
        return self.instruction(f"call double @{function}({', '.join('double ' + a for a in args)})")

    def truth(self, value: str) -> str:
        return self.instruction(f"fcmp une double {value}, {_ZERO}")

    def widen(self, flag: str) -> str:
        return self.instruction(f"uitofp i1 {flag} to double")

    def product(self, factor: str, n: int) -> str:
        out = factor
        for _ in range(n - 1):
            out = self.instruction(f"fmul double {out}, {factor}")
        return out

    def scalar(self, op, args: list[str], arg_vars: Sequence[Variable]) -> str:
        name = type(op).__name__
        if name.startswith("Convert") or name in ("Identity", "Cast"):
            return args[0]
        if name == "Second":
            return args[1]
        if name in _BINARY:
            out = args[0]
            for arg in args[1:]:
                out = self.instruction(f"{_BINARY[name]} double {out}, {arg}")
            return out
        if name == "Pow" and isinstance(arg_vars[1], Constant):
            k = float(arg_vars[1].data)
            if k == int(k) and 1 <= abs(k) <= 4:  # small integer powers as products
                out = self.product(args[0], int(abs(k)))
                return out if k > 0 else self.instruction(f"fdiv double {literal(1.0)}, {out}")
        if name in _COMPARE:
            return self.widen(self.instruction(f"fcmp {_COMPARE[name]} double {args[0]}, {args[1]}"))
        if name in _CALL_UNARY:
            return self.call(_CALL_UNARY[name], args[0])
        if name in _CALL_BINARY:
            return self.call(_CALL_BINARY[name], args[0], args[1])
        if name == "Neg":
            return self.instruction(f"fneg double {args[0]}")
        if name == "Sqr":
            return self.product(args[0], 2)
        if name == "Reciprocal":
            return self.instruction(f"fdiv double {literal(1.0)}, {args[0]}")
        if name == "Switch":
            return self.instruction(f"select i1 {self.truth(args[0])}, double {args[1]}, double {args[2]}")
        if name == "Clip":
            return self.call("pn.minimum", self.call("pn.maximum", args[0], args[1]), args[2])
        if name == "IntDiv":
            return self.call("llvm.floor.f64", self.instruction(f"fdiv double {args[0]}, {args[1]}"))
        if name in ("AND", "OR"):
            flags = [self.truth(a) for a in args]
            out = flags[0]
            for flag in flags[1:]:
                out = self.instruction(f"{name.lower()} i1 {out}, {flag}")
            return self.widen(out)
        if name == "Invert":
            return self.widen(self.instruction(f"fcmp oeq double {args[0]}, {_ZERO}"))
        if name == "IsNan":
            return self.widen(self.instruction(f"fcmp uno double {args[0]}, {args[0]}"))
        if name == "IsInf":
            magnitude = self.call("llvm.fabs.f64", args[0])
            return self.widen(self.instruction(f"fcmp oeq double {magnitude}, {literal(np.inf)}"))
        raise UnsupportedOperation(f"scalar operation {op} has no native translation")

    def scalar_node(self, op, inputs: Sequence[str], input_vars: Sequence[Variable]) -> list[str]:
        """Emit one scalar op (inlining composites) and return the operands of its outputs."""
        if type(op).__name__ == "Composite":
            inner = _Emitter(dict(zip(op.fgraph.inputs, inputs)))
            inner.counter = self.counter
            for node in op.fgraph.toposort():
                outs = inner.scalar_node(node.op, [inner.ref(i) for i in node.inputs], node.inputs)
                inner.names.update(zip(node.outputs, outs))
            self.counter = inner.counter
            self.lines.extend(inner.lines)
            return [inner.ref(o) for o in op.fgraph.outputs]
        return [self.scalar(op, list(inputs), list(input_vars))]

    def graph(self, inputs: Sequence[Variable], outputs: Sequence[Variable]) -> list[str]:
        fgraph = FunctionGraph(list(inputs), list(outputs), clone=False)
        for node in fgraph.toposort():
            op = node.op
            kind = type(op).__name__
            args = [self.ref(i) for i in node.inputs]
            if kind == "Elemwise" and all(o.ndim == 0 for o in node.outputs):
                outs = self.scalar_node(op.scalar_op, args, node.inputs)
            elif kind == "DimShuffle" and node.outputs[0].ndim == 0 and node.inputs[0].ndim == 0:
                outs = args
            elif kind in ("ScalarFromTensor", "TensorFromScalar"):
                outs = args
            else:
                raise UnsupportedOperation(
                    f"operation {op} (on non-scalar values) has no scalar native translation"
                )
            self.names.update(zip(node.outputs, outs))
        return [self.ref(o) for o in outputs]


def _rewrite(outputs: Sequence[Variable], inputs: Sequence[Variable], include) -> list[Variable]:
    # Rewrite a clone, then map the clone's inputs back: the caller's graph stays untouched and
    # the result is expressed in the caller's input variables.
    fgraph = FunctionGraph(list(inputs), list(outputs), clone=True)
    rewrite_graph(fgraph, include=include)
    return list(clone_replace(fgraph.outputs, replace=dict(zip(fgraph.inputs, inputs))))


def canonicalize(outputs: Sequence[Variable], inputs: Sequence[Variable]) -> list[Variable]:
    """Algebraic simplification that keeps the graph differentiable (no fused composites)."""
    return _rewrite(outputs, inputs, ("canonicalize",)) if outputs else []


def simplify(outputs: Sequence[Variable], inputs: Sequence[Variable]) -> list[Variable]:
    """Full rewrite for emission: canonicalise, stabilise, fuse and merge shared subexpressions."""
    return _rewrite(outputs, inputs, ("canonicalize", "stabilize", "specialize")) if outputs else []


def function_ir(
    fname: str,
    y: Sequence[Variable],
    t: Variable,
    p: Sequence[Variable],
    outputs: dict[str, Sequence[Variable]],
    shapes: dict[str, tuple[int, ...]],
    entries: dict[str, dict[Variable, tuple[int, ...]]] | None = None,
) -> str:
    """LLVM IR of ``void fname(double* y, double t, double* p, double* <entries>..., double* <outputs>...)``
    writing ``outputs[arg][flat index]`` into the C-ordered array ``arg`` of shape ``shapes[arg]``.

    ``entries[arg]`` maps further scalar inputs to their index in an input array ``arg`` (after ``p``; its shape
    also in ``shapes``). An output with more than one zero is zero-filled first, so code and compile time grow
    with its non-zero entries (a Hessian has ``d³`` entries, mostly zero).
    """
    entries = entries or {}
    names: dict[Variable, str] = {t: "%t"}
    load = []

    def load_entry(var: Variable, array: str, flat: int) -> None:
        names[var] = f"%{array}_{flat}"
        load.append(f"  %{array}_{flat}.ptr = getelementptr inbounds double, ptr %{array}, i64 {flat}")
        load.append(f"  %{array}_{flat} = load double, ptr %{array}_{flat}.ptr, align 8")

    for i, v in enumerate(y):
        load_entry(v, "y", i)
    for i, v in enumerate(p):
        load_entry(v, "p", i)
    extra = []
    for arg, index_of in entries.items():
        for v, index in index_of.items():
            load_entry(v, arg, int(np.ravel_multi_index(index, shapes[arg])))
            extra.append(v)
    flat: list[Variable] = []
    spans = {}
    for arg, outs in outputs.items():
        spans[arg] = (len(flat), len(flat) + len(outs))
        flat.extend(outs)
    inputs = [*y, t, *p, *extra]
    emitter = _Emitter(names)
    # Constant outputs (most entries of a sparse Jacobian) go straight to literals: rewriting and ordering a graph of
    # d² outputs costs far more than its few hundred non-constant ones.
    varying = [i for i, v in enumerate(flat) if not isinstance(v, Constant)]
    refs = [literal(v.data) if isinstance(v, Constant) else None for v in flat]
    if varying:
        for i, ref in zip(varying, emitter.graph(inputs, simplify([flat[i] for i in varying], inputs))):
            refs[i] = ref
    store = []
    for arg, (start, stop) in spans.items():
        values = refs[start:stop]
        zeros = sum(ref == _ZERO for ref in values)
        if zeros > 1:
            size = 8 * math.prod(shapes[arg])
            store.append(f"  call void @llvm.memset.p0.i64(ptr %{arg}, i8 0, i64 {size}, i1 false)")
        for k, ref in enumerate(values):
            if zeros > 1 and ref == _ZERO:
                continue
            store.append(f"  %{arg}.out{k} = getelementptr inbounds double, ptr %{arg}, i64 {k}")
            store.append(f"  store double {ref}, ptr %{arg}.out{k}, align 8")
    params = ", ".join(["ptr %y", "double %t", "ptr %p", *[f"ptr %{arg}" for arg in [*entries, *outputs]]])
    return "\n".join([f"define void @{fname}({params}) nounwind {{", "entry:", *load, *emitter.lines, *store,
                      "  ret void", "}"]) + "\n"


def module_ir(functions: Sequence[str]) -> str:
    """A module of :func:`function_ir`'s functions with the declarations and helpers they call."""
    return "\n".join([_DECLARATIONS, _PRELUDE, *functions])


# ---------------------------------------------------------------------------------------------- native modules
# The machine code of a module is specific to this CPU and LLVM: both are part of its cache file's name.
_native_modules: dict[str, "NativeModule"] = {}


@functools.cache
def _host():
    """``(suffix, make_target_machine)`` of this host, with LLVM's native target and libm's functions registered
    (once per process: the object files call libm by symbol name)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.CDLL(ctypes.util.find_library("m") or None)
    for name in LIBM_FUNCTIONS:
        llvm.add_symbol(name, ctypes.cast(getattr(libm, name), ctypes.c_void_p).value)
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    target = llvm.Target.from_default_triple()

    def make_target_machine():
        return target.create_target_machine(cpu=cpu, features=features, opt=2, codemodel="jitdefault",
                                            jit=True)

    suffix = source_key(llvm.get_process_triple(), cpu, features, repr(llvm.llvm_version_info))[:12]
    return suffix, make_target_machine


class NativeModule:
    """The functions of one generated module, linked into this process (kept alive with this object)."""

    def __init__(self, object_code: bytes, make_target_machine):
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), make_target_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
        self._engine.finalize_object()

    def address(self, name: str) -> int:
        """The address of the C function ``name``."""
        address = self._engine.get_function_address(name)
        if not address:
            raise KeyError(f"no function {name!r} in the generated module")
        return address


def load_native(key: str, functions: Sequence[str] | None = None,
                before_link: Callable[[], None] | None = None) -> NativeModule | None:
    """The native module ``key``: linked from its cached object file, or first compiled from ``functions`` (the IR
    of :func:`function_ir`'s) and cached. None when it is not cached and no functions were given. ``before_link``
    runs first when a module is linked in this process (registering the symbols it calls: an unresolved symbol
    aborts the process)."""
    with COMPILE_LOCK:
        if key in _native_modules:
            return _native_modules[key]
        suffix, make_target_machine = _host()
        path = cache_dir() / f"pnode_{key}_{suffix}.o"
        if path.exists():
            object_code = path.read_bytes()
        elif functions is None:
            return None
        else:
            module = llvm.parse_assembly(module_ir(functions))
            module.verify()
            # No IR passes: the graph arrives simplified and merged; LLVM's O2 pipeline before code generation
            # changed neither compile nor call times (Lorenz-96 d = 100, Navier–Stokes K = 3, FitzHugh–Nagumo).
            object_code = make_target_machine().emit_object(module)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")  # atomic: other processes may write it too
            with os.fdopen(fd, "wb") as fh:
                fh.write(object_code)
            os.replace(tmp, path)
        if before_link is not None:
            before_link()
        _native_modules[key] = NativeModule(object_code, make_target_machine)
        return _native_modules[key]


def cache_dir() -> Path:
    """Directory of the compiled modules (``PYMC_PNODE_CACHE_DIR``, else ``~/.cache/pymc_pnode``)."""
    root = os.environ.get("PYMC_PNODE_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "pymc_pnode"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write_probe"
        probe.touch()
        probe.unlink()
    except OSError:
        path = Path(tempfile.gettempdir()) / "pymc_pnode_cache"
        path.mkdir(parents=True, exist_ok=True)
    return path


def source_key(*parts: str) -> str:
    h = hashlib.sha256(CODEGEN_VERSION.encode())
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]
