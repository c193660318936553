"""debug_nans / debug_infs (funcgrad/nan_check.py, funcgrad/config.py): the first step that makes a
NaN (inf) raises FloatingPointError naming the primitive and the user's line, in eager code, under
jit, in gradients and on every device; nothing is checked or recorded when the options are off."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import nan_check
from funcgrad.devices.reference import ReferenceDevice
from funcgrad.lower.plan import Plan, compile_plan
from funcgrad.util import config


@pytest.fixture(autouse=True)
def options_off(monkeypatch):
    """Each test starts with both options off (environment and config) and leaves them so."""
    monkeypatch.delenv("FUNCGRAD_DEBUG_NANS", raising=False)
    monkeypatch.delenv("FUNCGRAD_DEBUG_INFS", raising=False)
    config.update("debug_nans", None)
    config.update("debug_infs", None)
    yield
    config.update("debug_nans", None)
    config.update("debug_infs", None)


def next_line() -> str:
    """'this_file:N' for the line after the caller's: where the next statement's op is written."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"


def nan_error(fn, *args) -> str:
    with pytest.raises(FloatingPointError) as info:
        fg.tree.map(lambda t: t.numpy(), fn(*args))
    return str(info.value)


# --- off by default, and free when off ---------------------------------------------------------------

def test_off_by_default_nans_are_just_values():
    assert config.debug_nans is False and config.debug_infs is False
    assert np.isnan(fnp.log(fg.Tensor([-1.0])).numpy()).all()


def test_nothing_is_recorded_and_plans_are_shared_when_off():
    before = len(nan_check._SOURCES)
    y = fnp.sin(fg.Tensor([1.0, 2.0])) * 3
    y.numpy()
    assert len(nan_check._SOURCES) == before
    ir = fg.make_ir(lambda x: fnp.exp(x) + 1)(fg.Tensor([1.0]))
    device = fg.devices.default_device()
    assert compile_plan(ir, device) is compile_plan(ir, device)


def test_plans_are_not_shared_while_checking():
    """A cached plan's IR is another graph's: its source lines would be wrong."""
    ir = fg.make_ir(lambda x: fnp.exp(x) + 1)(fg.Tensor([1.0]))
    device = fg.devices.default_device()
    with fg.debug_nans():
        assert compile_plan(ir, device) is not compile_plan(ir, device)


# --- eager --------------------------------------------------------------------------------------------

def test_eager_names_primitive_and_user_line():
    config.update("debug_nans", True)
    x = fg.Tensor([1.0, -1.0, 2.0])
    with pytest.raises(FloatingPointError) as info:
        where = next_line()
        y = fnp.log(x) * 2
        y.numpy()
    message = str(info.value)
    assert "`log` produced a NaN" in message
    assert where in message and "y = fnp.log(x) * 2" in message


def test_first_nan_in_a_fused_kernel_is_found():
    """sqrt makes the NaN; the mul and add fused after it only carry it."""
    x = fg.Tensor([1.0, 2.0, 3.0])

    def chain(x):
        a = x * 2 - 5
        where = next_line()
        b = fnp.sqrt(a)
        return b * 3 + fnp.exp(a), where

    with fg.debug_nans():
        y, where = chain(x)
        kernels = y.schedule()
        with pytest.raises(FloatingPointError) as info:
            y.numpy()
    assert len(kernels) == 1
    assert "`sqrt` produced a NaN" in str(info.value) and where in str(info.value)


def test_inf_minus_inf_is_named_where_the_nan_appears():
    """exp overflows to inf (not a NaN): the NaN is first made by the subtraction."""
    x = fg.Tensor([1000.0])
    with fg.debug_nans():
        where = next_line()
        message = nan_error(lambda x: fnp.exp(x) - fnp.exp(x), x)
    assert "`sub` produced a NaN" in message and where in message


def test_nan_in_a_reduction_kernel():
    x = fg.Tensor([0.0, 0.0])
    with fg.debug_nans():
        message = nan_error(lambda x: x / x.sum(), x)
    assert "`div` produced a NaN" in message


def test_nan_made_by_a_host_step():
    """cumsum runs on the host: inf + (-inf) inside it is a NaN its input did not have."""
    x = fg.Tensor([np.inf, -np.inf, 1.0])
    with fg.debug_nans():
        message = nan_error(lambda x: fnp.cumsum(x * 1.0), x)
    assert "`cumsum` produced a NaN" in message and "host step" in message


def test_nan_already_in_the_inputs_is_not_reported():
    x = fg.Tensor([np.nan, 1.0])
    with fg.debug_nans():
        y = (fnp.exp(x) * 2).numpy()
    assert np.isnan(y[0]) and y[1] == pytest.approx(2 * np.e)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_low_and_high_precision_dtypes(dtype):
    x = fg.Tensor([-1.0, 1.0], dtype=dtype)
    with fg.debug_nans():
        message = nan_error(fnp.sqrt, x)
    assert "`sqrt` produced a NaN" in message


