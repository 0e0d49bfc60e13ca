"""The services' flags are their settings (eos_server/settings_cli.py).

For the storage node and the coordinator, through every way of starting them (``eos node``,
``python -m partition_service``, ``eos coordinator``, ``python -m coordinator_service``):
each settings field has exactly one flag, spelt from its name; a flag left out falls back
to the field's ``EOS_*`` variable and then to its default; a flag given wins; ``--help``
shows each flag with its description, variable and default; a bad value, from a flag or a
variable, ends the command with status 2 and one line per problem. The checks read the
commands from the outside (click's parameters, the help text, the settings a command
builds), not from the generator, so a command whose flags were written by hand would be
held to the same rules.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args, get_origin

import pytest
import typer
from pydantic import Field
from pydantic_settings import BaseSettings
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner, Result

import coordinator_service.cli as coordinator_cli
import partition_service.cli as node_cli
from coordinator_service.settings import CoordinatorSettings
from eos_cli.main import app as eos_app
from eos_server.settings_cli import setting_flags, with_settings_flags
from partition_service.settings import NodeSettings

pytestmark = pytest.mark.unit


Entry = Callable[[], tuple[typer.Typer, list[str]]]
"""A way of starting a service: the typer app and the command names before the flags."""


@dataclass(frozen=True)
class Service:
    """A service whose command builds its settings from flags."""

    name: str
    model: type[BaseSettings]
    cli: ModuleType
    run: str  # the function of ``cli`` the command hands its settings to
    commands: tuple[Entry, ...]  # the ways of starting it: ``eos ...``, ``python -m ...``
    samples: dict[str, str]  # values for the settings whose validators refuse any text


def _eos(command: str) -> Entry:
    return lambda: (eos_app, [command])


def _node_module() -> tuple[typer.Typer, list[str]]:
    main = importlib.import_module("partition_service.__main__")
    return main.app, []


def _coordinator_module() -> tuple[typer.Typer, list[str]]:
    return coordinator_cli.standalone(), []


#: Samples of the shared settings whose validators refuse an arbitrary text; every other
#: field's samples are derived from its type and default (``_sample``).
SECURITY_SAMPLES = {
    "internal_token": "t" * 32,
    "tls_cert": "/certs/cert.pem",
    "tls_key": "/certs/key.pem",
}

SERVICES = [
    Service(
        name="node",
        model=NodeSettings,
        cli=node_cli,
        run="run_node",
        commands=(_eos("node"), _node_module),
        samples={**SECURITY_SAMPLES, "coordinator_url": "http://c1:8080,http://c2:8080"},
    ),
    Service(
        name="coordinator",
        model=CoordinatorSettings,
        cli=coordinator_cli,
        run="run_coordinator",
        commands=(_eos("coordinator"), _coordinator_module),
        samples={
            **SECURITY_SAMPLES,
            "nodes": "1=http://n1:9091,2=http://n2:9091",
            "public_url": "http://c1:8080",
            "super_users": "User:admin,User:ops",
        },
    ),
]
ENTRY_POINTS = [
    pytest.param(service, entry, id=f"{service.name}-{'eos' if i == 0 else 'module'}")
    for service in SERVICES
    for i, entry in enumerate(service.commands)
]
BY_SERVICE = [pytest.param(service, id=service.name) for service in SERVICES]


def spelt(name: str) -> str:
    return "--" + name.replace("_", "-")


def envvar(name: str) -> str:
    return "EOS_" + name.upper()


def annotated(model: type[BaseSettings], name: str, kind: type) -> bool:
    """Whether the field is a ``kind`` (or an optional one)."""
    annotation = model.model_fields[name].annotation
    return kind in (annotation, *get_args(annotation))


def is_bool(model: type[BaseSettings], name: str) -> bool:
    return annotated(model, name, bool)


def flag_problems(command: Any, model: type[BaseSettings]) -> list[str]:
    """What keeps ``command``'s options from being exactly ``model``'s fields, one flag
    each, spelt from the field's name (``--x/--no-x`` for a boolean); empty if nothing."""
    options = [p for p in command.params if isinstance(p, TyperOption)]
    per_field = Counter(p.name for p in options)
    problems = [
        f"{name}: {per_field[name]} flags" for name in model.model_fields if per_field[name] != 1
    ]
    problems += [f"{n}: a flag of no setting" for n in per_field if n not in model.model_fields]
    for option in options:
        if option.name not in model.model_fields:
            continue
        negative = [f"--no-{spelt(option.name)[2:]}"] if is_bool(model, option.name) else []
        if option.opts != [spelt(option.name)] or option.secondary_opts != negative:
            problems.append(f"{option.name}: spelt {option.opts} / {option.secondary_opts}")
    declared = Counter(o for p in options for o in (*p.opts, *p.secondary_opts))
    problems += [f"{opt}: declared {n} times" for opt, n in declared.items() if n > 1]
    return problems


