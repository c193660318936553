"""Render a ``Kernel`` (funcgrad/lower/kernel.py) as a WGSL compute shader for the WEBGPU device.

One invocation computes one output element: the flat output position comes from the (up to 2-D)
dispatch, is split into the global indices ``g0, g1, ...``, runs the reduction loops (if any) and
stores every output. Buffers are ``array<T>`` storage bindings, outputs first (binding 0, 1, ...);
a kernel with more arrays than the device has bindings packs its inputs (and if need be its
outputs) into one binding per storage type, at constant offsets (``buffer_layout``).

WGSL is narrower than the kernel IR, so some values change form at the buffer boundary
(``storage_dtype`` says how; the device converts on the host):

* no 8/16-bit storage: bool is stored as u32 (0/1); int8/int16 as i32, uint8/uint16 as u32 (and
  computed there, wrapped back to their width after every operation); float16/bfloat16 as f32
  (computed in f32 and rounded to their precision after every operation, as the reference does);
* no 64-bit types: float64, int64 and uint64 arrays raise ``WGSLUnsupportedError``. The kernel IR's
  int64 index arithmetic is rendered in i32; ``check_kernel`` makes sure every size fits.

Integer semantics follow the reference (x / 0 = x % 0 = 0, shifts out of range give 0 or -1,
wrap-around arithmetic). Floats: lavapipe (Mesa) optimizes floats unsafely: it compiles comparisons
as ordered, folds ``x != x``, and folds 0 / x and x / 0.0 to 0. So NaN tests and NaN-propagating
max/min work on the bits, and every float constant is built at run time from its bits and
``fg_zero`` (a private variable set to ``groups.z - 1``, which is 0 but unknown to the compiler);
that also spells infinities, which WGSL literals cannot. Subnormals may be flushed to zero by
float operations, so results in that range are built on the bits (``fg_ldexp``). The driver's math
library is rough (exp ~10 ulp, log ~500 ulp near 1, asin ~3000, sin wrong past ~1e5), so the
transcendental functions are written here: Cephes-style polynomials after exact range reduction
(sin/cos/tan reduce with 2/pi's bits, Payne-Hanek, in integer arithmetic), exact fmod by long
division, pow as exp(y log x) with y log x in double-float32. tests/devices/test_device_webgpu.py documents
the accuracy (within 4 ulp of NumPy).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.lower.kernel import BOOL, COMPARISONS, INDEX, Kernel, KExpr, UnsupportedDtypeError, two_over_pi_words

__all__ = ["render_wgsl", "buffer_layout", "BufferLayout", "Binding", "storage_dtype", "check_kernel",
           "WGSLUnsupportedError", "WORKGROUP_SIZE"]

WORKGROUP_SIZE = 64
MAX_INDEX = 2**31 - 1  # index arithmetic runs in i32

# value type in the shader, and the dtype of the storage buffer on the host side
_TYPES = {"bool": ("bool", np.uint32), "int8": ("i32", np.int32), "int16": ("i32", np.int32),
          "int32": ("i32", np.int32), "uint8": ("u32", np.uint32), "uint16": ("u32", np.uint32),
          "uint32": ("u32", np.uint32), "float16": ("f32", np.float32), "bfloat16": ("f32", np.float32),
          "float32": ("f32", np.float32)}
_NARROW_BITS = {"int8": 8, "int16": 16, "uint8": 8, "uint16": 16}
_ROUNDED = ("float16", "bfloat16")


PARTIAL_BLOCK = 64  # terms of a long float sum added into one partial sum (see render_wgsl's reduction)


class WGSLUnsupportedError(ValueError):
    """The kernel uses something WGSL cannot express (64-bit types, sizes beyond i32)."""


class WGSLDtypeError(WGSLUnsupportedError, UnsupportedDtypeError):
    """A 64-bit dtype, which WGSL has no type for."""


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The host dtype of a buffer holding ``dtype`` values (see the module docstring)."""
    name = np.dtype(dtype).name
    if name not in _TYPES:
        raise WGSLDtypeError(f"WEBGPU cannot hold {name} arrays (WGSL has no 64-bit types; "
                                   f"supported: {', '.join(_TYPES)})")
    return np.dtype(_TYPES[name][1])


def value_type(dtype: np.dtype) -> str:
    if np.dtype(dtype) == INDEX:
        return "i32"
    name = np.dtype(dtype).name
    if name not in _TYPES:
        raise WGSLDtypeError(f"WEBGPU cannot compute with {name} values (WGSL has no 64-bit types)")
    return _TYPES[name][0]


def check_kernel(kernel: Kernel) -> None:
    """Raise ``WGSLUnsupportedError`` unless every buffer dtype is storable and every size fits i32."""
    for role, avals in (("input", kernel.in_avals), ("output", kernel.out_avals)):
        for number, aval in enumerate(avals):
            storage_dtype(aval.dtype)
            if int(np.prod(aval.shape, dtype=np.int64)) > MAX_INDEX:
                raise WGSLUnsupportedError(f"kernel {kernel.name}: {role} {number} {aval} has more than 2^31 - 1 "
                                           "elements (WEBGPU indexes in i32)")
    iterations = int(np.prod(kernel.shape, dtype=np.int64)) * max(1, int(np.prod(kernel.reduce_shape, dtype=np.int64)))
    if max(list(kernel.shape) + list(kernel.reduce_shape) + [iterations]) > MAX_INDEX:
        raise WGSLUnsupportedError(f"kernel {kernel.name}: loop sizes {kernel.shape} x {kernel.reduce_shape} do not "
                                   "fit WEBGPU's i32 index arithmetic")


def op_class(dtype: np.dtype) -> str:
    """'b' bool, 's' signed (index included), 'u' unsigned, 'f' float (f16/bf16 too)."""
    dtype = np.dtype(dtype)
    return "b" if dtype == BOOL else {"i": "s", "u": "u", "f": "f", "V": "f"}[dtype.kind]


# --- constants ------------------------------------------------------------------------------------

def render_const(value: Any, dtype: np.dtype) -> str:
    """A WGSL literal; floats are built from their bits and ``fg_zero`` (see the module docstring)."""
    kind = op_class(dtype)
    if kind == "b":
        return "true" if value else "false"
    if kind == "s":
        integer = int(value)
        if not -2**31 <= integer < 2**31:
            raise WGSLUnsupportedError(f"the constant {integer} does not fit WEBGPU's i32 arithmetic")
        return "i32(-2147483647 - 1)" if integer == -2**31 else f"{integer}i"
    if kind == "u":
        return f"{int(value) & 0xFFFFFFFF}u"
    bits = struct.unpack("<I", struct.pack("<f", float(np.float32(value))))[0]
    return f"bitcast<f32>(0x{bits:08x}u | fg_zero)"


# --- operations -----------------------------------------------------------------------------------
# Templates per value class: {x} {y} operands, {T} the WGSL type, {bits} the dtype's width.

