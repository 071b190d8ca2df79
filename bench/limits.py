"""What the checks that run before authentication cost on hostile input, against benign input of the same size.

    python -m bench.limits [--budget-s S]

Every request meets these before login, throttling or any view, so each must be linear in the request's size:

* ``json`` — ``dashboard.limits.json_depth_exceeds``, the JSON depth check of ``RequestLimitsMiddleware``, on a
  1 MiB body: benign (API objects with strings, escapes and nesting 3 deep) and hostile ones (an unterminated
  string of ``\\"``, a string of ``\\"`` runs, brackets inside a string, a run of backslashes, 300,000 empty
  strings); the worst hostile one is reported.
* ``content_type`` — ``django.utils.http.parse_header_parameters``, which Django runs on every ``Content-Type``
  when it builds the request and DRF on every ``Accept`` entry, on a 64 KiB header (the longest header line
  ``manage.py runserver`` reads; gunicorn's default is 8 KiB): many parameters against an unterminated quote
  followed by ``;`` (and escaped quotes, quote pairs).
* ``multipart`` — Django's ``MultiPartParser`` (the CSRF check reads a login form before authentication) on a
  form of 900 parts, about 0.9 MB: benign part headers against ones with an unterminated quote followed by ``;``.

Each body is checked at doubling sizes up to the full size; once one check takes longer than ``--budget-s``
(default 2 s) the full-size time is estimated from the growth k of time ~ size^k
(least squares over the sizes measured, checks under 2 ms left out) and marked ``estimated``.
The last stdout line is one JSON object: seconds per case at full size, ``*_ratio`` = worst hostile / benign, and
``json_growth`` = k of the worst hostile JSON body (1 is linear, 2 quadratic).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable

MIB = 1 << 20
HEADER_BYTES = 64 << 10
PARTS = 900
#: The smallest size measured is the full size divided by this.
SMALLEST = 256
#: Checks faster than this are left out of the growth fit (timer noise).
MEASURABLE_S = 0.002


def json_bodies(size: int) -> dict[str, bytes]:
    """Benign and hostile JSON bodies of about ``size`` bytes."""
    item = json.dumps({"name": "adapter-1", "path": "/models/llama/lora-1", "rank": 16,
                       "notes": 'a "quoted" \\ word', "tags": [["a", "b"], {"k": [1, 2]}]})
    benign = ("[" + ",".join([item] * (size // (len(item) + 1))) + "]").encode()
    return {
        "benign": benign,
        "unterminated_escaped_quotes": b'"' + b'\\"' * (size // 2),
        "escaped_quote_runs": b'["' + (b'\\"' * 100 + b"x") * (size // 201) + b'"]',
        "brackets_in_a_string": b'["' + b"[{" * (size // 2) + b'"]',
        "backslash_run": b'["' + b"\\" * size,
        "empty_strings": b"[" + b'"",' * (size // 3) + b'""]',
    }


def header_values(size: int) -> dict[str, str]:
    """Benign and hostile ``Content-Type`` values of about ``size`` characters."""
    return {"benign": "application/json" + "; a=b" * (size // 5),
            "unterminated_quote": 'application/json; a="' + ";" * size,
            "escaped_quotes": 'application/json; a="' + '\\";' * (size // 3),
            "quote_pairs": "application/json" + ';""' * (size // 3)}


def multipart_bodies(parts: int) -> dict[str, bytes]:
    """Benign and hostile multipart bodies of ``parts`` parts (boundary ``BOUNDARY``), part headers ~950 bytes."""
    def form(extra: str) -> bytes:
        return b"".join(b'--BOUNDARY\r\nContent-Disposition: form-data; name="f%d"%s\r\n\r\nv\r\n'
                        % (index, extra.encode()) for index in range(parts)) + b"--BOUNDARY--\r\n"
    return {"benign": form('; x="' + "y" * 899 + '"'), "unterminated_quote": form('; x="' + ";" * 900)}


def _timed(check: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        check()
        elapsed = time.perf_counter() - started
        best = min(best, elapsed)
        if elapsed > 0.2:
            break
    return best


def _growth(points: list[tuple[int, float]]) -> float | None:
    """k of time ~ size^k, least squares over log-log ``points`` (``None`` for fewer than two)."""
    if len(points) < 2:
        return None
    xs = [math.log(size) for size, _ in points]
    ys = [math.log(seconds) for _, seconds in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def grow(make: Callable[[int], object], check: Callable[[object], object], full: int, budget_s: float) -> dict:
    """Seconds of ``check(make(size))`` at ``full``: measured at doubling sizes from ``full / SMALLEST``, or
    estimated from the growth once one took more than ``budget_s``. Returns seconds, growth k, estimated."""
    points: list[tuple[int, float]] = []
    size = max(full // SMALLEST, 1)
    while True:
        size = min(size, full)
        body = make(size)
        points.append((size, _timed(lambda body=body: check(body))))
        if size >= full or points[-1][1] > budget_s:
            break
        size *= 2
    growth = _growth([(size, seconds) for size, seconds in points if seconds >= MEASURABLE_S])
    last_size, last_s = points[-1]
    estimated = last_size < full
    seconds = last_s * (full / last_size) ** (growth or 1.0) if estimated else last_s
    return {"seconds": round(seconds, 4), "growth": round(growth, 2) if growth is not None else None,
            "estimated": estimated, "largest_measured_bytes": last_size}


def run(budget_s: float) -> dict:
    """Every case; returns the summary printed as the last line."""
    from django.core.files.uploadhandler import MemoryFileUploadHandler
    from django.http.multipartparser import MultiPartParser
    from django.utils.http import parse_header_parameters

    from dashboard.limits import DEFAULT_MAX_JSON_DEPTH, json_depth_exceeds

    results: dict[str, dict[str, dict]] = {"json": {}, "content_type": {}, "multipart": {}}
    for name in json_bodies(16):
        results["json"][name] = grow(lambda size, name=name: json_bodies(size)[name],
                                     lambda body: json_depth_exceeds(body, DEFAULT_MAX_JSON_DEPTH), MIB, budget_s)
    for name in header_values(16):
        results["content_type"][name] = grow(lambda size, name=name: header_values(size)[name],
                                             parse_header_parameters, HEADER_BYTES, budget_s)

    def parse_form(body):
        meta = {"CONTENT_TYPE": "multipart/form-data; boundary=BOUNDARY", "CONTENT_LENGTH": str(len(body))}
        return MultiPartParser(meta, io.BytesIO(body), [MemoryFileUploadHandler()]).parse()

    for name in multipart_bodies(1):
        results["multipart"][name] = grow(lambda parts, name=name: multipart_bodies(parts)[name], parse_form,
                                          PARTS, budget_s)
    summary: dict[str, object] = {}
    for case, bodies in results.items():
        for name, figures in bodies.items():
            mark = " (estimated)" if figures["estimated"] else ""
            print(f"{case:13} {name:28} {figures['seconds']:10.4f} s{mark}  growth {figures['growth']}")
        hostile_name, hostile = max(((name, figures) for name, figures in bodies.items() if name != "benign"),
                                    key=lambda item: item[1]["seconds"])
        benign_s = bodies["benign"]["seconds"]
        summary[f"{case}_benign_s"] = benign_s
        summary[f"{case}_hostile_s"] = hostile["seconds"]
        summary[f"{case}_hostile_estimated"] = hostile["estimated"]
        summary[f"{case}_worst"] = hostile_name
        summary[f"{case}_ratio"] = round(hostile["seconds"] / benign_s, 2) if benign_s > 0 else None
        if case == "json":
            summary["json_growth"] = hostile["growth"]
    summary["json_bytes"] = MIB
    summary["content_type_bytes"] = HEADER_BYTES
    summary["multipart_bytes"] = len(multipart_bodies(PARTS)["benign"])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=2.0,
                        help="a check slower than this stops the doubling; larger sizes are estimated")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvpool-bench-limits-") as workdir:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
        os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
        os.environ.setdefault("DATABASE_URL", f"sqlite:///{workdir}/db.sqlite3")
        import django

        django.setup()  # the dashboard's app set-up, as the web server runs it
        summary = run(args.budget_s)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