def test_integer_results_are_not_checked():
    with fg.debug_nans():
        assert (fg.Tensor([1, 2]) // fg.Tensor([1, 1])).tolist() == [1, 2]


# --- jit, grad, vmap, backward() ------------------------------------------------------------------

def test_jit_names_the_line_inside_the_traced_function():
    @fg.jit
    def f(x):
        a = x * 3
        return fnp.arccos(a)

    with fg.debug_nans():
        message = nan_error(f, fg.Tensor([0.1, 1.0]))
    assert "`acos` produced a NaN" in message and "return fnp.arccos(a)" in message
    assert f"{__file__}:" in message


def test_jit_traced_before_the_option_says_line_unknown():
    @fg.jit
    def f(x):
        return fnp.log(x)

    f(fg.Tensor([1.0])).numpy()  # traced and cached with the option off
    with fg.debug_nans():
        message = nan_error(f, fg.Tensor([-1.0]))
    assert "`log` produced a NaN" in message and "line unknown" in message


def where_sqrt(x):
    return fnp.where(x > 0, fnp.sqrt(x), 0.0).sum()  # the classic NaN gradient at 0


@pytest.mark.parametrize("jitted", [False, True])
def test_nan_in_the_backward_pass_names_the_derivative_and_the_forward_line(jitted):
    grad = fg.grad(where_sqrt)
    with fg.debug_nans():
        message = nan_error(fg.jit(grad) if jitted else grad, fg.Tensor([0.0, 4.0]))
    assert "produced a NaN" in message
    assert "derivative) of `sqrt`" in message
    assert "return fnp.where(x > 0, fnp.sqrt(x), 0.0).sum()" in message


def test_vmap_keeps_the_user_line():
    def f(x):
        return fnp.log(x - 1.0)

    with fg.debug_nans():
        message = nan_error(fg.vmap(f), fg.Tensor([[0.5], [2.0]]))
    assert "`log` produced a NaN" in message and "return fnp.log(x - 1.0)" in message
    assert "transformation" not in message  # the batched log is the same operation


def test_a_nan_only_the_compiled_kernel_makes_names_the_kernel():
    """When the reference implementations compute no NaN from the same inputs, the kernel and its
    equations are named instead (a device kernel that writes NaNs stands in for a rounding difference)."""
    class NaNDevice(ReferenceDevice):
        name = "NAN_TEST"

        def compile(self, kernel):
            def run(inputs, outputs):
                for out in outputs:
                    out[...] = np.nan
            return run

    ir = fg.make_ir(lambda x: fnp.exp(x) * 2)(fg.Tensor([1.0]))
    with fg.debug_nans(), pytest.raises(FloatingPointError) as info:
        Plan(ir, NaNDevice()).run([np.ones(1, np.float32)])
    message = str(info.value)
    assert "produced a NaN. The reference interpreter computes none there" in message
    assert "(equations: exp, mul)" in message


def test_seed_style_backward():
    w = fg.Tensor([0.0, 1.0], requires_grad=True)
    with fg.debug_nans():
        loss = (fnp.sqrt(w) * 0.0).sum()
        with pytest.raises(FloatingPointError) as info:
            loss.backward()
            w.grad.numpy()
    assert "derivative) of `sqrt`" in str(info.value)


# --- infs, and the ways to turn the checks on -----------------------------------------------------------

def test_debug_infs_names_the_overflow():
    x = fg.Tensor([1000.0])
    assert np.isinf(fnp.exp(x).numpy()).all()
    with fg.debug_nans():  # an inf is not a NaN
        assert np.isinf(fnp.exp(x).numpy()).all()
    with fg.debug_infs(), pytest.raises(FloatingPointError, match="`exp` produced an inf"):
        fnp.exp(x).numpy()


def test_environment_variable_is_read_at_run_time(monkeypatch):
    monkeypatch.setenv("FUNCGRAD_DEBUG_NANS", "1")
    assert config.debug_nans is True
    fg.Tensor([1.0]).sum().numpy()  # any run picks the variable up, so lines are recorded from here on
    with pytest.raises(FloatingPointError, match="`log` produced a NaN"):
        fnp.log(fg.Tensor([-2.0])).numpy()
    monkeypatch.setenv("FUNCGRAD_DEBUG_NANS", "0")
    assert np.isnan(fnp.log(fg.Tensor([-2.0])).numpy()).all()


def test_config_update_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("FUNCGRAD_DEBUG_NANS", "1")
    config.update("jax_debug_nans", False)  # jax.config's spelling works too
    assert config.debug_nans is False
    assert np.isnan(fnp.log(fg.Tensor([-2.0])).numpy()).all()
    with fg.config.override(debug_nans=True):
        assert fg.config.debug_nans is True
    assert fg.config.debug_nans is False


def test_bad_option_names_and_values():
    with pytest.raises(AttributeError, match="no option 'debug_nan'.*debug_infs, debug_nans"):
        config.update("debug_nan", True)
    with pytest.raises(TypeError, match="takes True, False or None, got 1"):
        config.update("debug_nans", 1)


def test_every_device(device_name):
    """Resident devices (CL, WEBGPU) are checked too: the step's values are downloaded."""
    x = fg.Tensor([0.5, -0.5], device=device_name)
    with fg.debug_nans():
        where = next_line()
        message = nan_error(lambda x: fnp.log(x) + 1, x)
    assert "`log` produced a NaN" in message and where in message
