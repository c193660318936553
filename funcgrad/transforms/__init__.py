"""IR-to-IR transformations: jvp, vjp/grad (linearize + transpose), vmap, and the rules of jit.

Each transform lives in its own module with its own rule table; ``ad_rules`` and
``batching_rules`` hold the rules of the first-order primitives, ``jit`` the rules of the jit
call, ``control_flow`` those of cond, while and scan, ``custom`` custom_jvp / custom_vjp,
checkpoint and stop_gradient. The transforms see only the core, the IR and util: ``jit`` itself,
the runtime that traces and calls jit functions, is ``funcgrad/jit_runtime.py`` (``fg.jit``).
"""

from funcgrad.transforms import ad_rules as _ad_rules  # noqa: F401  (registers the rules)
from funcgrad.transforms import control_flow as _control_flow  # noqa: F401
from funcgrad.transforms import custom as _custom  # noqa: F401
from funcgrad.transforms import batching_rules as _batching_rules  # noqa: F401
from funcgrad.transforms import complex_rules as _complex_rules  # noqa: F401
from funcgrad.transforms import jit as _jit_rules  # noqa: F401
from funcgrad.transforms import collective_rules as _collective_rules  # noqa: F401
from funcgrad.transforms.ad import grad, hessian, jacfwd, jacobian, jacrev, jvp, linearize, value_and_grad, vjp
from funcgrad.transforms.batching import vmap
from funcgrad.transforms.custom import (
    checkpoint, checkpoint_name, checkpoint_policies, custom_jvp, custom_vjp, eval_shape, print_saved_residuals,
    saved_residuals, stop_gradient,
)

__all__ = [
    "checkpoint", "checkpoint_name", "checkpoint_policies", "print_saved_residuals", "saved_residuals",
    "custom_jvp", "custom_vjp", "eval_shape", "grad", "hessian", "jacfwd", "jacobian", "jacrev",
    "jvp", "linearize", "stop_gradient", "value_and_grad", "vjp", "vmap",
]
