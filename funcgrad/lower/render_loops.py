"""LLVM IR text for the CPU device: the function builder every LLVM renderer writes with, and the plain
loop nests (``render_loops``) that ``render_llvm`` renders a kernel as unless its opts choose a register
tile (``render_tile``) or a blocked transpose (``render_transpose``). Those two build on this module;
``render_llvm.render_llvm`` is the entry point that picks one.

The generated function is ``void @name(ptr %out0.., ptr %in0.., i64 %start, i64 %end)``: it runs
the outermost global loop ``g0`` over ``[start, end)`` (so a caller can split the work across
threads) and every other loop in full. Loop counters and the accumulator live in allocas and the
code is deliberately plain; LLVM's O3 (mem2reg, LICM, the loop vectorizer) makes it fast.

Everything op-specific is data: ``FLOAT_OPS`` / ``INT_OPS`` map an ALU name to an instruction
template, ``CASTS`` maps (from-class, to-class) to one, ``REDUCE_IDENTITY`` gives each reduction's
start value. Templates write their result to ``{out}`` and may use temporaries ``{out}.suffix``.
float16 and bfloat16 are computed in float32 and rounded back after every operation, exactly as
the NumPy reference (``funcgrad.ir.primitives``) does. bool is ``i1`` in registers, ``i8`` in
memory. Loads are not bounds-checked: the scheduler makes every index in range (the NumPy
reference evaluator would raise on an out-of-range one).
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.dtypes import ml_dtypes  # imported on first use
from funcgrad.ir.primitives import with_cost
from funcgrad.lower.kernel import (
    BOOL,
    COMPARISONS,
    PARTIAL_SUM_MIN,
    Kernel,
    KExpr,
    Opt,
    comparison_breaks,
    dtype_class,
    dtype_name,
    flat_index,
    fold_comparisons,
    pi_scaled,
    simplify_index,
    two_over_pi_words,
    var,
    with_args,
)

__all__ = ["begin_kernel", "render_loops", "llvm_function_name", "LLVM_TYPES"]

LLVM_TYPES = {"bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "i8",
              "uint16": "i16", "uint32": "i32", "uint64": "i64", "float16": "half", "bfloat16": "bfloat",
              "float32": "float", "float64": "double"}
FLOAT32 = np.dtype(np.float32)


def value_type(dtype: np.dtype) -> str:
    return LLVM_TYPES[dtype_name(dtype)]


def memory_type(dtype: np.dtype) -> str:
    return "i8" if dtype_name(dtype) == "bool" else value_type(dtype)


op_class = dtype_class  # the kernel IR's dtype classes


# --- ALU templates -------------------------------------------------------------------------------
# Placeholders: {out} result, {x} {y} operands, {t} operand type, {s} intrinsic suffix (f32, i64),
# {f} libm suffix ('f' for float, '' for double), {bits} width; for integers the signedness words
# {div} {rem} {shr} {lt} {le} {gt} {ge} {max} {min} {sign} (see INT_WORDS).

def _intrinsic(name: str, arity: int = 1) -> str:
    operands = ", ".join(f"{{t}} {{{a}}}" for a in "xy"[:arity])
    return f"{{out}} = call {{t}} @llvm.{name}.{{s}}({operands})"


def _libm(name: str, arity: int = 1) -> str:
    operands = ", ".join(f"{{t}} {{{a}}}" for a in "xy"[:arity])
    return f"{{out}} = call {{t}} @{name}{{f}}({operands})"


FLOAT_OPS: dict[str, str] = {
    "neg": "{out} = fneg {t} {x}",
    "abs": _intrinsic("fabs"),
    "sign": """{out}.pos = fcmp ogt {t} {x}, 0.0
{out}.neg = fcmp olt {t} {x}, 0.0
{out}.zero = fcmp oeq {t} {x}, 0.0
{out}.a = select i1 {out}.zero, {t} 0.0, {t} {x}
{out}.b = select i1 {out}.neg, {t} -1.0, {t} {out}.a
{out} = select i1 {out}.pos, {t} 1.0, {t} {out}.b""",
    **{op: _intrinsic(op) for op in ("exp", "log", "exp2", "log2", "sin", "cos", "tan", "asin", "acos", "atan",
                                     "sinh", "cosh", "tanh", "sqrt", "floor", "ceil")},
    **{op: _libm(op) for op in ("expm1", "log1p", "asinh", "acosh", "atanh", "erf")},
    "rsqrt": "{out}.root = call {t} @llvm.sqrt.{s}({t} {x})\n{out} = fdiv {t} 1.0, {out}.root",
    "logistic": """{out}.half = fmul {t} {x}, 0.5
{out}.tanh = call {t} @llvm.tanh.{s}({t} {out}.half)
{out}.scaled = fmul {t} {out}.tanh, 0.5
{out} = fadd {t} {out}.scaled, 0.5""",
    "round": _intrinsic("roundeven"),
    "is_finite": "{out}.abs = call {t} @llvm.fabs.{s}({t} {x})\n{out} = fcmp olt {t} {out}.abs, 0x7FF0000000000000",
    "add": "{out} = fadd {t} {x}, {y}",
    "sub": "{out} = fsub {t} {x}, {y}",
    "mul": "{out} = fmul {t} {x}, {y}",
    "div": "{out} = fdiv {t} {x}, {y}",
    "rem": "{out} = frem {t} {x}, {y}",
    "pow": _intrinsic("pow", 2),
    "max": _intrinsic("maximum", 2),  # NaN-propagating, like np.maximum
    "min": _intrinsic("minimum", 2),
    "atan2": _intrinsic("atan2", 2),
    "eq": "{out} = fcmp oeq {t} {x}, {y}",
    "ne": "{out} = fcmp une {t} {x}, {y}",
    "lt": "{out} = fcmp olt {t} {x}, {y}",
    "le": "{out} = fcmp ole {t} {x}, {y}",
    "gt": "{out} = fcmp ogt {t} {x}, {y}",
    "ge": "{out} = fcmp oge {t} {x}, {y}",
}

# float32 exp, tanh, log, log2, log1p and expm1 written out as plain arithmetic (Cephes-style range
# reduction and minimax polynomials evaluated with fused multiply-adds, the scale by 2^n as llvm.ldexp:
# one vscalefps), so the loop vectorizer turns them into AVX-512 code instead of one libm call per
# element. Measured against float64 over every 64th float32: exp within 0.97 ulp, tanh within 1.2 ulp;
# over every 256th: log 0.82, log2 1.18, log1p 0.82, expm1 1.42 ulp (docs/architecture.md).
# float64 keeps the intrinsics.
def _f32(value: float) -> str:
    """A float32 constant in LLVM's exact hexadecimal (double-width) notation."""
    return "0x" + struct.pack(">d", float(np.float32(value))).hex().upper()


def _f64(value: float) -> str:
    """A float64 constant in LLVM's exact hexadecimal notation."""
    return "0x" + struct.pack(">d", float(value)).hex().upper()


def _horner(name: str, x: str, coefficients: tuple[float, ...], t: str = "float") -> list[str]:
    """Lines evaluating c0*x^(n-1) + ... + c(n-1) by Horner's rule with fused multiply-adds into
    ``{name}1..``, in type ``t`` (float or double); the last line's value is the polynomial."""
    constant, suffix = (_f32, "f32") if t == "float" else (_f64, "f64")
    lines = []
    previous = constant(coefficients[0])
    for position, c in enumerate(coefficients[1:], start=1):
        lines.append(f"{name}{position} = call {t} @llvm.fmuladd.{suffix}({t} {previous}, {t} {x}, {t} {constant(c)})")
        previous = f"{name}{position}"
    return lines


# Cephes expf: x = n ln2 + r (ln2 split in two, n * the first part exact), exp(r) ~ 1 + r + r^2 P(r)
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Cephes tanhf for |x| < 0.625: x + x^3 P(x^2)
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)


def _exp_reduced(out: str, x: str) -> list[str]:
    """x = n ln 2 + r (``{out}.n``, ``{out}.r``; ln 2 in two parts, n times the first exact) and
    ``{out}.p`` = expm1(r) = r + r^2 P(r)."""
    return [
        f"{out}.t = fmul float {x}, {_f32(1.44269504088896341)}",
        f"{out}.n = call float @llvm.roundeven.f32(float {out}.t)",
        f"{out}.r1 = call float @llvm.fmuladd.f32(float {out}.n, float {_f32(-0.693359375)}, float {x})",
        f"{out}.r = call float @llvm.fmuladd.f32(float {out}.n, float {_f32(2.12194440e-4)}, float {out}.r1)",
        *_horner(f"{out}.q", f"{out}.r", _EXP_POLY),
        f"{out}.rr = fmul float {out}.r, {out}.r",
        f"{out}.p = call float @llvm.fmuladd.f32(float {out}.q5, float {out}.rr, float {out}.r)",
    ]


def _exp_core(out: str, x: str) -> list[str]:
    """exp of ``x`` into ``out`` for x in [-104, 88.75] (not NaN): the result is y * 2^n by ldexp,
    which rounds once into the denormal range and overflows to inf above log(FLT_MAX)."""
    return [
        *_exp_reduced(out, x),
        f"{out}.y = fadd float {out}.p, 1.0",
        f"{out}.ni = fptosi float {out}.n to i32",
        f"{out} = call float @llvm.ldexp.f32.i32(float {out}.y, i32 {out}.ni)",
    ]


# exp(x) rounds to +0 below ln(2^-150) = -103.9720771 (EXP_ZERO_BELOW: the float32 just under it).
# Those lanes compute exp(0) and select 0: scaling into the underflow range costs a microcode assist
# per element on Intel (a causal mask's -1e9 scores made a softmax's exps 7x slower; docs/performance.md)
EXP_ZERO_BELOW = -103.97208
FLOAT32_EXP = "\n".join([
    "{out}.lo = call float @llvm.maxnum.f32(float {x}, float -104.0)",  # NaN becomes -104: selected back below
    "{out}.xc = call float @llvm.minnum.f32(float {out}.lo, float 88.75)",
    f"{{out}}.zero = fcmp olt float {{out}}.xc, {_f32(EXP_ZERO_BELOW)}",
    "{out}.xs = select i1 {out}.zero, float 0.0, float {out}.xc",
    *_exp_core("{out}.e", "{out}.xs"),
    "{out}.ez = select i1 {out}.zero, float 0.0, float {out}.e",
    "{out}.nan = fcmp uno float {x}, 0.0",
    "{out} = select i1 {out}.nan, float {x}, float {out}.ez",
])

