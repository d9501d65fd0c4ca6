"""How a run records its aspects: a description that is the same in every process and entry point."""

from __future__ import annotations

import types

from streams import NodeContext, Proceed, Retry, Timeout, describe_aspect

#: An application's aspects, compiled once as ``python app.py`` runs them and once as a program
#: that imports ``app`` does.
APP = """
async def audit(ctx, proceed):
    await proceed()


class Metered:
    def __init__(self, name):
        self.name = name

    async def __call__(self, ctx, proceed):
        await proceed()
"""


def app(module: str) -> types.ModuleType:
    loaded = types.ModuleType(module)
    exec(compile(APP, "app.py", "exec"), loaded.__dict__)
    return loaded


def test_a_users_aspect_is_described_by_its_qualified_name_whatever_its_module() -> None:
    as_script, as_import = app("__main__"), app("app")
    assert as_script.audit.__module__ != as_import.audit.__module__
    assert describe_aspect(as_script.audit) == describe_aspect(as_import.audit) == "audit"
    assert describe_aspect(as_script.Metered("a")) == describe_aspect(as_import.Metered("b")) == "Metered"


def test_retry_and_timeout_are_described_with_their_parameters() -> None:
    assert describe_aspect(Retry(3)) == "Retry(attempts=3, delay=0.0)"
    assert describe_aspect(Retry(3, delay=0)) == describe_aspect(Retry(3, delay=0.0))
    assert describe_aspect(Retry(2, delay=1.5)) == "Retry(attempts=2, delay=1.5)"
    assert describe_aspect(Timeout(5)) == describe_aspect(Timeout(5.0)) == "Timeout(5.0)"

    assert describe_aspect(Patient(4)) == "Patient(attempts=4, delay=0.0)"  # a Retry of one's own


class Patient(Retry):
    pass


class Around:
    async def around(self, ctx: NodeContext, proceed: Proceed) -> None:
        await proceed()


def test_a_method_is_described_by_its_qualified_name() -> None:
    assert describe_aspect(Around().around) == "Around.around"
