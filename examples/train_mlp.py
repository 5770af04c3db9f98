"""Train a small NumPy MLP whose normalization layers are layernorm_c.LayerNorm.

    python examples/train_mlp.py              # 1500 steps, a few seconds
    python examples/train_mlp.py --quick      # 300 steps, for a smoke test
    python examples/train_mlp.py --steps 3000 --seed 1

The model, Linear -> LayerNorm -> Tanh -> Linear -> LayerNorm -> Tanh ->
Linear, classifies 2-d points by which of three interleaved spirals they lie
on. Everything but the LayerNorm is plain NumPy, with a hand-written
backward; the optimizer is Adam. The script prints, in order:

1. a gradient check of the whole model: analytic gradients (every layer's
   backward) against central finite differences, in float64, for entries of
   every parameter (LayerNorm's weight and bias included) and of the input;
2. the loss and accuracy every few steps of training (float32), going down;
3. micro-batch accumulation: the first LayerNorm's grad_weight and grad_bias,
   accumulated over the batch split into parts in random orders, are
   bit-identical to the full-batch ones (a plain float32 sum is not);
4. PyTorch interop, when torch is installed: the model's state_dict loads
   into a torch.nn.Sequential of Linear, LayerNorm and Tanh layers, which
   gives the same logits, and torch's LayerNorm state_dict loads back.

Deterministic for a given --seed (on a given machine: NumPy's matmul may
round differently elsewhere). Needs NumPy and layernorm_c; torch optional.
"""
from __future__ import annotations

import argparse
import os
import sys

# The matrices here are tiny: BLAS threads would cost more than they give
# (and far more on a busy machine). Set before NumPy loads its BLAS.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import layernorm_c as lnc  # noqa: E402


# -- layers: each has __call__ (forward), backward, zero_grad, parameters ----

class Linear:
    """y = x @ weight.T + bias, with torch.nn.Linear's (out, in) weight and
    its initialization (both uniform in +-1/sqrt(n_in))."""

    def __init__(self, n_in, n_out, rng, dtype=np.float32):
        bound = 1.0 / np.sqrt(n_in)
        self.weight = rng.uniform(-bound, bound, (n_out, n_in)).astype(dtype)
        self.bias = rng.uniform(-bound, bound, n_out).astype(dtype)
        self.zero_grad()

    def __call__(self, x):
        self.x = x
        return x @ self.weight.T + self.bias

    def backward(self, dy):
        self.grad_weight += dy.T @ self.x
        self.grad_bias += dy.sum(axis=0)
        return dy @ self.weight

    def zero_grad(self):
        self.grad_weight = np.zeros_like(self.weight)
        self.grad_bias = np.zeros_like(self.bias)

    def parameters(self):
        return {"weight": self.weight, "bias": self.bias}

    def gradients(self):
        return {"weight": self.grad_weight, "bias": self.grad_bias}

    def state_dict(self):
        return {k: v.copy() for k, v in self.parameters().items()}

    def load_state_dict(self, state):
        self.weight = np.array(state["weight"], self.weight.dtype)
        self.bias = np.array(state["bias"], self.bias.dtype)


class Tanh:
    def __call__(self, x):
        self.y = np.tanh(x)
        return self.y

    def backward(self, dy):
        return dy * (1 - self.y * self.y)

    def zero_grad(self):
        pass

    def parameters(self):
        return {}

    def gradients(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class MLP:
    """A stack of layers, named like torch.nn.Sequential ("1.weight" is the
    first LayerNorm's gain). Keeps each layer's input and, after backward,
    the gradient that reached each layer's output."""

    def __init__(self, n_in, width, n_out, rng, dtype=np.float32):
        self.sizes = (n_in, width, n_out)
        self.layers = [
            Linear(n_in, width, rng, dtype), lnc.LayerNorm(width, dtype=dtype), Tanh(),
            Linear(width, width, rng, dtype), lnc.LayerNorm(width, dtype=dtype), Tanh(),
            Linear(width, n_out, rng, dtype),
        ]

    def __call__(self, x):
        self.inputs = []
        for layer in self.layers:
            self.inputs.append(x)
            x = layer(x)
        return x

    def backward(self, dy):
        self.grads = [None] * len(self.layers)
        for i in reversed(range(len(self.layers))):
            self.grads[i] = dy
            dy = self.layers[i].backward(dy)
        return dy

    def zero_grad(self):
        for layer in self.layers:
            layer.zero_grad()

    def parameters(self):
        return {f"{i}.{k}": v for i, layer in enumerate(self.layers)
                for k, v in layer.parameters().items()}

    def gradients(self):
        return {f"{i}.{k}": v for i, layer in enumerate(self.layers)
                for k, v in layer.gradients().items()}

    def state_dict(self):
        return {f"{i}.{k}": v for i, layer in enumerate(self.layers)
                for k, v in layer.state_dict().items()}

    def load_state_dict(self, state):
        for i, layer in enumerate(self.layers):
            prefix = f"{i}."
            layer.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                                   if k.startswith(prefix)})


