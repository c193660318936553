"""`import funcgrad` and a jitted training step load none of the modules only some programs need
(ml_dtypes, pooch, safetensors, funcgrad.distributed; llvmlite runs in the compiler worker); each loads,
and works, where it is used. Every check runs in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("ml_dtypes", "pooch", "tqdm", "safetensors", "funcgrad.distributed", "funcgrad.nn.state")

_PRELUDE = f"""
import sys
HEAVY = {HEAVY!r}
def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)
import funcgrad as fg
import funcgrad.numpy as fnp
import numpy as np
"""


def run(code: str, tmp_path: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FUNCGRAD_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_import_loads_no_heavy_module(tmp_path):
    assert run("print(loaded())", tmp_path) == ["[]"]


def test_jitted_mlp_step_loads_no_heavy_module(tmp_path):
    out = run("""
rng = np.random.default_rng(0)
params = [fnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((8, 16), (16,), (16, 4), (4,))]
x = fnp.asarray(rng.standard_normal((5, 8)).astype(np.float32))
def loss(p, x):
    h = fg.nn.functional.relu(x @ p[0] + p[1])
    return fnp.mean(fg.nn.functional.log_softmax(h @ p[2] + p[3], axis=-1))
step = fg.jit(lambda p, x: [a - 0.1 * g for a, g in zip(p, fg.grad(loss)(p, x))])
for _ in range(2):
    params = step(params, x)
assert all(np.isfinite(p.numpy()).all() for p in params)
print(loaded(), "llvmlite" in sys.modules)
""", tmp_path)
    assert out[-1] == "[] False"


def test_a_convolution_and_batchnorm_step_loads_no_heavy_module(tmp_path):
    """The CNN path (BatchNorm's float32-statistics check, the interpreter's low-precision sums) tests dtypes
    against ``dtypes.LOW_PRECISION``, which answers without creating bfloat16."""
    out = run("""
fg.Tensor.manual_seed(0)
conv, norm = fg.nn.Conv2d(1, 4, 3), fg.nn.BatchNorm(4)
x = fg.Tensor(np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32))
opt = fg.nn.optim.SGD([conv.weight, conv.bias, norm.weight, norm.bias], lr=0.1)
with fg.Tensor.train():
    loss = norm(conv(x)).relu().mean()
    opt.zero_grad(); loss.backward(); opt.step()
assert np.isfinite(loss.numpy())
print(loaded())
""", tmp_path)
    assert out[-1] == "[]"


def test_strided_convolution_gradients_and_random_normal_load_no_heavy_module(tmp_path):
    """A strided convolution's gradient lowers through the masked product (its compute-dtype check), and
    ``random.normal`` through erfinv's low-precision check: both ask ``dtypes.LOW_PRECISION``, not
    ``dtypes.bfloat16`` (whose import of ml_dtypes took 1.2-1.4 s of a CNN's first step on one machine)."""
    out = run("""
rng = np.random.default_rng(0)
x = fnp.asarray(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
w = fnp.asarray(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
loss = lambda x, w: (fg.nn.functional.conv2d(x, w, stride=2) ** 2).sum()
gx, gw = fg.jit(fg.grad(loss, argnums=(0, 1)))(x, w)
z = fg.jit(lambda k: fg.random.normal(k, (1000,)))(fg.random.key(0))
assert np.isfinite(gx.numpy()).all() and np.isfinite(gw.numpy()).all() and abs(float(z.numpy().mean())) < 0.2
print(fg.Tensor(np.ones(2, np.float16)).dtype, fnp.issubdtype("float32", np.floating), loaded())
""", tmp_path)
    assert out[-1] == "float16 True []"


def test_bfloat16_loads_ml_dtypes_and_works(tmp_path):
    out = run("""
print(loaded())
a = fnp.zeros(3, dtype=fnp.bfloat16)
print(loaded(), a.dtype, (a + 1.5).numpy().tolist(), float(fg.dtypes.finfo("bfloat16").eps))
print(fg.dtypes.result_type((fg.dtypes.bfloat16, False), (fg.dtypes.float32, True))[0],
      fg.dtypes.result_type((fg.dtypes.bfloat16, False), (fg.dtypes.float16, False))[0],
      fg.dtypes.bfloat16 in fg.dtypes.ALL_DTYPES, fg.dtypes.is_float(fg.dtypes.bfloat16))
import ml_dtypes
print(fg.Tensor(np.ones(2, ml_dtypes.bfloat16)).dtype)
""", tmp_path)
    assert out == ["[]", "['ml_dtypes'] bfloat16 [1.5, 1.5, 1.5] 0.0078125", "bfloat16 float32 True True", "bfloat16"]


def test_bfloat16_by_name_before_ml_dtypes(tmp_path):
    # promotion joins computed before bfloat16 exists stay right after it is added to the lattice
    out = run("""
print(fg.dtypes.result_type((fg.dtypes.int32, False), (fg.dtypes.float16, True))[0], loaded())
print(fg.dtypes.canonicalize("bfloat16"), "bfloat16" in fg.dtypes.ALL_DTYPES, loaded())
print(fg.dtypes.result_type((fg.dtypes.canonicalize("bfloat16"), False), (fg.dtypes.float32, True))[0])
""", tmp_path)
    assert out == ["float16 []", "bfloat16 True ['ml_dtypes']", "bfloat16"]


def test_state_distributed_and_download_load_on_use(tmp_path):
    out = run(f"""
from unittest import mock
fg.nn.state.safe_save({{"w": fg.Tensor([1.0, 2.0])}}, {str(tmp_path / "w.safetensors")!r})
print(fg.nn.state.safe_load({str(tmp_path / "w.safetensors")!r})["w"].tolist(), "safetensors" in sys.modules)
print(fg.distributed.__name__, "pooch" in sys.modules)
import os
os.environ["XDG_CACHE_HOME"] = {str(tmp_path / "xdg")!r}
import funcgrad.datasets as D
print("pooch" in sys.modules)
with mock.patch("pooch.retrieve", return_value="/fetched.gz") as retrieve:
    path, failures = D._fetch_into_cache(D.MNIST, D.MNIST.files[0])
print(path, failures, retrieve.call_count, "pooch" in sys.modules)
""", tmp_path)
    assert out[0] == "[1.0, 2.0] True"
    assert out[1:] == ["funcgrad.distributed False", "False", "/fetched.gz [] 1 True"]