FLOAT_OPS: dict[str, str] = {
    "neg": "-{x}", "abs": "abs({x})",
    "sign": "select(select(select({x}, 0.0f, {x} == 0.0f), -1.0f, {x} < 0.0f), 1.0f, {x} > 0.0f)",
    **{op: f"{op}({{x}})" for op in ("sqrt", "floor", "ceil", "round")},
    "sin": "fg_sin({x})", "cos": "fg_cos({x})", "tan": "fg_tan({x})",
    "exp": "fg_exp({x})", "exp2": "fg_exp2({x})", "cosh": "fg_cosh({x})",
    "atan": "fg_atan({x})", "asin": "fg_asin({x})", "acos": "fg_acos({x})",
    "sinh": "fg_sinh({x})", "tanh": "fg_tanh({x})", "asinh": "fg_asinh({x})", "acosh": "fg_acosh({x})",
    "atanh": "fg_atanh({x})", "log": "fg_log({x})", "log2": "fg_log2({x})",
    "rsqrt": "1.0f / sqrt({x})", "expm1": "fg_expm1({x})", "log1p": "fg_log1p({x})", "erf": "fg_erf({x})",
    "logistic": "0.5f * fg_tanh(0.5f * {x}) + 0.5f",
    "is_finite": "((bitcast<u32>({x}) & 0x7fffffffu) < 0x7f800000u)",
    "add": "{x} + {y}", "sub": "{x} - {y}", "mul": "{x} * {y}", "div": "{x} / {y}", "rem": "fg_fmod({x}, {y})",
    "pow": "fg_pow({x}, {y})", "max": "fg_max({x}, {y})", "min": "fg_min({x}, {y})", "atan2": "fg_atan2({x}, {y})",
    "eq": "{x} == {y}", "ne": "!({x} == {y})", "lt": "{x} < {y}", "le": "{x} <= {y}", "gt": "{x} > {y}",
    "ge": "{x} >= {y}",
}

_OUT_OF_RANGE = {"s": "({y} < 0i || {y} >= {bits}i)", "u": "({y} >= {bits}u)"}
INT_OPS: dict[str, dict[str, str]] = {
    "neg": {"s": "-{x}", "u": "0u - {x}"},
    "abs": {"s": "abs({x})", "u": "{x}"},
    "sign": {"s": "sign({x})", "u": "select(0u, 1u, {x} != 0u)"},
    "not": {"s": "~{x}", "u": "~{x}", "b": "!{x}"},
    "add": {"s": "{x} + {y}", "u": "{x} + {y}"},
    "sub": {"s": "{x} - {y}", "u": "{x} - {y}"},
    "mul": {"s": "{x} * {y}", "u": "{x} * {y}"},
    # Signed / and % go through unsigned magnitudes: WGSL defines them, but the OpenGL adapter
    # translates them to GLSL, where negative operands give undefined results (llvmpipe: -9 % 5 == 1).
    "div": {"s": "fg_idiv({x}, {y})", "u": "select({x} / {y}, 0u, {y} == 0u)"},
    "rem": {"s": "fg_irem({x}, {y})", "u": "{x} % select({y}, 1u, {y} == 0u)"},
    "pow": {"s": "fg_ipow_i32({x}, {y})", "u": "fg_ipow_u32({x}, {y})"},
    "max": {"s": "max({x}, {y})", "u": "max({x}, {y})", "b": "{x} || {y}"},
    "min": {"s": "min({x}, {y})", "u": "min({x}, {y})", "b": "{x} && {y}"},
    "and": {"s": "{x} & {y}", "u": "{x} & {y}", "b": "{x} && {y}"},
    "or": {"s": "{x} | {y}", "u": "{x} | {y}", "b": "{x} || {y}"},
    "xor": {"s": "{x} ^ {y}", "u": "{x} ^ {y}", "b": "{x} != {y}"},
    # WGSL masks the shift amount; the reference defines out-of-range shifts
    "shift_left": {k: f"select({{x}} << u32({{y}}), {{zero}}, {v})" for k, v in _OUT_OF_RANGE.items()},
    "shift_right": {"s": f"{{x}} >> u32(select({{y}}, 31i, {_OUT_OF_RANGE['s']}))",
                    "u": f"select({{x}} >> {{y}}, 0u, {_OUT_OF_RANGE['u']})"},
    "eq": {"s": "{x} == {y}", "u": "{x} == {y}", "b": "{x} == {y}"},
    "ne": {"s": "{x} != {y}", "u": "{x} != {y}", "b": "{x} != {y}"},
    "lt": {"s": "{x} < {y}", "u": "{x} < {y}", "b": "!{x} && {y}"},
    "le": {"s": "{x} <= {y}", "u": "{x} <= {y}", "b": "!{x} || {y}"},
    "gt": {"s": "{x} > {y}", "u": "{x} > {y}", "b": "{x} && !{y}"},
    "ge": {"s": "{x} >= {y}", "u": "{x} >= {y}", "b": "{x} || !{y}"},
}

# Index arithmetic divides non-negative values only (kernel.py's simplifier relies on that too), where
# the plain operators are defined on every adapter, GLSL's included.
INDEX_OPS: dict[str, str] = {
    "div": "select({x} / {y}, 0i, {y} == 0i)",
    "rem": "{x} % select({y}, 1i, {y} == 0i || {y} == -1i)",
}