def click_command(entry: Entry) -> Any:
    """The command an entry point runs, as typer hands it to (its own copy of) click."""
    app, prefix = entry()
    command: Any = typer.main.get_command(app)
    for name in prefix:
        assert isinstance(command, TyperGroup)
        command = command.commands[name]
    return command


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No ``EOS_*`` variable of the machine running the tests leaks into the settings."""
    for key in list(os.environ):
        if key.upper().startswith("EOS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option in --help
    yield monkeypatch


def invoke(
    service: Service,
    entry: Entry,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Result, list[BaseSettings]]:
    """Run the command with its service replaced by a list that keeps the settings."""
    built: list[BaseSettings] = []
    monkeypatch.setattr(service.cli, service.run, built.append)
    app, prefix = entry()
    return CliRunner().invoke(app, [*prefix, *args]), built


def _sample(service: Service, name: str, nth: int) -> str:
    """A valid value of the setting, as text: the first (``nth=1``) is never the default,
    and the second differs from the first wherever the validators allow any text."""
    if name in service.samples:
        return service.samples[name]
    field = service.model.model_fields[name]
    if is_bool(service.model, name):
        return str(field.default != (nth == 1)).lower()
    if get_origin(field.annotation) is Literal:
        others = [choice for choice in get_args(field.annotation) if choice != field.default]
        return str(others[0] if nth == 1 else field.default)
    if annotated(service.model, name, int):
        return str(int(field.default or 0) + nth)
    return f"sample-{nth}-{name}"


def _parsed(service: Service, name: str, text: str) -> object:
    """What the settings should hold for the text ``_sample`` gave."""
    if is_bool(service.model, name):
        return text == "true"
    if annotated(service.model, name, int):
        return int(text)
    if annotated(service.model, name, Path):
        return Path(text)
    return text


@pytest.mark.parametrize(("service", "entry"), ENTRY_POINTS)
def test_every_setting_has_exactly_one_flag(service: Service, entry: Entry) -> None:
    assert flag_problems(click_command(entry), service.model) == []


def test_a_setting_without_a_flag_is_caught() -> None:
    """The check above fails for a field the command has no flag for (and for a flag that
    names no field), so it would catch a settings model and a CLI that drift apart."""

    class Planted(NodeSettings):
        planted_ms: int = Field(default=1, description="A setting the node's CLI lacks.")

    command = click_command(_eos("node"))
    assert flag_problems(command, Planted) == ["planted_ms: 0 flags"]
    assert flag_problems(click_command(_eos("coordinator")), NodeSettings) != []


@pytest.mark.parametrize("service", BY_SERVICE)
def test_every_setting_is_described(service: Service) -> None:
    """The description is the flag's help: a field without one is a bare flag in --help."""
    assert [n for n, f in service.model.model_fields.items() if not f.description] == []


