"""Chat templates rendered in a bounded sandbox.

A chat template is Jinja code from a model file. Jinja's immutable sandbox keeps it
from reaching Python's internals; this module also keeps it from deciding how much
time and memory braze spends:

- **time**: a render has ``TIME_BUDGET`` seconds; a trace function checks the clock
  every few hundred Python lines, so nested ``range(100000)`` loops stop;
- **output**: rendered pieces are summed as they come, at most ``MAX_OUTPUT`` chars;
- **strings built in one call** (which the clock cannot interrupt): ``*``, ``**``,
  ``%``, ``~``, the ``center``/``indent``/``format``/``wordwrap``/``join``/``slice``
  filters, ``lipsum``, and
  the ``str`` methods that pad, fill, replace or join are refused when their result
  would pass ``MAX_STRING`` chars, before it is built.

Every failure is a ``TemplateError``.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from .errors import TemplateError

if TYPE_CHECKING:  # at run time jinja2 is imported on first use (_make_env)
    import jinja2

#: enough for any real prompt, small enough that ``'x' * 10**12`` or ``9**9**9`` fail fast
MAX_STRING = 1_000_000
MAX_OUTPUT = 4 * MAX_STRING
MAX_POWER_BITS = 40_000
TIME_BUDGET = 2.0
_CHECK_EVERY = 256  # trace events between clock reads (a read costs ~50 ns)
_BIG_NUMBER = re.compile(r"\d{7,}|\*")  # a width or precision of a million or more, or one from the args


class _Budget(Exception):
    """Raised inside the render by the clock or a size check; becomes a TemplateError."""


def _raise_exception(message: str) -> None:
    """Templates call ``raise_exception('...')`` to reject a conversation (e.g. roles
    not alternating)."""
    raise TemplateError(f"chat template rejected the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    """Templates (Llama 3.x) stamp today's date into the system prompt."""
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """JSON without Jinja's HTML escaping (``<`` stays ``<``): the output is a prompt,
    not a web page, and tool schemas must reach the model verbatim."""
    if indent is not None and (not isinstance(indent, int) or indent > 64):
        raise _Budget(f"tojson indent {indent!r} too large")
    return _sized(json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                             sort_keys=sort_keys))