# tanh(|x|) for |x| >= 0.625 is 1 - 2 / (exp(2|x|) + 1); |x| is clamped to 10 first (tanh rounds to 1
# beyond ~9.1), so exp needs no clamp and NaN takes the polynomial branch (fcmp ult), which keeps it
FLOAT32_TANH = "\n".join([
    "{out}.a = call float @llvm.fabs.f32(float {x})",
    "{out}.z = fmul float {x}, {x}",
    *_horner("{out}.s", "{out}.z", _TANH_POLY),
    "{out}.s5 = fmul float {out}.s4, {out}.z",
    "{out}.small = call float @llvm.fmuladd.f32(float {out}.s5, float {x}, float {x})",
    "{out}.ac = call float @llvm.minnum.f32(float {out}.a, float 10.0)",
    "{out}.two = fmul float {out}.ac, 2.0",
    *_exp_core("{out}.e", "{out}.two"),
    "{out}.den = fadd float {out}.e, 1.0",
    "{out}.frac = fdiv float 2.0, {out}.den",
    "{out}.big = fsub float 1.0, {out}.frac",
    "{out}.signed = call float @llvm.copysign.f32(float {out}.big, float {x})",
    "{out}.issmall = fcmp ult float {out}.a, 0.625",
    "{out}.small.signed = call float @llvm.copysign.f32(float {out}.small, float {x})",
    "{out} = select i1 {out}.issmall, float {out}.small.signed, float {out}.signed",
])

FLOAT32_LOGISTIC = ("{out}.half = fmul float {x}, 0.5\n"
                    + FLOAT32_TANH.replace("{x}", "<HALF>").replace("{out}", "{out}.th").replace("<HALF>", "{out}.half")
                    + "\n{out}.scaled = fmul float {out}.th, 0.5\n{out} = fadd float {out}.scaled, 0.5")

# Cephes logf: x = 2^e * m with m in [sqrt(1/2), sqrt(2)) (denormals scaled by 2^23 first, the bits read
# as integers), f = m - 1 exactly, log(1 + f) ~ f - f^2/2 + f^3 P(f), and e * ln 2 added in two parts
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_FLOAT32_MIN_NORMAL = 1.17549435e-38
_NAN = "0x7FF8000000000000"


def _log_core(out: str, x: str) -> list[str]:
    """For x > 0 and finite: ``{out}.e`` (the exponent, as a float), ``{out}.f`` (m - 1) and ``{out}.y``
    (log(1 + f) - f: the polynomial's part, -f^2/2 included), so that log(x) = f + y + e ln 2."""
    return [
        f"{out}.tiny = fcmp olt float {x}, {_f32(_FLOAT32_MIN_NORMAL)}",
        f"{out}.big = fmul float {x}, {_f32(2.0 ** 23)}",
        f"{out}.xn = select i1 {out}.tiny, float {out}.big, float {x}",
        f"{out}.bits = bitcast float {out}.xn to i32",
        f"{out}.biased = lshr i32 {out}.bits, 23",
        f"{out}.frac = and i32 {out}.bits, 8388607",
        f"{out}.half = or i32 {out}.frac, 1056964608",  # the exponent of 0.5: m in [0.5, 1)
        f"{out}.m = bitcast i32 {out}.half to float",
        f"{out}.low = fcmp olt float {out}.m, {_f32(0.707106781186547524)}",
        f"{out}.bias = select i1 {out}.tiny, i32 149, i32 126",
        f"{out}.e0 = sub i32 {out}.biased, {out}.bias",
        f"{out}.dec = zext i1 {out}.low to i32",
        f"{out}.ei = sub i32 {out}.e0, {out}.dec",
        f"{out}.e = sitofp i32 {out}.ei to float",
        f"{out}.m2 = fadd float {out}.m, {out}.m",
        f"{out}.mm = select i1 {out}.low, float {out}.m2, float {out}.m",
        f"{out}.f = fsub float {out}.mm, 1.0",
        f"{out}.z = fmul float {out}.f, {out}.f",
        *_horner(f"{out}.p", f"{out}.f", _LOG_POLY),
        f"{out}.pf = fmul float {out}.p{len(_LOG_POLY) - 1}, {out}.f",
        f"{out}.pz = fmul float {out}.pf, {out}.z",
        f"{out}.y = call float @llvm.fmuladd.f32(float {out}.z, float -0.5, float {out}.pz)",
    ]


def _log_specials(out: str, x: str, value: str) -> list[str]:
    """``out`` = ``value`` for x > 0 finite; log's +inf at +inf, -inf at +-0, NaN below 0, x where NaN."""
    return [
        f"{out}.atinf = fcmp oeq float {x}, 0x7FF0000000000000",
        f"{out}.vi = select i1 {out}.atinf, float 0x7FF0000000000000, float {value}",
        f"{out}.atzero = fcmp oeq float {x}, 0.0",
        f"{out}.vz = select i1 {out}.atzero, float 0xFFF0000000000000, float {out}.vi",
        f"{out}.negative = fcmp olt float {x}, 0.0",
        f"{out}.vn = select i1 {out}.negative, float {_NAN}, float {out}.vz",
        f"{out}.nan = fcmp uno float {x}, 0.0",
        f"{out} = select i1 {out}.nan, float {x}, float {out}.vn",
    ]


def _log_sum(out: str, correction: str | None = None) -> list[str]:
    """``{out}.r`` = f + y + e ln 2 from ``_log_core(out + ".c", ...)`` in Cephes' order of additions
    (ln 2 in two parts), with ``correction`` added among the small terms."""
    small = f"{out}.y1"
    lines = [f"{out}.y1 = call float @llvm.fmuladd.f32(float {out}.c.e, float {_f32(-2.12194440e-4)}, "
             f"float {out}.c.y)"]
    if correction is not None:
        small = f"{out}.y2"
        lines.append(f"{out}.y2 = fadd float {out}.y1, {correction}")
    return [*lines, f"{out}.r1 = fadd float {out}.c.f, {small}",
            f"{out}.r = call float @llvm.fmuladd.f32(float {out}.c.e, float {_f32(0.693359375)}, float {out}.r1)"]


def _log_lines(out: str, x: str) -> list[str]:
    """Natural log of ``x`` into ``out``, every float32 input."""
    return [*_log_core(f"{out}.c", x), *_log_sum(out), *_log_specials(out, x, f"{out}.r")]


_LOG2E_MINUS_1 = 0.44269504088896340736  # log2(e) - 1: f * log2(e) = f + f * this, without rounding log2(e)
FLOAT32_LOG = "\n".join(_log_lines("{out}", "{x}"))
FLOAT32_LOG2 = "\n".join([
    *_log_core("{out}.c", "{x}"),
    f"{{out}}.a = fmul float {{out}}.c.y, {_f32(_LOG2E_MINUS_1)}",
    f"{{out}}.b = call float @llvm.fmuladd.f32(float {{out}}.c.f, float {_f32(_LOG2E_MINUS_1)}, float {{out}}.a)",
    "{out}.s1 = fadd float {out}.b, {out}.c.y",
    "{out}.s2 = fadd float {out}.s1, {out}.c.f",
    "{out}.r = fadd float {out}.s2, {out}.c.e",
    *_log_specials("{out}", "{x}", "{out}.r"),
])
# log1p(x) = log(u) + (x - (u - 1)) / u for u = 1 + x rounded: the correction, what the rounding of u
# dropped, joins log's small terms before the last addition; x itself where u rounds to 1 (-0 kept)
FLOAT32_LOG1P = "\n".join([
    "{out}.u = fadd float {x}, 1.0",
    *_log_core("{out}.c", "{out}.u"),
    "{out}.d = fsub float {out}.u, 1.0",
    "{out}.dx = fsub float {x}, {out}.d",
    "{out}.k = fdiv float {out}.dx, {out}.u",
    *_log_sum("{out}", correction="{out}.k"),
    "{out}.one = fcmp oeq float {out}.d, 0.0",
    "{out}.ro = select i1 {out}.one, float {x}, float {out}.r",
    *_log_specials("{out}", "{out}.u", "{out}.ro"),
])
# expm1(x) = 2^n (expm1(r) + 1 - 2^-n) for x = n ln 2 + r: exp's polynomial without its final + 1 is
# expm1(r); x is clamped to [-20, 88.75] (expm1 rounds to -1 below -17.4, overflows above 88.73), and
# 0 (either sign) and NaN are returned as they came
FLOAT32_EXPM1 = "\n".join([
    "{out}.lo = call float @llvm.maxnum.f32(float {x}, float -20.0)",
    "{out}.xc = call float @llvm.minnum.f32(float {out}.lo, float 88.75)",
    *_exp_reduced("{out}", "{out}.xc"),
    "{out}.ni = fptosi float {out}.n to i32",
    "{out}.nn = sub i32 0, {out}.ni",
    "{out}.inv = call float @llvm.ldexp.f32.i32(float 1.0, i32 {out}.nn)",
    "{out}.s = fsub float 1.0, {out}.inv",
    "{out}.v = fadd float {out}.p, {out}.s",
    "{out}.e = call float @llvm.ldexp.f32.i32(float {out}.v, i32 {out}.ni)",
    "{out}.keep = fcmp ueq float {x}, 0.0",
    "{out} = select i1 {out}.keep, float {x}, float {out}.e",
])

# sin and cos of float32, in double from the reduction on: x = (j + f) pi/2 with |f| <= 1/2, then
# sin(f pi/2) or cos(f pi/2) by j mod 4, their Taylor series to r^11 and r^12 (under 2^-28 relative
# on |r| <= pi/4), rounded once to float32 at the end.
# Below 2^20, Cody and Waite in double: pi/2 in three parts of 33, 33 and 53 bits, so j * each of
# the first two is exact. From 2^20 (to inf), Payne and Hanek: the float's 24-bit integer m times
# the 96 bits of 2/pi that the exponent selects (word w of `two_over_pi_words` is chosen by selects
# among the constants: w <= 4 for any float32), bits 95..32 of the product holding the quadrant and
# 62 bits of f. Both run on every lane (the other reads a safe value) and a select picks one.
_PIO2_BITS = pi_scaled(200) >> 1  # floor(pi/2 * 2^200)
_PIO2_1 = (_PIO2_BITS >> 168) / 2.0 ** 32
_PIO2_2 = ((_PIO2_BITS >> 135) & ((1 << 33) - 1)) / 2.0 ** 65
_PIO2_3 = (_PIO2_BITS & ((1 << 135) - 1)) / 2.0 ** 200
_SIN_POLY = tuple((-1) ** k / float(np.prod(np.arange(1, 2 * k + 2, dtype=np.float64))) for k in range(5, 0, -1))
_COS_POLY = tuple((-1) ** k / float(np.prod(np.arange(1, 2 * k + 1, dtype=np.float64))) for k in range(6, 0, -1))
_TWO_OVER_PI = two_over_pi_words(8)
TRIG_LARGE = 2.0 ** 20