@pytest.mark.parametrize(("service", "entry"), ENTRY_POINTS)
def test_flags_left_out_are_the_defaults(
    service: Service, entry: Entry, clean_env: pytest.MonkeyPatch
) -> None:
    result, built = invoke(service, entry, [], clean_env)
    assert result.exit_code == 0, result.output
    (settings,) = built
    for name, field in service.model.model_fields.items():
        if field.default_factory is None:
            assert getattr(settings, name) == field.default, name


@pytest.mark.parametrize(("service", "entry"), ENTRY_POINTS)
def test_every_setting_is_read_from_its_variable_and_a_flag_wins(
    service: Service, entry: Entry, clean_env: pytest.MonkeyPatch
) -> None:
    fields = service.model.model_fields
    for name in fields:
        clean_env.setenv(envvar(name), _sample(service, name, 1))
    result, built = invoke(service, entry, [], clean_env)
    assert result.exit_code == 0, result.output
    for name in fields:
        assert getattr(built[0], name) == _parsed(service, name, _sample(service, name, 1)), name

    # Every flag given, against the variables that still hold the first samples.
    args: list[str] = []
    for name in fields:
        second = _sample(service, name, 2)
        if is_bool(service.model, name):
            args.append(spelt(name) if second == "true" else f"--no-{spelt(name)[2:]}")
        else:
            args += [spelt(name), second]
    result, built = invoke(service, entry, args, clean_env)
    assert result.exit_code == 0, result.output
    for name in fields:
        assert getattr(built[0], name) == _parsed(service, name, _sample(service, name, 2)), name


@pytest.mark.parametrize(("service", "entry"), ENTRY_POINTS)
def test_help_lists_every_flag_with_its_variable_and_default(
    service: Service, entry: Entry, clean_env: pytest.MonkeyPatch
) -> None:
    result, _ = invoke(service, entry, ["--help"], clean_env)
    assert result.exit_code == 0, result.output
    lines = {
        line.split()[1]: " ".join(line.split())
        for line in result.output.splitlines()
        if line.startswith("│ --")
    }
    for name, field in service.model.model_fields.items():
        line = lines[spelt(name)]
        assert " ".join(str(field.description).split()) in line, line
        assert f"[env var: {envvar(name)}]" in line, line
        if is_bool(service.model, name):
            assert f"--no-{spelt(name)[2:]}" in line, line
        default = field.default
        if field.default_factory is None and default not in (None, ""):
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            assert f"[default: {shown}]" in line, line
        else:
            assert "[default:" not in line, line


@pytest.mark.parametrize(("service", "entry"), ENTRY_POINTS)
def test_bad_values_exit_2_with_one_line_each(
    service: Service, entry: Entry, clean_env: pytest.MonkeyPatch
) -> None:
    """A flag's text and a variable's are parsed by the same model, so a bad value gets
    settings_or_exit's line whichever way it came (not click's usage error for a flag of
    the wrong type), and every problem is listed at once."""
    clean_env.setenv("EOS_LOG_FORMAT", "xml")
    clean_env.setenv(
        "EOS_MIGRATE_ON_START" if service.name == "coordinator" else "EOS_FSYNC", "maybe"
    )
    result, built = invoke(
        service, entry, ["--port", "abc", "--internal-token", "short"], clean_env
    )
    assert result.exit_code == 2 and not built
    flag = "--migrate-on-start" if service.name == "coordinator" else "--fsync"
    lines = result.stderr.splitlines()
    assert sorted(line.split(" (")[0] for line in lines) == sorted(
        f"error: {f}" for f in ("--port", "--internal-token", "--log-format", flag)
    ), result.stderr
    assert "Traceback" not in result.output


def test_a_setting_no_flag_can_express_is_refused_where_it_is_declared() -> None:
    class Listed(BaseSettings):
        names: list[str] = Field(default_factory=list)

    with pytest.raises(TypeError, match="names"):
        setting_flags(Listed)
    with pytest.raises(TypeError, match="names"):
        with_settings_flags(Listed)
