"""KFP recurring-run schedules: the 6-field cron (seconds first) and ``@every <duration>``, checked before any request.

The rules are the robfig/cron parser's that the KFP backend uses (seconds, minutes, hours, day of month,
month, day of week; names JAN-DEC and SUN-SAT; ``@yearly`` ... ``@hourly``; ``@every`` with a Go duration).
``python -m pipelines.run --schedule`` and ``pipelines.submit`` both call ``validate_cron``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.errors import UsageError


@dataclass(frozen=True)
class _CronField:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] stands for the value low + i

    def allowed(self) -> str:
        spelled = f" or {self.names[0]}-{self.names[-1]}" if self.names else ""
        return f"{self.low}-{self.high}{spelled}"


_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_CRON_FIELDS = (
    _CronField("second", 0, 59),
    _CronField("minute", 0, 59),
    _CronField("hour", 0, 23),
    _CronField("day-of-month", 1, 31),
    _CronField("month", 1, 12, _MONTHS),
    _CronField("day-of-week", 0, 6, _WEEKDAYS),
)
_CRON_FORM = (
    'KFP cron has 6 fields "second minute hour day-of-month month day-of-week", e.g. "0 0 3 * * 0" = 03:00 every Sunday'
)
# The descriptors robfig/cron v1 (the parser KFP's API server and scheduler use) accepts besides @every.
_CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def validate_cron(expression: str) -> None:
    """Check a KFP recurring-run schedule before anything is sent to the server.

    KFP parses schedules with Go's robfig/cron v1: six fields with seconds first
    (``"0 0 3 * * 0"`` = 03:00 every Sunday), each a ``*``/``?``, a value, a range ``a-b``, a step
    ``*/n``, ``a/n`` or ``a-b/n``, or a comma-separated list of those; months and weekdays may be
    spelled JAN-DEC and SUN-SAT. The descriptors @yearly, @annually, @monthly, @weekly, @daily,
    @midnight, @hourly and ``@every <Go duration>`` (e.g. ``@every 1h30m``) are accepted too.

    Args:
        expression: The schedule as the user typed it.

    Raises:
        UsageError: Naming the wrong field and showing the 6-field form. A 5-field (Unix) expression
            gets a hint to prepend a seconds field: robfig v1 would otherwise silently read it as
            seconds-first, so ``"0 3 * * 0"`` would not mean 03:00.
    """
    spec = " ".join(expression.split())
    if not spec:
        raise UsageError(f"schedule is empty; {_CRON_FORM}")
    if spec.startswith("@"):
        _validate_cron_descriptor(spec)
        return
    fields = spec.split(" ")
    if len(fields) == 5:
        raise UsageError(f'schedule "{spec}" has 5 fields but {_CRON_FORM}; prepend a seconds field, e.g. "0 {spec}"')
    if len(fields) != 6:
        count = f"{len(fields)} field" + ("s" if len(fields) > 1 else "")
        raise UsageError(f'schedule "{spec}" has {count} but {_CRON_FORM}')
    for field, text in zip(_CRON_FIELDS, fields, strict=True):
        problem = _cron_field_problem(field, text)
        if problem:
            raise UsageError(f'schedule "{spec}": {field.name} field "{text}" {problem}; {_CRON_FORM}')


def _cron_field_problem(field: _CronField, text: str) -> str | None:
    """Say what is wrong with one cron field, or return None when robfig/cron v1 accepts it."""
    for item in text.split(","):
        if not item:
            return "has an empty list item"
        range_part, slash, step = item.partition("/")
        if slash and not (step.isdigit() and int(step) > 0):
            return f'has step "/{step}"; a step must be a positive whole number'
        if range_part in ("*", "?"):
            continue
        low_text, dash, high_text = range_part.partition("-")
        low = _cron_value(field, low_text)
        high = _cron_value(field, high_text) if dash else low
        for value, value_text in ((low, low_text), (high, high_text)):
            if value is None:
                return f'has "{value_text}" where {field.allowed()} is expected'
            if not field.low <= value <= field.high:
                hint = " (0 is Sunday)" if field.name == "day-of-week" and value == 7 else ""
                return f"has {value} outside {field.low}-{field.high}{hint}"
        assert low is not None and high is not None  # the loop returned otherwise
        if low > high:
            return f"has range {low_text}-{high_text} whose start is after its end"
    return None


def _cron_value(field: _CronField, text: str) -> int | None:
    if text.isdigit():
        return int(text)
    if text.upper() in field.names:
        return field.low + field.names.index(text.upper())
    return None


def _validate_cron_descriptor(spec: str) -> None:
    if spec in _CRON_DESCRIPTORS:
        return
    duration = spec.removeprefix("@every ")
    if duration != spec:
        seconds = _go_duration_seconds(duration)
        if seconds is None:
            raise UsageError(
                f'schedule "{spec}": "{duration}" is not a Go duration; write e.g. "@every 1h30m" (units h, m, s)'
            )
        if seconds < 1:
            raise UsageError(
                f'schedule "{spec}": the interval must be at least 1s (robfig/cron rounds shorter ones up)'
            )
        return
    raise UsageError(
        f'schedule "{spec}" is not a known descriptor; use one of '
        f'{", ".join(_CRON_DESCRIPTORS)}, "@every <duration>" (e.g. "@every 6h"), '
        f"or a cron: {_CRON_FORM}"
    )


def _go_duration_seconds(text: str) -> float | None:
    """Parse a Go ``time.ParseDuration`` string such as ``1h30m``; None when it is not one."""
    sign = -1.0 if text.startswith("-") else 1.0
    text = text.removeprefix("-") if sign < 0 else text.removeprefix("+")
    if text == "0":
        return 0.0
    parts = _GO_DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sign * sum(float(number) * _GO_DURATION_UNITS[unit] for number, unit in parts)


# -------------------------------------------------------------------------------------------- submit