def _signed32(word: int) -> int:
    return word - (1 << 32) if word >> 31 else word


def _table_word(out: str, k: int) -> list[str]:
    """``out`` = word w + k of the 2/pi table (zero-extended), for w in 0..4 (``{out}.at<i>``: w == i),
    as a chain of selects among constants."""
    lines, previous = [], f"{_signed32(_TWO_OVER_PI[4 + k])}"
    for index in range(3, -1, -1):
        lines.append(f"{out}.s{index} = select i1 {{out}}.at{index}, i32 {_signed32(_TWO_OVER_PI[index + k])}, "
                     f"i32 {previous}")
        previous = f"{out}.s{index}"
    lines.append(f"{out} = zext i32 {previous} to i64")
    return lines


def _trig(cosine: bool) -> str:
    large = [
        "{out}.hb = select i1 {out}.big, float {out}.ax, float " + _f32(TRIG_LARGE),
        "{out}.bits = bitcast float {out}.hb to i32",
        "{out}.biased = lshr i32 {out}.bits, 23",
        "{out}.mant = and i32 {out}.bits, 8388607",
        "{out}.m = or i32 {out}.mant, 8388608",
        "{out}.p = sub i32 {out}.biased, 120",  # the window's first table bit: 2/pi's bit (exponent - 151), + 31
        "{out}.w = lshr i32 {out}.p, 5",
        "{out}.sh32 = and i32 {out}.p, 31",
        "{out}.sh = zext i32 {out}.sh32 to i64",
        *[f"{{out}}.at{index} = icmp eq i32 {{out}}.w, {index}" for index in range(4)],
        *[line for k in range(4) for line in _table_word(f"{{out}}.t{k}", k)],
    ]
    for k, name in enumerate(("2", "1", "0")):  # the window's three words, most significant first
        large += [f"{{out}}.h{name} = shl i64 {{out}}.t{k}, 32",
                  f"{{out}}.pair{name} = or i64 {{out}}.h{name}, {{out}}.t{k + 1}",
                  f"{{out}}.up{name} = shl i64 {{out}}.pair{name}, {{out}}.sh",
                  f"{{out}}.W{name} = lshr i64 {{out}}.up{name}, 32"]
    large += [
        "{out}.m64 = zext i32 {out}.m to i64",
        "{out}.p2 = mul i64 {out}.m64, {out}.W2",
        "{out}.p1 = mul i64 {out}.m64, {out}.W1",
        "{out}.p0 = mul i64 {out}.m64, {out}.W0",
        "{out}.q2 = shl i64 {out}.p2, 32",
        "{out}.p0h = lshr i64 {out}.p0, 32",
        "{out}.q1 = add i64 {out}.q2, {out}.p1",
        "{out}.q = add i64 {out}.q1, {out}.p0h",  # bits 95..32 of m * window: 2 of quadrant, 62 of f
        f"{{out}}.rq = add i64 {{out}}.q, {1 << 61}",
        "{out}.jq = lshr i64 {out}.rq, 62",
        "{out}.jb = trunc i64 {out}.jq to i32",
        f"{{out}}.fm = and i64 {{out}}.rq, {(1 << 62) - 1}",
        f"{{out}}.fs = sub i64 {{out}}.fm, {1 << 61}",
        "{out}.fd = sitofp i64 {out}.fs to double",
        f"{{out}}.rb = fmul double {{out}}.fd, {_f64(np.pi / 2 * 2.0 ** -62)}",
    ]
    small = [
        "{out}.xs = select i1 {out}.big, float 0.0, float {out}.ax",
        "{out}.xd = fpext float {out}.xs to double",
        f"{{out}}.t = fmul double {{out}}.xd, {_f64(2 / np.pi)}",
        "{out}.jd = call double @llvm.roundeven.f64(double {out}.t)",
        f"{{out}}.k1 = fmul double {{out}}.jd, {_f64(_PIO2_1)}",
        "{out}.r1 = fsub double {out}.xd, {out}.k1",
        f"{{out}}.k2 = fmul double {{out}}.jd, {_f64(_PIO2_2)}",
        "{out}.r2 = fsub double {out}.r1, {out}.k2",
        f"{{out}}.k3 = fmul double {{out}}.jd, {_f64(_PIO2_3)}",
        "{out}.rs = fsub double {out}.r2, {out}.k3",
        "{out}.js = fptosi double {out}.jd to i32",
    ]
    sign = [] if cosine else [  # sin is odd: the sign of x (of -0 too) goes back on at the end
        "{out}.xbits = bitcast float {x} to i32",
        "{out}.xneg = icmp slt i32 {out}.xbits, 0",
        "{out}.vneg = fneg double {out}.v2",
        "{out}.v3 = select i1 {out}.xneg, double {out}.vneg, double {out}.v2",
    ]
    return "\n".join([
        "{out}.ax = call float @llvm.fabs.f32(float {x})",
        f"{{out}}.big = fcmp oge float {{out}}.ax, {_f32(TRIG_LARGE)}",
        *large, *small,
        "{out}.j = select i1 {out}.big, i32 {out}.jb, i32 {out}.js",
        "{out}.r = select i1 {out}.big, double {out}.rb, double {out}.rs",
        f"{{out}}.quadrant = add i32 {{out}}.j, {1 if cosine else 0}",
        "{out}.rr = fmul double {out}.r, {out}.r",
        *_horner("{out}.ps", "{out}.rr", _SIN_POLY, "double"),
        f"{{out}}.sr = fmul double {{out}}.ps{len(_SIN_POLY) - 1}, {{out}}.rr",
        "{out}.sin = call double @llvm.fmuladd.f64(double {out}.sr, double {out}.r, double {out}.r)",
        *_horner("{out}.pc", "{out}.rr", _COS_POLY, "double"),
        f"{{out}}.cos = call double @llvm.fmuladd.f64(double {{out}}.pc{len(_COS_POLY) - 1}, double {{out}}.rr, "
        "double 1.0)",
        "{out}.odd = trunc i32 {out}.quadrant to i1",
        "{out}.v = select i1 {out}.odd, double {out}.cos, double {out}.sin",
        "{out}.half = and i32 {out}.quadrant, 2",
        "{out}.flip = icmp ne i32 {out}.half, 0",
        "{out}.vf = fneg double {out}.v",
        "{out}.v2 = select i1 {out}.flip, double {out}.vf, double {out}.v",
        *sign,
        f"{{out}}.f = fptrunc double {{out}}.v{2 if cosine else 3} to float",
        "{out}.finite = fcmp olt float {out}.ax, 0x7FF0000000000000",
        "{out}.nan = fsub float {x}, {x}",  # inf - inf and NaN - NaN: NaN
        "{out} = select i1 {out}.finite, float {out}.f, float {out}.nan",
    ])


FLOAT32_SIN = _trig(cosine=False)
FLOAT32_COS = _trig(cosine=True)

# erf, by two polynomials fitted here (Lawson-weighted least squares on 6000 Chebyshev nodes, then
# rounded to float32): for |x| < ERF_SPLIT, x + x p(x^2), p a degree-6 fit of erf(x)/x - 1 (the 1 kept
# exact: 2/sqrt(pi) itself rounds 0.9 ulp in float32); beyond, 1 - exp(-x^2) R(|x| - 2.5), R a degree-9
# fit of erfc(x) exp(x^2) weighted by exp(-x^2) (the absolute error of erfc), |x| clamped to 4 (erf
# rounds to 1 from 3.92), x^2's rounding error (an FMA) folded into exp(-x^2), and x's sign copied back
ERF_SPLIT = 0.921875
_ERF_SMALL = (8.397801866522059e-05, -0.0008149807108566165, 0.005201715975999832, -0.026859702542424202,
              0.11283701658248901, -0.37612634897232056, 0.12837916612625122)
_ERF_LARGE = (-3.3907239412656054e-05, -8.996214455692098e-05, -0.00019857216102536768, 0.0001838060561567545,
              -0.0006247806595638394, 0.0025666593573987484, -0.007982254959642887, 0.024927958846092224,
              -0.07435128837823868, 0.21080614626407623)
FLOAT32_ERF = "\n".join([
    "{out}.ax = call float @llvm.fabs.f32(float {x})",
    "{out}.z = fmul float {x}, {x}",
    *_horner("{out}.p", "{out}.z", _ERF_SMALL),
    f"{{out}}.small = call float @llvm.fmuladd.f32(float {{x}}, float {{out}}.p{len(_ERF_SMALL) - 1}, float {{x}})",
    "{out}.xc = call float @llvm.minnum.f32(float {out}.ax, float 4.0)",
    "{out}.s = fsub float {out}.xc, 2.5",
    *_horner("{out}.q", "{out}.s", _ERF_LARGE),
    "{out}.zz = fmul float {out}.xc, {out}.xc",
    "{out}.nz = fneg float {out}.zz",
    *_exp_core("{out}.e", "{out}.nz"),
    "{out}.lo = call float @llvm.fmuladd.f32(float {out}.xc, float {out}.xc, float {out}.nz)",
    "{out}.elo = fmul float {out}.e, {out}.lo",
    "{out}.ec = fsub float {out}.e, {out}.elo",  # exp(-(zz + lo)) = exp(-zz) (1 - lo)
    f"{{out}}.erfc = fmul float {{out}}.ec, {{out}}.q{len(_ERF_LARGE) - 1}",
    "{out}.one = fsub float 1.0, {out}.erfc",
    "{out}.big = call float @llvm.copysign.f32(float {out}.one, float {x})",
    f"{{out}}.near = fcmp olt float {{out}}.ax, {_f32(ERF_SPLIT)}",
    "{out}.v = select i1 {out}.near, float {out}.small, float {out}.big",
    "{out}.nan = fcmp uno float {x}, 0.0",
    "{out} = select i1 {out}.nan, float {x}, float {out}.v",
])

FLOAT32_OPS: dict[str, str] = {"exp": FLOAT32_EXP, "tanh": FLOAT32_TANH, "logistic": FLOAT32_LOGISTIC,
                               "log": FLOAT32_LOG, "log2": FLOAT32_LOG2, "log1p": FLOAT32_LOG1P,
                               "expm1": FLOAT32_EXPM1, "sin": FLOAT32_SIN, "cos": FLOAT32_COS,
                               "erf": FLOAT32_ERF}

