"""The settings' parsers: each is called as ``parse(value, key)`` and returns the checked value or
raises :class:`ConfigError` naming ``batchlu.<key>``. Parsing a parsed value gives it back unchanged
(:class:`batchlu.pipeline.config._settings.Options` parses its fields whenever it is built, from
YAML text or from values already checked). The command line maps each to a click type
(``batchlu.workflows._run_options``).
"""

from __future__ import annotations

import dataclasses
import pathlib

from dask.utils import parse_bytes, parse_timedelta

from ..errors import ConfigError
from ..store._io_engines import check as _io_engine
from ._choices import ZSTD_LEVELS

__all__ = ["AutoInteger", "Boolean", "Compressor", "Duration", "GPUs", "IOEngine", "InputFile", "Integer", "NewFile",
           "NonNegative", "Number", "OneOf", "Size", "Text"]


@dataclasses.dataclass(frozen=True)
class Size:
    """A positive size in bytes: a number, or text dask understands (``256MiB``); ``optional``: or null."""

    optional: bool = False

    def __call__(self, value, key: str) -> int | None:
        if value is None and self.optional:
            return None
        try:
            number = parse_bytes(value) if isinstance(value, str) else int(value)
            if isinstance(value, bool):
                raise ValueError
        except (TypeError, ValueError):
            number = None
        if number is None or number <= 0:
            raise ConfigError(f"Expected batchlu.{key} to be a positive size such as '256MiB'"
                              f"{' or null' if self.optional else ''}. Got {value!r} instead.")
        return number


@dataclasses.dataclass(frozen=True)
class Integer:
    """An integer >= ``minimum``; ``optional``: or null."""

    minimum: int
    optional: bool = False

    def __call__(self, value, key: str) -> int | None:
        if value is None and self.optional:
            return None
        try:
            number = int(value)
            if isinstance(value, bool) or (number != value and not isinstance(value, str)):
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"Expected batchlu.{key} to be an integer >= {self.minimum}"
                              f"{' or null' if self.optional else ''}. Got {value!r} instead.") from None
        if number < self.minimum:
            raise ConfigError(f"Expected batchlu.{key} >= {self.minimum}. Got {number} instead.")
        return number


@dataclasses.dataclass(frozen=True)
class AutoInteger:
    """``auto`` (or null) -> None, else an integer >= ``minimum``."""

    minimum: int

    def __call__(self, value, key: str) -> int | None:
        if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
            return None
        try:
            number = int(value)
            if isinstance(value, bool) or (number != value and not isinstance(value, str)):
                raise ValueError
        except (TypeError, ValueError):
            number = None
        if number is None or number < self.minimum:
            raise ConfigError(f"Expected batchlu.{key} to be auto or an integer >= {self.minimum}. "
                              f"Got {value!r} instead.")
        return number