def _sized(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_STRING:
        raise _Budget(f"a string of {len(text)} chars is past the {MAX_STRING} cap")
    return text


def _need(n: int, what: str) -> None:
    if n > MAX_STRING:
        raise _Budget(f"{what} would build {n} chars, past the {MAX_STRING} cap")


def _check_format(fmt: Any, what: str) -> None:
    if isinstance(fmt, str) and _BIG_NUMBER.search(fmt):
        raise _Budget(f"{what}: widths of a million or more (or '*') are refused")


def _width(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else len(str(value))


def _guard_str_call(obj: Any, args: Sequence[Any]) -> None:
    """Refuse a ``str`` method call whose result would pass the cap (estimated from
    its arguments before the call)."""
    obj = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    name = getattr(obj, "__name__", "")
    owner = getattr(obj, "__self__", None)
    if not isinstance(owner, str):
        return
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _need(_width(args[0]), f"str.{name}")
    elif name == "expandtabs":
        _need(len(owner) * (_width(args[0]) if args else 8), "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = owner.count(args[0]) if args[0] else len(owner) + 1
        _need(len(owner) + hits * len(args[1]), "str.replace")
    elif name == "join" and args:
        _need_join(args[0], owner, "str.join")
    elif name in ("format", "format_map"):
        _check_format(owner, "str.format")


def _need_join(items: Any, sep: str, what: str) -> None:
    if isinstance(items, (list, tuple, str)):
        _need(sum(len(x) if isinstance(x, str) else 1 for x in items) + len(sep) * len(items), what)


def _bounded_join(seq: Iterable[Any]) -> str:
    """Jinja's ``~`` and output joins: sized before the pieces are concatenated."""
    parts = [str(x) for x in seq]
    _need(sum(len(p) for p in parts), "'~'")
    return "".join(parts)


@lru_cache(maxsize=1)
def _make_env() -> jinja2.Environment:
    """One shared environment with what HF chat templates expect: block trimming (they
    are written assuming it), ``break``/``continue``, ``raise_exception``,
    ``strftime_now`` and an unescaped ``tojson``. No autoescape: the output is a
    prompt, not HTML. Made on first use, with jinja2's import (~6 MiB resident): a
    generation without a chat template never needs either."""
    import jinja2.ext
    import jinja2.filters
    import jinja2.nodes
    import jinja2.sandbox

    class _GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (HF marks assistant spans for
        training masks with it); for inference the body renders as is."""

        tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it so

        def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class _ChatSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox, stricter: touching an unsafe attribute raises at
        once (stock Jinja returns a silent undefined until it is used), and operators
        and calls that build strings are size-capped."""

        intercepted_binops = frozenset({"*", "**", "%"})

        def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
            raise jinja2.sandbox.SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                        _need(len(seq) * max(count, 0), "repetition")
                return left * right
            if operator == "**":
                ints = isinstance(left, int) and isinstance(right, int)
                # bits of the result ~ exponent * bits of the base
                if ints and abs(left) > 1 and right * abs(left).bit_length() > MAX_POWER_BITS:
                    raise _Budget("power result too large")
                return left**right
            if operator == "%":
                _check_format(left, "'%' formatting")
                return _sized(left % right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _guard_str_call(__obj, args)
            return _sized(super().call(__context, __obj, *args, **kwargs))

    env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag],
                       autoescape=False)
    filters = env.filters

    def center(value: Any, width: int = 80) -> str:
        _need(_width(width), "center")
        return str(jinja2.filters.do_center(value, width))

    def indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
        _need((_width(width) + 1) * (str(s).count("\n") + 1) + len(str(s)), "indent")
        return str(jinja2.filters.do_indent(s, width, first, blank))

    def format_(value: Any, *args: Any, **kwargs: Any) -> str:
        _check_format(value, "format")
        return str(_sized(jinja2.filters.do_format(value, *args, **kwargs)))

    def wordwrap(s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
        _need(2 * len(str(s)), "wordwrap")
        return str(jinja2.filters.do_wordwrap(env, s, width, *args, **kwargs))

    do_join = filters["join"]

    @jinja2.pass_eval_context
    def join(ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
        _need_join(value, str(d), "join")
        return str(_sized(do_join(ctx, value, d, attribute)))

    def slice_(value: Any, slices: int, fill_with: Any = None) -> Any:
        _need(_width(slices), "slice")  # one list per slice, however few items
        return jinja2.filters.do_slice(value, slices, fill_with)

    filters.update(slice=slice_, center=center, indent=indent, format=format_, wordwrap=wordwrap, join=join, tojson=_tojson)
    lipsum: Callable[..., Any] = env.globals["lipsum"]  # type: ignore[assignment]

    def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        _need(_width(n) * _width(max) * 16, "lipsum")
        return str(lipsum(n, html, min, max))

    env.globals["lipsum"] = bounded_lipsum
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    """Compiling costs milliseconds; a chat loop renders the same template per turn.
    The compiled module's ``~`` (``str_join``) is replaced by a sized one."""
    compiled = _make_env().from_string(template)
    namespace = compiled.root_render_func.__globals__
    namespace["str_join"] = namespace["markup_join"] = _bounded_join
    return compiled


class _Clock:
    """A trace function: every ``_CHECK_EVERY`` Python lines run during the render it
    reads the clock, and stops the render past its deadline."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.n = 0
        self.expired = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        # every Python frame, not only the template's: a filter's own loop (``slice``,
        # ``lipsum``) runs in Jinja's code. Measured: SmolLM2's template over 8
        # messages renders in 1.1 ms traced, 0.12 ms not; once per chat turn.
        self.n += 1
        if self.expired or (self.n % _CHECK_EVERY == 0 and time.monotonic() > self.deadline):
            # raised again at every event from now on: one raised inside a gc callback
            # (a Python frame too) is swallowed by the interpreter
            self.expired = True
            raise _Budget(f"render took more than {TIME_BUDGET} s")
        return self


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """Render a chat template (HF conventions: ``messages``, ``add_generation_prompt``,
    ``bos_token``, ``eos_token``, plus ``extra`` such as ``tools``) in the sandbox.

    Raises :class:`TemplateError` on a syntax error, a render error, a
    ``raise_exception`` call, a sandbox violation, or a time or size budget passed.
    """
    import jinja2.sandbox  # its exceptions, for the handlers below

    clock = _Clock(TIME_BUDGET)
    previous = sys.gettrace()
    try:
        compiled = _compile(template)
        parts: list[str] = []
        size = 0
        sys.settrace(clock)
        try:
            for piece in compiled.generate(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                           bos_token=bos_token, eos_token=eos_token, **extra):
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise _Budget(f"output passed {MAX_OUTPUT} chars")
                parts.append(piece)
        finally:
            sys.settrace(previous)
        return "".join(parts)
    except TemplateError:
        raise
    except _Budget as exc:
        raise TemplateError(f"over budget: {exc}") from None
    except jinja2.sandbox.SecurityError as exc:
        raise TemplateError(f"sandbox violation: {exc}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"syntax error on line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"render failed: {exc}") from None
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise TemplateError(f"render failed: {type(exc).__name__}") from None
    except Exception as exc:  # noqa: BLE001 - TypeError/KeyError... from template expressions
        raise TemplateError(f"render failed: {type(exc).__name__}: {exc}") from None
