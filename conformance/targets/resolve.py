"""Resolve ``--target`` text (and ``--target-cmd`` entries) to a :class:`Target`.

Names the suite knows itself: ``reference`` (default, :mod:`.reference`), ``vllm``
(:mod:`.vllm.target`), ``none`` (surfaces from ``--target-cmd`` only) and
``package.module:attr`` (an in-process object or a zero-argument factory of one, see
:func:`~enginewire.conformance.targets.contract.from_object`).

Layers above the suite add names through :func:`register_provider`: a provider owns a prefix
(``mutant`` owns ``mutant:NAME``) and turns the text after the colon into a target. The suite
never imports those layers; ``enginewire.fuzz.mutants`` registers the ``mutant`` provider
when it is imported, and the ``enginewire`` command line names it through
:func:`register_provider_module`, so it is imported only when a target uses its prefix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from enginewire.conformance.targets.contract import Target, TargetError, from_object

#: A provider: the text after ``PREFIX:`` -> the target (raise :class:`TargetError` for a
#: name it does not know).
Provider = Callable[[str], Target]

_PROVIDERS: dict[str, tuple[Provider, str]] = {}


def register_provider(prefix: str, provider: Provider, help: str = "") -> None:
    """Make ``--target PREFIX:NAME`` resolve through ``provider(NAME)``.

    ``prefix`` is a lower-case word that is not a built-in name; registering the same prefix
    again replaces the provider (re-imports stay harmless). ``help`` is one line for error
    messages (e.g. ``"mutant:NAME, a mutant of enginewire.fuzz.mutants"``).
    """
    _check_prefix(prefix)
    _PROVIDERS[prefix] = (provider, help or f"{prefix}:NAME")


def _check_prefix(prefix: str) -> None:
    if not prefix.isidentifier() or prefix != prefix.lower():
        raise ValueError(f"provider prefix must be a lower-case identifier, got {prefix!r}")
    if prefix in ("reference", "vllm", "none"):
        raise ValueError(f"provider prefix {prefix!r} is a built-in target name")


#: prefix -> (the module whose import registers it, its help line): providers not imported yet.
_PROVIDER_MODULES: dict[str, tuple[str, str]] = {}


def register_provider_module(prefix: str, module: str, help: str = "") -> None:
    """Make ``--target PREFIX:NAME`` import ``module`` the first time it is used; importing
    ``module`` must :func:`register_provider` the prefix. Until then the prefix costs nothing
    (a command that resolves no such target never imports the provider's layer)."""
    _check_prefix(prefix)
    _PROVIDER_MODULES[prefix] = (module, help or f"{prefix}:NAME")


def _provider(prefix: str) -> Provider | None:
    if prefix not in _PROVIDERS and prefix in _PROVIDER_MODULES:
        module = _PROVIDER_MODULES[prefix][0]
        importlib.import_module(module)
        if prefix not in _PROVIDERS:
            raise TargetError(f"importing {module} did not register the target provider "
                              f"{prefix!r}")
    found = _PROVIDERS.get(prefix)
    return None if found is None else found[0]


def providers() -> dict[str, str]:
    """The registered prefixes (imported or not yet) with their help lines."""
    found = {prefix: help for prefix, (_, help) in _PROVIDER_MODULES.items()}
    found.update((prefix, help) for prefix, (_, help) in _PROVIDERS.items())
    return dict(sorted(found.items()))


def _from_module(text: str) -> Target:
    module_name, _, attr = text.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        known = ", ".join(providers().values()) or "none registered"
        raise TargetError(f"{text}: cannot import {module_name}: {exc} "
                          f"(target providers: {known})") from exc
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise TargetError(f"{text}: {module_name} has no attribute {attr!r}") from None
    return from_object(text, obj)


def load_target(text: str = "reference", commands: Sequence[str] = (),
                version: str | None = None) -> Target:
    """Resolve ``--target`` text (and ``--target-cmd`` entries) to a :class:`Target`.

    With only commands and no explicit target text, the target is made of the commands alone.
    Commands replace the surfaces they name on a built-in or in-process target. ``version``
    makes the reference target follow that vLLM release (its layouts, handshake and sockets)
    and is the release an engine command is started for (its ``{version}`` and addresses).
    """
    prefix = text.partition(":")[0]
    if text in ("reference", ""):
        from enginewire.conformance.targets.reference import reference_target

        target = reference_target(version)
    elif text == "vllm":
        from enginewire.conformance.targets.vllm.target import vllm_target

        target = vllm_target()
    elif text == "none":
        target = Target(name="external")
    elif ":" in text and (provider := _provider(prefix)) is not None:
        target = provider(text.partition(":")[2])
    elif ":" in text:
        target = _from_module(text)
    else:
        extra = "".join(f", {help}" for help in providers().values())
        raise TargetError(
            f"unknown target {text!r}: use reference, vllm{extra} or package.module:attr"
        )
    if commands:
        from enginewire.conformance.targets.external import command_surfaces

        for surface, surface_obj in command_surfaces(commands, version).items():
            setattr(target, surface, surface_obj)
            if hasattr(surface_obj, "close"):
                target._closers.append(surface_obj.close)
        if text == "none":
            target.name = "external: " + "; ".join(commands)
    return target
