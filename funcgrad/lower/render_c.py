"""Render ``Kernel``s (funcgrad/lower/kernel.py) as C-family GPU source: OpenCL C here, CUDA C in
``render_cuda.py`` (a subclass that overrides the dialect points).

One work-item computes one output element: it turns its global id into the loop indices
``g0, g1, ...``, runs the reduction loops (if any) into an accumulator, then stores every output.
Large reductions with few outputs use a work-group per output instead: its work-items stride over
the reduction and combine their partial results with a tree in local memory (``LOCAL_REDUCE``).

The semantics are those of the NumPy reference (``funcgrad.ir.primitives``) and the LLVM renderer:
wrap-around integer arithmetic (computed in unsigned types, where C's overflow is defined),
x / 0 = x % 0 = 0, MIN / -1 = MIN, shifts by >= the width give 0 (or -1 for negative values shifted
right), NaN-propagating max/min with -0.0 < +0.0, float -> int conversions that saturate and send
NaN to 0. float16 and bfloat16 values are 16-bit patterns (in memory and in registers, so moving
them is exact); arithmetic converts them to float32 and rounds back to nearest even after every
operation, in integer code that needs no half-precision support. bool is stored as one byte.
Index arithmetic is 64-bit.

What differs between dialects is small and overridable: the type names (``TYPES``, ``STORAGE``;
helpers also use OpenCL's short unsigned names ``uchar ushort uint ulong``, which another dialect
typedefs in its ``preamble``), the kernel signature and address-space qualifiers (``signature``,
``pointer``), the thread-index expressions (``global_id``, ``local_id``, ``group_id``), local memory
and barriers (``local_array``, ``barrier``), the qualifier of helper functions, conversions and bit
casts (``convert``, ``reinterpret``, ``double_to_float_toward_zero``) and the math function names
(``MATH``, ``math_function``). ``render_program`` takes the dialect class.
Expressions are emitted as one typed temporary per distinct node, so shared subexpressions are
computed once and the source stays linear in the size of the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.lower.kernel import BOOL, COMPARISONS, Kernel, KExpr, dtype_class

__all__ = ["CRenderer", "OpenCLRenderer", "render_program", "render_opencl", "kernel_function_name", "LOCAL_REDUCE"]

FLOAT32 = np.dtype(np.float32)
# a reduction of at least ``min_length`` elements into at most ``max_outputs`` outputs runs one
# work-group of ``group`` work-items per output, combined in local memory
LOCAL_REDUCE = {"min_length": 1024, "max_outputs": 8192, "group": 64}
WORK_GROUP = 64  # work-items per group for one-element-per-item kernels


kind_of = dtype_class  # the kernel IR's dtype classes


def kernel_function_name(kernel: Kernel) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", kernel.name)
    return name if name[:1].isalpha() else f"k_{name}"


# integer helpers, instantiated per type: {T} the type, {U} an unsigned type at least 32 bits wide
# that holds it (C promotes narrower types to signed int, where overflow is undefined), {bits}
INT_HELPERS = {
    "div_s": "{T} fg_div_{T}({T} x, {T} y) {{ return y == 0 ? ({T})0 : y == -1 ? ({T})(0u - ({U})x) : ({T})(x / y); }}",
    "div_u": "{T} fg_div_{T}({T} x, {T} y) {{ return y == 0 ? ({T})0 : ({T})(x / y); }}",
    "rem_s": "{T} fg_rem_{T}({T} x, {T} y) {{ return (y == 0 || y == -1) ? ({T})0 : ({T})(x % y); }}",
    "rem_u": "{T} fg_rem_{T}({T} x, {T} y) {{ return y == 0 ? ({T})0 : ({T})(x % y); }}",
    "shl": "{T} fg_shl_{T}({T} x, {T} y) {{ return ({U})y >= {bits} ? ({T})0 : ({T})(({U})x << ({U})y); }}",
    "shr_s": "{T} fg_shr_{T}({T} x, {T} y) {{ return ({T})(x >> (({U})y >= {bits} ? {top} : ({U})y)); }}",
    "shr_u": "{T} fg_shr_{T}({T} x, {T} y) {{ return ({U})y >= {bits} ? ({T})0 : ({T})(x >> ({U})y); }}",
    "pow_s": """{T} fg_pow_{T}({T} base, {T} e) {{
  if (e < 0) return base == 1 ? ({T})1 : base == -1 ? ((e & 1) ? ({T})-1 : ({T})1) : ({T})0;
  {U} result = 1, b = ({U})base, n = ({U})e;
  while (n) {{ if (n & 1) result *= b; b *= b; n >>= 1; }}
  return ({T})result;
}}""",
    "pow_u": """{T} fg_pow_{T}({T} base, {T} e) {{
  {U} result = 1, b = ({U})base, n = ({U})e;
  while (n) {{ if (n & 1) result *= b; b *= b; n >>= 1; }}
  return ({T})result;
}}""",
}
# float helpers, per type {T} (float or double) with {z} its zero literal suffix
FLOAT_HELPERS = {
    # NaN-propagating, and -0.0 < +0.0 (IEEE 754-2019 maximum/minimum, as np.maximum)
    "max": "{T} fg_max_{T}({T} x, {T} y) {{ return (isnan(x) || isnan(y)) ? x + y : x == y ? "
           "(signbit(x) ? y : x) : (x > y ? x : y); }}",
    "min": "{T} fg_min_{T}({T} x, {T} y) {{ return (isnan(x) || isnan(y)) ? x + y : x == y ? "
           "(signbit(x) ? x : y) : (x < y ? x : y); }}",
    "sign": "{T} fg_sign_{T}({T} x) {{ return x > 0 ? ({T})1 : x < 0 ? ({T})-1 : x == 0 ? ({T})0 : x; }}",
}
# bfloat16 is float32's upper half: round to nearest even in integer arithmetic, NaNs stay quiet NaNs
BFLOAT_HELPERS = """ushort fg_bf16_bits(float x) {
  uint bits = fg_float_bits(x);
  if (isnan(x)) return (ushort)((bits >> 16) | 64);
  return (ushort)((bits + 32767u + ((bits >> 16) & 1u)) >> 16);
}
float fg_bf16_value(ushort bits) { return fg_bits_float((uint)bits << 16); }"""
# float16 <-> float32 in integer arithmetic (round to nearest even; NaNs quieted, as F16C and NumPy)
HALF_HELPERS = """float fg_half_value(ushort h) {
  uint sign = (uint)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return fg_bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) { float tiny = (float)mantissa * 5.9604644775390625e-8f; return sign ? -tiny : tiny; }
  return fg_bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