# helper functions, emitted once per shader when a template names them
HELPERS: dict[str, str] = {
    # pack2x16float leaves a NaN's bits to the adapter (OpenGL's llvmpipe gives 0x7fff): keep sign and payload
    "fg_f16_bits": """fn fg_f16_bits(x: f32) -> u32 {
  let bits = bitcast<u32>(x);
  if (fg_isnan(x)) { return ((bits >> 16u) & 0x8000u) | 0x7e00u | ((bits >> 13u) & 0x3ffu); }
  return pack2x16float(vec2<f32>(x, 0.0f)) & 0xffffu;
}""",
    # truncating signed division and remainder from unsigned ones (x / 0 = x % 0 = 0; MIN / -1 wraps)
    "fg_imagnitude": """fn fg_imagnitude(x: i32) -> u32 {
  return select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0i);
}""",
    "fg_idiv": """fn fg_idiv(x: i32, y: i32) -> i32 {
  let q = fg_imagnitude(x) / max(fg_imagnitude(y), 1u);
  return select(bitcast<i32>(select(q, 0u - q, (x < 0i) != (y < 0i))), 0i, y == 0i);
}""",
    "fg_irem": """fn fg_irem(x: i32, y: i32) -> i32 {
  let r = fg_imagnitude(x) % max(fg_imagnitude(y), 1u);
  return bitcast<i32>(select(r, 0u - r, x < 0i));
}""",
    "fg_isnan": """fn fg_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }""",
    # x86's default NaN (sign set), which NumPy's results carry on the machines tests run on
    "fg_nan": """fn fg_nan() -> f32 { return bitcast<f32>(0xffc00000u | fg_zero); }""",
    "fg_inf": """fn fg_inf() -> f32 { return bitcast<f32>(0x7f800000u | fg_zero); }""",
    # NaN propagates (the first NaN operand, as NumPy); -0.0 < +0.0 (IEEE 754-2019 maximum/minimum, as the reference)
    "fg_max": """fn fg_max(x: f32, y: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  if (fg_isnan(y)) { return y; }
  if (x == y) { return bitcast<f32>(bitcast<u32>(x) & bitcast<u32>(y)); }
  return select(y, x, x > y);
}""",
    "fg_min": """fn fg_min(x: f32, y: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  if (fg_isnan(y)) { return y; }
  if (x == y) { return bitcast<f32>(bitcast<u32>(x) | bitcast<u32>(y)); }
  return select(y, x, x < y);
}""",
    # atan2(+-0, +0) = +-0 and atan2(+-0, -0) = +-pi, which the driver gets wrong
    "fg_atan2": """fn fg_atan2(y: f32, x: f32) -> f32 {
  if (fg_isnan(x) || fg_isnan(y)) { return fg_nan(); }
  if (y == 0.0f && x == 0.0f) {
    let r = select(0.0f, 3.14159265358979f, (bitcast<u32>(x) >> 31u) == 1u);
    return select(r, -r, (bitcast<u32>(y) >> 31u) == 1u);
  }
  if (abs(x) == fg_inf() && abs(y) == fg_inf()) {
    let r = select(0.7853981633974483f, 2.356194490192345f, x < 0.0f);
    return select(r, -r, y < 0.0f);
  }
  if (x == 0.0f) { return select(1.5707963267948966f, -1.5707963267948966f, y < 0.0f); }
  let base = fg_atan(y / x);
  if (x > 0.0f || (x == 0.0f && (bitcast<u32>(x) >> 31u) == 0u)) { return base; }
  return select(base + 3.14159265358979f, base - 3.14159265358979f, y < 0.0f || (bitcast<u32>(y) >> 31u) == 1u);
}""",
    # Cephes atanf: reduce to |x| <= tan(pi/8), then a degree-9 odd polynomial
    "fg_atan": """fn fg_atan(x: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  var a = abs(x);
  var base = 0.0f;
  if (a > 2.414213562373095f) { base = 1.5707963267948966f; a = -1.0f / a; }
  else if (a > 0.4142135623730950f) { base = 0.7853981633974483f; a = (a - 1.0f) / (a + 1.0f); }
  let z = a * a;
  let r = base + ((((8.05374449538e-2f * z - 1.38776856032e-1f) * z + 1.99777106478e-1f) * z
                   - 3.33329491539e-1f) * z * a + a);
  return select(r, -r, x < 0.0f);
}""",
    # p * 2^k built on the bits, so results in the subnormal range survive a flush-to-zero driver
    "fg_ldexp": """fn fg_ldexp(p: f32, k: i32) -> f32 {
  let bits = bitcast<u32>(p);
  let e = i32((bits >> 23u) & 0xffu) - 127i + k;
  if (e > 127i) { return fg_inf(); }
  if (e >= -126i) { return bitcast<f32>((bits & 0x807fffffu) | (u32(e + 127i) << 23u)); }
  let shift = u32(-126i - e);
  if (shift > 24u) { return 0.0f; }
  let m = (bits & 0x7fffffu) | 0x800000u;
  let half = 1u << (shift - 1u);
  let rest = m & ((1u << shift) - 1u);
  var q = m >> shift;
  if (rest > half || (rest == half && (q & 1u) == 1u)) { q = q + 1u; }
  return bitcast<f32>((bits & 0x80000000u) | q);
}""",
    # Cephes expf: exp(r) for |r| <= ln2 / 2, as 1 + r + r^2 P(r)
    "fg_exp_reduced": """fn fg_exp_reduced(r: f32) -> f32 {
  let p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
           + 1.6666665459e-1f) * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}""",
    # exp(x) 2^k: x = n ln2 + r (ln2 in two parts, so r is exact); the driver's exp is ~10 ulp off
    "fg_exp_scaled": """fn fg_exp_scaled(x: f32, k: i32) -> f32 {
  if (fg_isnan(x)) { return x; }
  if (x > 200.0f) { return fg_inf(); }
  if (x < -200.0f) { return 0.0f; }
  let n = round(x * 1.4426950408889634f);
  let r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  return fg_ldexp(fg_exp_reduced(r), i32(n) + k);
}""",
    "fg_exp": """fn fg_exp(x: f32) -> f32 { return fg_exp_scaled(x, 0i); }""",
    "fg_exp2": """fn fg_exp2(x: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  if (x >= 128.0f) { return fg_inf(); }
  if (x < -150.0f) { return 0.0f; }
  let n = round(x);
  return fg_ldexp(fg_exp_reduced((x - n) * 0.6931471805599453f), i32(n));
}""",
    "fg_cosh": """fn fg_cosh(x: f32) -> f32 {
  let a = abs(x);
  if (a > 88.0f) { return fg_exp_scaled(a, -1i); }
  let e = fg_exp(a);
  return 0.5f * e + 0.5f / e;
}""",
    # 32 x 32 -> 64-bit product as (high, low) words, from 16-bit halves (WGSL has no 64-bit integers)
    "fg_mul_wide": """fn fg_mul_wide(a: u32, b: u32) -> vec2<u32> {
  let ll = (a & 0xffffu) * (b & 0xffffu);
  let lh = (a & 0xffffu) * (b >> 16u);
  let hl = (a >> 16u) * (b & 0xffffu);
  let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
  return vec2<u32>((a >> 16u) * (b >> 16u) + (lh >> 16u) + (hl >> 16u) + (mid >> 16u), (ll & 0xffffu) | (mid << 16u));
}""",
    # Payne-Hanek: |x| = q pi/2 + r with |r| <= pi/4, exact for every float32 (the driver's sin is
    # wrong past ~1e5): the significand times a 96-bit window of 2/pi's bits, in integers
    "fg_reduce_pio2": """fn fg_reduce_pio2(a: f32) -> vec2<f32> {
  if (a <= 0.7853981633974483f) { return vec2<f32>(a, 0.0f); }
  let bits = bitcast<u32>(a);
  let m = (bits & 0x7fffffu) | 0x800000u;
  let position = i32(bits >> 23u) - 120i;  // table bit where the window starts: 2/pi bit (exponent - 151), + 31
  let word = u32(position) / 32u;
  let shift = u32(position) % 32u;
  var w: array<u32, 3>;
  for (var i = 0u; i < 3u; i += 1u) {
    let high = fg_two_over_pi[word + i];
    let low = fg_two_over_pi[word + i + 1u];
    w[i] = select((high << shift) | (low >> (32u - shift)), high, shift == 0u);
  }
  let p2 = fg_mul_wide(m, w[2]);
  let p1 = fg_mul_wide(m, w[1]);
  let p0 = fg_mul_wide(m, w[0]);
  let r0 = p2.y;
  var r1 = p2.x + p1.y;
  let c1 = select(0u, 1u, r1 < p1.y);
  var r2 = p1.x + c1 + p0.y;
  let c2 = select(0u, 1u, r2 < p0.y || (r2 == p0.y && c1 == 1u));
  // the point sits after bit 94 of the product: quadrant in bits 95..94, fraction below
  var q = (r2 >> 30u) & 3u;
  var high = (r2 << 2u) | (r1 >> 30u);
  var low = (r1 << 2u) | (r0 >> 30u);
  var sign = 1.0f;
  if (high >= 0x80000000u) {  // fraction >= 1/2: the next quadrant, a negative remainder
    q = (q + 1u) & 3u;
    high = ~high;
    low = ~low + 1u;
    if (low == 0u) { high = high + 1u; }
    sign = -1.0f;
  }
  let fraction = f32(high) * 2.3283064365386963e-10f + f32(low) * 5.421010862427522e-20f;
  return vec2<f32>(sign * fraction * 1.5707963267948966f, f32(q));
}""",
    # Cephes sinf/cosf polynomials on |r| <= pi/4
    "fg_sin_reduced": """fn fg_sin_reduced(r: f32) -> f32 {
  let z = r * r;
  return r + r * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
}""",
    "fg_cos_reduced": """fn fg_cos_reduced(r: f32) -> f32 {
  let z = r * r;
  return 1.0f - 0.5f * z + z * z * ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z
                                   + 4.166664568298827e-2f);
}""",
    "fg_sin": """fn fg_sin(x: f32) -> f32 {
  if (fg_isnan(x) || abs(x) == fg_inf()) { return fg_nan(); }
  let reduced = fg_reduce_pio2(abs(x));
  let q = u32(reduced.y);
  var r = select(fg_sin_reduced(reduced.x), fg_cos_reduced(reduced.x), (q & 1u) == 1u);
  if (q >= 2u) { r = -r; }
  return select(r, -r, x < 0.0f || (bitcast<u32>(x) >> 31u) == 1u);
}""",
    "fg_cos": """fn fg_cos(x: f32) -> f32 {
  if (fg_isnan(x) || abs(x) == fg_inf()) { return fg_nan(); }
  let reduced = fg_reduce_pio2(abs(x));
  let q = u32(reduced.y);
  let r = select(fg_cos_reduced(reduced.x), fg_sin_reduced(reduced.x), (q & 1u) == 1u);
  return select(r, -r, q == 1u || q == 2u);
}""",
    "fg_tan": """fn fg_tan(x: f32) -> f32 {
  if (fg_isnan(x) || abs(x) == fg_inf()) { return fg_nan(); }
  let reduced = fg_reduce_pio2(abs(x));
  let z = reduced.x;
  let zz = z * z;
  // Cephes tanf on |z| <= pi/4; odd quadrants give -cot
  let t = (((((9.38540185543e-3f * zz + 3.11992232697e-3f) * zz + 2.44301354525e-2f) * zz + 5.34112807005e-2f) * zz
            + 1.33387994085e-1f) * zz + 3.33331568548e-1f) * zz * z + z;
  let r = select(t, -1.0f / t, (u32(reduced.y) & 1u) == 1u);
  return select(r, -r, x < 0.0f || (bitcast<u32>(x) >> 31u) == 1u);
}""",
    # Cephes asinf/acosf (the driver's asin is thousands of ulps off near +-1)
    "fg_asin": """fn fg_asin(x: f32) -> f32 {
  let a = abs(x);
  if (a > 1.0f || fg_isnan(x)) { return fg_nan(); }
  var z: f32;
  var s: f32;
  if (a > 0.5f) { z = 0.5f * (1.0f - a); s = sqrt(z); } else { z = a * a; s = a; }
  var r = ((((4.2163199048e-2f * z + 2.4181311049e-2f) * z + 4.5470025998e-2f) * z + 7.4953002686e-2f) * z
           + 1.6666752422e-1f) * z * s + s;
  if (a > 0.5f) { r = 1.5707963267948966f - (r + r); }
  return select(r, -r, x < 0.0f);
}""",
    "fg_acos": """fn fg_acos(x: f32) -> f32 {
  if (x < -0.5f) { return 3.14159265358979f - 2.0f * fg_asin(sqrt(0.5f * (1.0f + x))); }
  if (x > 0.5f) { return 2.0f * fg_asin(sqrt(0.5f * (1.0f - x))); }
  return 1.5707963267948966f - fg_asin(x);
}""",
    # 0.5 (E + E / (E + 1)) with E = expm1(|x|) keeps small arguments exact
    "fg_sinh": """fn fg_sinh(x: f32) -> f32 {
  let a = abs(x);
  var r: f32;
  if (a > 88.0f) { r = fg_exp_scaled(a, -1i); }
  else { let e = fg_expm1(a); r = 0.5f * (e + e / (e + 1.0f)); }
  return select(r, -r, x < 0.0f || (bitcast<u32>(x) >> 31u) == 1u);
}""",
    # tanh(|x|) = 1 - 2 / (exp(2|x|) + 1), a series near 0 (the driver's tanh overflows to NaN)
    "fg_tanh": """fn fg_tanh(x: f32) -> f32 {
  if (fg_isnan(x) || x == 0.0f) { return x; }
  let a = abs(x);
  if (a < 0.625f) {
    let z = x * x;
    return x + x * z * ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                        + 1.33314422036e-1f) * z - 3.33332819422e-1f);
  }
  let big = 1.0f - 2.0f / (fg_exp(min(2.0f * a, 88.0f)) + 1.0f);
  return select(big, -big, x < 0.0f);
}""",
    "fg_asinh": """fn fg_asinh(x: f32) -> f32 {
  let a = abs(x);
  var r: f32;
  if (a > 1.0e18f) { r = log(a) + 0.693147180559945f; }
  else if (a < 0.5f) { r = fg_log1p(a + a * a / (1.0f + sqrt(1.0f + a * a))); }
  else { r = log(a + sqrt(a * a + 1.0f)); }
  return select(r, -r, x < 0.0f);
}""",
    "fg_acosh": """fn fg_acosh(x: f32) -> f32 {
  if (x < 1.0f) { return fg_nan(); }
  if (x > 1.0e18f) { return log(x) + 0.693147180559945f; }
  let t = x - 1.0f;
  return fg_log1p(t + sqrt(2.0f * t + t * t));
}""",
    "fg_atanh": """fn fg_atanh(x: f32) -> f32 {
  let a = abs(x);
  if (a > 1.0f) { return fg_nan(); }
  let r = 0.5f * fg_log1p(2.0f * a / (1.0f - a));
  return select(r, -r, x < 0.0f);
}""",
    # Taylor series for |x| < 0.5 (the driver's exp and log are too rough to cancel against)
    "fg_expm1": """fn fg_expm1(x: f32) -> f32 {
  if (abs(x) >= 0.5f) { return fg_exp(x) - 1.0f; }
  return x + x * x * (0.5f + x * (1.6666666666666666e-1f + x * (4.1666666666666664e-2f + x * (8.333333333333333e-3f
         + x * (1.388888888888889e-3f + x * (1.984126984126984e-4f + x * (2.48015873015873e-5f
         + x * 2.7557319223985893e-6f)))))));
}""",
    # log from the double-float32 logarithm below, rounded once (the driver's log is ~500 ulp off near 1)
    "fg_log": """fn fg_log(x: f32) -> f32 {
  if (fg_isnan(x) || x == fg_inf()) { return x; }
  if (x < 0.0f) { return fg_nan(); }
  if (x == 0.0f) { return -fg_inf(); }
  let w = fg_log_wide(x);
  return w.x + w.y;
}""",
    # log(1 + x) with 1 + x exact as hi + lo
    "fg_log1p": """fn fg_log1p(x: f32) -> f32 {
  if (fg_isnan(x) || x == fg_inf()) { return x; }
  if (x < -1.0f) { return fg_nan(); }
  if (x == -1.0f) { return -fg_inf(); }
  if (abs(x) < 5.9604645e-8f) { return x; }
  let u = fg_two_sum(1.0f, x);
  let w = fg_log_wide(u.x);
  return w.x + (w.y + u.y / u.x);
}""",
    "fg_log2": """fn fg_log2(x: f32) -> f32 {
  if (fg_isnan(x) || x == fg_inf()) { return x; }
  if (x < 0.0f) { return fg_nan(); }
  if (x == 0.0f) { return -fg_inf(); }
  let w = fg_log_wide(x);
  let p = fg_two_prod(w.x, 1.4426950408889634f);
  return p.x + (p.y + (w.x * 1.92596298909109e-8f + w.y * 1.4426950408889634f));
}""",
    # |x| < 0.5: Taylor series; above: 1 - erfc with Numerical Recipes' erfc (relative error < 1.2e-7)
    "fg_erf": """fn fg_erf(x: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  let a = abs(x);
  if (a < 0.5f) {
    let z = x * x;
    return 1.1283791670955126f * x * (1.0f + z * (-0.333333333333f + z * (0.1f + z * (-0.0238095238095f
                                      + z * (0.00462962962963f - z * 0.000757575757576f)))));
  }
  if (a > 4.0f) { return select(1.0f, -1.0f, x < 0.0f); }
  let t = 1.0f / (1.0f + 0.5f * a);
  let p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (
      0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  let r = 1.0f - t * fg_exp(p - a * a);
  return select(r, -r, x < 0.0f);
}""",
    # C fmod, exact: long division on the significands (as musl's fmodf); the remainder has the dividend's sign
    "fg_fmod": """fn fg_fmod(x: f32, y: f32) -> f32 {
  let ax = bitcast<u32>(x) & 0x7fffffffu;
  let ay = bitcast<u32>(y) & 0x7fffffffu;
  if (fg_isnan(x)) { return x; }
  if (fg_isnan(y)) { return y; }
  if (ay == 0u || ax == 0x7f800000u) { return fg_nan(); }
  if (ax < ay) { return x; }
  let sign = bitcast<u32>(x) & 0x80000000u;
  var ex = i32(ax >> 23u);
  var ey = i32(ay >> 23u);
  var mx = ax & 0x7fffffu;
  var my = ay & 0x7fffffu;
  if (ex == 0i) {  // subnormal: normalize
    let s = i32(countLeadingZeros(mx)) - 8i;
    mx = mx << u32(s);
    ex = 1i - s;
  } else {
    mx = mx | 0x800000u;
  }
  if (ey == 0i) {  // subnormal: normalize
    let s = i32(countLeadingZeros(my)) - 8i;
    my = my << u32(s);
    ey = 1i - s;
  } else {
    my = my | 0x800000u;
  }
  loop {
    if (mx >= my) {
      mx = mx - my;
      if (mx == 0u) { return bitcast<f32>(sign); }
    }
    if (ex <= ey) { break; }
    mx = mx << 1u;
    ex = ex - 1i;
  }
  let s = i32(countLeadingZeros(mx)) - 8i;
  mx = mx << u32(s);
  ex = ex - s;
  if (ex > 0i) { return bitcast<f32>(sign | (u32(ex) << 23u) | (mx & 0x7fffffu)); }
  return bitcast<f32>(sign | (mx >> u32(1i - ex)));
}""",
    # double-float32 arithmetic (a value as hi + lo). lavapipe simplifies float algebra ((a + b) - a
    # to b), so intermediate results pass through fg_opaque, which it cannot see through
    "fg_opaque": """fn fg_opaque(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | fg_zero); }""",
    "fg_high_half": """fn fg_high_half(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) & 0xfffff000u); }""",
    "fg_two_sum": """fn fg_two_sum(a: f32, b: f32) -> vec2<f32> {
  let s = fg_opaque(a + b);
  let b_virtual = fg_opaque(s - a);
  return vec2<f32>(s, (a - fg_opaque(s - b_virtual)) + (b - b_virtual));
}""",
    # a b exactly, as hi + lo: products of 12-bit halves are exact (Dekker)
    "fg_two_prod": """fn fg_two_prod(a: f32, b: f32) -> vec2<f32> {
  let p = fg_opaque(a * b);
  let a_hi = fg_high_half(a);
  let a_lo = a - a_hi;
  let b_hi = fg_high_half(b);
  let b_lo = b - b_hi;
  return vec2<f32>(p, (((a_hi * b_hi - p) + a_hi * b_lo) + a_lo * b_hi) + a_lo * b_lo);
}""",
    "fg_mul_wide_float": """fn fg_mul_wide_float(y: f32, v: vec2<f32>) -> vec2<f32> {
  let p = fg_two_prod(y, v.x);
  return vec2<f32>(p.x, p.y + y * v.y);
}""",
    # log(a) for finite a > 0 as hi + lo: a = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with
    # s = (m - 1) / (m + 1) carried as hi + lo; ln2 in three parts so e ln2 is exact enough
    "fg_log_wide": """fn fg_log_wide(a: f32) -> vec2<f32> {
  var bits = bitcast<u32>(a);
  var e = 0i;
  if (bits < 0x00800000u) { bits = bitcast<u32>(f32(bits)); e = -149i; }  // subnormal: m 2^-149
  e = e + i32(bits >> 23u) - 127i;
  var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);
  if (m > 1.4142135623730951f) { m = bitcast<f32>((bits & 0x007fffffu) | 0x3f000000u); e = e + 1i; }
  let num = m - 1.0f;
  let den = fg_two_sum(m, 1.0f);
  let s_hi = fg_opaque(num / den.x);
  let p = fg_two_prod(s_hi, den.x);
  let s_lo = (((num - p.x) - p.y) - s_hi * den.y) / den.x;
  let z = s_hi * s_hi;
  let series = 2.0f * s_hi * z * (0.3333333333333333f + z * (0.2f + z * (0.14285714285714285f + z * (
      0.1111111111111111f + z * (0.09090909090909091f + z * (0.07692307692307693f + z * 0.06666666666666667f))))));
  let fe = f32(e);
  let head = fg_two_sum(fe * 0.693359375f, 2.0f * s_hi);
  return fg_two_sum(head.x, head.y + ((2.0f * s_lo + series) + (fe * -2.121962606906891e-4f
                                                                 + fe * 1.820635975313678e-9f)));
}""",
    # exp(hi + lo): as fg_exp, with lo added to the reduced argument
    "fg_exp_wide": """fn fg_exp_wide(t: vec2<f32>) -> f32 {
  if (t.x > 200.0f) { return fg_inf(); }
  if (t.x < -200.0f) { return 0.0f; }
  let n = round(t.x * 1.4426950408889634f);
  let r = ((t.x - n * 0.693359375f) - n * -2.12194440e-4f) + t.y;
  return fg_ldexp(fg_exp_reduced(r), i32(n));
}""",
    # C pow for float32: exp(y log|x|) with y log|x| in double-float32 (the driver's pow is ~60 ulp
    # off and undefined for x <= 0)
    "fg_pow": """fn fg_pow(x: f32, y: f32) -> f32 {
  if (y == 0.0f || x == 1.0f) { return 1.0f; }
  if (fg_isnan(x) || fg_isnan(y)) { return fg_nan(); }
  let integer = trunc(y) == y;
  let odd = integer && abs(y) < 16777216.0f && (i32(abs(y)) & 1i) == 1i;
  if (x < 0.0f && !integer && abs(x) != fg_inf()) { return fg_nan(); }
  let a = abs(x);
  var r: f32;
  if (a == 0.0f) { r = select(0.0f, fg_inf(), y < 0.0f); }
  else if (a == fg_inf()) { r = select(fg_inf(), 0.0f, y < 0.0f); }
  else if (x == -1.0f && abs(y) == fg_inf()) { return 1.0f; }
  else if (abs(y) == fg_inf()) { r = select(0.0f, fg_inf(), (a < 1.0f) == (y < 0.0f)); }
  else { r = fg_exp_wide(fg_mul_wide_float(y, fg_log_wide(a))); }
  let negative = x < 0.0f || (x == 0.0f && (bitcast<u32>(x) >> 31u) == 1u);
  return select(r, -r, negative && odd);
}""",
    "fg_ipow_i32": """fn fg_ipow_i32(base: i32, exponent: i32) -> i32 {
  if (exponent < 0i) {
    if (base == 1i) { return 1i; }
    if (base == -1i) { return select(1i, -1i, (exponent & 1i) == 1i); }
    return 0i;
  }
  var b = base;
  var e = exponent;
  var r = 1i;
  while (e != 0i) {
    if ((e & 1i) == 1i) { r = r * b; }
    b = b * b;
    e = e >> 1u;
  }
  return r;
}""",
    "fg_ipow_u32": """fn fg_ipow_u32(base: u32, exponent: u32) -> u32 {
  var b = base;
  var e = exponent;
  var r = 1u;
  while (e != 0u) {
    if ((e & 1u) == 1u) { r = r * b; }
    b = b * b;
    e = e >> 1u;
  }
  return r;
}""",
    "fg_round_f16": """fn fg_round_f16(x: f32) -> f32 {
  if (fg_isnan(x)) { return x; }
  return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0f))).x;
}""",
    # to nearest even in integer arithmetic (NaN stays NaN)
    "fg_round_bf16": """fn fg_round_bf16(x: f32) -> f32 {
  let bits = bitcast<u32>(x);
  if (fg_isnan(x)) { return bitcast<f32>(bits | 0x00400000u); }
  let rounded = bits + 0x7fffu + ((bits >> 16u) & 1u);
  return bitcast<f32>(rounded & 0xffff0000u);
}""",
}
# enough bits for the largest float32 exponent (2^127: window ends near bit 127 + 96)
TWO_OVER_PI_TABLE = ("var<private> fg_two_over_pi: array<u32, 10> = array<u32, 10>("
                     + ", ".join(f"0x{word:08x}u" for word in two_over_pi_words(9)) + ");")