def _float(value) -> float | None:
    """``value`` as a float, or None where it is not a number (a bool is not one)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Number:
    """A positive number."""

    def __call__(self, value, key: str) -> float:
        number = _float(value)
        if number is None or not 0 < number < float("inf"):
            raise ConfigError(f"Expected batchlu.{key} to be a positive number. Got {value!r} instead.")
        return number


@dataclasses.dataclass(frozen=True)
class NonNegative:
    """A finite number >= 0; ``optional``: or null."""

    optional: bool = False

    def __call__(self, value, key: str) -> float | None:
        if value is None and self.optional:
            return None
        number = _float(value)
        if number is None or not 0 <= number < float("inf"):
            raise ConfigError(f"Expected batchlu.{key} to be a number >= 0"
                              f"{' or null' if self.optional else ''}. Got {value!r} instead.")
        return number


@dataclasses.dataclass(frozen=True)
class Duration:
    """A positive duration: seconds as a number, or text dask understands (``30s``, ``2 minutes``)."""

    def __call__(self, value, key: str) -> float:
        try:
            seconds = parse_timedelta(value, default="seconds")
        except (TypeError, ValueError, KeyError):
            seconds = None
        if seconds is None or isinstance(value, bool) or not seconds > 0:
            raise ConfigError(f"Expected batchlu.{key} to be a positive duration such as 30s. "
                              f"Got {value!r} instead.")
        return float(seconds)


@dataclasses.dataclass(frozen=True)
class Boolean:
    def __call__(self, value, key: str) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"Expected batchlu.{key} to be true or false. Got {value!r} instead.")


class AutoBoolean:
    """``auto`` (or null) -> None, else true or false."""

    def __call__(self, value, key: str) -> bool | None:
        if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
            return None
        try:
            return Boolean()(value, key)
        except ConfigError:
            raise ConfigError(f"Expected batchlu.{key} to be auto, true or false. Got {value!r} instead.") from None


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of ``choices`` (any case)."""

    choices: tuple[str, ...]

    def __call__(self, value, key: str) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in self.choices:
            raise ConfigError(f"Expected batchlu.{key} to be one of {', '.join(self.choices)}. "
                              f"Got {value!r} instead.")
        return text


@dataclasses.dataclass(frozen=True)
class Text:
    """Non-empty text (an address, a host name)."""

    def __call__(self, value, key: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise ConfigError(f"Expected batchlu.{key} to be text. Got {value!r} instead.")
        return str(value).strip()


@dataclasses.dataclass(frozen=True)
class Compressor:
    """The output arrays' codec: ``auto``, ``zstd``, ``zstd:LEVEL``, ``lz4`` or ``none`` (null and false:
    none)."""

    def __call__(self, value, key: str) -> str:
        text = "none" if value is None or value is False else str(value).strip().lower()
        name, _, level = text.partition(":")
        if name in ("auto", "none", "lz4") and not level:
            return text
        if name == "zstd" and (not level or (level.lstrip("-").isdigit() and int(level) in ZSTD_LEVELS)):
            return text
        raise ConfigError(f"Expected batchlu.{key} to be auto, zstd, zstd:LEVEL with LEVEL from "
                          f"{ZSTD_LEVELS[0]} to {ZSTD_LEVELS[-1]}, lz4, or none. Got {value!r} instead.")


@dataclasses.dataclass(frozen=True)
class IOEngine:
    """``batchlu.io-engine``: one of pipeline.store._io_engines.NAMES, installed where named."""

    def __call__(self, value, key: str) -> str:
        return _io_engine(value)


@dataclasses.dataclass(frozen=True)
class GPUs:
    """GPUs as CUDA_VISIBLE_DEVICES lists them, ``"0,1"`` (a YAML list too); null: unset."""

    def __call__(self, value, key: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return ",".join(str(g) for g in value)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(f"Expected batchlu.{key} to be GPUs such as '0,1'. Got {value!r} instead.")
        return str(value)


@dataclasses.dataclass(frozen=True)
class InputFile:
    """A file the run reads (a certificate); null or empty: none. The CLI checks that it exists."""

    def __call__(self, value, key: str) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, (str, pathlib.PurePath)):
            raise ConfigError(f"Expected batchlu.{key} to be a file path. Got {value!r} instead.")
        return str(value)


@dataclasses.dataclass(frozen=True)
class NewFile:
    """A file the run writes (report, log), made absolute: its folder must exist (a run never creates
    folders); null or empty: none."""

    def __call__(self, value, key: str) -> str | None:
        path = InputFile()(value, key)
        if path is None:
            return None
        target = pathlib.Path(path).expanduser().absolute()
        if target.is_dir():
            raise ConfigError(f"Expected batchlu.{key} to be a file path. Got the folder {target} instead.")
        if not target.parent.is_dir():
            raise ConfigError(f"Expected the folder of batchlu.{key} {target} to exist. Got no folder "
                              f"{target.parent} instead.")
        return str(target)

