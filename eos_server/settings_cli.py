"""Command-line flags generated from a service's settings model.

``eos node`` and ``eos coordinator`` (and ``python -m partition_service`` /
``python -m coordinator_service``) take one flag per field of their pydantic-settings
model: ``segment_bytes`` is ``--segment-bytes``, a boolean ``fsync`` is
``--fsync/--no-fsync``. A flag's help is the field's description followed by its ``EOS_*``
variable and its default, all read from the model, so a setting added to the model is a
flag at once and the flags cannot drift from the settings (tests/test_settings_cli.py).

The flags hold no values of their own. A flag left out is not passed to the model, so
pydantic-settings falls back to the ``EOS_*`` variable and then to the field's default; a
flag given is passed as the text typed, and the model parses it as it would parse the
variable. A bad value from either place is therefore reported the same way, by
``settings_or_exit``: one line per problem naming the flag and the variable, exit status 2
— never a usage error for the flag and a different message for the variable.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from rich.markup import escape

from eos_server.process import settings_or_exit

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
CommandT = TypeVar("CommandT", bound=Callable[..., None])

#: How a value of each plain type is shown after its flag in ``--help`` (typer's own forms).
_METAVARS: dict[object, str] = {str: "<str>", int: "<int>", float: "<float>", Path: "<path>"}


@dataclass(frozen=True)
class SettingFlag:
    """One field of a settings model as the command line shows it."""

    field: str
    """The settings field: also the keyword the command function receives the value under."""
    flag: str
    """``--segment-bytes``."""
    negative: str | None
    """``--no-fsync`` for a boolean setting (its flag is ``--fsync/--no-fsync``), else None."""
    envvar: str
    """``EOS_SEGMENT_BYTES``: the variable pydantic-settings reads the field from."""
    default: str | None
    """The field's default as ``--help`` shows it; None when there is none to show (no
    default, None or empty, or one made afresh for each instance)."""
    metavar: str | None
    """What follows the flag in ``--help``: ``<int>``, ``[json|text]``; None for a boolean."""
    description: str
    """The settings field's description."""

    @property
    def help(self) -> str:
        """The flag's help line: the description, then the variable and the default."""
        parts = [self.description, f"[env var: {self.envvar}]"]
        if self.default is not None:
            parts.append(f"[default: {self.default}]")
        return " ".join(part for part in parts if part)


def setting_flags(model: type[BaseSettings]) -> list[SettingFlag]:
    """The flags of ``model``, one per field: the service's own settings first, then those
    it inherits (eos_security's, shared by every service), each in declaration order, so
    ``--help`` opens with what sets this service apart.

    Raises ``TypeError`` for a field no flag can express (a list, a nested model) or whose
    variable is renamed by an alias, so such a setting is refused where it is added rather
    than left without a flag.
    """
    fields = sorted(model.model_fields.items(), key=lambda item: _declared_by(model, item[0]))
    return [_setting_flag(model, name, field) for name, field in fields]


def with_settings_flags(model: type[BaseSettings]) -> Callable[[CommandT], CommandT]:
    """Give a command function taking ``**flags`` one typer option per field of ``model``.

    typer reads a command's parameters from its signature; the function's own signature is
    replaced, so it must take nothing but ``**flags``, which then receives every field by
    name, None for a flag not given (hand them to ``settings_from_flags``).
    """
    parameters = [
        inspect.Parameter(
            flag.field,
            inspect.Parameter.KEYWORD_ONLY,
            default=_option(flag),
            annotation=bool | None if flag.negative else str | None,
        )
        for flag in setting_flags(model)
    ]

    def with_flags(command: CommandT) -> CommandT:
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        return command

    return with_flags


def setting_option(model: type[BaseSettings], name: str) -> Any:
    """The typer option of one field of ``model``, for a command that takes only a few of
    the settings (``eos db upgrade``); its parameter is annotated ``str | None``, or
    ``bool | None`` for a boolean setting."""
    return _option(_setting_flag(model, name, model.model_fields[name]))


def settings_from_flags(model: type[SettingsT], flags: Mapping[str, object]) -> SettingsT:
    """The settings: the flags given, then the ``EOS_*`` variables, then the defaults.

    A flag not given arrives as None and is left out, so the model looks further; a value
    the model refuses ends the process through ``settings_or_exit`` (status 2).
    """
    given = {name: value for name, value in flags.items() if value is not None}
    return settings_or_exit(model, **given)


def _setting_flag(model: type[BaseSettings], name: str, field: FieldInfo) -> SettingFlag:
    if field.alias is not None or field.validation_alias is not None:
        raise TypeError(f"{model.__name__}.{name}: an alias would rename its EOS_ variable")
    spelt = name.replace("_", "-")
    prefix = model.model_config.get("env_prefix", "")
    envvar = prefix + name
    if not model.model_config.get("case_sensitive", False):
        envvar = envvar.upper()
    kind = _value_type(field.annotation)
    if kind is bool:
        negative: str | None = f"--no-{spelt}"
        metavar: str | None = None
    elif get_origin(kind) is Literal and all(isinstance(c, str) for c in get_args(kind)):
        negative, metavar = None, "[" + "|".join(get_args(kind)) + "]"
    elif kind in _METAVARS:
        negative, metavar = None, _METAVARS[kind]
    else:
        raise TypeError(f"{model.__name__}.{name}: no command-line form for {kind!r}")
    return SettingFlag(
        field=name,
        flag=f"--{spelt}",
        negative=negative,
        envvar=envvar,
        default=_shown_default(field),
        metavar=metavar,
        description=field.description or "",
    )


def _declared_by(model: type[BaseSettings], name: str) -> int:
    """How far up ``model``'s bases the field ``name`` is declared (0: by the model)."""
    for depth, cls in enumerate(model.__mro__):
        if name in vars(cls).get("__annotations__", {}):
            return depth
    return len(model.__mro__)


def _value_type(annotation: Any) -> Any:
    """The type of the value a flag gives: ``int`` for ``int | None`` as for ``int`` (None
    is what a flag left out stands for, never a value typed)."""
    if get_origin(annotation) in (Union, types.UnionType):
        present = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(present) == 1:
            return present[0]
    return annotation


def _shown_default(field: FieldInfo) -> str | None:
    if field.is_required() or field.default_factory is not None or field.default in (None, ""):
        return None
    if isinstance(field.default, bool):
        return "true" if field.default else "false"  # as EOS_FSYNC=false is written
    return str(field.default)


def _option(flag: SettingFlag) -> Any:
    """A typer option that defaults to None (not given) and shows the model's default.

    The help is escaped because typer renders it as rich markup, in which ``[env var: X]``
    is a style tag and would vanish from the help.
    """
    declaration = f"{flag.flag}/{flag.negative}" if flag.negative else flag.flag
    return typer.Option(
        None, declaration, help=escape(flag.help), metavar=flag.metavar, show_default=False
    )
