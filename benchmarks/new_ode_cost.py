"""What a new vector field costs before its first solve: ``pn.ODE`` and the exact initialisation's functions.

Every filter starts from the exact Taylor coefficients of the solution (``ODE.taylor_coefficients``); likelihood
gradients also need their vector–Jacobian product (``ODE.taylor_vjp``) and forward-mode tangents their Jacobian
(``ODE.taylor_functions``). Each is a generated function of the ODE plus a C callback for the kernels
(:mod:`pymc_pnode._callbacks`). This times, in a fresh process per model and repeat whose generated-code cache
(``PYMC_PNODE_CACHE_DIR``) is empty and whose numba cache is the machine's (library code warm, as a user's is after
the first model): ``ode`` = ``pn.ODE``, ``taylor`` = coefficients and vector–Jacobian product with their C callbacks
(what the Fenrir likelihood needs), ``jac`` = the Jacobian with its callback, and the median time per call of each
from Python (order 3, 15 × 200 calls), with a checksum of their outputs. Then what a user waits for in all: in a
fresh process, FitzHugh–Nagumo's ``pn.ODE``, ``pn.fenrir_loglik`` at its defaults (40 observations of the first state)
with ``pytensor.function`` of it and its gradient, and the first call (the library's Fenrir kernel from the cache).

Models: FitzHugh–Nagumo (d = 2) and Lorenz-96 (d = 10, 50; ``benchmarks/scale.py``'s field). With ``--cold`` every
process also gets an empty numba cache (the first model on a fresh machine; the Fenrir table is skipped).

Run: ``python benchmarks/new_ode_cost.py --repeats 3`` (prints a Markdown table). To compare two trees of the
package, run it with ``PYTHONPATH`` pointing at each in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = {"FitzHugh–Nagumo": 2, "Lorenz-96, d = 10": 10, "Lorenz-96, d = 50": 50}

_MEASURE = r'''
import json, sys, time, timeit
import numpy as np
import pymc_pnode as pn

sys.path.insert(0, {bench_dir!r})
from scale import lorenz96

def fhn(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]

d = {d}
func, k = (fhn, 3) if d == 2 else (lorenz96, 1)
t0 = time.perf_counter()
ode = pn.ODE(func, n_states=d, n_theta=k)
t1 = time.perf_counter()
taylor, vjp = ode.taylor_coefficients(3), ode.taylor_vjp(3)
taylor.address, vjp.address
t2 = time.perf_counter()
jac = ode.taylor_functions(3)[1]
jac.address
t3 = time.perf_counter()
y, p = np.linspace(-1.0, 1.0, d), np.full(k, 0.3)
out, w, gy, gp = np.empty((4, d)), np.ones((4, d)), np.empty(d), np.empty(k)
jy, jp = np.empty((4, d, d)), np.empty((4, d, k))
per_call = []
for f, args in [(taylor, (y, 0.1, p, out)), (vjp, (y, 0.1, p, w, gy, gp)), (jac, (y, 0.1, p, jy, jp))]:
    f(*args)
    per_call.append(float(np.median(timeit.repeat(lambda: f(*args), number=200, repeat=15))) / 200 * 1e6)
print(json.dumps(dict(ode=t1 - t0, taylor=t2 - t1, jac=t3 - t2, per_call=per_call,
                      checksum=float(out.sum() + gy.sum() + gp.sum() + jy.sum() + jp.sum()))))
'''


_FIRST_FENRIR = r'''
import json, time
import numpy as np
import pymc_pnode as pn
import pytensor
import pytensor.tensor as pt

def fhn(y, t, p):
    a, b, c = p[0], p[1], p[2]
    return [c * (y[0] - y[0] ** 3 / 3 + y[1]), -(y[0] - a - b * y[1]) / c]

times = np.linspace(0.5, 20.0, 40)
data = np.sin(times)[:, None]
t0 = time.perf_counter()
ode = pn.ODE(fhn, n_states=2, n_theta=3)
theta = pt.dvector("theta")
ll = pn.fenrir_loglik(ode, [-1.0, 1.0], theta, times, data, obs_matrix=[[1.0, 0.0]], obs_sigma=0.1)
value_and_grad = pytensor.function([theta], [ll, pytensor.grad(ll, theta)])
t1 = time.perf_counter()
value = float(value_and_grad(np.array([0.2, 0.2, 3.0]))[0])
t2 = time.perf_counter()
print(json.dumps(dict(build=t1 - t0, first=t2 - t1, total=t2 - t0, value=value)))
'''


def _fresh_process(code: str, cold: bool = False) -> dict:
    """Run ``code`` in a fresh process with an empty generated-code cache (and numba cache, if ``cold``); its last
    line of output as JSON."""
    with tempfile.TemporaryDirectory() as generated, tempfile.TemporaryDirectory() as numba_cache:
        env = dict(os.environ, PYMC_PNODE_CACHE_DIR=generated)
        if cold:
            env["NUMBA_CACHE_DIR"] = numba_cache
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(d: int, cold: bool = False) -> dict:
    """The phases of the ``d``-state model, in a fresh process."""
    return _fresh_process(_MEASURE.format(bench_dir=os.path.dirname(os.path.abspath(__file__)), d=d), cold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="an empty numba cache in every process too")
    args = parser.parse_args()
    import numpy as np

    import pymc_pnode

    print(f"package: {os.path.dirname(pymc_pnode.__file__)}\n")
    print("| model | pn.ODE [s] | coefficients + VJP [s] | Jacobian [s] | per call: coefficients / VJP / Jacobian [µs] "
          "| checksum |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, d in MODELS.items():
        runs = [measure(d, args.cold) for _ in range(args.repeats)]
        med = {key: float(np.median([r[key] for r in runs])) for key in ("ode", "taylor", "jac")}
        calls = np.median([r["per_call"] for r in runs], axis=0)
        print(f"| {label} | {med['ode']:.2f} | {med['taylor']:.2f} | {med['jac']:.2f} | "
              f"{calls[0]:.2f} / {calls[1]:.2f} / {calls[2]:.2f} | {runs[0]['checksum']:.12g} |", flush=True)
    if args.cold:
        return
    runs = [_fresh_process(_FIRST_FENRIR) for _ in range(args.repeats)]
    med = {key: float(np.median([r[key] for r in runs])) for key in ("build", "first", "total")}
    print("\n| FitzHugh–Nagumo, new model | pn.ODE + fenrir_loglik + pytensor.function [s] | first logp + gradient [s] "
          "| total [s] | log-likelihood |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| median of {args.repeats} | {med['build']:.2f} | {med['first']:.2f} | {med['total']:.2f} | "
          f"{runs[0]['value']:.10g} |")


if __name__ == "__main__":
    main()
