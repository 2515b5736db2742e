"""The convention options ppo_ref can express, in one table (:data:`OPTIONS`), read by
everything that compares conventions: :mod:`ppo_ref.testing` (``identify`` tries
:func:`combinations`; its reference computations receive :func:`resolve_convention`'s dict)
and ``ppo-ref check`` (:mod:`ppo_ref.vectors`).
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Tuple, Union

from ppo_ref.config import PRESETS, PPOConfig
from ppo_ref.spec.losses import (CLIP_FRACTION_MODES, CLIP_INTERVALS, KL_ESTIMATORS,
                                 NORM_EPS_PLACEMENTS, SINGLE_ELEMENT_RESULTS,
                                 VALUE_CLIP_BOUNDARY_GRADS, VALUE_LOSS_MODES)
from ppo_ref.spec.masks import TRUNCATION_MODES
from ppo_ref.spec.update import LOSS_AGGREGATIONS

__all__ = ["Option", "OPTIONS", "QUANTITIES", "options_for", "resolve_convention",
           "combinations", "describe", "preset_names_matching"]

QUANTITIES = ("gae", "vtrace", "policy_loss", "value_loss", "normalize_advantages")


class Option(NamedTuple):
    """One choice implementations make differently: ``name`` (its :class:`ppo_ref.PPOConfig`
    field and convention-dict key), every value it can take (``values``, the reference first),
    the :data:`QUANTITIES` whose reference result depends on it (``"update"``: only the whole
    update, :func:`ppo_ref.testing.trace.identify_trace`), and a one-line ``help``."""
    name: str
    values: Tuple[Any, ...]
    quantities: Tuple[str, ...]
    help: str

    @property
    def reference(self):
        return self.values[0]


def _option(name: str, values, quantities: Tuple[str, ...]) -> Option:
    """The option of the :class:`~ppo_ref.PPOConfig` field ``name``, its ``help`` the field's."""
    return Option(name, tuple(values), quantities,
                  PPOConfig.__dataclass_fields__[name].metadata["help"])


#: The options, one row each (reference value first).
OPTIONS: Tuple[Option, ...] = (
    _option("truncation", TRUNCATION_MODES, ("gae", "vtrace")),
    _option("bootstrap_terminal_last_row", (False, True), ("gae", "vtrace")),
    _option("value_loss_mode", VALUE_LOSS_MODES, ("value_loss",)),
    _option("value_loss_scale", (1.0, 0.5), ("value_loss",)),
    _option("value_clip_boundary_grad", VALUE_CLIP_BOUNDARY_GRADS, ("value_loss",)),
    _option("advantage_norm_ddof", (1, 0), ("normalize_advantages",)),
    _option("advantage_norm_eps", (1e-8, 1e-7, 1e-6, 1e-5, 1e-4), ("normalize_advantages",)),
    _option("advantage_norm_eps_placement", NORM_EPS_PLACEMENTS, ("normalize_advantages",)),
    _option("advantage_norm_single_element", SINGLE_ELEMENT_RESULTS, ("normalize_advantages",)),
    _option("clip_interval", CLIP_INTERVALS, ("policy_loss",)),
    _option("dual_clip", (None, 2.0, 3.0), ("policy_loss",)),
    _option("clip_fraction_mode", CLIP_FRACTION_MODES, ("policy_loss",)),
    _option("kl_estimator", KL_ESTIMATORS, ("policy_loss",)),
    _option("loss_aggregation", LOSS_AGGREGATIONS, ("policy_loss", "value_loss")),
    _option("drop_truncated_steps", (False, True), ("update",)),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def options_for(quantity: str) -> Tuple[Option, ...]:
    """The options whose value changes the reference result of ``quantity``."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {list(QUANTITIES)}, got {quantity!r}")
    return tuple(o for o in OPTIONS if quantity in o.quantities)


def resolve_convention(convention: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """``{option name: value}`` for every option of :data:`OPTIONS`, from a preset name of
    :meth:`ppo_ref.PPOConfig.preset` or a dict of option values (the options it leaves out keep
    their reference value). A value may be any its :class:`~ppo_ref.PPOConfig` field accepts
    (e.g. ``dual_clip=1.5``), not only those of its row (the ones :func:`combinations` tries).
    ``ValueError`` for an unknown preset, an unknown option name or a value its field refuses
    (the field's message)."""
    out = {o.name: o.reference for o in OPTIONS}
    if isinstance(convention, str):
        if convention not in PRESETS:
            raise ValueError(f"convention must be a preset name {sorted(PRESETS)} or a dict of "
                             f"options, got {convention!r}")
        given = {k: v for k, v in PRESETS[convention].items() if k in _BY_NAME}
    elif isinstance(convention, Mapping):
        given = dict(convention)
    else:
        raise ValueError(f"convention must be a preset name or a dict of options, got "
                         f"{type(convention).__name__}")
    for name in given:
        if name not in _BY_NAME:
            raise ValueError(f"convention has an unknown option {name!r}; options: "
                             f"{[o.name for o in OPTIONS]}")
    try:  # the fields' own checks (in one config): also values identify does not try
        config = PPOConfig(**given)
    except ValueError as exc:
        raise ValueError(f"convention option {exc}") from None
    out.update({name: getattr(config, name) for name in given})
    return out


def combinations(quantity: str) -> Iterator[Dict[str, Any]]:
    """Every combination of the options of ``quantity`` (reference values first), as dicts."""
    opts = options_for(quantity)
    for values in itertools.product(*(o.values for o in opts)):
        yield dict(zip((o.name for o in opts), values))


def preset_names_matching(quantity: str, options: Mapping[str, Any]) -> List[str]:
    """The presets whose options for ``quantity`` equal ``options``."""
    resolved = {name: resolve_convention(name) for name in PRESETS}
    return [name for name, r in resolved.items()
            if all(r[o.name] == options.get(o.name, o.reference) for o in options_for(quantity))]


def describe(quantity: str, options: Mapping[str, Any]) -> str:
    """``"cleanrl (truncation='terminate', bootstrap_terminal_last_row=False)"``: the options of
    ``quantity`` and the presets that share them."""
    text = ", ".join(f"{o.name}={options.get(o.name, o.reference)!r}"
                     for o in options_for(quantity))
    presets = preset_names_matching(quantity, options)
    return f"{'/'.join(presets)} ({text})" if presets else f"({text})"
