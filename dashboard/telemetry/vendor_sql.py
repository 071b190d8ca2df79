"""The SQL that differs between the dashboard's backends (PostgreSQL, the fleet database; SQLite, the embedded
default), in one place: bucket starts, epoch seconds and back, seconds after an origin, weighted sums, half-up
averages, the smaller of two values.

Each function takes ``vendor`` (``connection.vendor``) and SQL expressions, and returns an SQL expression; a ``%``
is written ``%%`` (the statements are run with parameters). Other backends raise ``NotImplementedError``.
"""
from __future__ import annotations

_UNITS = {60: "minute", 3600: "hour"}


def _check(vendor: str) -> None:
    if vendor not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"no telemetry SQL for the {vendor} backend")


def bucket_start(vendor: str, column: str, seconds: int) -> str:
    """Start of the UTC minute (``seconds`` 60), hour (3600) or other interval of ``seconds`` counted from the epoch
    (300: 5 minutes; a divisor of a day) holding the datetime ``column``, as the backend stores datetimes (so it
    compares equal to a stored bucket start). PostgreSQL: ``date_bin`` (arithmetic on the instant; ``date_trunc``
    with a time zone converted every row, several times slower in the rollup's aggregations)."""
    _check(vendor)
    if vendor == "postgresql":
        return f"date_bin('{seconds} seconds', {column}, TIMESTAMPTZ '1970-01-01 00:00:00+00')"
    if seconds not in _UNITS:
        return f"datetime({epoch_seconds(vendor, column)} / {seconds} * {seconds}, 'unixepoch')"
    unit = _UNITS[seconds]
    # Django stores UTC text 'YYYY-MM-DD HH:MM:SS[.ffffff]' (str() of a naive datetime: no fraction when it is 0)
    return f"strftime('%%Y-%%m-%%d %%H:{'%%M' if unit == 'minute' else '00'}:00', {column})"


def epoch_seconds(vendor: str, column: str) -> str:
    """Whole seconds since the epoch (rounded down) of the datetime ``column``, an integer."""
    _check(vendor)
    if vendor == "postgresql":  # date_part: double precision, exact to the microsecond for these dates (extract:
        return f"floor(date_part('epoch', {column}))::bigint"  # numeric, slower)
    return f"CAST(strftime('%%s', {column}) AS INTEGER)"


def from_epoch_seconds(vendor: str, seconds: str) -> str:
    """The UTC date-time ``seconds`` (a whole number of seconds since the epoch) as the backend stores datetimes
    (so it compares equal to a stored bucket start)."""
    _check(vendor)
    if vendor == "postgresql":
        return f"to_timestamp({seconds})"
    return f"datetime({seconds}, 'unixepoch')"


def weighted(vendor: str, value: str, weight: str) -> str:
    """``value * weight`` without integer overflow where the backend can (PostgreSQL: numeric)."""
    _check(vendor)
    return f"({value})::numeric * ({weight})" if vendor == "postgresql" else f"({value}) * ({weight})"


def weighted_sum(vendor: str, value: str, weight: str) -> str:
    """Aggregate: the sum of ``value * weight`` over the group without integer overflow. PostgreSQL: the rows of
    weight 1 (every raw sample) summed as integers (``sum(bigint)``, exact), only the others multiplied as
    ``numeric`` (several times slower per row); a ``numeric``."""
    _check(vendor)
    if vendor == "postgresql":
        return (f"(coalesce(sum({value}) FILTER (WHERE {weight} = 1), 0) + "
                f"coalesce(sum(({value})::numeric * ({weight})) FILTER (WHERE {weight} <> 1), 0))")
    return f"sum(({value}) * ({weight}))"


def half_up_average(vendor: str, total: str, weight: str) -> str:
    """``total / weight`` rounded half up, for non-negative integers (0 when ``weight`` is 0)."""
    _check(vendor)
    if vendor == "postgresql":  # round(numeric) rounds half away from zero
        return f"coalesce(round(({total}) / nullif({weight}, 0)), 0)"
    half_up = f"({total}) / ({weight}) + (2 * (({total}) %% ({weight})) >= {weight})"
    return f"CASE WHEN {weight} > 0 THEN {half_up} ELSE 0 END"


def least(vendor: str, first: str, second: str) -> str:
    """The smaller of two non-NULL values."""
    _check(vendor)
    return f"least({first}, {second})" if vendor == "postgresql" else f"min({first}, {second})"


def analytic_settings(vendor: str) -> list[str]:
    """Statements to run first in the transaction of one large read (a chart's aggregation): on PostgreSQL no JIT
    (its compilation took seconds per chart query, more than the query) and room to sort in memory."""
    _check(vendor)
    return ["SET LOCAL jit = off", "SET LOCAL work_mem = '64MB'"] if vendor == "postgresql" else []


def bytewise(vendor: str, column: str) -> str:
    """Text ``column`` compared byte by byte, for sorts that only group equal values (PostgreSQL: ``COLLATE "C"``;
    a linguistic collation made the chart's window sort several times slower)."""
    _check(vendor)
    return f'{column} COLLATE "C"' if vendor == "postgresql" else column


def seconds_after_origin(vendor: str, column: str) -> str:
    """``column`` (a date-time) as seconds after the origin, the first ``%s`` parameter: a ``datetime`` on
    PostgreSQL, whole epoch seconds on SQLite; exact to the microsecond / millisecond (chargeback's integrals)."""
    _check(vendor)
    if vendor == "postgresql":
        return f"CAST(EXTRACT(EPOCH FROM ({column} - %s)) AS DOUBLE PRECISION)"
    # whole seconds (exact integers), then the milliseconds of "%f" ("SS.SSS")
    return (f"(CAST(strftime('%%s', {column}) AS INTEGER) - %s "
            f"+ CAST(substr(strftime('%%f', {column}), 3) AS REAL))")