REDUCE_ALU = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}
BOOL_REDUCE_ALU = {"sum": "or", "prod": "and", "max": "or", "min": "and"}


def reduce_identity(op: str, dtype: np.dtype, empty: bool) -> Any:
    """The reduction's start value (a non-empty float sum starts at -0.0, as in render_llvm)."""
    kind = op_class(dtype)
    if op == "sum":
        return False if kind == "b" else (0.0 if empty else -0.0) if kind == "f" else 0
    if op == "prod":
        return True if kind == "b" else 1
    if kind == "b":
        return op == "min"
    if kind == "f":
        return -np.inf if op == "max" else np.inf
    info = np.iinfo(np.int32 if np.dtype(dtype) == INDEX else dtype)
    return info.min if op == "max" else info.max


# --- the renderer ---------------------------------------------------------------------------------

class _ShaderBuilder:
    """Emits the body of ``main``: one ``let`` per expression node, cached per scope."""

    def __init__(self, inputs: Sequence[tuple[str, int]]) -> None:
        self.inputs = inputs  # (binding, offset) of each input
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.cache: dict[KExpr, str] = {}
        self.helpers: dict[str, str] = {}
        self.acc_value: str | None = None

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def let(self, text: str, dtype: np.dtype) -> str:
        self.counter += 1
        name = f"v{self.counter}"
        self.emit(f"let {name}: {value_type(dtype)} = {text};")
        return name

    def use(self, text: str) -> str:
        """Note the helper functions ``text`` calls (and those they call); returns ``text``."""
        for name, source in HELPERS.items():
            if name + "(" in text and name not in self.helpers:
                self.use(source.split("{", 1)[1])  # dependencies first: WGSL allows any order, readers prefer this
                self.helpers[name] = source
        return text

    def value(self, e: KExpr) -> str:
        if e not in self.cache:
            self.cache[e] = self._render(e)
        return self.cache[e]

    def _render(self, e: KExpr) -> str:
        if e.op == "const":
            return render_const(e.arg, e.dtype)
        if e.op == "var":
            return e.arg
        if e.op == "acc":
            if self.acc_value is None:
                raise ValueError("acc is read outside the epilogue of a reduction")
            return self.acc_value
        if e.op == "load":
            name, offset = self.inputs[e.arg]
            index = self.value(e.args[0])
            loaded = f"{name}[{f'{offset}i + {index}' if offset else index}]"
            return self.let(f"{loaded} != 0u" if e.dtype == BOOL else loaded, e.dtype)
        if e.op == "where":
            cond, a, b = (self.value(x) for x in e.args)
            return self.let(f"select({b}, {a}, {cond})", e.dtype)
        if e.op == "cast":
            return self.let(self.use(cast_text(self.value(e.args[0]), e.args[0].dtype, e.dtype)), e.dtype)
        if e.op == "bitcast":
            return self.let(self.use(bitcast_text(self.value(e.args[0]), e.args[0].dtype, e.dtype)), e.dtype)
        source = e.args[0].dtype
        operands = [self.value(a) for a in e.args]
        if e.op in ("sub", "div") and len(operands) == 2 and operands[0] == operands[1] and op_class(source) == "f":
            # lavapipe folds x - x to 0 and x / x to 1, which inf - inf and 0 / 0 (NaN) are not: hide
            # that the operands are one value
            operands[1] = f"fg_opaque({operands[1]})"
        text = alu_text(e.op, operands, source)
        natural = BOOL if e.op in COMPARISONS or e.op == "is_finite" else source
        if natural != e.dtype:
            text = cast_text(f"({text})", natural, e.dtype)
        return self.let(self.use(text), e.dtype)