# integer semantics follow the reference: wrap-around arithmetic, x / 0 = x % 0 = 0, MIN / -1 = MIN,
# shifts by >= the width (or negative) give 0, or -1 for arithmetic right shifts of negatives
INT_OPS: dict[str, str | dict[str, str]] = {
    "neg": "{out} = sub {t} 0, {x}",
    "abs": {"s": "{out} = call {t} @llvm.abs.{s}({t} {x}, i1 false)", "u": "{out} = or {t} {x}, 0"},
    "sign": {"s": """{out}.pos = icmp sgt {t} {x}, 0
{out}.neg = icmp slt {t} {x}, 0
{out}.one = zext i1 {out}.pos to {t}
{out}.minus = zext i1 {out}.neg to {t}
{out} = sub {t} {out}.one, {out}.minus""",
             "u": "{out}.nonzero = icmp ne {t} {x}, 0\n{out} = zext i1 {out}.nonzero to {t}"},
    "not": "{out} = xor {t} {x}, -1",
    "add": "{out} = add {t} {x}, {y}",
    "sub": "{out} = sub {t} {x}, {y}",
    "mul": "{out} = mul {t} {x}, {y}",
    "div": {"s": """{out}.zero = icmp eq {t} {y}, 0
{out}.minus1 = icmp eq {t} {y}, -1
{out}.unsafe = or i1 {out}.zero, {out}.minus1
{out}.divisor = select i1 {out}.unsafe, {t} 1, {t} {y}
{out}.quotient = sdiv {t} {x}, {out}.divisor
{out}.negated = sub {t} 0, {x}
{out}.q = select i1 {out}.minus1, {t} {out}.negated, {t} {out}.quotient
{out} = select i1 {out}.zero, {t} 0, {t} {out}.q""",
            "u": """{out}.zero = icmp eq {t} {y}, 0
{out}.divisor = select i1 {out}.zero, {t} 1, {t} {y}
{out}.quotient = udiv {t} {x}, {out}.divisor
{out} = select i1 {out}.zero, {t} 0, {t} {out}.quotient"""},
    # x % 1 == 0 covers both x % 0 (defined as 0) and x % -1 (which overflows srem for MIN)
    "rem": {"s": """{out}.zero = icmp eq {t} {y}, 0
{out}.minus1 = icmp eq {t} {y}, -1
{out}.unsafe = or i1 {out}.zero, {out}.minus1
{out}.divisor = select i1 {out}.unsafe, {t} 1, {t} {y}
{out} = srem {t} {x}, {out}.divisor""",
            "u": """{out}.zero = icmp eq {t} {y}, 0
{out}.divisor = select i1 {out}.zero, {t} 1, {t} {y}
{out} = urem {t} {x}, {out}.divisor"""},
    "pow": "{out} = call {t} @fg.ipow.{sign}{bits}({t} {x}, {t} {y})",
    "max": "{out} = call {t} @llvm.{max}.{s}({t} {x}, {t} {y})",
    "min": "{out} = call {t} @llvm.{min}.{s}({t} {x}, {t} {y})",
    "and": "{out} = and {t} {x}, {y}",
    "or": "{out} = or {t} {x}, {y}",
    "xor": "{out} = xor {t} {x}, {y}",
    "shift_left": """{out}.outside = icmp uge {t} {y}, {bits}
{out}.amount = select i1 {out}.outside, {t} 0, {t} {y}
{out}.shifted = shl {t} {x}, {out}.amount
{out} = select i1 {out}.outside, {t} 0, {t} {out}.shifted""",
    "shift_right": {"s": """{out}.outside = icmp uge {t} {y}, {bits}
{out}.amount = select i1 {out}.outside, {t} {top_bit}, {t} {y}
{out} = ashr {t} {x}, {out}.amount""",
                    "u": """{out}.outside = icmp uge {t} {y}, {bits}
{out}.amount = select i1 {out}.outside, {t} 0, {t} {y}
{out}.shifted = lshr {t} {x}, {out}.amount
{out} = select i1 {out}.outside, {t} 0, {t} {out}.shifted"""},
    "eq": "{out} = icmp eq {t} {x}, {y}",
    "ne": "{out} = icmp ne {t} {x}, {y}",
    "lt": "{out} = icmp {lt} {t} {x}, {y}",
    "le": "{out} = icmp {le} {t} {x}, {y}",
    "gt": "{out} = icmp {gt} {t} {x}, {y}",
    "ge": "{out} = icmp {ge} {t} {x}, {y}",
}
INT_WORDS = {
    "s": {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "max": "smax", "min": "smin", "sign": "s"},
    "u": {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "max": "umax", "min": "umin", "sign": "u"},
}

# integer power by squaring (wrapping); negative exponents give 0 except for bases 1 and -1
IPOW_HELPER = """define internal {t} @fg.ipow.{sign}{bits}({t} %base, {t} %exponent) alwaysinline {{
entry:
  %negative = icmp slt {t} %exponent, 0
  %is_negative = and i1 %negative, {signed}
  br i1 %is_negative, label %inverse, label %loop
inverse:
  %is_one = icmp eq {t} %base, 1
  %is_minus_one = icmp eq {t} %base, -1
  %odd = trunc {t} %exponent to i1
  %sign = select i1 %odd, {t} -1, {t} 1
  %minus_one_power = select i1 %is_minus_one, {t} %sign, {t} 0
  %inverse_result = select i1 %is_one, {t} 1, {t} %minus_one_power
  ret {t} %inverse_result
loop:
  %b = phi {t} [ %base, %entry ], [ %b.next, %step ]
  %e = phi {t} [ %exponent, %entry ], [ %e.next, %step ]
  %result = phi {t} [ 1, %entry ], [ %result.next, %step ]
  %done = icmp eq {t} %e, 0
  br i1 %done, label %exit, label %step
step:
  %bit = trunc {t} %e to i1
  %product = mul {t} %result, %b
  %result.next = select i1 %bit, {t} %product, {t} %result
  %b.next = mul {t} %b, %b
  %e.next = lshr {t} %e, 1
  br label %loop
exit:
  ret {t} %result
}}"""

# --- casts ----------------------------------------------------------------------------------------
# Keyed by (from-class, to-class) over 'b', 's', 'u', 'f'; float16/bfloat16 go through float32
# first (see render_cast). {from}/{to} are the LLVM types, {fs}/{ts} their intrinsic suffixes.
CASTS = {
    ("b", "s"): "{out} = zext i1 {x} to {to}",
    ("b", "u"): "{out} = zext i1 {x} to {to}",
    ("b", "f"): "{out} = uitofp i1 {x} to {to}",
    ("s", "f"): "{out} = sitofp {from} {x} to {to}",
    ("u", "f"): "{out} = uitofp {from} {x} to {to}",
    # truncate toward zero, saturate, NaN -> 0: exactly the .sat intrinsics
    ("f", "s"): "{out} = call {to} @llvm.fptosi.sat.{ts}.{fs}({from} {x})",
    ("f", "u"): "{out} = call {to} @llvm.fptoui.sat.{ts}.{fs}({from} {x})",
    ("s", "b"): "{out} = icmp ne {from} {x}, 0",
    ("u", "b"): "{out} = icmp ne {from} {x}, 0",
    ("f", "b"): "{out} = fcmp une {from} {x}, 0.0",
}
# float32 -> bfloat16, rounding to nearest even in integer arithmetic. LLVM's own fptrunc would use
# AVX512-BF16's vcvtneps2bf16, which flushes denormals, or a libcall that is not in the process.
FLOAT_TO_BFLOAT = """{out}.bits = bitcast float {x} to i32
{out}.upper = lshr i32 {out}.bits, 16
{out}.lsb = and i32 {out}.upper, 1
{out}.bias = add i32 {out}.lsb, 32767
{out}.rounded = add i32 {out}.bits, {out}.bias
{out}.shifted = lshr i32 {out}.rounded, 16
{out}.quiet = or i32 {out}.upper, 64
{out}.nan = fcmp uno float {x}, 0.0
{out}.result = select i1 {out}.nan, i32 {out}.quiet, i32 {out}.shifted
{out}.short = trunc i32 {out}.result to i16
{out} = bitcast i16 {out}.short to bfloat"""
# float64 -> float32 rounding to odd (truncate, then set the last bit if inexact), so that a
# following float32 -> float16 rounding equals direct float64 -> float16 rounding (NumPy's), without
# LLVM's __truncdfhf2 libcall.
DOUBLE_TO_FLOAT_ODD = """{out}.near = fptrunc double {x} to float
{out}.back = fpext float {out}.near to double
{out}.inexact = fcmp one double {out}.back, {x}
{out}.near_abs = call double @llvm.fabs.f64(double {out}.back)
{out}.x_abs = call double @llvm.fabs.f64(double {x})
{out}.rounded_up = fcmp ogt double {out}.near_abs, {out}.x_abs
{out}.bits = bitcast float {out}.near to i32
{out}.down = zext i1 {out}.rounded_up to i32
{out}.truncated = sub i32 {out}.bits, {out}.down
{out}.odd = or i32 {out}.truncated, 1
{out}.result = select i1 {out}.inexact, i32 {out}.odd, i32 {out}.bits
{out} = bitcast i32 {out}.result to float"""

# --- reductions -----------------------------------------------------------------------------------
REDUCE_ALU = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}
BOOL_REDUCE_ALU = {"sum": "or", "prod": "and", "max": "or", "min": "and"}  # sum != 0 is any()
# float sums and products may be reassociated, so the loop vectorizer can keep partial results
REASSOCIATE = {"add": "{out} = fadd reassoc {t} {x}, {y}", "mul": "{out} = fmul reassoc {t} {x}, {y}"}


def reduce_identity(op: str, dtype: np.dtype, empty: bool) -> Any:
    """The reduction's start value. A non-empty float sum starts at -0.0 so that a sum of -0.0s
    stays -0.0 (as NumPy's does); an empty one is +0.0."""
    kind = op_class(dtype)
    if op == "sum":
        return False if kind == "b" else (0.0 if empty else -0.0) if kind in "fh" else 0
    if op == "prod":
        return True if kind == "b" else 1
    low = op == "max"
    if kind == "b":
        return not low
    if kind in "fh":
        return -np.inf if low else np.inf
    info = np.iinfo(dtype)
    return info.min if low else info.max


# --- constants ------------------------------------------------------------------------------------

