"""The ``sidecar`` command group, its error policy and shared options.

Every command module registers itself on :data:`main` (or :data:`bench`). Heavy imports
(torch, faust) happen inside the commands so that ``sidecar --help`` stays instant.
A wrong path or a bad file ends in one readable ``error:`` line and exit code 2,
never a traceback (``--debug`` shows the traceback).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from typing import Any, NoReturn

import click

from model_store import ModelStoreError
from sidecar.errors import SidecarError

log = logging.getLogger(__name__)

# OSError covers every wrong path (missing, a file where a directory belongs, an existing
# file in the way, no permission, read-only disk), not only the three most common ones.
_EXPECTED = (SidecarError, ModelStoreError, OSError)

# errno values that describe the path itself, so the same call fails the same way again.
_PERMANENT_ERRNOS = frozenset(
    {
        errno.EEXIST,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EINVAL,
    }
)


class _UsageLine(click.UsageError):
    """A usage error (bad option value, missing option) shown as one ``error:`` line that
    points at the command's help, instead of click's usage block (exit status 2 still)."""

    def show(self, file: Any = None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"error: {self.format_message()}{hint}", file=file, err=file is None)


def _one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, _UsageLine | click.exceptions.NoArgsIsHelpError):
        return exc  # already one line, or a group run without a command (its help)
    return _UsageLine(exc.format_message(), exc.ctx)


class _Group(click.Group):
    """A click group that turns expected failures into one line on stderr."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:  # the group's own options (``sidecar --log-level bogus``)
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _one_line(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a subcommand's options, or its own check
            new = _one_line(exc)
            if new is exc:
                raise
            raise new from exc
        except BrokenPipeError as exc:
            fd = _closed_stdout()
            if fd is None:
                self._fail(ctx, exc)  # a socket's peer went away: an error like any other
            # The reader of stdout went away (`sidecar models show ... | head -1`): not an
            # error of the command. Nothing more can be written there, not even at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
            sys.exit(141)  # what a shell reports for a writer stopped by SIGPIPE
        except _EXPECTED as exc:
            self._fail(ctx, exc)

    @staticmethod
    def _fail(ctx: click.Context, exc: BaseException) -> NoReturn:
        """One ``error:`` line and exit 2, or the traceback under --debug."""
        if (ctx.obj or {}).get("debug"):
            if not (isinstance(exc, OSError) and exc.errno == errno.EPIPE):
                raise exc
            import traceback

            traceback.print_exc()  # raised, click would end EPIPE quietly with exit 1
            sys.exit(2)
        hint = " (retrying may help)" if _retryable(exc) else ""
        click.echo(f"error: {_describe(exc)}{hint}", err=True)
        sys.exit(2)


def _closed_stdout() -> int | None:
    """stdout's file descriptor when it is a pipe whose reader has gone, else None (a
    broken pipe can also be a socket, and CliRunner's stdout has no descriptor)."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None
    return fd if any(ev & select.POLLERR for _, ev in events) else None


def _describe(exc: BaseException) -> str:
    if (
        isinstance(exc, FileExistsError)
        and exc.filename2 is None
        and os.path.lexists(exc.filename)
        and not os.path.isdir(exc.filename)
    ):
        # a folder was to be made where a file already is ("File exists" says too little)
        return f"{exc.filename} already exists and is not a directory"
    if isinstance(exc, OSError) and exc.filename is not None:
        what = exc.strerror or type(exc).__name__
        if exc.filename2 is not None:
            return f"{what}: {exc.filename} -> {exc.filename2}"
        return f"{what}: {exc.filename}"
    return str(exc) or type(exc).__name__


def _retryable(exc: BaseException) -> bool:
    """Whether the one-line message should suggest trying again."""
    if isinstance(exc, OSError):
        # A refused or timed-out connection may come back; a bad path will not.
        return isinstance(exc, ConnectionError | TimeoutError)
    if not getattr(exc, "retryable", False):
        return False
    # The store marks every OSError it wraps as retryable (StoreUnavailable), including
    # "--store-dir is a file"; look at the cause so that such a message does not
    # promise that a retry could help.
    cause = exc.__cause__
    return not (isinstance(cause, OSError) and cause.errno in _PERMANENT_ERRNOS)


def configure_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Configure the root logger once, at the entry point."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx logs every request with its URL at INFO: one line per batch sent to an
    # embedding server, and a key given as a query parameter would be in it.
    if logging.getLevelName(level) != logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log verbosity  [default: log.level, WARNING].",
)
@click.option(
    "--log-json/--no-log-json",
    default=None,
    help="Log as JSON lines (for cluster log shippers)  [default: log.json_lines, off].",
)
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, log_level: str | None, log_json: bool | None, debug: bool) -> None:
    """OOD moderation sidecar for RAG services.

    Scores each chat query against the knowledge base (KB) it is meant for and emits an
    ID (answerable from the KB) or OOD verdict. Train a detector with `sidecar train`,
    judge the method with `sidecar eval` and a release with `sidecar check`, run it on
    Kafka with `sidecar worker`, or try it all locally with `sidecar demo`.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if log_level is None or log_json is None:
        # SIDECAR_LOG__LEVEL / __JSON_LINES; bad settings are the subcommand's to report
        # (in one line), so logging falls back to the defaults here.
        from sidecar.errors import ConfigError
        from sidecar.settings import LogSettings, load_settings

        try:
            log = load_settings().log
        except (ConfigError, OSError):  # e.g. an unreadable secrets directory
            log = LogSettings()
        log_level = log_level or log.level
        log_json = log.json_lines if log_json is None else log_json
    configure_logging(log_level, log_json)


@main.group(cls=_Group)
def bench() -> None:
    """Measure speed and behaviour; every benchmark writes a JSON report."""
