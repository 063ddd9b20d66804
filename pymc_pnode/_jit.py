"""numba compilation in one place: the options of every kernel, deferred compilation, and the registration of
PyTensor Ops with PyTensor's numba backend (``mode="NUMBA"``, nutpie)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import numba as nb
import numpy as np
from numba.core.imputils import impl_ret_borrowed

# Compilation options of every kernel of the package: cached on disk, NumPy's error model (no exceptions
# in division), no GIL.
JIT = dict(cache=True, error_model="numpy", nogil=True)

# Options of the filter operations (``pymc_pnode.filtering``), on top of :data:`JIT`. Only FMA
# contraction: reassociation made the small loops 2× slower, and nnan/ninf would break the divergence
# checks. ``forceinline`` has LLVM inline every helper into the kernel that calls it (and the kernels into
# their Python entry wrappers): no call overhead for the dozen array-passing calls per step, and the
# kernels' fixed sizes reach the helpers' loops. It makes the Fenrir logp + gradient ≈ 1.5× faster, at ≈ 65 s
# more cold compile time for a FitzHugh–Nagumo kernel (117 against 50 s; benchmarks/results/compile_profile.md).
# numba compiles each force-inlined function on its own as well, to machine code that is never called; the
# large phases that a kernel calls once (the forward pass) are therefore inlined at numba's IR level
# (``inline="always"``), which skips that compile (the Fenrir kernel: 109 → 71 s, same run time).
# Every kernel with these options compiles with the SLP vectoriser (:func:`slp_vectorization`): numba
# optimises a helper once, inside the first kernel that needs it, caches that bitcode and inlines it into
# every later kernel, so helpers shared by kernels compiled with different LLVM settings made a kernel's speed
# depend on which kernel a process compiled first (docs/benchmarks.md, "Which kernel compiles a helper first").
INLINE_JIT = dict(JIT, fastmath={"contract"}, forceinline=True)

# Held by every compile-on-first-use path (generated vector-field modules, the Fenrir kernels, deferred
# kernels): nutpie runs chains in threads, and their first evaluations would otherwise compile or import
# the same code at once. With a cold cache one thread then read a half-imported generated module (an
# AttributeError inside the sampler's logp: "All initialization points failed", then a segfault).
COMPILE_LOCK = threading.RLock()


class CompiledOnFirstUse:
    """A numba kernel with an explicit signature, compiled (or loaded from the disk cache) at its first call.

    ``@nb.njit(signature)`` compiles at import; a large kernel then costs every ``import pymc_pnode`` on a
    fresh machine its compile time (``run_filter``: ≈ 17 s) whether it is used or not. Call it like the
    function, from Python or from other compiled code; ``.dispatcher`` is the numba dispatcher. Kernels
    with :data:`INLINE_JIT` options compile with the SLP vectoriser, as the Fenrir kernels do.
    """

    def __init__(self, func, signature, options):
        self.py_func = func
        self._signature = signature
        self._options = options
        self._dispatcher = None
        self._entry_point = None
        functools.update_wrapper(self, func)

    @property
    def dispatcher(self):
        if self._dispatcher is None:
            with COMPILE_LOCK:
                if self._dispatcher is None:
                    inlines_filter_helpers = self._options.get("forceinline", False)
                    with slp_vectorization() if inlines_filter_helpers else contextlib.nullcontext():
                        self._dispatcher = nb.njit(self._signature, **self._options)(self.py_func)
        return self._dispatcher

    @property
    def entry_point(self) -> Callable:
        """The compiled function without the dispatcher's type resolution of the arguments: a few
        microseconds less per call from Python (most for named tuples), for
        arguments of exactly the signature's types."""
        if self._entry_point is None:
            dispatcher = self.dispatcher
            self._entry_point = dispatcher.overloads[dispatcher.signatures[0]].entry_point
        return self._entry_point

    def __call__(self, *args):
        return self.dispatcher(*args)


@nb.extending.typeof_impl.register(CompiledOnFirstUse)
def _typeof_compiled_on_first_use(value, context):
    # Called from other compiled code, the kernel is its dispatcher (compiled then, if not yet).
    return nb.typeof(value.dispatcher, context.purpose)