def render_const(value: Any, dtype: np.dtype) -> str:
    """An LLVM literal: decimal integers (two's complement for large unsigned values), hex floats."""
    dtype = np.dtype(dtype)
    kind = op_class(dtype)
    if kind == "b":
        return "true" if value else "false"
    if kind in "su":
        bits = dtype.itemsize * 8
        number = int(value) & ((1 << bits) - 1)
        return str(number - (1 << bits) if number >= 1 << (bits - 1) else number)
    name = dtype_name(dtype)
    if name == "float16":
        return f"0xH{int(np.asarray(value, np.float16).view(np.uint16)):04X}"
    if name == "bfloat16":
        return f"0xR{int(np.asarray(value, ml_dtypes.bfloat16).view(np.uint16)):04X}"
    # float and double constants are both written as the double's bits (float ones are exact)
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(np.asarray(value, dtype))))[0]:016X}"


def llvm_function_name(kernel: Kernel) -> str:
    """The kernel's name as an LLVM identifier (and the symbol the device looks up)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", kernel.name)
    return name if name[:1].isalpha() or name[:1] == "_" else f"kernel_{name}"


# --- the renderer ---------------------------------------------------------------------------------

# loop metadata the renderer attaches (``close_loop(..., hints=...)``); "unroll=k" and "width=w"
# carry a number (see ``_hint_entry``)
LOOP_HINTS = {"no_vectorize": '!"llvm.loop.vectorize.enable", i1 false',
              "vectorize": '!"llvm.loop.vectorize.enable", i1 true',
              "no_unroll": '!"llvm.loop.unroll.disable"',
              "unroll": '!"llvm.loop.unroll.count", i32 {}',
              "width": '!"llvm.loop.vectorize.width", i32 {}',
              "interleave": '!"llvm.loop.interleave.count", i32 {}'}


def _hint_entry(hint: str) -> str:
    name, _, number = hint.partition("=")
    return LOOP_HINTS[name].format(number)


@attrs.frozen
class LoopChoices:
    """A kernel's opts (``funcgrad.lower.optimize``) as the renderer reads them: ``reorder`` the
    i-k-j order, ``rows`` output rows per block in it, ``split`` the partial-sum depth, ``unroll``
    reduction depth -> count, ``vectorize`` the innermost loop's width (None: LLVM decides; 0: a
    vectorised loop that is not unrolled; 1: scalar)."""

    reorder: bool = False
    rows: int = 1
    split: int | None = None
    unroll: tuple[tuple[int, int], ...] = ()
    vectorize: int | None = None
    swaps: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_opts(cls, opts: tuple[Opt, ...]) -> LoopChoices:
        by_action = {opt.action: opt for opt in opts}
        return cls(swaps=tuple((opt.axis, opt.amount) for opt in opts if opt.action == "swap"),
                   reorder="reorder" in by_action,
                   rows=by_action["upcast"].amount if "upcast" in by_action else 1,
                   split=by_action["split"].axis if "split" in by_action else None,
                   unroll=tuple((opt.axis, opt.amount) for opt in opts if opt.action == "unroll"),
                   vectorize=by_action["vectorize"].amount if "vectorize" in by_action else None)

    def loop_order(self, rank: int) -> list[int]:
        """The global axes from outermost to innermost after the swaps (``swap(a, b)`` exchanges
        the loops of axes a and b; the indices, and so the outputs' layout, are unchanged)."""
        order = list(range(rank))
        for a, b in self.swaps:
            i, j = order.index(a), order.index(b)
            order[i], order[j] = order[j], order[i]
        return order

    def reduce_hints(self, depth: int, innermost: bool) -> tuple[str, ...]:
        """Hints for reduction loop ``depth`` (``innermost``: no loop inside it)."""
        hints = [f"unroll={count}" if count > 1 else "no_unroll" for axis, count in self.unroll if axis == depth]
        return tuple(hints) + (self.inner_hints() if innermost else ())

    def inner_hints(self) -> tuple[str, ...]:
        """Hints for the innermost loop from the vectorize opt."""
        if self.vectorize is None:
            return ()
        if self.vectorize == 0:  # keep a short loop a vectorised loop: no full unroll (see _row_block)
            return ("vectorize", "no_unroll")
        return ("no_vectorize",) if self.vectorize == 1 else ("vectorize", f"width={self.vectorize}")


_FIELDS: dict[Any, dict[str, Any]] = {}  # _FunctionBuilder.fields by dtype


class _FunctionBuilder:
    """Emits the body of one kernel function: SSA names, one expression cache per scope."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counter = 0
        self.helpers: dict[str, str] = {}
        self.cache: dict[KExpr, str] = {}
        self.acc_value: str | None = None
        self.var_names: dict[str, str] = {}  # a loop variable rendered under another loop's name

    def fresh(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def emit(self, text: str) -> None:
        lines = text.splitlines()
        if len(lines) == 1:  # most instructions
            self.lines.append("  " + lines[0])
        else:
            self.lines.extend(["  " + line for line in lines])

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def instantiate(self, template: str, **fields: Any) -> str:
        out = self.fresh()
        self.emit(template.format(out=out, **fields))
        return out

    # expressions are computed where they are used; LICM hoists what does not depend on the loop
    def value(self, e: KExpr) -> str:
        if e in self.cache:
            return self.cache[e]
        result = self._render(e)
        self.cache[e] = result
        return result

    def _render(self, e: KExpr) -> str:
        if e.op == "const":
            return render_const(e.arg, e.dtype)
        if e.op == "var":
            return f"%{self.var_names.get(e.arg, e.arg)}"
        if e.op == "acc":
            if self.acc_value is None:
                raise ValueError("acc is read outside the epilogue of a reduction")
            return self.acc_value
        if e.op == "load":
            index = self.value(e.args[0])
            pointer = self.instantiate("{out} = getelementptr inbounds {t}, ptr %in{n}, i64 {i}",
                                       t=memory_type(e.dtype), n=e.arg, i=index)
            loaded = self.instantiate("{out} = load {t}, ptr {p}", t=memory_type(e.dtype), p=pointer)
            if op_class(e.dtype) == "b":
                return self.instantiate("{out} = icmp ne i8 {x}, 0", x=loaded)
            return loaded
        if e.op == "where":
            cond, a, b = (self.value(x) for x in e.args)
            return self.instantiate("{out} = select i1 {c}, {t} {a}, {t} {b}", c=cond, t=value_type(e.dtype), a=a, b=b)
        if e.op == "cast":
            return self.cast(self.value(e.args[0]), e.args[0].dtype, e.dtype)
        if e.op == "bitcast":
            return self.bitcast(self.value(e.args[0]), e.args[0].dtype, e.dtype)
        result = self.alu(e.op, [self.value(a) for a in e.args], e.args[0].dtype)
        natural = BOOL if e.op in COMPARISONS or e.op == "is_finite" else e.args[0].dtype
        # the reference converts a result to the node's dtype (e.g. is_finite built without dtype=bool)
        return result if natural == e.dtype else self.cast(result, natural, e.dtype)

    def alu(self, op: str, operands: list[str], dtype: np.dtype) -> str:
        kind = op_class(dtype)
        if kind == "h":  # compute in float32, round back (comparisons and is_finite give bools)
            wide = [self.extend_to_float(x, dtype) for x in operands]
            result = self.alu(op, wide, FLOAT32)
            return result if op in COMPARISONS or op == "is_finite" else self.narrow_from_float(result, dtype)
        table: dict[str, Any] = FLOAT_OPS if kind == "f" else INT_OPS
        if kind == "f" and np.dtype(dtype) == FLOAT32 and op in FLOAT32_OPS:
            table = FLOAT32_OPS
        if op not in table:
            raise ValueError(f"unsupported operation {op} on {np.dtype(dtype).name}")
        template = table[op]
        if isinstance(template, dict):
            template = template["u" if kind == "b" else kind]
        fields = self.fields(dtype)
        if op == "pow" and kind in "su":
            self.helpers.setdefault(f"{fields['sign']}{fields['bits']}", IPOW_HELPER.format(
                **fields, signed="true" if kind == "s" else "false"))
        return self.instantiate(template, **fields, x=operands[0],
                                y=operands[1] if len(operands) > 1 else None)

    @staticmethod
    def fields(dtype: np.dtype) -> dict[str, Any]:
        """A template's type fields for ``dtype`` (one shared dict per dtype: read it, never modify it)."""
        fields = _FIELDS.get(dtype)
        if fields is None:
            kind = op_class(dtype)
            t = value_type(dtype)
            bits = 1 if kind == "b" else np.dtype(dtype).itemsize * 8
            fields = {"t": t, "bits": bits, "top_bit": bits - 1, "s": {"float": "f32", "double": "f64"}.get(t, t),
                      "f": "f" if t == "float" else ""}
            if kind in "sub":
                fields.update(INT_WORDS["s" if kind == "s" else "u"])
            _FIELDS[dtype] = fields
        return fields

    def extend_to_float(self, x: str, dtype: np.dtype) -> str:
        return self.instantiate("{out} = fpext {t} {x} to float", t=value_type(dtype), x=x)

    def narrow_from_float(self, x: str, dtype: np.dtype) -> str:
        if dtype_name(dtype) == "bfloat16":
            return self.instantiate(FLOAT_TO_BFLOAT, x=x)
        return self.instantiate("{out} = fptrunc float {x} to half", x=x)

    def cast(self, x: str, source: np.dtype, target: np.dtype) -> str:
        source, target = np.dtype(source), np.dtype(target)
        if source == target:
            return x
        if op_class(source) == "h":
            x, source = self.extend_to_float(x, source), FLOAT32
        if op_class(target) == "h":
            if source.name == "float64" and target.name == "float16":
                x = self.instantiate(DOUBLE_TO_FLOAT_ODD, x=x)
            else:  # ints and float64 reach bfloat16 through float32, as ml_dtypes converts
                x = self.cast(x, source, FLOAT32)
            return self.narrow_from_float(x, target)
        if source == target:
            return x
        from_kind, to_kind = op_class(source), op_class(target)
        from_type, to_type = value_type(source), value_type(target)
        if from_kind in "su" and to_kind in "su":
            if source.itemsize == target.itemsize:
                return x
            verb = "trunc" if source.itemsize > target.itemsize else "sext" if from_kind == "s" else "zext"
            return self.instantiate(f"{{out}} = {verb} {from_type} {{x}} to {to_type}", x=x)
        if from_kind == "f" and to_kind == "f":
            verb = "fptrunc" if source.itemsize > target.itemsize else "fpext"
            return self.instantiate(f"{{out}} = {verb} {from_type} {{x}} to {to_type}", x=x)
        suffix = {"float": "f32", "double": "f64"}
        return self.instantiate(CASTS[(from_kind, to_kind)], x=x, **{
            "from": from_type, "to": to_type, "fs": suffix.get(from_type, from_type),
            "ts": suffix.get(to_type, to_type)})

    def bitcast(self, x: str, source: np.dtype, target: np.dtype) -> str:
        source, target = np.dtype(source), np.dtype(target)
        if source.itemsize != target.itemsize:
            raise ValueError(f"bitcast needs dtypes of one width, got {source.name} and {target.name}")
        if op_class(source) == "b":
            return self.instantiate("{out} = zext i1 {x} to i8", x=x) if op_class(target) != "b" else x
        if op_class(target) == "b":
            return self.instantiate("{out} = icmp ne i8 {x}, 0", x=x)
        if value_type(source) == value_type(target):
            return x
        return self.instantiate("{out} = bitcast {a} {x} to {b}", a=value_type(source), x=x, b=value_type(target))

    # --- loops ---
    def open_loop(self, name: str, start: str, end: str) -> None:
        self.emit(f"store i64 {start}, ptr %{name}.addr\nbr label %{name}.cond")
        self.label(f"{name}.cond")
        self.emit(f"%{name} = load i64, ptr %{name}.addr\n%{name}.go = icmp slt i64 %{name}, {end}\n"
                  f"br i1 %{name}.go, label %{name}.body, label %{name}.exit")
        self.label(f"{name}.body")

    def close_loop(self, name: str, step: int = 1, hints: tuple[str, ...] = ()) -> None:
        """Close loop ``name``; ``hints`` (keys of ``LOOP_HINTS``) become its ``!llvm.loop`` metadata."""
        metadata = ""
        if hints:
            node = f"!{sum(key.startswith('!') for key in self.helpers)}"
            entries = ", ".join(f"!{{{_hint_entry(hint)}}}" for hint in hints)
            self.helpers[node] = f"{node} = distinct !{{{node}, {entries}}}"
            metadata = f", !llvm.loop {node}"
        self.emit(f"%{name}.next = add nsw i64 %{name}, {step}\nstore i64 %{name}.next, ptr %{name}.addr\n"
                  f"br label %{name}.cond{metadata}")
        self.label(f"{name}.exit")


def begin_kernel() -> None:
    """Forget the memos of the previous kernel (``substitute``'s hold one kernel's expressions)."""
    _SUBSTITUTIONS.memos = {}


def render_loops(kernel: Kernel) -> str:
    """The LLVM IR module (text) for ``kernel`` as plain loop nests, following its (checked) opts;
    its function is named ``llvm_function_name(kernel)``. Called by ``render_llvm.render_llvm``
    after ``begin_kernel``."""
    assert kernel.opts is not None
    choices = LoopChoices.from_opts(kernel.opts)
    builder = _FunctionBuilder()
    global_vars = [f"g{i}" for i in range(len(kernel.shape))]
    reduce_vars = [f"r{i}" for i in range(len(kernel.reduce_shape))]
    for name in global_vars + reduce_vars:
        builder.emit(f"%{name}.addr = alloca i64")
    acc_dtype = kernel.acc_dtype
    acc_compute = None
    if acc_dtype is not None:
        acc_compute = accumulator_dtype(acc_dtype)
        builder.emit(f"%acc.addr = alloca {value_type(acc_compute)}")
        builder.emit(f"%part.addr = alloca {value_type(acc_compute)}")  # used by long float sums only

    if acc_compute is not None and choices.reorder:
        _render_reduce_outer(builder, kernel, global_vars, reduce_vars, acc_compute, choices)
        return _module(kernel, builder)

    order = choices.loop_order(len(global_vars))
    # a reduction runs inside only the output loops its expression reads: the loops after them are
    # opened after it, so a row statistic fused into its row's elementwise pass (softmax's sum, see
    # schedule.py) is computed once per row, not once per element
    outer = len(order)
    if kernel.reduce_expr is not None:
        read = loop_variables(kernel.reduce_expr)
        outer = max((position + 1 for position, depth in enumerate(order) if global_vars[depth] in read), default=0)
        if all(kernel.shape[depth] == 1 for depth in order[outer:]):
            outer = len(order)  # nothing to gain (and the source of a keepdims reduction stays as it was)
    reused = _row_reuse(kernel, [global_vars[depth] for depth in order[outer:]])
    if reused is not None:  # the reduction's terms, kept in a stack row for the row's outputs
        builder.emit(f"%row.addr = alloca [{kernel.reduce_shape[0]} x {value_type(reused.dtype)}]")

    def open_global(depth: int) -> None:
        builder.open_loop(global_vars[depth], "%start" if depth == 0 else "0",
                          "%end" if depth == 0 else str(kernel.shape[depth]))

    inner_hints = (*choices.inner_hints(), *_interleave_hints(kernel, choices))
    pieces = _pieces(kernel, order[-1]) if kernel.reduce_expr is None and order else None
    if pieces is not None:  # the innermost loop in ranges, each with its own (decided) outputs
        for depth in order[:-1]:
            open_global(depth)
        _render_pieces(builder, kernel, global_vars, order[-1], pieces, inner_hints)
        for depth in reversed(order[:-1]):
            builder.close_loop(global_vars[depth])
        return _module(kernel, builder)

    for depth in order[:outer]:
        open_global(depth)

    if kernel.reduce_expr is not None and acc_dtype is not None and acc_compute is not None:
        empty = int(np.prod(kernel.reduce_shape)) == 0
        identity = render_const(reduce_identity(kernel.reduce_op or "", acc_compute, empty), acc_compute)
        acc_type = value_type(acc_compute)
        builder.emit(f"store {acc_type} {identity}, ptr %acc.addr")
        alu = (BOOL_REDUCE_ALU if op_class(acc_compute) == "b" else REDUCE_ALU)[kernel.reduce_op or ""]
        split = choices.split
        into = "%acc.addr" if split is None else "%part.addr"
        for depth, (name, size) in enumerate(zip(reduce_vars, kernel.reduce_shape)):
            if depth == split:
                builder.emit(f"store {acc_type} {identity}, ptr %part.addr")
            builder.open_loop(name, "0", str(size))
        value = builder.value(kernel.reduce_expr)
        if reused is not None:
            builder.emit(_row_slot_line("%row.slot", kernel.reduce_shape[0], reused.dtype, reduce_vars[0])
                         + f"\nstore {value_type(reused.dtype)} {value}, ptr %row.slot")
        if op_class(acc_dtype) == "h":
            value = builder.extend_to_float(value, acc_dtype)
        old = builder.instantiate("{out} = load {t}, ptr " + into, t=acc_type)
        if op_class(acc_compute) == "f" and alu in REASSOCIATE:
            new = builder.instantiate(REASSOCIATE[alu], t=acc_type, x=old, y=value)
        else:
            new = builder.alu(alu, [old, value], acc_compute)
        builder.emit(f"store {acc_type} {new}, ptr {into}")
        for depth in reversed(range(len(reduce_vars))):
            builder.close_loop(reduce_vars[depth], hints=_partial_hints(kernel, choices, depth, len(reduce_vars)))
            if depth == split:  # fold the finished partial sum into the total
                total = builder.instantiate("{out} = load {t}, ptr %acc.addr", t=acc_type)
                part = builder.instantiate("{out} = load {t}, ptr %part.addr", t=acc_type)
                summed = builder.instantiate(REASSOCIATE[alu], t=acc_type, x=total, y=part)
                builder.emit(f"store {acc_type} {summed}, ptr %acc.addr")
        builder.cache = {}  # values computed inside the reduction loop do not dominate the epilogue
        final = builder.instantiate("{out} = load {t}, ptr %acc.addr", t=value_type(acc_compute))
        builder.acc_value = builder.narrow_from_float(final, acc_dtype) if op_class(acc_dtype) == "h" else final

    for depth in order[outer:]:
        open_global(depth)
    if reused is not None:
        column = global_vars[order[-1]]
        builder.emit(_row_slot_line("%row.read", kernel.reduce_shape[0], reused.dtype, column))
        builder.cache[reused] = builder.instantiate("{out} = load {t}, ptr %row.read", t=value_type(reused.dtype))
    _store_outputs(builder, kernel, global_vars)
    for position in reversed(range(len(order))):
        innermost = position == len(order) - 1 and (not reduce_vars or outer < len(order))
        builder.close_loop(global_vars[order[position]], hints=inner_hints if innermost else ())
    return _module(kernel, builder)


MAX_PIECES = 16  # an elementwise loop is split into at most this many ranges (see _pieces)


def _pieces(kernel: Kernel, depth: int) -> list[tuple[int, int, Kernel]] | None:
    """An elementwise kernel's loop ``depth`` split where its comparisons of index values that move with
    that loop alone change (a concatenation's or a pad's ranges): [(start, end, the kernel with that
    loop shifted by ``start`` and run over ``end - start``, every comparison decided and the index
    arithmetic simplified)], or None when nothing splits. A concatenation of three arrays along the
    last axis then reads each as a plain contiguous copy, not three guarded gathers per element."""
    name, extent = f"g{depth}", kernel.shape[depth]
    breaks = comparison_breaks(kernel.outputs, name, extent)
    if not breaks or len(breaks) >= MAX_PIECES:
        return None
    points = [0, *breaks, extent]
    pieces = []
    for start, end in zip(points, points[1:]):
        bounds = {f"g{i}": d for i, d in enumerate(kernel.shape)}
        bounds[name] = end - start
        folded: dict[KExpr, KExpr] = {}
        simplified: dict[KExpr, KExpr] = {}
        outputs = tuple(simplify_index(fold_comparisons(substitute(e, name, start, {}), bounds, folded), bounds,
                                       simplified) for e in kernel.outputs)
        pieces.append((start, end, attrs.evolve(kernel, outputs=outputs)))
    return pieces


def _render_pieces(builder: _FunctionBuilder, kernel: Kernel, global_vars: list[str], depth: int,
                   pieces: list[tuple[int, int, Kernel]], hints: tuple[str, ...]) -> None:
    """One loop per piece of ``_pieces``, under its own name (its counter runs from 0; outputs are stored
    at the shifted position). Loop 0's range is the thread's chunk ``[%start, %end)``, clipped to each piece."""
    name = global_vars[depth]
    for number, (start, end, piece) in enumerate(pieces):
        loop = f"{name}.p{number}"
        builder.lines.insert(0, f"  %{loop}.addr = alloca i64")
        builder.cache = {}  # values computed in an earlier piece's loop do not dominate this one
        builder.var_names[name] = loop
        if depth == 0:  # the chunk of axis 0 this call runs, within the piece, counted from its start
            low = builder.instantiate("{out} = call i64 @llvm.smax.i64(i64 %start, i64 {x})", x=start)
            high = builder.instantiate("{out} = call i64 @llvm.smin.i64(i64 %end, i64 {x})", x=end)
            first = builder.instantiate("{out} = sub i64 {x}, {y}", x=low, y=start)
            last = builder.instantiate("{out} = sub i64 {x}, {y}", x=high, y=start)
        else:
            first, last = "0", str(end - start)
        builder.open_loop(loop, first, last)
        _store_outputs(builder, piece, global_vars, mid=name, row=start)
        builder.close_loop(loop, hints=hints)
    del builder.var_names[name]
    builder.cache = {}


def _row_reuse(kernel: Kernel, after: list[str]) -> KExpr | None:
    """The reduction's term as the outputs read it, when a per-row reduction (``after``: the output
    loops opened after it) is one loop over the same extent as the one output loop after it, its term
    is costly (exp, log, ...), and an output recomputes that term at the output loop's index: softmax's
    ``exp(x - max)``, summed and then divided by the sum. The renderer keeps the row's terms in a stack
    row and the outputs load them instead of computing them twice (the same values, bit for bit)."""
    if kernel.reduce_expr is None or len(after) != 1 or len(kernel.reduce_shape) != 1:
        return None
    extent = kernel.reduce_shape[0]
    if not 0 < extent <= MAX_ROW or kernel.shape[int(after[0][1:])] != extent \
            or op_class(kernel.reduce_expr.dtype) != "f":
        return None
    term = _rename(kernel.reduce_expr, "r0", var(after[0]), {})
    found: set[KExpr] = set()
    stack = list(kernel.outputs)
    while stack:
        node = stack.pop()
        if node == term:
            return term if _costly(term, {}) else None
        if node not in found:
            found.add(node)
            stack.extend(node.args)
    return None


def _row_slot_line(name: str, extent: int, dtype: np.dtype, index: str) -> str:
    return f"{name} = getelementptr inbounds [{extent} x {value_type(dtype)}], ptr %row.addr, i64 0, i64 %{index}"


def _rename(e: KExpr, name: str, replacement: KExpr, memo: dict[KExpr, KExpr]) -> KExpr:
    if e not in memo:
        if e.op == "var" and e.arg == name:
            memo[e] = replacement
        else:
            args = tuple(_rename(a, name, replacement, memo) for a in e.args)
            memo[e] = with_args(e, args)
    return memo[e]


COSTLY = {p.kernel_op for p in with_cost("divide", "transcendental")}


def _computes(e: KExpr, test: Callable[[KExpr], bool], memo: dict[KExpr, bool]) -> bool:
    """Does ``test`` hold for ``e`` or any node below it (``memo``: the answers so far, for one ``test``)?"""
    if e not in memo:
        memo[e] = test(e) or any(_computes(a, test, memo) for a in e.args)
    return memo[e]


def _costly(e: KExpr, memo: dict[KExpr, bool]) -> bool:
    """Does ``e`` compute anything dearer than a load from L1 (a transcendental function, a divide)?"""
    return _computes(e, lambda node: node.op in COSTLY, memo)


def is_inline_math(e: KExpr) -> bool:
    """Is ``e`` a float32 function rendered as an inline polynomial (FLOAT32_OPS: exp, tanh, logistic, the
    log family; a chain of ~30 dependent vector operations, a fraction of a libm call's time)?"""
    return e.op in FLOAT32_OPS and np.dtype(e.dtype) == FLOAT32


def loop_variables(e: KExpr) -> set[str]:
    """The names of the loop variables ``e`` reads."""
    found: set[str] = set()
    seen: set[KExpr] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "var":
            found.add(node.arg)
        stack.extend(node.args)
    return found


def _store_outputs(builder: _FunctionBuilder, kernel: Kernel, global_vars: list[str], mid: str | None = None,
                   row: int = 0) -> None:
    """Store every output at the current loop position (or, in a row block, at row ``mid + row``)."""
    indices = [var(name) for name in global_vars]
    if mid is not None and row:
        indices = [substitute(e, mid, row) for e in indices]
    position = builder.value(flat_index(indices, kernel.shape)) if kernel.shape else "0"
    for number, (expr, aval) in enumerate(zip(kernel.outputs, kernel.out_avals)):
        if expr.dtype != aval.dtype:
            raise ValueError(f"output {number} is computed as {expr.dtype.name} but stored as {aval.dtype.name}")
        value = builder.value(expr)
        if op_class(aval.dtype) == "b":
            value = builder.instantiate("{out} = zext i1 {x} to i8", x=value)
        pointer = builder.instantiate("{out} = getelementptr inbounds {t}, ptr %out{n}, i64 {i}",
                                      t=memory_type(aval.dtype), n=number, i=position)
        builder.emit(f"store {memory_type(aval.dtype)} {value}, ptr {pointer}")


def accumulator_dtype(acc_dtype: np.dtype) -> np.dtype:
    """The dtype a reduction accumulates in (float16/bfloat16 sums accumulate in float32)."""
    return FLOAT32 if op_class(acc_dtype) == "h" else np.dtype(acc_dtype)


def partial_sum_split(kernel: Kernel, acc_compute: np.dtype) -> int | None:
    """Where a long float sum splits its reduction loops into two levels, or None.

    One float32 accumulator over n values loses ~n ulps (BatchNorm's sums over N*H*W = 204,800
    values came out 1e-4 off, and its backward magnifies that): the trailing reduction loops whose
    extent reaches about sqrt(n) sum into a fresh partial, added to the total once per outer
    iteration, so the error is ~(n / m + m) ulps for an inner extent m."""
    if kernel.reduce_op != "sum" or op_class(acc_compute) != "f" or len(kernel.reduce_shape) < 2:
        return None
    total = int(np.prod(kernel.reduce_shape))
    if total < PARTIAL_SUM_MIN:
        return None
    inner = 1
    for depth in reversed(range(1, len(kernel.reduce_shape))):
        inner *= kernel.reduce_shape[depth]
        if inner * inner >= total:
            return depth
    return 1


SHORT_PARTIAL = 128  # a partial sum's innermost loop up to this long is kept a loop (see _partial_hints)


def _partial_hints(kernel: Kernel, choices: LoopChoices, depth: int, loops: int) -> tuple[str, ...]:
    """Reduction loop ``depth``'s hints, plus ``no_unroll`` on a partial sum's (``split``) short
    innermost loop: O3 fully unrolls it into a scalar chain before the vectoriser sees it; kept a loop,
    it vectorises, and runs and compiles faster (the CNN's BatchNorm sum over (512, 64) partials of 64:
    docs/performance.md)."""
    hints = choices.reduce_hints(depth, depth == loops - 1)
    if choices.split is None or depth != loops - 1 or depth < choices.split \
            or kernel.reduce_shape[depth] > SHORT_PARTIAL or any(hint.startswith("unroll") for hint in hints):
        return hints
    return (*hints, "no_unroll") if "no_unroll" not in hints else hints


INLINE_INTERLEAVE = 4  # vectors in flight per iteration of an elementwise loop with a FLOAT32_OPS function


def _interleave_hints(kernel: Kernel, choices: LoopChoices) -> tuple[str, ...]:
    """``interleave=4`` for the innermost loop of an elementwise kernel computing a FLOAT32_OPS function,
    when the opts leave its vectorisation to LLVM: one vector's ~30 dependent operations are latency-bound,
    and four independent vectors per iteration keep the cores busy (faster on GELU, docs/performance.md;
    the same bits: each element's arithmetic is unchanged)."""
    if kernel.reduce_expr is not None or choices.vectorize is not None:
        return ()
    memo: dict[KExpr, bool] = {}
    return (f"interleave={INLINE_INTERLEAVE}",) if any(_computes(e, is_inline_math, memo) for e in kernel.outputs) \
        else ()


MAX_ROW = 1 << 14  # the reduce-outer order keeps one output row of accumulators on the stack


def _loads(e: KExpr, found: list[KExpr], seen: set[int]) -> list[KExpr]:
    if id(e) in seen:
        return found
    seen.add(id(e))
    if e.op == "load":
        found.append(e)
    for a in e.args:
        _loads(a, found, seen)
    return found


def reduce_outer(kernel: Kernel) -> bool:
    """Should the reduction run outside the innermost output loop? That is the i-k-j order of a
    matrix product: when an operand is contiguous along the last output axis, and every operand
    contiguous along the reduction does not move with that axis (it is loop-invariant there), the
    inner loop walks memory with stride 1 and vectorizes."""
    if kernel.reduce_expr is None or not kernel.shape or not kernel.reduce_shape:
        return False
    if not 16 <= kernel.shape[-1] <= MAX_ROW:
        return False
    from funcgrad.lower.kernel import _affine
    last_global, last_reduce = var(f"g{len(kernel.shape) - 1}"), var(f"r{len(kernel.reduce_shape) - 1}")
    strides = [(_affine(load.args[0]) or {}) for load in _loads(kernel.reduce_expr, [], set())]
    along_output = any(terms.get(last_global) == 1 for terms in strides)
    conflicting = any(terms.get(last_reduce) == 1 and terms.get(last_global) for terms in strides)
    if len(kernel.shape) >= 3 and int(np.prod(kernel.reduce_shape)) <= WINDOW_TERMS \
            and all(terms.get(last_global) == 1 for terms in strides):
        return False  # a pooling window over channels-last images: unrolled, its output loop vectorises as it is
    return along_output and not conflicting


WINDOW_TERMS = 16  # see reduce_outer: a reduction this short whose loads all run along the last output axis


SHORT_ROW = 64  # rows shorter than this get loop hints in the i-k-j order (see _row_block)
ROW_BLOCK = 2  # output rows computed together in the i-k-j order (2 measured best here: 4 and 8 spill)


# substitute's memos for the kernel being rendered, per thread: (name, offset) -> {expression: result}. A
# register tile shifts the same expression by the same offsets for every row and vector of every block;
# render_llvm starts them afresh for each kernel
_SUBSTITUTIONS = threading.local()


def _substitution_memo(name: str, offset: int) -> dict[KExpr, KExpr]:
    memos: dict[tuple[str, int], dict[KExpr, KExpr]] | None = getattr(_SUBSTITUTIONS, "memos", None)
    if memos is None:
        memos = _SUBSTITUTIONS.memos = {}
    memo = memos.get((name, offset))
    if memo is None:
        memo = memos[(name, offset)] = {}
    return memo


def substitute(e: KExpr, name: str, offset: int, memo: dict[KExpr, KExpr] | None = None) -> KExpr:
    """``e`` with loop variable ``name`` replaced by ``name + offset``."""
    if offset == 0:
        return e
    if memo is None:
        memo = _substitution_memo(name, offset)
    out = memo.get(e)
    if out is None:
        if e.op == "var" and e.arg == name:
            out = KExpr("add", e.dtype, (e, KExpr("const", e.dtype, (), offset)))
        else:
            args = tuple([substitute(a, name, offset, memo) for a in e.args])
            out = with_args(e, args)
        memo[e] = out
    return out


def _render_reduce_outer(builder: _FunctionBuilder, kernel: Kernel, global_vars: list[str], reduce_vars: list[str],
                         acc_compute: np.dtype, choices: LoopChoices) -> None:
    """Loops: outer output axes; then, per block of output rows, (1) set a stack block of
    accumulators to the identity, (2) run the reduction loops with the last output axis innermost
    (every row of the block reuses each load of the operand that varies along that axis), (3)
    apply the epilogue and store the rows. A remainder loop takes the rows a block does not fill.
    Splits over %start..%end like the plain order."""
    last, size = global_vars[-1], kernel.shape[-1]
    block = choices.rows if len(global_vars) >= 2 else 1
    mid = global_vars[-2] if block > 1 else None
    acc_type = value_type(acc_compute)
    partial = choices.split is not None
    for row in range(block):  # one alloca per row: distinct objects, so the vectorizer sees no aliasing
        builder.emit(f"%row{row} = alloca [{size} x {acc_type}]")
        if partial:
            builder.emit(f"%part{row} = alloca [{size} x {acc_type}]")
    for rows in {block, 1}:
        for phase in ("init", "acc", "out") + (("pinit", "fold") if partial else ()):
            builder.emit(f"%{last}.{phase}{rows}.addr = alloca i64")
        for name in reduce_vars:  # each block has its own reduction loops
            builder.emit(f"%{name}.{rows}.addr = alloca i64")
    if mid is not None:
        builder.emit(f"%{mid}.rem.addr = alloca i64")
    outer = global_vars[:-2] if mid is not None else global_vars[:-1]
    for depth, (name, extent) in enumerate(zip(outer, kernel.shape)):
        builder.open_loop(name, "%start" if depth == 0 else "0", "%end" if depth == 0 else str(extent))
    if mid is None:
        low, high = ("0", str(size)) if outer else ("%start", "%end")
        _row_block(builder, kernel, reduce_vars, acc_compute, choices, last, None, 1, low, high)
    else:
        mid_low, mid_high = ("%start", "%end") if not outer else ("0", str(kernel.shape[-2]))
        builder.emit(f"%{mid}.lim = sub i64 {mid_high}, {block - 1}")
        builder.open_loop(mid, mid_low, f"%{mid}.lim")
        _row_block(builder, kernel, reduce_vars, acc_compute, choices, last, mid, block, "0", str(size))
        builder.close_loop(mid, block)
        builder.emit(f"%{mid}.done = load i64, ptr %{mid}.addr")
        builder.open_loop(f"{mid}.rem", f"%{mid}.done", mid_high)
        builder.var_names[mid] = f"{mid}.rem"
        _row_block(builder, kernel, reduce_vars, acc_compute, choices, last, mid, 1, "0", str(size))
        del builder.var_names[mid]
        builder.close_loop(f"{mid}.rem")
    for name in reversed(outer):
        builder.close_loop(name)


def _row_block(builder: _FunctionBuilder, kernel: Kernel, reduce_vars: list[str], acc_compute: np.dtype,
               choices: LoopChoices, last: str, mid: str | None, rows: int, low: str, high: str) -> None:
    """One block of ``rows`` output rows (rows differ in ``mid``) in the i-k-j order."""
    assert kernel.reduce_expr is not None
    acc_dtype = kernel.reduce_expr.dtype
    acc_type = value_type(acc_compute)
    size = kernel.shape[-1]
    empty = int(np.prod(kernel.reduce_shape)) == 0
    identity = render_const(reduce_identity(kernel.reduce_op or "", acc_compute, empty), acc_compute)
    alu = (BOOL_REDUCE_ALU if op_class(acc_compute) == "b" else REDUCE_ALU)[kernel.reduce_op or ""]
    saved = dict(builder.cache)
    global_vars = [f"g{i}" for i in range(len(kernel.shape))]

    def slot(loop: str, row: int, array: str = "row") -> str:
        return builder.instantiate("{out} = getelementptr inbounds [" + str(size) + " x {t}], ptr %" + array
                                   + str(row) + ", i64 0, i64 {i}", t=acc_type, i=f"%{loop}")

    # a long float sum adds the trailing reduction loops into a partial row, folded into the total
    # row once per outer iteration (see partial_sum_split)
    split = choices.split
    target = "row" if split is None else "part"

    init = f"{last}.init{rows}"
    builder.open_loop(init, low, high)
    for row in range(rows):
        builder.emit(f"store {acc_type} {identity}, ptr {slot(init, row)}")
    builder.close_loop(init)

    for depth, (name, extent) in enumerate(zip(reduce_vars, kernel.reduce_shape)):
        if depth == split:
            reset = f"{last}.pinit{rows}"
            builder.open_loop(reset, low, high)
            for row in range(rows):
                builder.emit(f"store {acc_type} {identity}, ptr {slot(reset, row, 'part')}")
            builder.close_loop(reset)
        builder.open_loop(f"{name}.{rows}", "0", str(extent))
        builder.var_names[name] = f"{name}.{rows}"
    inner = f"{last}.acc{rows}"
    builder.open_loop(inner, low, high)
    builder.var_names[last] = inner
    for row in range(rows):
        value = builder.value(substitute(kernel.reduce_expr, mid, row) if mid is not None else kernel.reduce_expr)
        if op_class(acc_dtype) == "h":
            value = builder.extend_to_float(value, acc_dtype)
        pointer = slot(inner, row, target)
        old = builder.instantiate("{out} = load {t}, ptr {p}", t=acc_type, p=pointer)
        if op_class(acc_compute) == "f" and alu in REASSOCIATE:
            new = builder.instantiate(REASSOCIATE[alu], t=acc_type, x=old, y=value)
        else:
            new = builder.alu(alu, [old, value], acc_compute)
        builder.emit(f"store {acc_type} {new}, ptr {pointer}")
    # LLVM fully unrolls a short row (< 64: 16 lanes x its interleave of 4) and may then vectorise a
    # reduction loop with gathers (much slower on 20-wide rows and on 1-row remainder blocks, see
    # docs/performance.md):
    # the reduction loops stay scalar, and (the heuristics' vectorize(0, 0)) a row that is not whole
    # vectors stays a vectorised loop
    builder.close_loop(inner, hints=choices.inner_hints())
    for depth in reversed(range(len(reduce_vars))):
        name = reduce_vars[depth]
        builder.close_loop(f"{name}.{rows}", hints=("no_vectorize", *choices.reduce_hints(depth, False)))
        del builder.var_names[name]
        if depth == split:
            fold = f"{last}.fold{rows}"
            builder.open_loop(fold, low, high)
            for row in range(rows):
                total_slot, part_slot = slot(fold, row), slot(fold, row, "part")
                total = builder.instantiate("{out} = load {t}, ptr {p}", t=acc_type, p=total_slot)
                part = builder.instantiate("{out} = load {t}, ptr {p}", t=acc_type, p=part_slot)
                summed = builder.instantiate(REASSOCIATE["add"], t=acc_type, x=total, y=part)
                builder.emit(f"store {acc_type} {summed}, ptr {total_slot}")
            builder.close_loop(fold)
    builder.cache = dict(saved)

    out = f"{last}.out{rows}"
    builder.open_loop(out, low, high)
    builder.var_names[last] = out
    in_loop = dict(builder.cache)
    for row in range(rows):
        builder.cache = dict(in_loop)  # ``acc`` (and what is computed from it) differs per row
        final = builder.instantiate("{out} = load {t}, ptr {p}", t=acc_type, p=slot(out, row))
        builder.acc_value = builder.narrow_from_float(final, acc_dtype) if op_class(acc_dtype) == "h" else final
        shifted = kernel if mid is None or row == 0 else attrs.evolve(
            kernel, outputs=tuple(substitute(e, mid, row) for e in kernel.outputs))
        _store_outputs(builder, shifted, global_vars, mid, row)
    builder.close_loop(out)
    builder.cache = dict(saved)
    builder.acc_value = None
    del builder.var_names[last]


def _module(kernel: Kernel, builder: _FunctionBuilder) -> str:
    builder.emit("ret void")

    parameters = [f"ptr noalias %out{i}" for i in range(len(kernel.outputs))]
    parameters += [f"ptr noalias %in{i}" for i in range(len(kernel.in_avals))]
    body = "\n".join(builder.lines)
    lines = [f"; kernel {kernel.name}", *(f";   {line}" for line in str(kernel).splitlines()[1:]),
             f"define void @{llvm_function_name(kernel)}({', '.join(parameters + ['i64 %start', 'i64 %end'])}) #0 {{",
             "entry:", body, "}", *builder.helpers.values(), *_declarations(body + "\n".join(builder.helpers.values())),
             'attributes #0 = { nounwind "prefer-vector-width"="512" "min-legal-vector-width"="512" }',
             "attributes #1 = { nounwind willreturn memory(none) }"]
    return "\n".join(lines) + "\n"


_CALL = re.compile(r"call (\S+) @([\w.]+)\(([^)]*)\)")


def _declarations(body: str) -> list[str]:
    """``declare`` lines for every intrinsic and libm function the body calls (helpers defined in
    the module are skipped). libm functions are pure here (no errno), hence attribute group #1."""
    found: dict[str, str] = {}
    for result, name, arguments in _CALL.findall(body):
        if name.startswith("fg.") or name in found:
            continue
        types = ", ".join(argument.split()[0] for argument in arguments.split(","))
        found[name] = f"declare {result} @{name}({types})" + ("" if name.startswith("llvm.") else " #1")
    return list(found.values())


def external_symbols(source: str) -> list[str]:
    """Names of the non-intrinsic functions an LLVM module declares (libm), for resolution checks."""
    return re.findall(r"^declare \S+ @([\w.]+)\(.*#1$", source, flags=re.MULTILINE)