def alu_text(op: str, operands: list[str], dtype: np.dtype) -> str:
    """WGSL for one ALU operation on values of ``dtype``, wrapped/rounded back to ``dtype``."""
    kind = op_class(dtype)
    x, y = operands[0], operands[1] if len(operands) > 1 else ""
    if kind == "f":
        if op not in FLOAT_OPS:
            raise ValueError(f"unsupported operation {op} on {np.dtype(dtype).name}")
        text = FLOAT_OPS[op].format(x=x, y=y)
        return text if op in COMPARISONS or op == "is_finite" else narrow(text, dtype)
    if np.dtype(dtype) == INDEX and op in INDEX_OPS:
        return INDEX_OPS[op].format(x=x, y=y)
    table = INT_OPS.get(op, {})
    if kind not in table:
        raise ValueError(f"unsupported operation {op} on {np.dtype(dtype).name}")
    name = np.dtype(dtype).name
    bits = _NARROW_BITS.get(name, 1 if kind == "b" else 32)
    text = table[kind].format(x=x, y=y, bits=bits, zero="0i" if kind == "s" else "0u")
    return text if op in COMPARISONS else narrow(text, dtype)


def narrow(text: str, dtype: np.dtype) -> str:
    """Bring a value computed in i32/u32/f32 back to ``dtype``'s range or precision."""
    name = np.dtype(dtype).name
    if name in _NARROW_BITS:
        bits = _NARROW_BITS[name]
        if np.dtype(dtype).kind == "u":
            return f"(({text}) & {(1 << bits) - 1}u)"
        return f"((({text}) << {32 - bits}u) >> {32 - bits}u)"
    if name in _ROUNDED:
        return f"fg_round_{'f16' if name == 'float16' else 'bf16'}({text})"
    return text


