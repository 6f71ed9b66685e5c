"""Text from a server or an agent as a reader sees it: the characters that change how it reads without being
seen (bidi overrides and isolates, zero-width characters, controls) shown as visible codes, ``⟨U+202E⟩``, so
that "gpj.exe" reversed by U+202E cannot pass unnoticed. Pure code: the dashboard's ``reveal`` filter shows
them so (as HTML), and so do the team notices (as plain text)."""

from __future__ import annotations

import re

# Characters that change how text reads without being visible: bidi overrides and isolates, zero-width
# characters, the BOM.
CONTROLS = {
    0x200B,  # zero-width space (not U+200C/U+200D, the joiners Persian words and emoji are spelt with)
    *range(0x200E, 0x2010),  # LRM, RLM
    *range(0x202A, 0x202F),  # embeddings and overrides
    *range(0x2060, 0x2065),  # word joiner, invisible operators
    *range(0x2066, 0x206A),  # isolates
    0x061C,  # Arabic letter mark
    0xFEFF,
    0x00AD,  # soft hyphen
}
# Every character shown as a visible code: the invisible ones above, C0 controls but newline and tab, DEL
# and the C1 controls.
_SHOWN = sorted({*CONTROLS, *range(0x20), *range(0x7F, 0xA0)} - {0x09, 0x0A})
SHOWN_AS_CODE = re.compile("[" + "".join(f"\\u{code:04x}" for code in _SHOWN) + "]+")
# A run longer than this is shown as one code with its length: a server's text of a million zero-width
# spaces would otherwise be a page of tens of megabytes.
RUN_SHOWN = 3


def _code(char: str, plain: bool) -> str:
    code = ord(char)
    return (
        f"\u27e8U+{code:04X}\u27e9"
        if plain
        else f'<span class="ctl" title="U+{code:04X}">U+{code:04X}</span>'
    )


def run_shown(run: str, plain: bool) -> str:
    """A run of characters to show as codes (plain text, or HTML): each coded, or past `RUN_SHOWN` of them
    one code that names every kind in it (there are fewer than a hundred kinds: a bidi override is never
    hidden in a run) and how many characters the run holds."""
    if len(run) <= RUN_SHOWN:
        return "".join(_code(char, plain) for char in run)
    named = " ".join(f"U+{ord(char):04X}" for char in sorted(set(run)))
    label = f"{named} \u00d7{len(run)}"
    return f"\u27e8{label}\u27e9" if plain else f'<span class="ctl" title="{label}">{label}</span>'


def plain(text: str) -> str:
    """`text` with each character to show as a code coded, as plain text (a notice's subject and body)."""
    return SHOWN_AS_CODE.sub(lambda found: run_shown(found.group(), True), text)