ushort fg_half_bits(float x) {
  uint bits = fg_float_bits(x), magnitude = bits & 0x7fffffffu;
  ushort sign = (ushort)((bits >> 16) & 0x8000u);
  if (magnitude > 0x7f800000u) return sign | 0x7e00u | (ushort)((magnitude & 0x7fffffu) >> 13);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) return sign | (ushort)rint(fg_bits_float(magnitude) * 16777216.0f);
  uint rebased = magnitude - 0x38000000u;
  return sign | (ushort)((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13);
}"""

# float ALU operations on float32/float64: {x} {y} operands, {T} the type
FLOAT_OPS = {
    "neg": "(-{x})", "add": "({x} + {y})", "sub": "({x} - {y})", "mul": "({x} * {y})", "div": "({x} / {y})",
    "eq": "({x} == {y})", "ne": "({x} != {y})", "lt": "({x} < {y})", "le": "({x} <= {y})", "gt": "({x} > {y})",
    "ge": "({x} >= {y})", "rsqrt": "(({T})1 / sqrt({x}))",
    "is_finite": "(isfinite({x}) != 0)",
    # tanh rounds to +-1 beyond |x| = 9.01 (float32) or 19.1 (float64); say so exactly, since some libms
    # (PoCL's) return 1 - ulp even at infinity; NaN fails the comparison and goes through tanh
    "tanh": "(fabs({x}) > ({T})20 ? copysign(({T})1, {x}) : tanh({x}))",
    "logistic": "(({T})0.5 * (fabs({x}) > ({T})40 ? copysign(({T})1, {x}) : tanh(({T})0.5 * {x})) + ({T})0.5)",
}
# the math library, op -> function name (the same name serves float and double: C overloads)
MATH = {"abs": "fabs", "exp": "exp", "log": "log", "exp2": "exp2", "log2": "log2", "expm1": "expm1", "log1p": "log1p",
        "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
        "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "sqrt": "sqrt",
        "erf": "erf", "floor": "floor", "ceil": "ceil", "round": "rint", "rem": "fmod", "pow": "pow",
        "atan2": "atan2"}
# integer ALU operations: {x} {y} operands, {T} type, {U} unsigned wide type; name -> helper for the rest
INT_OPS = {
    "neg": "({T})(0u - ({U}){x})", "add": "({T})(({U}){x} + ({U}){y})", "sub": "({T})(({U}){x} - ({U}){y})",
    "mul": "({T})(({U}){x} * ({U}){y})", "not": "({T})(~{x})", "and": "({T})({x} & {y})", "or": "({T})({x} | {y})",
    "xor": "({T})({x} ^ {y})", "max": "({x} > {y} ? {x} : {y})", "min": "({x} < {y} ? {x} : {y})",
    "eq": "({x} == {y})", "ne": "({x} != {y})", "lt": "({x} < {y})", "le": "({x} <= {y})", "gt": "({x} > {y})",
    "ge": "({x} >= {y})",
}
INT_OPS_SIGNED = {"abs": "({x} < 0 ? ({T})(0u - ({U}){x}) : {x})", "sign": "({T})(({x} > 0) - ({x} < 0))"}
INT_OPS_UNSIGNED = {"abs": "{x}", "sign": "({T})({x} != 0)"}
INT_HELPER_OPS = {"div": "div", "rem": "rem", "shift_left": "shl", "shift_right": "shr", "pow": "pow"}
# bool follows NumPy: + is or, * is and
BOOL_OPS = {"not": "(!{x})", "and": "({x} && {y})", "or": "({x} || {y})", "xor": "({x} != {y})", "add": "({x} || {y})",
            "mul": "({x} && {y})", "max": "({x} || {y})", "min": "({x} && {y})", "eq": "({x} == {y})",
            "ne": "({x} != {y})", "lt": "(!{x} && {y})", "le": "(!{x} || {y})", "gt": "({x} && !{y})",
            "ge": "({x} || !{y})", "abs": "{x}", "sign": "{x}", "sub": "({x} != {y})"}
REDUCE_ALU = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


class CRenderer:
    """The C-family renderer; subclasses set the dialect (see the module docstring)."""

    dialect = "C"
    TYPES = {"bool": "bool", "int8": "char", "int16": "short", "int32": "int", "int64": "long", "uint8": "uchar",
             "uint16": "ushort", "uint32": "uint", "uint64": "ulong", "float16": "ushort", "bfloat16": "ushort",
             "float32": "float", "float64": "double"}
    STORAGE = {"bool": "uchar"}  # memory types that differ from the value types
    kernel_qualifier = "__kernel"
    global_qualifier = "__global"
    local_qualifier = "__local"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    helper_qualifier = ""  # e.g. CUDA's __device__

    def __init__(self) -> None:
        self.indent = 1
        self.helpers: dict[str, str] = {}
        self.lines: list[str] = []
        self.cache: dict[KExpr, str] = {}
        self.counter = 0
        self.acc_name: str | None = None
        self.dtypes_used: set[str] = set()

    # --- dialect points ----------------------------------------------------------------------
    def global_id(self) -> str:
        return "get_global_id(0)"

    def local_id(self) -> str:
        return "get_local_id(0)"

    def group_id(self) -> str:
        return "get_group_id(0)"

    def signature(self, name: str, parameters: list[str], group_size: int | None) -> str:
        attribute = f"__attribute__((reqd_work_group_size({group_size}, 1, 1))) " if group_size else ""
        return f"{self.kernel_qualifier} {attribute}void {name}({', '.join(parameters)})"

    def pointer(self, dtype: np.dtype, name: str, const: bool) -> str:
        return f"{self.global_qualifier} {'const ' if const else ''}{self.storage_type(dtype)}* restrict {name}"

    def local_array(self, type_name: str, name: str, size: int) -> str:
        return f"{self.local_qualifier} {type_name} {name}[{size}];"

    def preamble(self) -> list[str]:
        return ["#pragma OPENCL EXTENSION cl_khr_fp64 : enable"] if "float64" in self.dtypes_used else []

    def convert(self, x: str, source: np.dtype, target: np.dtype) -> str:
        """A value conversion between float32/float64 and the integers (no bool, no 16-bit floats)."""
        to_type = self.value_type(target)
        if kind_of(source) == "f" and kind_of(target) in "su":
            return f"convert_{to_type}_sat({x})"  # truncates, saturates, NaN -> 0
        if kind_of(target) == "f":
            return f"convert_{to_type}({x})"  # round to nearest even
        return f"({to_type})({x})"

    def reinterpret(self, x: str, source: np.dtype, target: np.dtype) -> str:
        """Bit cast between types of one width (value types, no bool, no 16-bit floats)."""
        return f"as_{self.value_type(target)}({x})"

    def double_to_float_toward_zero(self, x: str) -> str:
        return f"convert_float_rtz({x})"

    def half_from_double(self) -> str:
        """float64 -> float16 rounded once: to float32 rounding to odd (truncate, then set the last
        bit if inexact), then to float16."""
        odd = self.reinterpret(f"{self.reinterpret('f', FLOAT32, np.dtype(np.uint32))} | 1u", np.dtype(np.uint32),
                               FLOAT32)
        return (f"ushort fg_half_bits_d(double x) {{ float f = {self.double_to_float_toward_zero('x')}; "
                f"return fg_half_bits((double)f != x ? {odd} : f); }}")

    # --- types ----------------------------------------------------------------------------------
    def value_type(self, dtype: np.dtype) -> str:
        self.dtypes_used.add(np.dtype(dtype).name)
        return self.TYPES[np.dtype(dtype).name]

    def storage_type(self, dtype: np.dtype) -> str:
        name = np.dtype(dtype).name
        self.dtypes_used.add(name)
        return self.STORAGE.get(name, self.TYPES[name])

    def unsigned_wide(self, dtype: np.dtype) -> str:
        return "ulong" if np.dtype(dtype).itemsize == 8 else "uint"

    def helper(self, key: str, text: str) -> None:
        if key not in self.helpers:
            self.helpers[key] = "\n".join(f"{self.helper_qualifier} {line}" if self.helper_qualifier and
                                          re.match(r"^(\w+) fg_", line) else line for line in text.splitlines())

    def bits_helpers(self) -> None:
        uint32 = np.dtype(np.uint32)
        self.helper("bits", f"uint fg_float_bits(float x) {{ return {self.reinterpret('x', FLOAT32, uint32)}; }}\n"
                            f"float fg_bits_float(uint x) {{ return {self.reinterpret('x', uint32, FLOAT32)}; }}")

    # --- constants ------------------------------------------------------------------------------
    def constant(self, value: Any, dtype: np.dtype) -> str:
        dtype = np.dtype(dtype)
        kind = kind_of(dtype)
        type_name = self.value_type(dtype)
        if kind == "b":
            return "true" if value else "false"
        if kind in "su":
            number = int(value)
            if -(1 << 31) < number < (1 << 31):
                return f"(({type_name}){number})"
            return f"(({type_name}){number & ((1 << dtype.itemsize * 8) - 1):#x}ul)"
        if kind == "h":  # a bit pattern
            return f"(({type_name}){int(np.asarray(value, dtype).view(np.uint16)):#06x})"
        rounded = float(np.asarray(value, dtype).astype(np.float64))
        suffix = "f" if dtype == FLOAT32 else ""
        if np.isnan(rounded):
            return f"(({type_name})NAN)"
        if np.isinf(rounded):
            return f"(({type_name}){'-' if rounded < 0 else ''}INFINITY)"
        return f"{rounded.hex()}{suffix}"

    # --- expressions ----------------------------------------------------------------------------
    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("  " * indent + line)

    def temporary(self, dtype: np.dtype, expression: str) -> str:
        self.counter += 1
        name = f"v{self.counter}"
        self.emit(f"{self.value_type(dtype)} {name} = {expression};", self.indent)
        return name

    def value(self, e: KExpr) -> str:
        if e in self.cache:
            return self.cache[e]
        if e.op == "const":
            return self.constant(e.arg, e.dtype)
        if e.op == "var":
            return str(e.arg)
        if e.op == "acc":
            if self.acc_name is None:
                raise ValueError("acc is read outside the epilogue of a reduction")
            return self.acc_name
        result = self.temporary(e.dtype, self.expression(e))
        self.cache[e] = result
        return result

    def expression(self, e: KExpr) -> str:
        if e.op == "load":
            return self.load(f"in{e.arg}", self.value(e.args[0]), e.dtype)
        if e.op == "where":
            cond, a, b = (self.value(x) for x in e.args)
            return f"({cond} ? {a} : {b})"
        if e.op == "cast":
            return self.cast(self.value(e.args[0]), e.args[0].dtype, e.dtype)
        if e.op == "bitcast":
            return self.bitcast(self.value(e.args[0]), e.args[0].dtype, e.dtype)
        operand_dtype = e.args[0].dtype
        result = self.alu(e.op, [self.value(a) for a in e.args], operand_dtype)
        natural = BOOL if e.op in COMPARISONS or e.op == "is_finite" else operand_dtype
        return result if natural == e.dtype else self.cast(result, natural, e.dtype)

    def load(self, buffer: str, index: str, dtype: np.dtype) -> str:
        return f"({buffer}[{index}] != 0)" if np.dtype(dtype) == BOOL else f"{buffer}[{index}]"

    def store_value(self, value: str, dtype: np.dtype) -> str:
        """``value`` as the bits stored in memory."""
        return f"(uchar)({value})" if np.dtype(dtype) == BOOL else value

    def low_helpers(self, dtype: np.dtype) -> str:
        """Declare the float16 or bfloat16 helpers; returns their name infix ('half' or 'bf16')."""
        self.bits_helpers()
        if np.dtype(dtype).name == "float16":
            self.helper("half", HALF_HELPERS)
            return "half"
        self.helper("bfloat", BFLOAT_HELPERS)
        return "bf16"

    def to_float(self, bits: str, dtype: np.dtype) -> str:
        """A float16/bfloat16 bit pattern as its float32 value."""
        return f"fg_{self.low_helpers(dtype)}_value({bits})"

    def from_float(self, value: str, dtype: np.dtype) -> str:
        """A float32 value rounded to a float16/bfloat16 bit pattern."""
        return f"fg_{self.low_helpers(dtype)}_bits({value})"

    def alu(self, op: str, operands: Sequence[str], dtype: np.dtype) -> str:
        dtype = np.dtype(dtype)
        kind = kind_of(dtype)
        if kind == "h":  # computed in float32, rounded back (comparisons and is_finite give bools)
            result = self.alu(op, [self.to_float(x, dtype) for x in operands], FLOAT32)
            return result if op in COMPARISONS or op == "is_finite" else self.from_float(result, dtype)
        x = operands[0]
        y = operands[1] if len(operands) > 1 else None
        type_name = self.value_type(dtype)
        if kind == "b":
            if op not in BOOL_OPS:
                raise ValueError(f"unsupported operation {op} on bool")
            return BOOL_OPS[op].format(x=x, y=y)
        if kind == "f":
            if op in ("max", "min", "sign"):
                self.helper(f"{op}_{type_name}", FLOAT_HELPERS[op].format(T=type_name))
                return f"fg_{op}_{type_name}({', '.join(operands)})"
            if op in FLOAT_OPS:
                return FLOAT_OPS[op].format(x=x, y=y, T=type_name)
            if op in MATH:
                return f"{self.math_function(op, dtype)}({', '.join(operands)})"
            raise ValueError(f"unsupported operation {op} on {dtype.name}")
        fields = {"T": type_name, "U": self.unsigned_wide(dtype), "bits": dtype.itemsize * 8,
                  "top": dtype.itemsize * 8 - 1}
        if op in INT_HELPER_OPS:
            name = INT_HELPER_OPS[op]
            template = INT_HELPERS.get(f"{name}_{kind}", INT_HELPERS.get(name))
            assert template is not None
            self.helper(f"{name}_{type_name}", template.format(**fields))
            return f"fg_{name}_{type_name}({x}, {y})"
        table = {**INT_OPS, **(INT_OPS_SIGNED if kind == "s" else INT_OPS_UNSIGNED)}
        if op not in table:
            raise ValueError(f"unsupported operation {op} on {dtype.name}")
        return table[op].format(x=x, y=y, **fields)

    def math_function(self, op: str, dtype: np.dtype) -> str:
        return MATH[op]

    def cast(self, x: str, source: np.dtype, target: np.dtype) -> str:
        source, target = np.dtype(source), np.dtype(target)
        if source == target:
            return x
        from_kind, to_kind = kind_of(source), kind_of(target)
        if to_kind == "b":
            return f"({self.to_float(x, source)} != 0)" if from_kind == "h" else f"({x} != 0)"
        if from_kind == "b":
            return f"({self.value_type(target)})({x} ? 1 : 0)" if to_kind != "h" else \
                self.from_float(f"({x} ? 1.0f : 0.0f)", target)
        if from_kind == "h":
            return self.cast(self.to_float(x, source), FLOAT32, target)
        if to_kind == "h":
            if source.name == "float64" and target.name == "float16":  # one rounding, as NumPy
                self.low_helpers(target)
                self.helper("half_d", self.half_from_double())
                return f"fg_half_bits_d({x})"
            # ints and float64 reach bfloat16 through float32 (as ml_dtypes), ints reach float16 so too
            return self.from_float(self.cast(x, source, FLOAT32), target)
        if from_kind in "su" and to_kind in "su":
            return f"({self.value_type(target)})({x})"
        return self.convert(x, source, target)

    def bitcast(self, x: str, source: np.dtype, target: np.dtype) -> str:
        source, target = np.dtype(source), np.dtype(target)
        if source.itemsize != target.itemsize:
            raise ValueError(f"bitcast needs dtypes of one width, got {source.name} and {target.name}")
        if source == target:
            return x
        # float16/bfloat16 values are already their bit patterns: bit casts of them are integer casts
        source, target = (np.dtype(np.uint16) if kind_of(dt) == "h" else dt for dt in (source, target))
        if source == target:
            return x
        if kind_of(source) == "b":
            return f"({self.value_type(target)})({x} ? 1 : 0)"
        if kind_of(target) == "b":
            return f"({x} != 0)"
        if kind_of(source) in "su" and kind_of(target) in "su":
            return f"({self.value_type(target)})({x})"
        return self.reinterpret(x, source, target)

    # --- reductions -----------------------------------------------------------------------------
    def reduce_identity(self, op: str, dtype: np.dtype, empty: bool) -> str:
        kind = kind_of(dtype)
        if kind == "b":
            return "false" if op in ("sum", "max") else "true"
        if op == "sum":
            return self.constant(0.0 if empty else -0.0, dtype) if kind in "fh" else self.constant(0, dtype)
        if op == "prod":
            return self.constant(1, dtype)
        if kind in "fh":
            return self.constant(-np.inf if op == "max" else np.inf, dtype)
        info = np.iinfo(dtype)
        return self.constant(info.min if op == "max" else info.max, dtype)

    def combine(self, op: str, old: str, new: str, acc_dtype: np.dtype) -> str:
        return self.alu(REDUCE_ALU[op], [old, new], acc_dtype)

    # --- whole kernels --------------------------------------------------------------------------
    def index_setup(self, flat: str, names: Sequence[str], shape: Sequence[int], indent: int) -> None:
        """Loop indices from a C-order flat position (which is known to be in range)."""
        for axis, (name, size) in enumerate(zip(names, shape)):
            step = int(np.prod(shape[axis + 1:], dtype=np.int64))
            expression = flat if step == 1 else f"({flat} / {step})"
            if axis > 0:
                expression = f"({expression} % {size})"
            self.emit(f"long {name} = {expression};", indent)

    def render(self, kernel: Kernel, name: str | None = None) -> tuple[str, str, int | None]:
        """(helpers, kernel function source, work-group size for a local reduction or None)."""
        name = name or kernel_function_name(kernel)
        size = int(np.prod(kernel.shape, dtype=np.int64))
        reduce_length = int(np.prod(kernel.reduce_shape, dtype=np.int64))
        local = (kernel.reduce_expr is not None and reduce_length >= LOCAL_REDUCE["min_length"]
                 and size <= LOCAL_REDUCE["max_outputs"])
        group = LOCAL_REDUCE["group"] if local else None
        parameters = [self.pointer(a.dtype, f"out{i}", False) for i, a in enumerate(kernel.out_avals)]
        parameters += [self.pointer(a.dtype, f"in{i}", True) for i, a in enumerate(kernel.in_avals)]
        global_names = [f"g{i}" for i in range(len(kernel.shape))]
        reduce_names = [f"r{i}" for i in range(len(kernel.reduce_shape))]
        self.emit(f"long gid = (long){self.group_id() if local else self.global_id()};")
        self.emit(f"if (gid >= {size}) return;")
        self.index_setup("gid", global_names, kernel.shape, 1)
        if kernel.reduce_expr is not None:
            acc_dtype = kernel.reduce_expr.dtype
            acc_compute = FLOAT32 if kind_of(acc_dtype) == "h" else np.dtype(acc_dtype)
            acc_type = self.value_type(acc_compute)
            identity = self.reduce_identity(kernel.reduce_op or "", acc_compute, reduce_length == 0)
            op = kernel.reduce_op or ""
            self.emit(f"{acc_type} acc = {identity};")
            if local:
                assert group is not None
                self.emit(f"long lid = (long){self.local_id()};")
                self.emit(f"for (long rflat = lid; rflat < {reduce_length}; rflat += {group}) {{")
                self.index_setup("rflat", reduce_names, kernel.reduce_shape, 2)
                depth = 1
            else:
                for depth, (rname, extent) in enumerate(zip(reduce_names, kernel.reduce_shape), start=1):
                    self.emit(f"for (long {rname} = 0; {rname} < {extent}; {rname}++) {{", depth)
                depth = len(reduce_names)
            self.indent = depth + 1
            saved = dict(self.cache)
            value = self.value(kernel.reduce_expr)
            if kind_of(acc_dtype) == "h":
                value = self.to_float(value, acc_dtype)
            self.emit(f"acc = {self.combine(op, 'acc', value, acc_compute)};", self.indent)
            self.cache = saved
            for level in range(depth, 0, -1):
                self.emit("}", level)
            self.indent = 1
            if local:
                assert group is not None
                self.emit(self.local_array(acc_type, "partial", group))
                self.emit("partial[lid] = acc;")
                self.emit(self.barrier)
                self.emit(f"for (long step = {group // 2}; step > 0; step >>= 1) {{")
                combined = self.combine(op, "partial[lid]", "partial[lid + step]", acc_compute)
                self.emit(f"if (lid < step) partial[lid] = {combined};", 2)
                self.emit(self.barrier, 2)
                self.emit("}")
                self.emit("if (lid != 0) return;")
                self.emit("acc = partial[0];")
            if kind_of(acc_dtype) == "h":
                self.emit(f"ushort acc_rounded = {self.from_float('acc', acc_dtype)};")
                self.acc_name = "acc_rounded"
            else:
                self.acc_name = "acc"
        for number, (expr, aval) in enumerate(zip(kernel.outputs, kernel.out_avals)):
            if expr.dtype != aval.dtype:
                raise ValueError(f"output {number} is computed as {expr.dtype.name} but stored as {aval.dtype.name}")
            self.emit(f"out{number}[gid] = {self.store_value(self.value(expr), aval.dtype)};")
        body = "\n".join(self.lines)
        listing = "\n".join(f"// {line}" for line in str(kernel).splitlines())
        function = f"{listing}\n{self.signature(name, parameters, group)} {{\n{body}\n}}"
        return "\n".join(self.helpers.values()), function, group


class OpenCLRenderer(CRenderer):
    """OpenCL C (the dialect the base class writes)."""

    dialect = "OpenCL C"


def render_program(kernels: Sequence[Kernel], names: Sequence[str] | None = None,
                   dialect: type[CRenderer] = OpenCLRenderer) -> tuple[str, list[int | None]]:
    """One program in ``dialect`` holding every kernel (each helper once), and each kernel's
    work-group size for a local-memory reduction (None: any size).

    >>> source, groups = render_program([kernel])  # doctest: +SKIP
    """
    helpers: dict[str, str] = {}
    used: set[str] = set()
    functions, groups = [], []
    renderer = dialect()
    for position, kernel in enumerate(kernels):
        renderer = dialect()
        renderer.helpers, renderer.dtypes_used = helpers, used  # shared: each helper is written once
        _, function, group = renderer.render(kernel, names[position] if names else None)
        functions.append(function)
        groups.append(group)
    return "\n".join([*renderer.preamble(), *helpers.values(), *functions]) + "\n", groups


def render_opencl(kernels: Sequence[Kernel], names: Sequence[str] | None = None) -> tuple[str, list[int | None]]:
    """``render_program`` in OpenCL C."""
    return render_program(kernels, names, OpenCLRenderer)
