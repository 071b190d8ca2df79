"""Header parameters (``Content-Type``, ``Content-Disposition``) split in linear time.

Django 5.2 parses every request's ``Content-Type`` (``WSGIRequest.__init__``, before any middleware), DRF every
``Accept`` entry (content negotiation, before authentication), and the multipart parser each part's headers, all
with ``django.utils.http.parse_header_parameters``, which hands the line to the standard library's
``email.message._parseparam``. In the Python this project runs on (3.11.7), as in every release before the fix of
CPython issue gh-136063, that function is quadratic: for each ``;`` it recounts the quotes from the start of the
parameter, and it copies the rest of the line for each parameter.
Anonymous, a ``Content-Type: application/json; a="`` followed by 64 Ki ``;`` took 3.1 s and a 0.87 MB multipart
form of 900 parts with such headers 0.8 s, 16 times a benign one (``python -m bench.limits``).

``install()`` (called from ``DashboardConfig.ready``) puts ``parseparam`` in its place: the same result for every
input (the tests compare it with the function it replaces), in a fixed number of passes over the line.
"""
from __future__ import annotations

import email.message
from itertools import pairwise

#: The function ``install`` replaced (``None`` until then); the tests compare ``parseparam`` with it.
replaced = None


def split_params(s: str) -> tuple[list[str], int]:
    """``email.message._parseparam(s)`` and the work it took: ``(parameters, steps)``.

    The standard library ends a parameter at the first ``;`` with an even number of quotes before it in the
    parameter, not counting a quote preceded by a backslash; each ``name=value`` gets its name lower-cased and both
    sides stripped. As every parameter but the last ends on such a ``;``, those are the ``;`` with an even number
    of counted quotes before them in the whole line: here the line is split at its counted quotes once, and the
    ``;`` of every other piece are the ends. ``steps`` counts the characters the passes (``replace``, ``split``,
    ``find``) and copies handled, plus one per piece: at most ``7 * (len(s) + 2)``, whatever ``s`` holds.
    """
    s = ";" + str(s)
    # Same length, and every quote left is one the standard library counts ('\\"' is never one).
    counted = s.replace('\\"', "\\x")
    steps = 2 * len(s)
    ends = []
    offset = 0
    for index, piece in enumerate(counted.split('"')):
        steps += 1
        if index % 2 == 0:  # outside quotes
            steps += len(piece)
            at = piece.find(";")
            while at >= 0:
                ends.append(offset + at)
                at = piece.find(";", at + 1)
        offset += len(piece) + 1
    ends.append(len(s))  # ends[0] is the ';' put in front
    params = []
    for start, end in pairwise(ends):
        param = s[start + 1:end]
        if "=" in param:
            cut = param.index("=")
            param = param[:cut].strip().lower() + "=" + param[cut + 1:].strip()
        params.append(param.strip())
        steps += 3 * len(param) + 1  # the slice, the name/value rewrite and the final strip
    return params, steps


def parseparam(s: str) -> list[str]:
    """Drop-in for ``email.message._parseparam``: the parameters of a header line (see ``split_params``)."""
    return split_params(s)[0]


def install() -> None:
    """Make ``email.message`` split parameters with ``parseparam`` (idempotent)."""
    global replaced
    current = getattr(email.message, "_parseparam", None)
    if current is None or current is parseparam:
        return
    replaced = current
    email.message._parseparam = parseparam  # type: ignore[attr-defined]