class VectorisedEntryPoint:
    """A filter kernel called from Python without an explicit signature (``nb.njit(**INLINE_JIT)``, compiled per
    argument types), whose compiles run with the SLP vectoriser as :class:`CompiledOnFirstUse`'s do.

    Compiled outside that setting, such an entry point (``smooth``) was 3–6 % slower, and numba would cache the
    filter helpers it inlines unvectorised for every later kernel (docs/benchmarks.md, "Which kernel compiles a
    helper first"). The dispatcher's own compilation stays disabled, so a call with known types costs nothing
    extra; one with new types fails to match, and is compiled here (or loaded from the disk cache).
    """

    def __init__(self, func):
        self.dispatcher = nb.njit(**INLINE_JIT)(func)
        functools.update_wrapper(self, func)

    def __call__(self, *args):
        dispatcher = self.dispatcher
        if dispatcher.signatures:  # (compilation disabled after the first)
            try:
                return dispatcher(*args)
            except TypeError:
                types = tuple(dispatcher.typeof_pyval(a) for a in args)
                if types in dispatcher.overloads:
                    raise  # raised by the kernel itself
        else:
            types = tuple(dispatcher.typeof_pyval(a) for a in args)
        with COMPILE_LOCK, slp_vectorization():
            dispatcher.disable_compile(False)
            try:
                dispatcher.compile(types)
            finally:
                dispatcher.disable_compile(bool(dispatcher.signatures))  # (numba refuses it before a first one)
        return dispatcher(*args)


def vectorised_entry_point(func) -> VectorisedEntryPoint:
    """Decorator: :class:`VectorisedEntryPoint`."""
    return VectorisedEntryPoint(func)


def compile_on_first_use(signature, **options):
    """Decorator: ``nb.njit(signature, **options)``, deferred to the first call (:class:`CompiledOnFirstUse`)."""
    return lambda func: CompiledOnFirstUse(func, signature, options)


@contextlib.contextmanager
def slp_vectorization() -> Iterator[None]:
    """Let LLVM's SLP vectoriser run on what numba compiles inside this block.

    numba switches it off by default (numba PR 8852, after miscompilations reported with older LLVM
    versions). With the helpers inlined and their sizes fixed, it turns the unrolled 8-wide loops of
    the Fenrir kernel into AVX instructions: logp + gradient ≈ 1.2× faster. Used for every kernel that
    inlines the filter operations (:data:`INLINE_JIT`). Only what is compiled here is affected (the setting
    is read when a module is optimised, and restored afterwards); the tests compare the kernels' results with
    independent dense computations and central differences.
    """
    previous = nb.config.SLP_VECTORIZE
    nb.config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        nb.config.SLP_VECTORIZE = previous


def readonly(x, dtype=np.float64) -> np.ndarray:
    """A read-only C-contiguous view (or copy) of ``x`` with ``dtype``, as the kernels' signatures type their
    inputs (PyTensor's numba backend passes constants read-only)."""
    arr = np.ascontiguousarray(x, dtype=dtype)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


@nb.extending.intrinsic
def as_readonly(typingctx, arr):
    """Inside compiled code: ``arr`` typed as read-only, to match the kernels' read-only signatures.

    numba converts a writable array argument to a read-only parameter by itself, but not the arrays
    inside a named tuple; this cast (the same data, a new reference) does it for the bundles.
    """
    if not isinstance(arr, nb.types.Array):
        return None

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return arr.copy(readonly=True)(arr), codegen


def register_numba(op_type: type, make_function: Callable, object_mode_outputs=None) -> None:
    """Register ``op_type`` with PyTensor's numba backend (``mode="NUMBA"``, nutpie).

    ``make_function(op)`` returns a Python function of the Op's inputs that computes its outputs (a tuple of
    arrays, or one array). With ``object_mode_outputs`` (the numba type of those outputs) the compiled graph
    calls it in numba's object mode: through Python (≈ 20 µs per call) to the package's already compiled
    kernels, instead of inlining a copy of them into every graph (≈ 20 s of compilation per Op, measured),
    and the accuracy counts of every evaluation keep working. Without, the function is compiled into the
    graph (it must be numba code calling compiled kernels; cheap to compile when they are). PyTensor does
    not cache either on disk: the functions hold addresses of this process's vector-field callbacks
    (:mod:`pymc_pnode._callbacks`).
    """
    from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_and_cache_key

    @register_funcify_and_cache_key(op_type)
    def _funcify(op, node=None, **kwargs):
        run = make_function(op)
        if object_mode_outputs is None:
            return numba_njit(run), None

        @numba_njit
        def object_mode_op(*inputs):
            with nb.objmode(outputs=object_mode_outputs):
                outputs = run(*inputs)
            return outputs

        return object_mode_op, None