def _float_to_int(x: str, target: np.dtype) -> str:
    """Truncate toward zero and saturate to the target's range; NaN gives 0 (the reference)."""
    t = value_type(target)
    info = np.iinfo(np.int32 if target == INDEX else target)
    low, high = float(info.min), float(info.max)
    top = float(np.float32(high)) if float(np.float32(high)) <= high else float(np.nextafter(np.float32(high), 0))
    f32 = np.dtype(np.float32)
    clamped = f"{t}(clamp(trunc({x}), {render_const(low, f32)}, {render_const(top, f32)}))"
    suffix = "i" if t == "i32" else "u"
    saturated = f"select({clamped}, {info.max}{suffix}, {x} >= {render_const(high + 1, f32)})"
    return f"select({saturated}, 0{suffix}, fg_isnan({x}))"


def cast_text(x: str, source: np.dtype, target: np.dtype) -> str:
    """WGSL converting ``x`` (a value of ``source``) to ``target``, as convert_element_type does."""
    source, target = np.dtype(source), np.dtype(target)
    if source == target:
        return x
    from_kind, to_kind = op_class(source), op_class(target)
    t = value_type(target)
    if to_kind == "b":
        return {"f": f"!({x} == 0.0f)", "s": f"{x} != 0i", "u": f"{x} != 0u"}[from_kind]
    if from_kind == "b":
        return f"select({render_const(0, target)}, {render_const(1, target)}, {x})"
    if from_kind == "f" and to_kind == "f":
        return narrow(x, target)  # f32 holds every float16/bfloat16 value exactly
    if from_kind == "f":
        return narrow(_float_to_int(x, target), target) if target.name in _NARROW_BITS else _float_to_int(x, target)
    if to_kind == "f":
        return narrow(f"f32({x})", target)
    return narrow(f"{t}({x})", target)  # integer to integer: wrap to the target's width


