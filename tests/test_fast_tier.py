"""The compiled tier's package (ppo_ref.fast): FAST_FUNCTIONS lists every public function of its
modules and every listed name exists; the public facades re-export the readable tier."""
import importlib
import inspect
import pkgutil

import pytest

import ppo_ref.fast
from ppo_ref.fast import FAST_FUNCTIONS

FAST_MODULES = sorted(m.name for m in pkgutil.iter_modules(ppo_ref.fast.__path__))


def _resolve(dotted):
    module, _, name = dotted.rpartition(".")
    return importlib.import_module(module), name


@pytest.mark.parametrize("dotted", FAST_FUNCTIONS)
def test_every_listed_function_exists_and_is_callable(dotted):
    module, name = _resolve(dotted)
    assert callable(getattr(module, name, None)), dotted
    assert not inspect.isclass(getattr(module, name)), dotted


@pytest.mark.parametrize("module_name", FAST_MODULES)
def test_every_public_function_of_a_fast_module_is_listed(module_name):
    module = importlib.import_module(f"ppo_ref.fast.{module_name}")
    assert isinstance(module.__all__, list), f"{module_name} has no __all__ list"
    public = {name for name, obj in vars(module).items()
              if not name.startswith("_") and callable(obj) and not inspect.isclass(obj)
              and getattr(getattr(obj, "py_func", obj), "__module__", None) == module.__name__}
    listed = {d.rpartition(".")[2] for d in FAST_FUNCTIONS
              if d.rpartition(".")[0] == module.__name__}
    exported = {name for name in module.__all__
                if callable(getattr(module, name)) and not inspect.isclass(getattr(module, name))}
    missing = public - set(module.__all__)
    assert not missing, f"{module_name}: not in __all__: {missing}"
    assert exported <= listed, f"{module_name}: not in FAST_FUNCTIONS: {exported - listed}"


@pytest.mark.parametrize("public, spec", [
    ("ppo_ref.nn.lstm", "ppo_ref.spec.lstm"), ("ppo_ref.nn.mlp", "ppo_ref.spec.layers"),
    ("ppo_ref.nn.actor_critic", "ppo_ref.spec.networks"),
    ("ppo_ref.nn.distributions", "ppo_ref.spec.distributions"),
    ("ppo_ref.losses", "ppo_ref.spec.losses"), ("ppo_ref.optim", "ppo_ref.spec.optim")])
def test_public_facades_reexport_the_readable_tier(public, spec):
    pub, sp = importlib.import_module(public), importlib.import_module(spec)
    own = {"adam_state_to_arrays", "adam_state_from_arrays"}  # checkpoint helpers of optim
    for name in pub.__all__:
        if name not in own:
            assert getattr(pub, name) is getattr(sp, name), f"{public}.{name}"


def _malformed_networks():
    """``(name, params, shared_trunk)``: actor-critic parameters that are wrong in one way."""
    import numpy as np
    from ppo_ref.spec.networks import actor_critic_init
    rng = np.random.default_rng(0)
    separate = actor_critic_init(rng, 3, 2, net_arch=(4, 5))
    shared = actor_critic_init(rng, 3, 2, net_arch=(4,), shared_trunk=True)
    cases = []

    def change(name, base, shared_trunk, **edits):
        params = {k: v.copy() for k, v in base.items()}
        for k, v in edits.items():
            k = k.replace("__", ".")
            if v is None:
                del params[k]
            else:
                params[k] = v
        cases.append((name, params, shared_trunk))
    change("missing bias", separate, False, pi__b1=None)
    change("widths do not chain", separate, False, pi__w1=np.zeros((5, 3)))
    change("two value outputs", separate, False, vf__w2=np.zeros((2, 5)), vf__b2=np.zeros(2))
    change("non-finite weight", separate, False, pi__w0=np.full((4, 3), np.nan))
    change("towers of different inputs", separate, False, vf__w0=np.zeros((4, 2)))
    change("extra key", separate, False, extra=np.zeros(1))
    change("trunk keys without shared_trunk", shared, False)
    change("two-layer heads on a trunk", separate, True)
    change("head not reading the trunk", shared, True, vf__w0=np.zeros((1, 3)))
    return cases


@pytest.mark.parametrize("name, params, shared_trunk", _malformed_networks(),
                         ids=[c[0] for c in _malformed_networks()])
def test_fast_network_tables_use_the_spec_parameter_check(name, params, shared_trunk):
    """The compiled actor-critic's tables (``flat_net``) come from the spec's own check of the
    parameters: every malformed network is refused with the spec's very message."""
    import numpy as np
    from ppo_ref.fast.actor_critic import flat_net
    from ppo_ref.fast.flat import flatten_arrays
    from ppo_ref.spec.networks import actor_critic_forward
    with pytest.raises(ValueError) as spec_error:
        actor_critic_forward(params, np.zeros((1, 3)), shared_trunk=shared_trunk)
    try:
        flat = flatten_arrays(params)
    except ValueError:  # arrays the one-buffer layout itself cannot hold
        return
    with pytest.raises(ValueError) as fast_error:
        flat_net(flat, flat.layout, shared_trunk)
    assert str(fast_error.value) == str(spec_error.value)
