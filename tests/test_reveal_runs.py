"""Invisible characters in a server's text are shown as codes; a run of them is shown as one code with its
length, so a title of a million zero-width spaces makes a line, not a page of tens of megabytes."""

from __future__ import annotations

from approvals.templatetags.approvals_ui import reveal
from approvals.visible import RUN_SHOWN


def test_a_few_invisible_characters_are_each_shown() -> None:
    assert reveal("a\u202eb") == 'a<span class="ctl" title="U+202E">U+202E</span>b'
    assert reveal("a" + "\u200b" * RUN_SHOWN + "b").count('class="ctl"') == RUN_SHOWN


def test_a_long_run_is_one_code_with_its_length() -> None:
    shown = reveal("deploy" + "\u200b" * 1_000_000 + "<b>")
    assert (
        shown == 'deploy<span class="ctl" title="U+200B \u00d71000000">U+200B \u00d71000000</span>&lt;b&gt;'
    )


def test_a_run_of_several_kinds_names_them() -> None:
    assert reveal("a" + "\u200b\u202e" * 50 + "b", "text") == "a\u27e8U+200B U+202E \u00d7100\u27e9b"
    mixed = "".join(chr(code) for code in (0xFEFF, 0x200B, 0x202E, 0x2060, 0x2066, 0x200E))
    assert reveal(mixed, "text") == "\u27e8U+200B U+200E U+202E U+2060 U+2066 U+FEFF \u00d76\u27e9"