def bitcast_text(x: str, source: np.dtype, target: np.dtype) -> str:
    """WGSL reinterpreting the bits of ``x`` (``source`` and ``target`` have one width)."""
    source, target = np.dtype(source), np.dtype(target)
    if source.itemsize != target.itemsize:
        raise ValueError(f"bitcast needs dtypes of one width, got {source.name} and {target.name}")
    bits = source.itemsize * 8
    mask = (1 << bits) - 1
    if op_class(source) == "b" or op_class(target) == "b":
        return cast_text(x, source, target)
    # to the raw bits as u32
    if source.name == "float16":
        raw = f"fg_f16_bits({x})"
    elif source.name == "bfloat16":
        raw = f"(bitcast<u32>({x}) >> 16u)"
    elif bits == 32:
        raw = f"bitcast<u32>({x})"
    else:
        raw = f"(bitcast<u32>({x}) & {mask}u)"
    # from the raw bits
    if target.name == "float16":
        return f"unpack2x16float({raw}).x"
    if target.name == "bfloat16":
        return f"bitcast<f32>({raw} << 16u)"
    if bits == 32:
        return f"bitcast<{value_type(target)}>({raw})"
    if target.kind == "u":
        return raw
    return f"((bitcast<i32>({raw}) << {32 - bits}u) >> {32 - bits}u)"


@attrs.frozen
class Binding:
    """One storage binding: the arrays it holds (``members``: output or input numbers), one after
    another from ``offsets``, all of the host dtype ``storage``."""

    name: str
    storage: np.dtype
    writable: bool
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    size: int  # elements


@attrs.frozen
class BufferLayout:
    """Where each output and input of a kernel lives: ``outputs[n]``/``inputs[n]`` is
    (binding name, element offset). Bindings are numbered in order, outputs first."""

    bindings: tuple[Binding, ...]
    outputs: tuple[tuple[str, int], ...]
    inputs: tuple[tuple[str, int], ...]