def cross_entropy(logits, labels):
    """The mean cross-entropy and its gradient with respect to the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    rows = np.arange(len(labels))
    dlogits = np.exp(logp)
    dlogits[rows, labels] -= 1
    return -logp[rows, labels].mean(), dlogits / len(labels)


class Adam:
    def __init__(self, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t, self.m, self.v = 0, {}, {}

    def step(self, model):
        self.t += 1
        b1, b2 = self.betas
        grads = model.gradients()
        for name, p in model.parameters().items():  # updated in place
            g = grads[name]
            m = self.m[name] = b1 * self.m.get(name, 0) + (1 - b1) * g
            v = self.v[name] = b2 * self.v.get(name, 0) + (1 - b2) * g * g
            p -= (self.lr * (m / (1 - b1 ** self.t))
                  / (np.sqrt(v / (1 - b2 ** self.t)) + self.eps)).astype(p.dtype)


def spirals(n_per_class, n_classes, rng, turns=2.0, noise=0.2):
    """Points on interleaved spirals of `turns` turns (radius 0.05 to 1),
    labelled by spiral; `noise` jitters the angle (radians)."""
    r = np.tile(np.linspace(0.05, 1.0, n_per_class), n_classes)
    labels = np.repeat(np.arange(n_classes), n_per_class)
    theta = (2 * np.pi * (turns * r + labels / n_classes)
             + noise * rng.standard_normal(r.shape))
    x = np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1)
    return x.astype(np.float32), labels


# -- 1. the gradient check ---------------------------------------------------

def gradient_check(model, x, labels, rng, per_tensor=6, h=1e-5):
    """Central differences of the whole model's loss, in float64, against
    its backward, for `per_tensor` random entries of every parameter and of
    the input. A tensor's error is the largest |numeric - analytic| of its
    entries, relative to its largest analytic gradient entry. Returns the
    largest over the tensors."""
    m64 = MLP(*model.sizes, np.random.default_rng(0), dtype=np.float64)
    m64.load_state_dict(model.state_dict())  # the same parameters, in float64
    x = x.astype(np.float64)

    def loss():
        return cross_entropy(m64(x), labels)[0]

    m64.zero_grad()
    dx = m64.backward(cross_entropy(m64(x), labels)[1])
    tensors = dict(m64.parameters(), input=x)
    analytic = dict(m64.gradients(), input=dx)
    kinds = {str(i): type(layer).__name__ for i, layer in enumerate(m64.layers)}
    print(f"gradient check (float64, central differences, h = {h:g}): {len(labels)} "
          f"points, {per_tensor} entries per tensor")
    worst = 0.0
    for name, arr in tensors.items():
        err = 0.0
        for j in rng.choice(arr.size, size=min(per_tensor, arr.size), replace=False):
            idx = np.unravel_index(j, arr.shape)
            keep = arr[idx]
            arr[idx] = keep + h
            up = loss()
            arr[idx] = keep - h
            down = loss()
            arr[idx] = keep
            err = max(err, abs((up - down) / (2 * h) - analytic[name][idx]))
        err /= np.abs(analytic[name]).max()
        kind = kinds.get(name.split(".")[0], "")
        print(f"  {name:9s} {kind:10s} {str(arr.shape):8s} relative error {err:.1e}")
        worst = max(worst, err)
    print(f"  max relative error: {worst:.1e}")
    return worst


# -- 2. training ---------------------------------------------------------------

def train(model, x, labels, steps, every, lr=3e-3):
    """Full-batch Adam; prints and returns the loss every `every` steps."""
    opt = Adam(lr)
    print(f"training: Adam (lr {lr:g}), full batch of {len(labels)} points, float32")
    history = []
    for step in range(steps + 1):
        model.zero_grad()
        logits = model(x)
        loss, dlogits = cross_entropy(logits, labels)
        if step % every == 0 or step == steps:
            accuracy = (logits.argmax(axis=1) == labels).mean()
            print(f"  step {step:5d}   loss {loss:.4f}   accuracy {accuracy:.3f}")
            history.append((step, float(loss)))
        if step < steps:
            model.backward(dlogits)
            opt.step(model)
    return history


# -- 3. micro-batch accumulation -------------------------------------------

def accumulation_check(model, x, labels, rng):
    """Split the batch into micro-batches in random orders and accumulate
    the first LayerNorm's gradients over them: bit-identical to the full
    batch. The layer gets the same records and upstream gradients each time
    (those of one full-batch pass: a NumPy matmul of one row may round
    differently from the same row inside a batch, so the rest of the model
    is kept out of it). Returns True if every split matched."""
    model.zero_grad()
    model.backward(cross_entropy(model(x), labels)[1])
    ln = model.layers[1]
    h, g = model.inputs[1], model.grads[1]  # its input and the gradient reaching it
    full_w, full_b = ln.grad_weight.copy(), ln.grad_bias.copy()
    xhat = lnc.layer_norm(h, eps=ln.eps)
    naive_full = (g * xhat).sum(axis=0)  # a plain float32 sum, for comparison

    n = len(h)
    splits = []
    for parts in (2, 5, 17):
        cuts = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False))
        splits.append(np.split(rng.permutation(n), cuts))
    splits.append([np.array([i]) for i in reversed(range(n))])  # one record at a time
    print(f"micro-batch accumulation: the first LayerNorm's gradients over {n} records")
    all_equal = True
    for parts in splits:
        ln.zero_grad()
        naive = np.zeros_like(naive_full)
        for part in parts:
            ln(h[part])
            ln.backward(g[part])
            naive += (g[part] * lnc.layer_norm(h[part], eps=ln.eps)).sum(axis=0)
        same = (np.array_equal(ln.grad_weight, full_w)
                and np.array_equal(ln.grad_bias, full_b))
        all_equal &= same
        sizes = [len(p) for p in parts]
        what = (f"{len(parts)} parts of 1, in reverse order" if len(parts) == n else
                f"{len(parts)} parts, sizes {sizes}" if len(parts) < 6 else
                f"{len(parts)} parts, sizes {min(sizes)} to {max(sizes)}")
        print(f"  {what}:")
        print(f"    LayerNorm grad_weight and grad_bias bit-identical to the full "
              f"batch's: {'yes' if same else 'NO'}")
        print(f"    a plain float32 sum of dy * xhat: {np.sum(naive != naive_full)} of "
              f"{naive.size} entries differ")
    ln.zero_grad()
    return all_equal


# -- 4. PyTorch interop ----------------------------------------------------------

def torch_interop(model, x):
    """Load the model into torch.nn.Sequential and compare the logits;
    returns the largest difference, or None without torch."""
    try:
        import torch
    except ImportError:
        print("PyTorch: not installed, skipped")
        return None
    width = model.layers[1].normalized_shape[0]
    n_out = model.layers[-1].bias.size
    nn = torch.nn
    net = nn.Sequential(nn.Linear(x.shape[1], width), nn.LayerNorm(width), nn.Tanh(),
                        nn.Linear(width, width), nn.LayerNorm(width), nn.Tanh(),
                        nn.Linear(width, n_out))
    # the keys match; torch wants tensors, so convert the arrays
    net.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    with torch.no_grad():
        logits_torch = net(torch.from_numpy(x)).numpy()
    logits = model(x)
    diff = float(np.abs(logits - logits_torch).max())
    ln = lnc.LayerNorm(width)
    ln.load_state_dict(net[1].state_dict())  # torch's tensors load as they are
    back = (np.array_equal(ln.weight, model.layers[1].weight)
            and np.array_equal(ln.bias, model.layers[1].bias))
    print(f"PyTorch {torch.__version__}: the model's state_dict loads into "
          f"torch.nn.Sequential")
    print(f"  logits differ by at most {diff:.1e} (largest |logit| "
          f"{np.abs(logits).max():.1f})")
    print(f"  torch.nn.LayerNorm's state_dict loads back into lnc.LayerNorm, "
          f"unchanged: {'yes' if back else 'NO'}")
    return diff


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training steps (default 1500)")
    parser.add_argument("--quick", action="store_true", help="300 steps unless --steps")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else 300 if args.quick else 1500
    if steps < 0:
        parser.error(f"--steps: expected a number >= 0, got {steps}")

    rng = np.random.default_rng(args.seed)
    x, labels = spirals(100, 3, rng)
    model = MLP(2, 64, 3, rng)
    lns = [layer for layer in model.layers if isinstance(layer, lnc.LayerNorm)]
    total = sum(p.size for p in model.parameters().values())
    print(f"layernorm_c {lnc.__version__}: an MLP 2-64-64-3 on {len(labels)} points of "
          f"3 spirals")
    print(f"  {total} parameters, {sum(ln.num_parameters for ln in lns)} of them in "
          f"{len(lns)} LayerNorm layers ({lns[0].convention}, eps {lns[0].eps:g})")
    print()
    few = rng.choice(len(labels), size=8, replace=False)
    err = gradient_check(model, x[few], labels[few], rng)
    print()
    history = train(model, x, labels, steps, every=max(steps // 10, 1))
    print()
    identical = accumulation_check(model, x, labels, rng)
    print()
    torch_diff = torch_interop(model, x)
    return {"gradient_error": err, "history": history, "identical": identical,
            "torch_diff": torch_diff}


if __name__ == "__main__":
    results = main()
    # a failed check is a failed run
    sys.exit(0 if results["gradient_error"] < 1e-6 and results["identical"] else 1)
