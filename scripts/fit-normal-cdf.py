#!/usr/bin/env python3
"""Fits Q(t) of Note [Vectorisable float math] (ember/kernels/cpu/vec_math.h): erfc(z) = t e^(-z^2) Q(t) with
t = 1 / (1 + z/2), so Q(t) = erfcx(z) / t on t in (0, 1] (z in [0, inf)). Weighted least squares for relative error
on Chebyshev nodes, in double, against mpmath at 30 digits; prints the monomial coefficients (constant term first)
rounded to float and the fit's relative error. Needs numpy and mpmath (pip); not used by the build.
"""
import mpmath as mp
import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P

mp.mp.dps = 30
DEGREE = 10


def q_exact(t):
    z = 2 * (1 / t - 1)
    return float(mp.erfc(z) * mp.exp(z * z) / t)


ts = 0.5 * (1 - np.cos(np.linspace(0, np.pi, 4000)))[1:]  # Chebyshev-spaced points of (0, 1]
y = np.array([q_exact(mp.mpf(t)) for t in ts])
cheb = C.chebfit(2 * ts - 1, y, DEGREE, w=1 / y)  # in x = 2t - 1
mono = np.zeros(1)
for k, a in enumerate(C.cheb2poly(cheb)):
    mono = P.polyadd(mono, a * P.polypow([-1, 2], k))
mono32 = mono.astype(np.float32)
err = (P.polyval(ts, mono32.astype(np.float64)) - y) / y
print("coefficients (t^0 first):", ", ".join("%.9e" % c for c in mono32))
print("max relative error with float coefficients, evaluated in double: %.3g" % np.abs(err).max())
