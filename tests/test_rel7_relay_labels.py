"""A relay's label is shown to reviewers as its server's name: one that looks like a registered server the
agent may not use is refused, whatever letters spell it, and one that shows as nothing is not a name."""
# ruff: noqa: F811  (pytest fixtures are named as arguments)

from __future__ import annotations

import pytest

from approvals.models import AuditEvent, ToolCall
from tests import factories

# The fixture `relay` (a relay posted under a label), which the tests take as an argument.
from tests.test_lcx_relays import relay  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "label",
    [
        "Secrets v\u0430ult",  # a Cyrillic a
        "\u0455ecrets vault",  # a Cyrillic dze, drawn as s
        "V\u0410ULT",  # a Cyrillic capital A
        "v\u0430u\u04cft",  # a Cyrillic a and a Cyrillic palochka
        "Vau\u0399t",  # a Greek capital iota, drawn as l in most sans-serif faces
        "Secrets vau1t",  # a digit one for the l
        "Vau\u04cft",  # a Cyrillic palochka, drawn as l
        "va\u034fult",  # a combining grapheme joiner: drawn as nothing
        "vault\ufe0f",  # a variation selector: drawn as nothing
        "Secrets\u3164vault",  # a Hangul filler: drawn as a space
    ],
)
def test_a_label_in_look_alike_letters_is_refused(relay, label: str) -> None:
    """Only spellings that NFKC, case and format characters fold were refused: the vault's name in Cyrillic
    or Greek letters that are drawn as the Latin ones, or with a mark drawn as nothing, was accepted, and
    reviewers saw the agent's questions under the vault's name."""
    response = relay(label)
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "server_not_allowed"
    assert not ToolCall.objects.exists()


@pytest.mark.parametrize(
    "label",
    [
        "Secrets vaults",
        "vault 2",
        "Deploy",
        "\u03a5\u0391\u039a\u039f",
        "\u0432\u043e\u043b\u0442",
        "V\u00e1ult",
    ],
)
def test_a_label_of_its_own_in_any_script_stays_a_label(relay, label: str) -> None:
    created = relay(label)
    assert created.status_code == 201, created.content
    assert ToolCall.objects.get().server_label == label


@pytest.mark.parametrize("label", [" ", "\u200b", "\u3164", "\u034f\u200d", "\u2800"])
def test_a_label_that_shows_as_nothing_is_refused(relay, label: str) -> None:
    """Reviewers would see questions from no server at all: a label is a name, and must show as one."""
    response = relay(label)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_body"
    assert error["fields"] == {"server": "shows as nothing"}
    assert not ToolCall.objects.exists()
    assert not AuditEvent.objects.filter(verb="relay.submitted").exists()


@pytest.mark.parametrize("label", ["infra tools", "\u0456nfra tools", "INFRA TOOLS", "lnfra tools"])
def test_a_capital_i_read_as_an_l_still_reads_in_any_case(relay, label: str) -> None:
    """A capital I passes for an l, and a name is read in any case: both hold together."""
    factories.server("infra", name="Infra tools")
    response = relay(label)
    assert response.status_code == 403, response.content