def buffer_layout(kernel: Kernel, max_bindings: int | None = None) -> BufferLayout:
    """A binding per array when they fit ``max_bindings``; otherwise the inputs (and, if still too
    many, the outputs) are packed into one binding per storage dtype (at most three each)."""
    def group(role: str, avals: Sequence[Any], packed: bool) -> list[Binding]:
        sizes = [int(np.prod(aval.shape, dtype=np.int64)) for aval in avals]
        if not packed:
            return [Binding(f"{role}{n}", storage_dtype(aval.dtype), role == "out", (n,), (0,), size)
                    for n, (aval, size) in enumerate(zip(avals, sizes))]
        bindings = []
        for storage in (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.float32)):
            members = tuple(n for n, aval in enumerate(avals) if storage_dtype(aval.dtype) == storage)
            if members:
                offsets = tuple(int(sum(sizes[m] for m in members[:k])) for k in range(len(members)))
                bindings.append(Binding(f"{role}_{_storage_type(storage)}", storage, role == "out", members, offsets,
                                        int(sum(sizes[m] for m in members))))
        return bindings

    limit = max_bindings if max_bindings is not None else len(kernel.in_avals) + len(kernel.out_avals)
    outputs = group("out", kernel.out_avals, False)
    inputs = group("in", kernel.in_avals, len(outputs) + len(kernel.in_avals) > limit)
    if len(outputs) + len(inputs) > limit:
        outputs = group("out", kernel.out_avals, True)
    if len(outputs) + len(inputs) > limit:
        raise WGSLUnsupportedError(f"kernel {kernel.name} needs {len(outputs) + len(inputs)} storage buffers even "
                                   f"packed by dtype, over the device's limit of {limit}")

    def places(bindings: list[Binding], count: int) -> tuple[tuple[str, int], ...]:
        found = {m: (b.name, o) for b in bindings for m, o in zip(b.members, b.offsets)}
        return tuple(found[n] for n in range(count))

    return BufferLayout(tuple(outputs + inputs), places(outputs, len(kernel.out_avals)),
                        places(inputs, len(kernel.in_avals)))


def render_wgsl(kernel: Kernel, layout: BufferLayout | None = None) -> str:
    """The compute shader for ``kernel`` (entry point ``main``, workgroup size ``WORKGROUP_SIZE``),
    with its buffers bound as ``layout`` says (default: one binding per array).

    >>> print(render_wgsl(k))  # doctest: +SKIP
    @group(0) @binding(0) var<storage, read_write> out0: array<f32>; ...
    """
    check_kernel(kernel)
    layout = layout or buffer_layout(kernel)
    builder = _ShaderBuilder(layout.inputs)
    size = int(np.prod(kernel.shape, dtype=np.int64))
    builder.emit("fg_zero = groups.z - 1u;  // 0, but only known at run time (see the module docstring)")
    builder.emit(f"let index = gid.x + gid.y * groups.x * {WORKGROUP_SIZE}u;")
    builder.emit(f"if (index >= {size}u) {{ return; }}")
    rest = "i32(index)"
    for axis in reversed(range(len(kernel.shape))):
        extent = kernel.shape[axis]
        builder.emit(f"let g{axis}: i32 = {rest if axis == 0 else f'{rest} % {extent}i'};")
        if axis:
            builder.emit(f"let q{axis}: i32 = {rest} / {extent}i;")
            rest = f"q{axis}"

    if kernel.reduce_expr is not None:
        acc_dtype = kernel.reduce_expr.dtype
        empty = int(np.prod(kernel.reduce_shape)) == 0
        identity = render_const(reduce_identity(kernel.reduce_op or "", acc_dtype, empty), acc_dtype)
        builder.emit(f"var acc: {value_type(acc_dtype)} = {identity};")
        outer_cache = dict(builder.cache)
        last = len(kernel.reduce_shape) - 1
        # a long float sum adds blocks of its innermost loop as partial sums (two levels: ~(n/B + B)
        # roundings instead of n; a serial 4096-term softmax sum was 1.6e-5 off)
        blocked = (kernel.reduce_op == "sum" and op_class(acc_dtype) == "f" and bool(kernel.reduce_shape)
                   and kernel.reduce_shape[last] >= 2 * PARTIAL_BLOCK)
        for axis, extent in enumerate(kernel.reduce_shape):
            if blocked and axis == last:
                builder.emit(f"for (var rb: i32 = 0i; rb < {extent}i; rb += {PARTIAL_BLOCK}i) {{")
                builder.emit(f"  var part: {value_type(acc_dtype)} = {identity};")
                builder.emit(f"  for (var r{axis}: i32 = rb; r{axis} < min(rb + {PARTIAL_BLOCK}i, {extent}i); "
                             f"r{axis} += 1i) {{")
                builder.indent += 2
                continue
            builder.emit(f"for (var r{axis}: i32 = 0i; r{axis} < {extent}i; r{axis} += 1i) {{")
            builder.indent += 1
        item = builder.value(kernel.reduce_expr)
        alu = (BOOL_REDUCE_ALU if op_class(acc_dtype) == "b" else REDUCE_ALU)[kernel.reduce_op or ""]
        # float16/bfloat16 sums are accumulated in f32 and rounded once, as the reference does
        compute = np.dtype(np.float32) if acc_dtype.name in _ROUNDED else acc_dtype
        into = "part" if blocked else "acc"
        builder.emit(f"{into} = {builder.use(alu_text(alu, [into, item], compute))};")
        for axis in reversed(range(len(kernel.reduce_shape))):
            builder.indent -= 1
            builder.emit("}")
            if blocked and axis == last:
                builder.emit(f"acc = {builder.use(alu_text(alu, ['acc', 'part'], compute))};")
                builder.indent -= 1
                builder.emit("}")
        builder.cache = outer_cache  # values computed inside the loop are out of scope after it
        builder.acc_value = builder.let(builder.use(narrow("acc", acc_dtype)), acc_dtype)

    for number, (expr, aval) in enumerate(zip(kernel.outputs, kernel.out_avals)):
        if expr.dtype != aval.dtype:
            raise ValueError(f"output {number} is computed as {expr.dtype.name} but stored as {aval.dtype.name}")
        value = builder.value(expr)
        name, offset = layout.outputs[number]
        position = f"{offset}u + index" if offset else "index"
        builder.emit(f"{name}[{position}] = {f'select(0u, 1u, {value})' if aval.dtype == BOOL else value};")

    bindings = [f"@group(0) @binding({n}) var<storage, {'read_write' if b.writable else 'read'}> {b.name}: "
                f"array<{_storage_type(b.storage)}>;" for n, b in enumerate(layout.bindings)]
    header = [f"// kernel {kernel.name}", *(f"//   {line}" for line in str(kernel).splitlines()[1:])]
    table = [TWO_OVER_PI_TABLE] if "fg_reduce_pio2" in builder.helpers else []
    return "\n".join([*header, *bindings, "var<private> fg_zero: u32;", *table, "",
                      *builder.helpers.values(), "",
                      f"@compute @workgroup_size({WORKGROUP_SIZE})",
                      "fn main(@builtin(global_invocation_id) gid: vec3<u32>, "
                      "@builtin(num_workgroups) groups: vec3<u32>) {", *builder.lines, "}"]) + "\n"


def _storage_type(dtype: np.dtype) -> str:
    return {"i": "i32", "u": "u32", "f": "f32"}[storage_dtype(dtype).kind]
